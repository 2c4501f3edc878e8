// A convolution's training forward pass when one batch norm alone reads its output
// (Network::Plan pairs them in bf16 GPU training networks): either cuDNN's convolution, after
// which the batch norm reads y once more for its statistics, or Topiary's Hopper implicit GEMM
// writing y and the batch norm's moments of y from its epilogue (kernels/sparse/hopper_conv.h),
// which the batch norm merges instead (kernels::BatchNormMoments). The batch norm's apply pass
// is the same either way.
//
// Chosen by measurement, on the first eager training call: both routes up to the batch
// norm's statistics, on the call's own operands, timed as captured graphs (the Hopper kernel
// in each of its configurations). A call during capture before that runs cuDNN's route,
// which is always correct. TOPIARY_CONV_MOMENTS=on forces the Hopper route untimed (tests,
// comparisons); =off, PlanOptions::fuse_batch_norm_moments false or a deterministic plan
// (the choice depends on timings) leave every pair to cuDNN's route.
#ifndef TOPIARY_TRAINER_NN_MOMENTS_DISPATCH_H_
#define TOPIARY_TRAINER_NN_MOMENTS_DISPATCH_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/conv/conv.h"
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/sparse/block_sparse_conv.h"
#include "trainer/core/device.h"

namespace topiary {

class MomentsDispatch {
 public:
  // For the convolution `layer` of this shape (bf16, without a bias) on `device`; null when
  // the moments route is off (see above) or no Hopper configuration takes the shape (not an
  // sm_90 GPU, channels not multiples of 8, ...).
  static absl::StatusOr<std::unique_ptr<MomentsDispatch>> Create(const std::string& layer,
                                                                 const kernels::ConvShape& shape,
                                                                 bool deterministic,
                                                                 Device* device);
  // The workspace the timing needs (the batch norm's, for its statistics pass).
  static size_t WorkspaceBytes(const kernels::ConvShape& shape);

  // The forward pass y = conv(x, w) by the measured route. Returns true when it ran the
  // Hopper route and filled *moments (its partial sums and slice count); false: the caller
  // runs `dense` (cuDNN) and *moments is left as it was.
  absl::StatusOr<bool> Run(const void* x, const void* w, void* y, void* workspace,
                           kernels::BatchNormMoments* moments,
                           const std::function<absl::Status()>& dense,
                           const kernels::CudaContext& ctx);

  // The moments' buffer, [3][slices][K] floats with room for slices() slices: the most any
  // Hopper configuration of the shape writes, so a block-masked layer's block-sparse forward
  // (sparse_dispatch.h) writes its moments here too.
  float* part() const { return part_.data(); }
  int slices() const { return static_cast<int>(part_.size() / (3 * shape_.k)); }

  // Times `conv` (writing y, and the moments where *moments says) followed by the batch norm's
  // statistics (merging *moments, or a pass over y when it is null), as a captured graph: how
  // Run compares its routes, and how a block-masked layer's block-sparse forward is compared
  // with the measured route (sparse_dispatch.h).
  absl::StatusOr<float> TimeWithStatistics(const std::function<absl::Status()>& conv, const void* y,
                                           const kernels::BatchNormMoments* moments,
                                           void* workspace, const kernels::CudaContext& ctx) const;
  // The measured route's time with the statistics (ms); negative until Run has measured, and
  // when the route is forced.
  float route_ms() const { return measured_ ? (chosen_ ? fused_ms_ : unfused_ms_) : -1; }

  // For the plan report: "forward with its batch norm's moments: wgmma 128x128x64 pingpong
  // (0.0858 ms with the statistics, against cuDNN + the statistics pass 0.1078 ms)", or that
  // it is not measured yet.
  std::string Describe() const;

 private:
  MomentsDispatch() = default;
  // The batch norm's statistics of y into throwaway outputs: what the timing runs after each
  // route's convolution (moments null: the statistics pass reads y).
  absl::Status Statistics(const void* y, const kernels::BatchNormMoments* moments, void* workspace,
                          const kernels::CudaContext& ctx) const;

  std::string layer_;
  kernels::ConvShape shape_;
  bool forced_ = false;
  std::unique_ptr<kernels::BlockSparseConvCuda> plan_;  // one block, kept: a dense convolution
  Buffer<float> part_;                                  // the moments, [3][slices()][K]
  Buffer<float> scratch_;  // the timing's batch-norm parameters and outputs, [8][K]
  bool measured_ = false, chosen_ = false;
  float fused_ms_ = -1, unfused_ms_ = -1;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_MOMENTS_DISPATCH_H_
