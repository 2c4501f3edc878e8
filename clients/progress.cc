#include "clients/progress.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "clients/text.h"
#include "trainer/run/events.h"
#include "trainer/util/file_util.h"

namespace topiary {

std::string FormatDuration(double seconds) {
  const long s = std::lround(std::max(seconds, 0.0));
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%d:%02d", s / 60, s % 60);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
}

namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

TransferProgress::TransferProgress(std::FILE* out, bool tty, std::string verb, int files,
                                   uint64_t bytes)
    : out_(out),
      tty_(tty),
      verb_(std::move(verb)),
      files_(files),
      bytes_(bytes),
      start_(NowSeconds()) {}

void TransferProgress::Update(int files, uint64_t bytes) {
  const double now = NowSeconds();
  if (!tty_ || now - last_ < 0.1) return;
  last_ = now;
  const double rate = bytes / std::max(now - start_, 1e-3);
  absl::FPrintF(out_, "\r%s  %d/%d files  %s of %s  %3.0f%%  %s/s\x1b[K", verb_, files, files_,
                HumanBytes(bytes), HumanBytes(bytes_), bytes_ > 0 ? 100.0 * bytes / bytes_ : 100.0,
                HumanBytes(static_cast<uint64_t>(rate)));
  std::fflush(out_);
}

void TransferProgress::Done(const std::string& summary) {
  if (tty_) absl::FPrintF(out_, "\r\x1b[K");
  absl::FPrintF(out_, "%s (%s)\n", summary, FormatDuration(NowSeconds() - start_));
}

namespace {

// "round 3 " before a fine-tuning epoch; nothing before a dense one.
std::string PhasePrefix(const topiary::v1::Phase& phase) {
  return phase.kind() == topiary::v1::Phase::DENSE ? "" : PhaseName(phase) + " ";
}

}  // namespace

void PrintRoundTable(std::FILE* out, const topiary::v1::RunSummary& s) {
  const bool val = s.rounds_size() > 0 && s.rounds(s.rounds_size() - 1).val_loss() > 0;
  absl::FPrintF(out,
                "\nround  sparsity  layers (min-max)   %s top-1  loss     time      mult-adds\n",
                val ? " val" : "test");
  const int64_t dense_macs = s.rounds_size() > 0 ? s.rounds(0).multiply_adds() : 0;
  for (const auto& r : s.rounds()) {
    double lo = 1, hi = 0;
    for (const auto& l : r.layers()) {
      lo = std::min(lo, l.sparsity());
      hi = std::max(hi, l.sparsity());
    }
    const std::string range =
        r.layers_size() ? absl::StrFormat("%5.1f%% - %5.1f%%", 100 * lo, 100 * hi) : "-";
    // Multiply-adds per image against the dense network's (channel pruning shrinks them).
    const std::string macs =
        dense_macs > 0 ? absl::StrFormat("%8.1f%%", 100.0 * r.multiply_adds() / dense_macs) : "-";
    const HeldOut h = HeldOutOf(r);
    absl::FPrintF(out, "%5d  %7.1f%%  %-17s  %9.2f%%  %.4f  %-8s  %s\n", r.round(),
                  100 * r.sparsity(), range, 100 * h.top1, h.loss, FormatDuration(r.seconds()),
                  macs);
  }
  // Per-layer sparsity by round (percent of the kernel's weights).
  const auto& last = s.rounds(s.rounds_size() - 1);
  if (last.layers_size() == 0) return;
  absl::FPrintF(out, "\nper-layer sparsity %% by round\n%-30s", "layer");
  for (int i = 1; i < s.rounds_size(); ++i) absl::FPrintF(out, " %4d", s.rounds(i).round());
  absl::FPrintF(out, "\n");
  for (const auto& layer : last.layers()) {
    absl::FPrintF(out, "%-30s", layer.layer());
    for (int i = 1; i < s.rounds_size(); ++i) {
      double v = 0;
      for (const auto& l : s.rounds(i).layers()) {
        if (l.layer() == layer.layer()) v = l.sparsity();
      }
      absl::FPrintF(out, " %4.0f", 100 * v);
    }
    absl::FPrintF(out, "\n");
  }
  PrintEngineChoices(out, last);
}

void PrintEngineChoices(std::FILE* out, const topiary::v1::RoundSummary& r) {
  bool any = false;
  for (const auto& l : r.layers()) any = any || l.has_forward();
  if (!any) return;
  absl::FPrintF(out,
                "\nconvolution kernels in round %d (measured ms, block-sparse / dense; * = "
                "chosen)\n%-30s %7s  %-21s %-21s %-21s\n",
                r.round(), "layer", "blocks", "forward", "backward data", "backward filter");
  auto cell = [](const topiary::v1::ConvPassChoice& c) -> std::string {
    if (c.dense_ms() < 0) return "dense (not measured)";
    const bool sparse = c.chosen() == topiary::v1::ConvPassChoice::BLOCK_SPARSE;
    return absl::StrFormat("%s%.3f / %s%.3f", sparse ? "*" : "", c.sparse_ms(), sparse ? "" : "*",
                           c.dense_ms());
  };
  for (const auto& l : r.layers()) {
    if (!l.has_forward()) continue;
    absl::FPrintF(out, "%-30s %6.1f%%  %-21s %-21s %-21s\n", l.layer(),
                  100.0 * (l.units() - l.zero_units()) / std::max<int64_t>(l.units(), 1),
                  cell(l.forward()), cell(l.backward_data()), cell(l.backward_filter()));
  }
}

void PrintInputSparsity(
    std::FILE* out,
    const google::protobuf::RepeatedPtrField<topiary::v1::ConvInputSparsity>& layers) {
  if (layers.empty()) return;
  double sum = 0;
  const topiary::v1::ConvInputSparsity* lo = &layers[0];
  const topiary::v1::ConvInputSparsity* hi = &layers[0];
  for (const auto& l : layers) {
    sum += l.zero_fraction();
    if (l.zero_fraction() < lo->zero_fraction()) lo = &l;
    if (l.zero_fraction() > hi->zero_fraction()) hi = &l;
  }
  absl::FPrintF(out,
                "convolution inputs (last evaluation): %.1f%% zeros on average over %d layers, "
                "%.1f%% (%s) to %.1f%% (%s)\n",
                100 * sum / layers.size(), layers.size(), 100 * lo->zero_fraction(), lo->layer(),
                100 * hi->zero_fraction(), hi->layer());
}

void ProgressPrinter::PrintStarted(const topiary::v1::RunStarted& s) {
  const std::string val =
      s.validation_images() > 0 ? absl::StrFormat(" / %d validation", s.validation_images()) : "";
  absl::FPrintF(out_, "%s: %s on %s (%d train%s / %d test images), %d parameters, %s\n", s.name(),
                s.model_arch(), s.dataset(), s.train_images(), val, s.test_images(), s.parameters(),
                s.device());
  if (!s.energy().empty()) absl::FPrintF(out_, "energy: %s\n", s.energy());
  if (!s.image_decoder().empty()) {
    absl::FPrintF(out_, "images streamed from data.path, decoded by %s\n", s.image_decoder());
  }
  if (s.skipped_images() > 0) {
    absl::FPrintF(out_, "skipped %d bad image files (data.image_folder.bad_images: SKIP), e.g.\n",
                  s.skipped_images());
    for (const std::string& why : s.skipped_examples()) absl::FPrintF(out_, "  %s\n", why);
  }
  if (s.has_gradient_sampling()) {
    const auto& g = s.gradient_sampling();
    absl::FPrintF(out_, "sampled weight gradients in %d conv layers (top_k %d, %s scale), %s\n",
                  g.layers_size(), g.top_k(),
                  absl::AsciiStrToLower(topiary::v1::GradientSamplingSpec::Scale_Name(g.scale())),
                  g.policy());
  }
}

// Planning comes before the first step; on a terminal it redraws one line, as the bar.
void ProgressPrinter::PrintPlanning(const topiary::v1::Planning& p) {
  if (!p.done() && !tty_) return;
  const std::string line = absl::StrFormat(
      "planning %s: %d/%d layers, convolutions: %d cached, %d measured%s  %s", p.network(),
      p.layers_done(), p.layers_total(), p.convolutions_cached(), p.convolutions_measured(),
      p.convolutions_untimed() ? absl::StrFormat(", %d untimed", p.convolutions_untimed()) : "",
      FormatDuration(p.seconds()));
  if (!p.done()) {
    absl::FPrintF(out_, "\r\033[K%s", line);
    bar_open_ = true;
    return;
  }
  if (bar_open_) absl::FPrintF(out_, "\r\033[K");
  bar_open_ = false;
  absl::FPrintF(out_, "%s, %s\n", line, HumanBytes(p.planned_bytes()));
  for (const std::string& n : p.cache_notes()) absl::FPrintF(out_, "plan cache: %s\n", n);
}

void ProgressPrinter::PrintProgress(const topiary::v1::Progress& p) {
  const double frac =
      p.images_total() ? static_cast<double>(p.images_done()) / p.images_total() : 0;
  constexpr int kWidth = 28;
  const int filled = static_cast<int>(frac * kWidth);
  const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
  absl::FPrintF(
      out_,
      "\r\033[K%sepoch %d/%d [%s] %3.0f%%  %6.0f img/s  loss %.4f  top-1 %.1f%%  lr %.4g  "
      "ETA %s",
      PhasePrefix(p.training_phase()), p.epoch(), p.epochs(), bar, 100 * frac, p.images_per_s(),
      p.loss(), 100 * p.top1(), p.lr(), FormatDuration(p.eta_s()));
  bar_open_ = true;
}

void ProgressPrinter::PrintEpoch(const topiary::v1::EpochSummary& ep) {
  if (bar_open_) absl::FPrintF(out_, "\r\033[K");
  bar_open_ = false;
  absl::FPrintF(out_, "%sepoch %d: train loss %.4f top-1 %.2f%%  %.0f img/s  %s",
                PhasePrefix(ep.training_phase()), ep.epoch(), ep.train_loss(),
                100 * ep.train_top1(), ep.images_per_s(), FormatDuration(ep.seconds()));
  if (ep.evaluated() && ep.val_loss() > 0) {
    absl::FPrintF(out_, "  | val loss %.4f top-1 %.2f%%", ep.val_loss(), 100 * ep.val_top1());
  } else if (ep.evaluated()) {
    absl::FPrintF(out_, "  | test loss %.4f top-1 %.2f%% top-5 %.2f%%", ep.test_loss(),
                  100 * ep.test_top1(), 100 * ep.test_top5());
  }
  if (ep.train_joules_per_image() > 0) {
    absl::FPrintF(out_, "  | %.3f J/train image", ep.train_joules_per_image());
    if (ep.test_joules_per_image() > 0) {
      absl::FPrintF(out_, ", %.4f J/test image", ep.test_joules_per_image());
    }
  }
  absl::FPrintF(out_, "\n");
}

void ProgressPrinter::PrintState(const topiary::v1::StateChanged& st) {
  if (bar_open_) absl::FPrintF(out_, "\r\033[K");
  bar_open_ = false;
  absl::FPrintF(out_, "state: %s%s%s\n", topiary::v1::ExperimentState_Name(st.state()),
                st.reason().empty() ? "" : " - ", st.reason());
  if (st.state() == topiary::v1::WAITING_FOR_ROUND) {
    absl::FPrintF(out_,
                  "  waiting: `topiary round ID [--target X] [--step F] [--epochs N]` starts "
                  "the next round, `topiary round ID --finish` ends the rounds here, "
                  "`topiary cancel ID` ends the experiment\n");
  }
}

void ProgressPrinter::PrintRound(const topiary::v1::RoundSummary& r) {
  if (bar_open_) absl::FPrintF(out_, "\r\033[K");
  bar_open_ = false;
  const HeldOut h = HeldOutOf(r);
  if (r.round() == 0) {
    // A fork of a pruned checkpoint starts from that model, not from a dense one.
    const std::string model =
        r.sparsity() > 0 ? absl::StrFormat("starting model (sparsity %.1f%%)", 100 * r.sparsity())
                         : std::string("dense model");
    // With a validation set, round 0 also reports the test set (the accuracy drop's base).
    const std::string test = h.set == std::string("val") && r.test_loss() > 0
                                 ? absl::StrFormat("; test top-1 %.2f%%", 100 * r.test_top1())
                                 : "";
    absl::FPrintF(out_, "%s: %s top-1 %.2f%%, loss %.4f%s\n", model, h.set, 100 * h.top1, h.loss,
                  test);
  } else if (r.channel_groups_size() > 0) {
    // Channel pruning: the network is smaller, not sparser.
    int narrowed = 0;
    for (const auto& g : r.channel_groups()) narrowed += g.after() < g.before();
    absl::FPrintF(out_,
                  "round %d: %d multiply-adds, %d parameters (%d of %d channel groups "
                  "narrowed)  %s top-1 %.2f%% loss %.4f  %s\n",
                  r.round(), r.multiply_adds(), r.parameters(), narrowed, r.channel_groups_size(),
                  h.set, 100 * h.top1, h.loss, FormatDuration(r.seconds()));
  } else {
    absl::FPrintF(out_,
                  "round %d: sparsity %.1f%% (%d of %d layers at target)  %s top-1 %.2f%% "
                  "loss %.4f  %s\n",
                  r.round(), 100 * r.sparsity(), r.layers_at_target(), r.layers_pruned(), h.set,
                  100 * h.top1, h.loss, FormatDuration(r.seconds()));
  }
  if (r.round() == 1) {
    for (const std::string& why : r.dense_layers()) absl::FPrintF(out_, "  left dense: %s\n", why);
    for (const auto& l : r.layers()) {
      if (l.requested_units() > l.target_units()) {
        absl::FPrintF(out_,
                      "  %s: the target asks %d of %d blocks zero; the column cap and the "
                      "no-empty-row rule allow %d, its effective target\n",
                      l.layer(), l.requested_units(), l.units(), l.target_units());
      }
    }
  }
  if (!r.checkpoint().empty()) absl::FPrintF(out_, "  checkpoint %s\n", r.checkpoint());
}

void ProgressPrinter::PrintSummary(const topiary::v1::RunSummary& s) {
  if (bar_open_) absl::FPrintF(out_, "\n");
  bar_open_ = false;
  if (s.state() == topiary::v1::PAUSED) {
    // A pause has no error to show: say where the run stopped and how it goes on.
    absl::FPrintF(out_,
                  "PAUSED after %d epochs; it resumes from %s (`topiary resume ID`, or "
                  "`topiary run SPEC --resume CKPT`)\n",
                  s.epochs(), s.checkpoint().empty() ? "its last checkpoint" : s.checkpoint());
  } else if (s.state() == topiary::v1::CANCELLED) {
    absl::FPrintF(out_, "CANCELLED after %d epochs%s%s\n", s.epochs(),
                  s.checkpoint().empty() ? "" : "; last checkpoint ", s.checkpoint());
  } else if (s.state() != topiary::v1::SUCCEEDED) {
    absl::FPrintF(out_, "%s: %s\n", topiary::v1::ExperimentState_Name(s.state()), s.error());
  } else {
    absl::FPrintF(out_,
                  "%s: test top-1 %.2f%%, top-5 %.2f%%, loss %.4f after %d epochs in %s on %s "
                  "(%.0f train img/s)\n",
                  topiary::v1::ExperimentState_Name(s.state()), 100 * s.test_top1(),
                  100 * s.test_top5(), s.test_loss(), s.epochs(), FormatDuration(s.seconds()),
                  s.device(), s.train_images_per_s());
    if (s.val_loss() > 0) {
      absl::FPrintF(out_, "  validation top-1 %.2f%%, loss %.4f (the held-out training images)\n",
                    100 * s.val_top1(), s.val_loss());
    }
  }
  if (s.conv_input_sparsity_size() > 0) PrintInputSparsity(out_, s.conv_input_sparsity());
  if (s.train_joules_per_image() > 0) {
    absl::FPrintF(out_, "energy: %.3f J per training image, %.4f J per test image\n",
                  s.train_joules_per_image(), s.test_joules_per_image());
  }
  if (s.has_gradient_sampling()) {
    absl::FPrintF(out_, "weight gradients sampled on %d steps, exact on %d\n",
                  s.gradient_sampling().sampled_steps(), s.gradient_sampling().exact_steps());
  }
  if (s.rounds_size() > 1) PrintRoundTable(out_, s);
  if (!s.target_note().empty()) absl::FPrintF(out_, "note: %s\n", s.target_note());
  if (!s.out_dir().empty()) absl::FPrintF(out_, "outputs: %s\n", s.out_dir());
}

void ProgressPrinter::Print(const topiary::v1::Event& event) {
  topiary::v1::Event e = event;  // its names and messages came from files and the daemon
  MakePrintable(&e);
  if (e.has_started()) {
    PrintStarted(e.started());
  } else if (e.has_planning()) {
    PrintPlanning(e.planning());
  } else if (e.has_progress() && tty_) {
    PrintProgress(e.progress());
  } else if (e.has_epoch()) {
    PrintEpoch(e.epoch());
  } else if (e.has_state()) {
    PrintState(e.state());
  } else if (e.has_round()) {
    PrintRound(e.round());
  } else if (e.has_summary()) {
    PrintSummary(e.summary());
  }
  std::fflush(out_);
}

}  // namespace topiary
