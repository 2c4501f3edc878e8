// The end of a residual block in one pass each way (GPU): y = relu(bn_a(a) + bn_b(b)), where
// bn_b is a batch norm (a projection shortcut) or the identity, and the ReLU is optional.
//
// Unfused, the batch norms write their outputs, the add reads them back, and its backward
// writes the same gradient twice for the batch norms to read twice each. Here the batch
// norms are folded (their statistics, scale and shift come from BatchNormForwardTrainCuda
// without an output, or at inference BatchNormFoldEvalCuda: batch_norm.h), the
// forward pass reads a and b once and writes y, and the backward pass computes the masked
// gradient g once, with both batch norms' gradient sums in the same pass, then applies them.
// Statistics stay deterministic and synchronizable as in batch_norm.h.
#ifndef TOPIARY_KERNELS_NORM_POOL_RESIDUAL_TAIL_H_
#define TOPIARY_KERNELS_NORM_POOL_RESIDUAL_TAIL_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/runtime/dtype.h"

namespace topiary::kernels {

struct CudaContext;

// One input of the tail and the batch norm folded into it.
struct FoldedBatchNorm {
  const void* x = nullptr;  // the batch norm's input [M, C] (with no batch norm: the input)
  // [2][C], y = x * scale + shift (batch_norm.h's save_scale_shift); null: no batch norm
  // (the identity).
  const float* scale_shift = nullptr;
  // Backward only: the batch norm's gamma and saved statistics, and its gradients (dx
  // overwritten, dgamma and dbeta this rank's sums, as BatchNormBackwardCuda writes them).
  const float* gamma = nullptr;
  const float* save_mean = nullptr;
  const float* save_inv_std = nullptr;
  void* dx = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  bool identity() const { return scale_shift == nullptr; }
};

struct ResidualTailShape {
  int64_t m = 0;  // rows: N*H*W
  int c = 0;      // channels
  bool relu = true;
};

// Whether the fused kernels take C channels of type t: whole 16-byte vectors per row, at most
// 256 of them (bf16: C % 8 == 0 and C <= 2048; fp32: C % 4 == 0 and C <= 1024). Otherwise the
// network runs the batch norms and the add unfused.
bool ResidualTailFusableCuda(DType t, int c);
size_t ResidualTailWorkspaceFloatsCuda(const ResidualTailShape& sh, int sync_ranks = 1);

// y = act(bn_a(a.x) + bn_b(b.x)). REQUIRES: a is a batch norm; every pointer 16-byte aligned.
absl::Status ResidualTailForwardCuda(DType t, const ResidualTailShape& sh, const FoldedBatchNorm& a,
                                     const FoldedBatchNorm& b, void* y, const CudaContext& ctx);

// Backward from dy (plus dy2, the gradient of y's other reader, when not null): writes
// g = (dy + dy2) masked by y > 0 (with the ReLU) to `g` (with an identity b, g is b's input
// gradient), and each batch norm's dx, dgamma and dbeta. With `sync`, the global batch's
// gradient means, as BatchNormBackwardCuda. g must not alias dy or dy2.
absl::Status ResidualTailBackwardCuda(DType t, const ResidualTailShape& sh, const void* y,
                                      const void* dy, const void* dy2, const FoldedBatchNorm& a,
                                      const FoldedBatchNorm& b, void* g, float* workspace,
                                      const CudaContext& ctx, BatchNormSync* sync = nullptr);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_NORM_POOL_RESIDUAL_TAIL_H_
