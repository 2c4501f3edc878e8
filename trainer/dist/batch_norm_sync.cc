#include "trainer/dist/batch_norm_sync.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "trainer/nn/layers.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

class CollectiveBatchNormSync : public kernels::BatchNormSync {
 public:
  CollectiveBatchNormSync(Collective* collective, int rank, size_t channels)
      : collective_(collective),
        rank_(rank),
        mine_(2 * 2 * channels),
        all_(static_cast<size_t>(collective->ranks()) * mine_.size()) {}
  int ranks() const override { return collective_->ranks(); }

  // The sums are doubles and the collective moves floats: each sum travels whole, as a float
  // pair (hi, and lo = the rest: 48 bits of mantissa), gathered from every rank and added
  // here in rank order. (Averaged as single floats, the backward pass's nearly cancelling
  // sums of dy lost their low digits, which one rank keeps: two ranks drifted from one rank
  // holding the batch by 1e-6 of the loss per step.)
  absl::Status SumOverRanks(double* sums, int n) override {
    const size_t floats = 2 * static_cast<size_t>(n);
    if (floats > mine_.size()) {
      return absl::InternalError("synchronized batch norm: more channels than planned");
    }
    for (int i = 0; i < n; ++i) {
      mine_[2 * i] = static_cast<float>(sums[i]);
      mine_[2 * i + 1] = static_cast<float>(sums[i] - static_cast<double>(mine_[2 * i]));
    }
    TOPIARY_RETURN_IF_ERROR(Gather(mine_.data(), floats, all_.data()));
    for (int i = 0; i < n; ++i) {
      double total = 0;
      for (int r = 0; r < ranks(); ++r) {
        const float* pair = all_.data() + r * floats + 2 * i;
        total += static_cast<double>(pair[0]) + static_cast<double>(pair[1]);
      }
      sums[i] = total;
    }
    return absl::OkStatus();
  }

  absl::Status Gather(const float* data, size_t n, float* all) override {
    return collective_->AllGather(rank_, data, n, all);
  }

 private:
  Collective* collective_;
  int rank_;
  std::vector<float> mine_;  // this rank's pairs
  std::vector<float> all_;   // every rank's, in rank order
};

}  // namespace

size_t WidestBatchNorm(const Model& model) {
  size_t widest = 0;
  for (const Model::Node& node : model.nodes()) {
    if (node.layer->kind() != LayerKind::kBatchNorm) continue;
    widest = std::max(widest, static_cast<const BatchNorm2d*>(node.layer)->channels());
  }
  return widest;
}

std::unique_ptr<kernels::BatchNormSync> MakeBatchNormSync(Collective* collective, int rank,
                                                          size_t channels) {
  return std::make_unique<CollectiveBatchNormSync>(collective, rank, channels);
}

}  // namespace topiary
