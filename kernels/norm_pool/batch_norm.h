// Batch normalization over NHWC activations viewed as [M, C] (M = N*H*W): statistics per
// channel, optionally fused with the ReLU that follows it (one pass over memory instead of
// two, forward and backward: these layers are memory-bound on the CPU). Semantics follow PyTorch's
// BatchNorm2d: biased variance for normalization, unbiased variance in the running average, running
// = (1 - momentum)*running + momentum*batch.
#ifndef TOPIARY_KERNELS_NORM_POOL_BATCH_NORM_H_
#define TOPIARY_KERNELS_NORM_POOL_BATCH_NORM_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/runtime/dtype.h"

namespace topiary::kernels {

struct CudaContext;

// Synchronized batch norm (data parallelism): every rank normalizes with the statistics of the
// global batch. The CPU functions below hand each pass's per-channel sums to SumOverRanks and
// use the global figures; the CUDA functions gather every rank's per-channel moments (forward)
// and sums (backward) in device memory and merge them in rank order. Every rank holds the same
// number of rows and calls them in the same order. Errors (another rank failed) come back from
// the functions.
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  virtual int ranks() const = 0;
  // sums[0, n), this rank's, become the sums over the ranks of every rank's sums[0, n),
  // added in rank order in double: the same bits on every rank. (CPU ranks.)
  virtual absl::Status SumOverRanks(double* sums, int n) = 0;
  // Every rank's data[0, n) into all[r * n, (r + 1) * n): bits whole (the CUDA functions pass
  // doubles as float pairs). GPU ranks: device memory, enqueued on the rank's stream, so a
  // captured step captures it.
  virtual absl::Status Gather(const float* data, size_t n, float* all) = 0;
};

struct BatchNormShape {
  int64_t m = 0;  // rows: N*H*W
  int c = 0;      // channels
  float eps = 1e-5f;
  float momentum = 0.1f;
  bool relu = false;  // y = max(0, bn(x)); the backward pass then needs y
};

// Floats of scratch memory the CPU functions below need (planned, so a training step
// allocates nothing; depends on CpuThreads()).
size_t BatchNormWorkspaceFloatsCpu(const BatchNormShape& sh);

// Training forward: y = (x - mean) * inv_std * gamma + beta with the batch's statistics (with
// `sync`, the global batch's: m rows on each of sync->ranks() ranks). Writes save_mean and
// save_inv_std [C] for the backward pass and updates the running stats.
// REQUIRES: m >= 2; workspace holds BatchNormWorkspaceFloatsCpu(sh) floats.
absl::Status BatchNormForwardTrainCpu(const BatchNormShape& sh, const float* x, const float* gamma,
                                      const float* beta, float* running_mean, float* running_var,
                                      float* save_mean, float* save_inv_std, float* y,
                                      float* workspace, BatchNormSync* sync = nullptr);

// Inference forward with the running statistics.
void BatchNormForwardEvalCpu(const BatchNormShape& sh, const float* x, const float* gamma,
                             const float* beta, const float* running_mean, const float* running_var,
                             float* y, float* workspace);

// Backward of the training forward: overwrites dx [M, C], dgamma and dbeta [C]. With relu,
// y is the forward output and dy is first masked by y > 0; otherwise y may be null. With
// `sync` (as in the forward pass), dx uses the global batch's means of dy and dy * xhat;
// dgamma and dbeta stay this rank's sums (the gradient averaging combines them).
absl::Status BatchNormBackwardCpu(const BatchNormShape& sh, const float* x, const float* y,
                                  const float* dy, const float* gamma, const float* save_mean,
                                  const float* save_inv_std, float* dx, float* dgamma, float* dbeta,
                                  float* workspace, BatchNormSync* sync = nullptr);

// CUDA twins. Statistics are reduced without atomics (per-slice partials merged in a fixed
// order), so results are deterministic. workspace holds BatchNormWorkspaceFloatsCuda floats,
// with room for the moments of `sync_ranks` ranks when synchronized. x, y, dy and dx are of
// type t (fp32 or bf16); statistics, parameters and their gradients are fp32. With `sync`
// (sync->ranks() <= sync_ranks), as on the CPU: the global batch's statistics, this rank's
// dgamma and dbeta. The training forward pass also keeps the normalization's scale and shift
// (y = x * scale + shift, [2][C]) in save_scale_shift (may be null without the ReLU); with
// the ReLU the backward pass takes its mask from x and them, the same bits as y > 0, instead
// of reading y (two passes over memory fewer). With y null the forward pass writes no output.
//
// With `moments`, the pass that wrote x has already reduced it (a convolution's epilogue,
// kernels/sparse/hopper_conv.h): the training forward pass merges those slices instead of
// reading x for its statistics, and reads x only to apply them (not at all with y null).
size_t BatchNormWorkspaceFloatsCuda(const BatchNormShape& sh, int sync_ranks = 1);
constexpr int kBatchNormMaxMomentSlices = 512;
struct BatchNormMoments {
  // [3][slices][C] floats in device memory: per slice of x's rows and channel, the count,
  // mean and M2 (sum of squared deviations from the mean) of the values as stored in x. A
  // slice may hold count 0 (then its mean and M2 are ignored); the counts add up to sh.m.
  const float* part = nullptr;
  int slices = 0;  // 1 .. kBatchNormMaxMomentSlices
};
absl::Status BatchNormForwardTrainCuda(DType t, const BatchNormShape& sh, const void* x,
                                       const float* gamma, const float* beta, float* running_mean,
                                       float* running_var, float* save_mean, float* save_inv_std,
                                       float* save_scale_shift, void* y, float* workspace,
                                       const CudaContext& ctx, BatchNormSync* sync = nullptr,
                                       const BatchNormMoments* moments = nullptr);
absl::Status BatchNormForwardEvalCuda(DType t, const BatchNormShape& sh, const void* x,
                                      const float* gamma, const float* beta,
                                      const float* running_mean, const float* running_var, void* y,
                                      const CudaContext& ctx);
absl::Status BatchNormBackwardCuda(DType t, const BatchNormShape& sh, const void* x, const void* dy,
                                   const float* gamma, const float* save_mean,
                                   const float* save_inv_std, const float* save_scale_shift,
                                   void* dx, float* dgamma, float* dbeta, float* workspace,
                                   const CudaContext& ctx, BatchNormSync* sync = nullptr);

// A batch norm folded into the pass that reads its output (the residual tail,
// residual_tail.h) runs BatchNormForwardTrainCuda with y null (the statistics, the running
// statistics and save_scale_shift only) and, at inference, this: save_scale_shift from the
// running statistics.
absl::Status BatchNormFoldEvalCuda(const BatchNormShape& sh, const float* gamma, const float* beta,
                                   const float* running_mean, const float* running_var,
                                   float* scale_shift, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_NORM_POOL_BATCH_NORM_H_
