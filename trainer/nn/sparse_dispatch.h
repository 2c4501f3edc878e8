// Dispatch by measurement between a convolution's dense cuDNN plan and the block-sparse kernels
// (kernels/sparse/block_sparse_conv.h), per pass, for a layer whose kernel has a block mask.
//
// The block lists are packed when the dispatch first sees a mask version (a prune step or a
// checkpoint load installs a new one), on the first eager call after it: the forward and
// backward-data passes then time both sides on the call's own operands (their outputs are
// overwritten by the pass that follows) and keep the faster. The filter gradient runs dense
// unless forced: its only block-sparse kernel is the plain one, which loses everywhere. Captured
// CUDA graphs record whichever side was chosen; the runner captures anew after every prune step,
// after an eager step. A call made during capture with a mask the dispatch has not seen runs dense:
// dense is correct for every mask (masked weights are zero), so a stale plan can cost speed, never
// results.
//
// Off on the CPU, for deterministic plans (the choice depends on timings, and the two sides
// round differently), and in mode off (PlanOptions::block_sparse, or TOPIARY_SPARSE_CONV=off);
// mode on runs every pass of every block-masked convolution with the block-sparse kernels,
// untimed (deterministic plans included: the kernels use no atomics), for tests and
// comparisons.
#ifndef TOPIARY_TRAINER_NN_SPARSE_DISPATCH_H_
#define TOPIARY_TRAINER_NN_SPARSE_DISPATCH_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/conv/conv.h"
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/sparse/block_sparse_conv.h"
#include "trainer/core/parameter.h"
#include "trainer/nn/layer.h"
#include "trainer/nn/moments_dispatch.h"

namespace topiary {

class SparseConvDispatch {
 public:
  // A training forward pass whose output one batch norm alone reads (which then merges the
  // moments of y instead of reading y for its statistics): the layer's moments route
  // (moments_dispatch.h), whose buffer (`route->part()`) a block-sparse forward writes the
  // moments into, whose measured route (cuDNN then the statistics pass, or Hopper's dense
  // convolution writing the moments) the block-sparse forward is timed against with the
  // statistics included, and which runs the pass where the block-sparse side loses; the
  // workspace that timing needs (MomentsDispatch::WorkspaceBytes) and the summary to fill.
  struct MomentsRequest {
    MomentsDispatch* route = nullptr;
    void* workspace = nullptr;
    kernels::BatchNormMoments* moments = nullptr;
  };

  // For a layer named `layer` of this shape and element type; mode kOn runs every pass
  // block-sparse, untimed.
  SparseConvDispatch(std::string layer, kernels::ConvShape shape, kernels::DType dtype,
                     BlockSparseMode mode);

  // Runs pass `pass` with the block-sparse kernels if that is the measured choice for the
  // kernel's current mask, and returns whether it did (false: the caller runs `dense`).
  // `dense` runs the pass with cuDNN's plan (used here only to time it); operands as
  // BlockSparseConvCuda::Tune's; bias is the forward pass's bias and dbias the filter
  // gradient's (either may be null). With a MomentsRequest (forward, no bias) and a
  // block-sparse configuration that writes the moments (Hopper's), the forward is timed with
  // the batch norm's statistics against the request's route, and whichever of the two runs
  // writes the moments where it can (filling *request->moments; otherwise that is left as it
  // was). Returns true when it ran the pass.
  absl::StatusOr<bool> Run(kernels::SparsePass pass, const Parameter& kernel, const void* in0,
                           const void* in1, void* out, const float* bias, float* dbias,
                           const std::function<absl::Status()>& dense,
                           const kernels::CudaContext& ctx,
                           const MomentsRequest* request = nullptr);

  const SparseConvChoice& choice() const { return choice_; }
  // Whether the last block-sparse forward wrote the batch norm's moments (a MomentsRequest).
  bool wrote_moments() const { return wrote_moments_; }

 private:
  // Packs the block lists of the kernel's current mask (or drops them: no block mask).
  absl::Status Replan(const Parameter& kernel, const kernels::CudaContext& ctx);
  // Chooses the side of pass `pass` for the current plan, on the call's operands (Run's; its
  // outputs are overwritten by the run that follows): mode kOn forces block-sparse untimed;
  // otherwise the block-sparse configurations are tuned and the chosen one timed against the
  // dense side, with the batch norm's statistics where the request asks for them.
  absl::Status Measure(kernels::SparsePass pass, const void* in0, const void* in1, void* out,
                       const float* bias, float* dbias, const std::function<absl::Status()>& dense,
                       const kernels::CudaContext& ctx, const MomentsRequest* request);
  // The planned block-sparse pass; `moments` (forward only, or null) receives the batch norm's
  // moments of y.
  absl::Status RunSparse(kernels::SparsePass pass, const void* in0, const void* in1, void* out,
                         const float* bias, float* dbias, float* moments,
                         const kernels::CudaContext& ctx);
  // The slices of the moments the planned forward writes into the request's buffer (0: none).
  int MomentSlices(const MomentsRequest& request, const kernels::CudaContext& ctx) const;

  std::string layer_;
  kernels::ConvShape shape_;
  kernels::DType dtype_;
  BlockSparseMode mode_;
  uint64_t version_ = 0;  // the mask version planned for (0: none yet)
  std::unique_ptr<kernels::BlockSparseConvCuda> plan_;
  bool measured_[3] = {false, false, false};
  SparseConvChoice choice_;
  bool wrote_moments_ = false;
};

// The mode a network planned with `planned` uses: TOPIARY_SPARSE_CONV=on|off when set, else
// `planned`.
BlockSparseMode EffectiveSparseMode(BlockSparseMode planned);

// Whether convolutions may dispatch to the block-sparse kernels at all (see above).
bool SparseDispatchEnabled(bool gpu, bool deterministic, BlockSparseMode mode);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_SPARSE_DISPATCH_H_
