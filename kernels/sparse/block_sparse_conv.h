// Block-sparse convolution: a convolution whose filter is zero outside a grid of kept
// (input-channel block, output-channel block) pairs, each block spanning every filter tap
// (the block masks of docs/algorithms.md §1). Only kept blocks are computed:
//
//   forward        y[p, k]  = sum over kept (row(c), col(k)) and taps of x[p @ tap, c] w[k, tap, c]
//   backward data  dx[q, c] = the same sum over the transposed structure (output blocks that
//                             keep c's row), gathered from dy at the positions that read q
//   backward filter dw[k, tap, c] for kept blocks only; every other entry is written 0
//
// The structure (which blocks are kept) is packed once, when a plan is made for a grid; the
// weights are read in place from the dense [K, R, S, C] filter, so an optimizer step needs no
// re-packing. The CPU functions are the reference; the CUDA plan has a bf16 tensor-core path
// (8x8 blocks, or blocks whose sides are multiples of 8, with C and K multiples of 8), on
// H100/H200 Hopper's wgmma kernels for blocks that their tiles align with (hopper_conv.h:
// forward and stride-1 backward data, 64- or 128-channel input blocks; backward filter,
// 128-channel output blocks), and a plain path for
// everything else (fp32, any block shape). Results equal the dense convolution with the
// masked filter up to float rounding.
#ifndef TOPIARY_KERNELS_SPARSE_BLOCK_SPARSE_CONV_H_
#define TOPIARY_KERNELS_SPARSE_BLOCK_SPARSE_CONV_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/dtype.h"
#include "kernels/sparse/block_grid.h"

namespace topiary::kernels {

struct CudaContext;

// OK when the grid's dimensions match the shape's channels and every entry is 0 or 1;
// otherwise names the problem.
absl::Status CheckBlockGrid(const ConvShape& shape, const BlockGrid& grid);

// The CPU reference (fp32). Outputs are overwritten; bias and dbias may be null.
// REQUIRES: CheckConvShape(shape).ok() and CheckBlockGrid(shape, grid).ok().
void BlockSparseConv2dForwardCpu(const ConvShape& shape, const BlockGrid& grid, const float* x,
                                 const float* w, const float* bias, float* y);
void BlockSparseConv2dBackwardDataCpu(const ConvShape& shape, const BlockGrid& grid,
                                      const float* dy, const float* w, float* dx);
void BlockSparseConv2dBackwardFilterCpu(const ConvShape& shape, const BlockGrid& grid,
                                        const float* x, const float* dy, float* dw, float* dbias);

enum class SparsePass { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };
const char* SparsePassName(SparsePass pass);  // "forward", "backward data", "backward filter"

// A block-sparse convolution planned for one shape, grid and element type on the GPU: the
// packed block lists live in device memory (copied when the plan is made, so make plans
// outside CUDA-graph capture). Each pass has several kernel configurations (tile shapes);
// Tune times them on real operands and keeps the fastest. Not thread-safe.
class BlockSparseConvCuda {
 public:
  static absl::StatusOr<std::unique_ptr<BlockSparseConvCuda>> Create(const ConvShape& shape,
                                                                     const BlockGrid& grid,
                                                                     DType dtype,
                                                                     const CudaContext& ctx);
  ~BlockSparseConvCuda();
  BlockSparseConvCuda(const BlockSparseConvCuda&) = delete;
  BlockSparseConvCuda& operator=(const BlockSparseConvCuda&) = delete;

  // True when the forward and backward-data passes run on tensor cores (bf16, 8-aligned).
  bool tensor_cores() const { return tensor_cores_; }
  // How many kernel configurations (tile shapes) a pass has, choosing the one it runs with, and
  // the chosen one's name, e.g. "tc 128x64/3" (pixels x channels per CTA / pipeline stages),
  // "wgmma 256x128x64 2wg" (Hopper: pixels x channels x reduction channels per tile, consumer
  // warpgroups) or "plain"; for logs, tests and benchmarks.
  int configs(SparsePass pass) const;
  // Whether Tune times this configuration; until set or tuned, a pass runs its first such
  // one. All are, but the plain filter-gradient kernel where Hopper's exist.
  bool tuned(SparsePass pass, int config) const;
  absl::Status set_config(SparsePass pass, int config);
  std::string config_name(SparsePass pass) const;

  // The passes, operands as ConvCudaPlan's (elements of the plan's dtype; bias and dbias fp32
  // and may be null). No workspace is needed: the Hopper filter gradient's fp32 partial sums
  // live in the plan (at most a tile per kept tile and per CTA: 5-11 MB for resnet50's layer3
  // at 50% kept).
  // Passes of one plan must not run concurrently.
  // Forward may also write the batch norm's moments of y (Hopper's configurations, no bias:
  // hopper_conv.h), [3][forward_moment_slices(ctx)][K] floats; forward_moment_slices is 0
  // when the chosen forward configuration cannot.
  absl::Status Forward(const void* x, const void* w, const float* bias, void* y,
                       const CudaContext& ctx, float* moments = nullptr) const;
  int forward_moment_slices(const CudaContext& ctx) const;
  absl::Status BackwardData(const void* dy, const void* w, void* dx, const CudaContext& ctx) const;
  absl::Status BackwardFilter(const void* x, const void* dy, void* dw, float* dbias,
                              const CudaContext& ctx) const;

  // Runs `pass` with every configuration on these operands (outputs are overwritten, as a call
  // would), keeps the fastest and returns its time in milliseconds (mean of 5 runs).
  // Operands: forward (x, w -> y), backward data (dy, w -> dx), backward filter (x, dy -> dw).
  // Must not be called while the stream is being captured.
  absl::StatusOr<float> Tune(SparsePass pass, const void* in0, const void* in1, void* out,
                             const CudaContext& ctx);

  struct Device;  // the packed lists in device memory; defined by the implementation

 private:
  BlockSparseConvCuda() = default;
  // moments: forward on a Hopper configuration only (Forward checks).
  absl::Status Run(SparsePass pass, int config, const void* in0, const void* in1, void* out,
                   const float* bias, float* dbias, const CudaContext& ctx,
                   float* moments = nullptr) const;

  ConvShape shape_;
  DType dtype_ = DType::kF32;
  bool tensor_cores_ = false;
  int config_[3] = {0, 0, 0};
  std::unique_ptr<Device> d_;
};

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_BLOCK_SPARSE_CONV_H_
