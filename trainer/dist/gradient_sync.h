// GradientSync: one rank's share of data-parallel gradient averaging. The model's trainable
// parameters are grouped into buckets in the order the backward pass finishes them (the
// last layers first; the first bucket small, so communication starts early, the rest about
// 25 MiB, as PyTorch DDP's). When the backward pass has written a bucket's last gradient,
// the bucket is gathered into one flat fp32 array (widening bf16 gradients on the way),
// averaged across the ranks, and scattered back into each parameter's grad, on the
// collective's side stream while the backward pass goes on. Finish makes the rank's stream
// wait for the last bucket, so the optimizer step reads averaged gradients.
#ifndef TOPIARY_TRAINER_DIST_GRADIENT_SYNC_H_
#define TOPIARY_TRAINER_DIST_GRADIENT_SYNC_H_

#include <memory>
#include <vector>

#include "kernels/elementwise/elementwise.h"
#include "trainer/dist/collective.h"
#include "trainer/nn/model.h"

namespace topiary {

class GradientSync : public GradientReducer {
 public:
  static constexpr size_t kFirstBucketBytes = size_t{1} << 20;
  static constexpr size_t kBucketBytes = size_t{25} << 20;

  // bf16: the network computes bf16 gradients (Parameter::grad_bf16, where present).
  // REQUIRES: the model's parameters and the collective outlive the result; every rank's
  // model has the same architecture (so every rank makes the same buckets).
  static absl::StatusOr<std::unique_ptr<GradientSync>> Create(Model* model, Collective* collective,
                                                              int rank, bool bf16);

  absl::Status LayerDone(int node) override;
  absl::Status Finish() override;

  int buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    int last_node = 0;  // the node whose backward pass writes the bucket's last gradient
    size_t floats = 0;
    Buffer<float> flat;
    // Gradient -> flat (widening bf16 ones), flat -> fp32 gradient. GPU: device tables.
    std::vector<kernels::CastItem> gather_bf16, gather_f32, scatter;
    Buffer<kernels::CastItem> gather_bf16_dev, gather_f32_dev, scatter_dev;
  };
  GradientSync(Collective* collective, int rank) : collective_(collective), rank_(rank) {}
  absl::Status Reduce(Bucket& b);

  Collective* collective_;
  int rank_;
  std::vector<Bucket> buckets_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DIST_GRADIENT_SYNC_H_
