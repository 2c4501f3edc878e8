#include "trainer/dist/batch_norm_sync.h"

#include <algorithm>
#include <vector>

#include "trainer/nn/layers.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

class CollectiveBatchNormSync : public kernels::BatchNormSync {
 public:
  CollectiveBatchNormSync(Collective* collective, int rank, size_t floats)
      : collective_(collective), rank_(rank), buffer_(floats) {}
  int ranks() const override { return collective_->ranks(); }

  // The sums are doubles, and the collective averages floats. Rounding each rank's sums to
  // float and averaging them in float lost the low digits of sums that nearly cancel (the
  // backward pass's sum of dy over a channel), which a single rank keeps in double: the
  // synchronized ranks drifted from one rank at 1e-6 per step. So each rank sends its sums
  // whole, as float pairs (hi + lo: 48 bits of mantissa), in its own slot of a buffer of
  // zeros: the average of x and zeros is x / ranks, exactly (ranks a power of two; otherwise
  // within a float rounding of lo). Every rank then adds the slots in rank order, in
  // double, the same bits everywhere.
  absl::Status MeanOverRanks(double* sums, int n) override {
    const int ranks = collective_->ranks();
    const size_t floats = static_cast<size_t>(ranks) * 2 * n;
    if (floats > buffer_.size()) {
      return absl::InternalError("synchronized batch norm: more channels than planned");
    }
    std::fill(buffer_.begin(), buffer_.begin() + floats, 0.0f);
    float* mine = buffer_.data() + static_cast<size_t>(rank_) * 2 * n;
    for (int i = 0; i < n; ++i) {
      mine[2 * i] = static_cast<float>(sums[i]);
      mine[2 * i + 1] = static_cast<float>(sums[i] - static_cast<double>(mine[2 * i]));
    }
    TOPIARY_RETURN_IF_ERROR(collective_->AllReduceMean(rank_, buffer_.data(), floats));
    for (int i = 0; i < n; ++i) {
      double total = 0;
      for (int r = 0; r < ranks; ++r) {
        const float* slot = buffer_.data() + static_cast<size_t>(r) * 2 * n;
        total +=
            static_cast<double>(slot[2 * i]) * ranks + static_cast<double>(slot[2 * i + 1]) * ranks;
      }
      sums[i] = total / ranks;
    }
    return absl::OkStatus();
  }

 private:
  Collective* collective_;
  int rank_;
  std::vector<float> buffer_;
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

absl::StatusOr<std::unique_ptr<kernels::BatchNormSync>> MakeBatchNormSync(Collective* collective,
                                                                          int rank,
                                                                          size_t channels) {
  // Two sums per channel, each a float pair, in every rank's slot.
  const size_t floats = static_cast<size_t>(collective->ranks()) * 2 * 2 * channels;
  TOPIARY_RETURN_IF_ERROR(collective->Reserve(rank, floats));
  return std::unique_ptr<kernels::BatchNormSync>(
      new CollectiveBatchNormSync(collective, rank, floats));
}

}  // namespace topiary
