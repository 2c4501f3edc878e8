#include "trainer/store/checkpoint_report.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "trainer/store/checkpoint.h"
#include "trainer/store/checkpoint_schema.h"
#include "trainer/util/glob.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

using topiary::v1::CheckpointReport;
using topiary::v1::LayerReport;

constexpr int kTile = 8;

// Whether weight i of a kernel [K, C, taps] is kept by `mask` (block grid or element mask).
struct MaskView {
  const H5Dataset* mask = nullptr;
  bool block = false;
  int64_t bi = 1, bo = 1, cols = 1;
  bool kept(int64_t k, int64_t c, size_t i) const {
    if (mask == nullptr) return true;
    if (block) return mask->u8[(c / bi) * cols + k / bo] != 0;
    return mask->u8[i] != 0;
  }
};

void FillLayer(const H5Dataset& kernel, const H5Dataset* mask, bool one_layer, LayerReport* r) {
  for (int64_t d : kernel.shape) r->add_shape(d);
  const int64_t k_dim = kernel.shape[0], c_dim = kernel.shape.size() > 1 ? kernel.shape[1] : 1;
  const int64_t taps = static_cast<int64_t>(kernel.count()) / (k_dim * c_dim);
  MaskView view;
  view.mask = mask;
  if (mask != nullptr) {
    // The file's attribute names the kind (the schema check admitted only these three).
    const auto kind = MaskKindFromName(AttrString(mask->attrs, kMaskKindAttr));
    r->set_mask(kind == MaskInfo::Kind::kBlock     ? topiary::v1::MASK_BLOCK
                : kind == MaskInfo::Kind::kElement ? topiary::v1::MASK_ELEMENT
                : kind == MaskInfo::Kind::kNofM    ? topiary::v1::MASK_N_OF_M
                                                   : topiary::v1::MASK_NONE);
    view.block = r->mask() == topiary::v1::MASK_BLOCK;
    if (view.block) {
      view.bi = std::max<int64_t>(1, AttrInt(mask->attrs, kBlockInAttr, 1));
      view.bo = std::max<int64_t>(1, AttrInt(mask->attrs, kBlockOutAttr, 1));
      view.cols = mask->shape.size() == 2 ? mask->shape[1] : 1;
      r->set_block_in(static_cast<int32_t>(view.bi));
      r->set_block_out(static_cast<int32_t>(view.bo));
      r->set_block_rows(static_cast<int32_t>(mask->shape[0]));
      r->set_block_cols(static_cast<int32_t>(view.cols));
      for (int64_t row = 0; row < mask->shape[0]; ++row) {
        int kept = 0;
        for (int64_t c = 0; c < view.cols; ++c) kept += mask->u8[row * view.cols + c] != 0;
        r->add_row_occupancy(kept);
        r->set_blocks_kept(r->blocks_kept() + kept);
      }
      if (one_layer) {
        for (uint8_t v : mask->u8) r->add_block_grid(v != 0);
      }
    } else if (r->mask() == topiary::v1::MASK_N_OF_M) {
      r->set_n(static_cast<int32_t>(AttrInt(mask->attrs, kNAttr)));
      r->set_m(static_cast<int32_t>(AttrInt(mask->attrs, kMAttr)));
    }
  }
  const int64_t tile_rows = (c_dim + kTile - 1) / kTile, tile_cols = (k_dim + kTile - 1) / kTile;
  std::vector<double> tile_kept(tile_rows * tile_cols, 0), tile_all(tile_rows * tile_cols, 0);
  double sum = 0, sum_sq = 0, abs_max = 0, abs_nonzero = 0;
  int64_t zeros = 0;
  bool consistent = true;
  for (int64_t k = 0; k < k_dim; ++k) {
    for (int64_t c = 0; c < c_dim; ++c) {
      for (int64_t t = 0; t < taps; ++t) {
        const size_t i = (static_cast<size_t>(k) * c_dim + c) * taps + t;
        const double w = kernel.f32[i];
        sum += w;
        sum_sq += w * w;
        abs_max = std::max(abs_max, std::fabs(w));
        if (w == 0) {
          ++zeros;
        } else {
          abs_nonzero += std::fabs(w);
        }
        const bool kept = view.kept(k, c, i);
        if (!kept && w != 0) consistent = false;
        const size_t tile = (c / kTile) * tile_cols + k / kTile;
        tile_kept[tile] += kept;
        tile_all[tile] += 1;
      }
    }
  }
  const double n = static_cast<double>(kernel.count());
  r->set_weights(static_cast<int64_t>(kernel.count()));
  r->set_zeros(zeros);
  r->set_sparsity(zeros / n);
  r->set_mask_consistent(consistent);
  auto* s = r->mutable_stats();
  s->set_mean(sum / n);
  s->set_std(std::sqrt(std::max(0.0, sum_sq / n - (sum / n) * (sum / n))));
  s->set_abs_max(abs_max);
  s->set_abs_mean_nonzero(zeros < n ? abs_nonzero / (n - zeros) : 0);
  if (one_layer && mask != nullptr && !view.block) {
    r->set_tile_rows(static_cast<int32_t>(tile_rows));
    r->set_tile_cols(static_cast<int32_t>(tile_cols));
    for (size_t t = 0; t < tile_kept.size(); ++t) r->add_tile_density(tile_kept[t] / tile_all[t]);
  }
}

// An approximate or sampled layer's group attributes, in the spec's terms. The document check
// has refused names outside the schema's tables, so each maps (absent: the default, which is
// what files before the attribute meant).
void DescribeLayerAttrs(const H5Attrs& attrs, LayerReport* r) {
  auto value = [&](const char* attr, auto& names, auto fallback) {
    return FirstOf(names, AttrString(attrs, attr)).value_or(fallback);
  };
  if (attrs.count(kMultiplierAttr)) {
    topiary::v1::LayerApproximation* a = r->mutable_approximation();
    a->set_multiplier(AttrString(attrs, kMultiplierAttr));
    a->set_multiplier_sha256(AttrString(attrs, kMultiplierSha256Attr));
    a->set_range(ToSpec(kSpecRanges, value(kActivationRangeAttr, kRangeNames,
                                           ConvApproximation::Range::kPerBatch)));
    a->set_weight_tuning(AttrInt(attrs, kWeightTuningAttr) != 0);
    a->set_weight_code(ToSpec(kSpecWeightCodes, value(kWeightCodeAttr, kWeightCodeNames,
                                                      kernels::WeightCode::kAsymmetric)));
    a->set_per_channel_weights(
        value(kWeightScalesAttr, kWeightScalesNames, kernels::WeightScales::kPerTensor) ==
        kernels::WeightScales::kPerChannel);
  }
  if (attrs.count(kWeightGradientAttr)) {
    topiary::v1::LayerGradientSampling* g = r->mutable_weight_gradient();
    g->set_top_k(static_cast<int32_t>(
        std::clamp<int64_t>(AttrInt(attrs, kWeightGradientTopKAttr), 0, INT32_MAX)));
    g->set_scale(ToSpec(kSpecScales, value(kWeightGradientScaleAttr, kSamplingScaleNames,
                                           GradientSampling::Scale::kUnbiased)));
  }
}

}  // namespace

absl::StatusOr<CheckpointReport> InspectCheckpoint(const std::string& path,
                                                   const std::string& layer_pattern) {
  TOPIARY_ASSIGN_OR_RETURN(const CheckpointFile file, OpenCheckpoint(path));
  const H5Document& doc = file.doc;
  const CheckpointState& state = file.state;
  CheckpointReport report;
  report.set_path(path);
  report.set_format_version(AttrInt(doc.groups.at(kRootGroup), kFormatVersionAttr));
  report.set_experiment_id(state.experiment_id);
  report.set_parent(state.parent);
  report.set_model_arch(state.model_arch);
  report.set_created_at(state.created_at);
  report.set_round(state.position.round);
  report.set_epoch(state.position.epoch);
  report.set_global_step(state.position.global_step());
  *report.mutable_metrics() = state.metrics;
  report.set_spec(state.spec_text);
  // Kernels: /layers/<layer>/kernel (datasets are sorted by path).
  std::vector<std::string> kernels;
  int64_t parameters = 0, weights = 0, zeros = 0;
  for (const auto& [name, d] : doc.datasets) {
    if (name.rfind(kLayersPrefix, 0) != 0) continue;
    // Trainable parameters, as a run counts them (batch-norm statistics are not).
    const auto role = ParamRoleFromName(name.substr(name.rfind('/') + 1));
    if (role == ParamRole::kKernel || role == ParamRole::kBias || role == ParamRole::kGamma ||
        role == ParamRole::kBeta) {
      parameters += static_cast<int64_t>(d.count());
    }
    const std::string suffix = absl::StrCat("/", ParamRoleName(ParamRole::kKernel));
    if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      const size_t prefix = std::strlen(kLayersPrefix);
      kernels.push_back(name.substr(prefix, name.size() - prefix - suffix.size()));
      for (float w : d.f32) zeros += w == 0.0f;
      weights += static_cast<int64_t>(d.count());
    }
  }
  // Model order when the file records it (layer_order), else by name. Each name's rank is
  // looked up once (a crafted file's long order list must not make this quadratic).
  std::unordered_map<std::string, size_t> rank;
  size_t next = 0;
  for (absl::string_view name : absl::StrSplit(
           AttrString(doc.groups.at(kRootGroup), kLayerOrderAttr), ',', absl::SkipEmpty())) {
    rank.emplace(std::string(name), next++);
  }
  auto rank_of = [&](const std::string& layer) {
    auto it = rank.find(layer);
    return it == rank.end() ? next : it->second;
  };
  std::vector<std::pair<size_t, std::string>> ranked;
  for (std::string& layer : kernels) ranked.emplace_back(rank_of(layer), std::move(layer));
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  kernels.clear();
  for (auto& [r, layer] : ranked) kernels.push_back(std::move(layer));
  report.set_parameters(parameters);
  report.set_sparsity(weights > 0 ? static_cast<double>(zeros) / weights : 0);
  std::vector<std::string> matched;
  for (const std::string& layer : kernels) {
    if (layer_pattern.empty() || GlobMatch(layer_pattern, layer)) matched.push_back(layer);
  }
  if (matched.empty()) {
    return absl::NotFoundError(absl::StrCat("--layer: '", layer_pattern, "' matches no layer of ",
                                            path, " (", kernels.size(), " conv/linear layers)"));
  }
  for (const std::string& layer : matched) {
    const std::string dir = kLayersPrefix + layer;
    auto dataset = [&](const char* role) {
      return doc.datasets.find(absl::StrCat(dir, "/", role));
    };
    const auto mask = dataset(kMaskRole);
    LayerReport* r = report.add_layers();
    r->set_layer(layer);
    if (state.network) {
      for (const auto& node : state.network->layers()) {
        if (node.name() == layer) r->set_original_out_channels(node.original_out_channels());
      }
    }
    r->set_has_bias(dataset(ParamRoleName(ParamRole::kBias)) != doc.datasets.end());
    if (auto g = doc.groups.find(dir); g != doc.groups.end()) {
      DescribeLayerAttrs(g->second, r);
    }
    if (auto range = dataset(ParamRoleName(ParamRole::kActivationRange));
        range != doc.datasets.end() && r->has_approximation()) {
      for (float v : range->second.f32) r->mutable_approximation()->add_activation_range(v);
    }
    FillLayer(dataset(ParamRoleName(ParamRole::kKernel))->second,
              mask == doc.datasets.end() ? nullptr : &mask->second, matched.size() == 1, r);
  }
  return report;
}

}  // namespace topiary
