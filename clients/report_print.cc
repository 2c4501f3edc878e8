#include "clients/report_print.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "clients/progress.h"
#include "clients/text.h"
#include "topiary/v1/events.pb.h"
#include "trainer/run/events.h"

namespace topiary {
namespace {

// The mask of one layer as text: the block grid, or the kept share per 8x8 channel tile.
std::string MaskHeatMap(const topiary::v1::LayerReport& r) {
  std::string out;
  if (r.block_grid_size() > 0) {
    absl::StrAppendFormat(&out,
                          "%s: %dx%d blocks, rows = input blocks (%d), columns = output "
                          "blocks (%d); '#' kept, '.' zero\n",
                          r.layer(), r.block_in(), r.block_out(), r.block_rows(), r.block_cols());
    for (int row = 0; row < r.block_rows(); ++row) {
      absl::StrAppendFormat(&out, "%4d ", row);
      for (int c = 0; c < r.block_cols(); ++c) {
        out += r.block_grid(row * r.block_cols() + c) ? '#' : '.';
      }
      absl::StrAppendFormat(&out, "  %d/%d\n", r.row_occupancy(row), r.block_cols());
    }
    return out;
  }
  if (r.tile_density_size() > 0) {
    static const char* kShades[] = {" ", ".", ":", "-", "=", "+", "*", "#", "@"};
    absl::StrAppendFormat(&out,
                          "%s: kept share per 8x8 channel tile, rows = input tiles (%d), "
                          "columns = output tiles (%d); ' ' none ... '@' all\n",
                          r.layer(), r.tile_rows(), r.tile_cols());
    for (int row = 0; row < r.tile_rows(); ++row) {
      absl::StrAppendFormat(&out, "%4d ", row);
      for (int c = 0; c < r.tile_cols(); ++c) {
        const float d = r.tile_density(row * r.tile_cols() + c);
        out += kShades[std::clamp(static_cast<int>(std::lround(d * 8)), 0, 8)];
      }
      out += '\n';
    }
    return out;
  }
  return r.layer() + ": dense (no mask)\n";
}

// The approximate layers of a report, one line each (nothing when all are exact).
void PrintApproximations(const topiary::v1::CheckpointReport& r) {
  bool header = false;
  using topiary::v1::ApproximationSpec;
  for (const auto& l : r.layers()) {
    if (!l.has_approximation()) continue;
    const topiary::v1::LayerApproximation& a = l.approximation();
    if (!header) {
      absl::PrintF("\napproximate convolutions: multiplier, table SHA-256, activation range\n");
      header = true;
    }
    std::string range = absl::AsciiStrToLower(ApproximationSpec::RangeMode_Name(a.range()));
    if (a.activation_range_size() == 3) {
      range += a.activation_range(2) != 0
                   ? absl::StrFormat(" [%.4g, %.4g]", a.activation_range(0), a.activation_range(1))
                   : " (not yet observed)";
    }
    absl::PrintF("  %-30s %-20s %.16s  %s%s%s\n", l.layer(), a.multiplier(), a.multiplier_sha256(),
                 range,
                 a.weight_code() == ApproximationSpec::SIGN_MAGNITUDE ? ", sign-magnitude weights"
                 : a.weight_tuning()                                  ? ", weight-tuned"
                                                                      : "",
                 a.per_channel_weights() ? ", per-channel weight scales" : "");
  }
}

// The layers whose weight gradients the run sampled, and how many steps sampled.
void PrintSampling(const topiary::v1::CheckpointReport& r,
                   const topiary::v1::CheckpointMetrics& metrics) {
  std::vector<std::string> layers;
  std::string how;
  for (const auto& l : r.layers()) {
    if (!l.has_weight_gradient()) continue;
    layers.push_back(l.layer());
    how = absl::StrFormat("top_k %d, %s scale", l.weight_gradient().top_k(),
                          absl::AsciiStrToLower(topiary::v1::GradientSamplingSpec::Scale_Name(
                              l.weight_gradient().scale())));
  }
  if (layers.empty()) return;
  absl::PrintF("\nsampled weight gradients (%s): %s\n", how, absl::StrJoin(layers, ", "));
  if (metrics.has_gradient_sampling()) {
    const auto& g = metrics.gradient_sampling();
    absl::PrintF("  %s: %d steps sampled, %d exact\n", OneLine(g.policy()), g.sampled_steps(),
                 g.exact_steps());
  }
}

}  // namespace

namespace {

// The mask column: the file's own word for the kind ("block", "element"), n:m for N:M masks,
// "-" for none.
std::string MaskLabel(const topiary::v1::LayerReport& l) {
  switch (l.mask()) {
    case topiary::v1::MASK_BLOCK:
      return "block";
    case topiary::v1::MASK_ELEMENT:
      return "element";
    case topiary::v1::MASK_N_OF_M:
      return absl::StrFormat("%d:%d", l.n(), l.m());
    default:
      return "-";
  }
}

}  // namespace

void PrintImportSummary(topiary::v1::ImportSummary s, bool json) {
  if (json) {
    absl::PrintF("%s\n", ScriptJson(s));
    return;
  }
  MakePrintable(&s);
  absl::PrintF(
      "%s: %s, %d layers from %d ONNX nodes (%d ReLUs fused, %d batch norms kept, %d dropped), "
      "%d parameters, %dx%dx%d images, %d classes\n",
      s.checkpoint(), s.arch(), s.layers(), s.onnx_nodes(), s.fused_relus(), s.batch_norms(),
      s.dropped(), s.parameters(), s.height(), s.width(), s.channels(), s.classes());
}

void PrintCheckpointReport(topiary::v1::CheckpointReport r, bool json) {
  if (json) {
    absl::PrintF("%s\n", ScriptJson(r));
    return;
  }
  MakePrintable(&r);
  const topiary::v1::CheckpointMetrics& metrics = r.metrics();
  absl::PrintF("%s (topiary checkpoint, format %d)\n", r.path(), r.format_version());
  absl::PrintF("experiment %s: %s, round %d, epoch %d, step %d, written %s\n",
               r.experiment_id().empty() ? "-" : r.experiment_id(), r.model_arch(), r.round(),
               r.epoch(), r.global_step(), r.created_at());
  if (!r.parent().empty()) absl::PrintF("parent %s\n", r.parent());
  absl::PrintF(
      "test top-1 %.2f%%, loss %.4f (before the first prune step: %.2f%%); %d parameters; "
      "conv and linear sparsity %.1f%%\n\n",
      100 * metrics.test_top1(), metrics.test_loss(), 100 * metrics.dense_top1(), r.parameters(),
      100 * r.sparsity());
  if (metrics.rounds_size() > 0 && metrics.rounds(0).multiply_adds() > 0) {
    const auto& last = metrics.rounds(metrics.rounds_size() - 1);
    absl::PrintF("%d multiply-adds per image (%.1f%% of the dense network's)\n\n",
                 last.multiply_adds(),
                 100.0 * last.multiply_adds() / metrics.rounds(0).multiply_adds());
  }
  absl::PrintF("%-30s %-16s %-8s %-13s %8s %9s %9s %9s\n", "layer", "shape (OIHW)", "mask",
               "blocks kept", "sparsity", "mean", "std", "|w| max");
  for (const auto& l : r.layers()) {
    std::vector<std::string> dims;
    for (int64_t d : l.shape()) dims.push_back(std::to_string(d));
    // A layer channel pruning narrowed: its output channels now, of how many.
    if (l.original_out_channels() > 0 && !dims.empty()) {
      dims[0] += absl::StrFormat("(of %d)", l.original_out_channels());
    }
    const std::string mask = MaskLabel(l);
    const std::string blocks =
        l.mask() == topiary::v1::MASK_BLOCK
            ? absl::StrFormat("%d/%d", l.blocks_kept(), l.block_rows() * l.block_cols())
            : "-";
    absl::PrintF("%-30s %-16s %-8s %-13s %7.1f%% %9.4f %9.4f %9.4f%s\n", l.layer(),
                 absl::StrJoin(dims, "x"), mask, blocks, 100 * l.sparsity(), l.stats().mean(),
                 l.stats().std(), l.stats().abs_max(),
                 l.mask_consistent() ? "" : "  (masked weights not zero!)");
  }
  PrintApproximations(r);
  if (metrics.rounds_size() > 0) {
    PrintEngineChoices(stdout, metrics.rounds(metrics.rounds_size() - 1));
  }
  if (metrics.conv_input_sparsity_size() > 0) {
    absl::PrintF("\n");
    PrintInputSparsity(stdout, metrics.conv_input_sparsity());
    for (const auto& l : metrics.conv_input_sparsity()) {
      absl::PrintF("  %-30s %5.1f%% zeros\n", l.layer(), 100 * l.zero_fraction());
    }
  }
  PrintSampling(r, metrics);
  if (r.layers_size() == 1 && r.layers(0).mask() != topiary::v1::MASK_NONE) {
    absl::PrintF("\n%s", MaskHeatMap(r.layers(0)));
  }
}

// The table of `topiary multipliers`: one line per multiplier, or a JSON array.
void PrintMultipliers(bool json, const std::vector<topiary::v1::MultiplierInfo>& rows) {
  if (json) {
    std::vector<std::string> json;
    for (const auto& m : rows) json.push_back(ScriptJson(m));
    absl::PrintF("[%s]\n", absl::StrJoin(json, ","));
    return;
  }
  absl::PrintF("%-14s %-12s %9s %6s %6s %6s %6s %6s %11s %7s %7s\n", "name", "sha256", "MAE",
               "MAE%", "WCE", "WCE%", "EP%", "MRE%", "MSE", "mW", "um2");
  for (const auto& m : rows) {
    if (!m.error().empty()) {
      absl::PrintF("%-14s (%s)\n", OneLine(m.name()), OneLine(m.error()));
      continue;
    }
    absl::PrintF("%-14s %-12s %9.2f %6.3f %6.0f %6.3f %6.2f %6.3f %11.6g %7s %7s\n",
                 OneLine(m.name()), m.sha256().substr(0, 12), m.mae(), m.mae_pct(), m.wce(),
                 m.wce_pct(), m.ep_pct(), m.mre_pct(), m.mse(),
                 m.has_power_mw() ? absl::StrFormat("%.3f", m.power_mw()) : "",
                 m.has_area_um2() ? absl::StrFormat("%.1f", m.area_um2()) : "");
  }
}

}  // namespace topiary
