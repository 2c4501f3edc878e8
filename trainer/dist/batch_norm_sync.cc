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

  // The collective averages floats: each rank's sums travel as floats (7 significant digits,
  // the precision of the activations they sum) and come back as doubles.
  absl::Status MeanOverRanks(double* sums, int n) override {
    if (static_cast<size_t>(n) > buffer_.size()) {
      return absl::InternalError("synchronized batch norm: more channels than planned");
    }
    for (int i = 0; i < n; ++i) buffer_[i] = static_cast<float>(sums[i]);
    TOPIARY_RETURN_IF_ERROR(collective_->AllReduceMean(rank_, buffer_.data(), n));
    for (int i = 0; i < n; ++i) sums[i] = buffer_[i];
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
  const size_t floats = 2 * channels;  // two sums per channel
  TOPIARY_RETURN_IF_ERROR(collective->Reserve(rank, floats));
  return std::unique_ptr<kernels::BatchNormSync>(
      new CollectiveBatchNormSync(collective, rank, floats));
}

}  // namespace topiary
