// Hopper (sm_90a) block-sparse forward convolution, bf16 NHWC in and out, fp32 accumulation:
// an implicit GEMM whose producer warp loads, by TMA im2col, only the K tiles that an output
// tile's kept list names (kept_tiles.h), and whose consumer warpgroups multiply them with
// wgmma. The pipeline, TMA descriptors, shared-memory layouts and epilogue are CUTLASS's
// (its sm90 implicit-GEMM collectives); the kernel around them is Topiary's, because CUTLASS's
// kernel gives every output tile the same K count. With every tile kept it is a dense
// convolution, which is how the benchmarks compare it with cuDNN.
//
// Used by BlockSparseConvCuda as extra forward configurations on H100/H200.
#ifndef TOPIARY_KERNELS_SPARSE_HOPPER_FPROP_H_
#define TOPIARY_KERNELS_SPARSE_HOPPER_FPROP_H_

#include <string>

#include "absl/status/status.h"
#include "kernels/conv/conv.h"

namespace topiary::kernels {

struct CudaContext;

// The kernel configurations (tile shapes and schedules).
int HopperFpropConfigs();
std::string HopperFpropConfigName(int config);  // e.g. "wgmma 128x128x64 coop"
int HopperFpropTileK(int config);
int HopperFpropTileN(int config);

// Whether the kernels take this shape on the current device: an sm_90 GPU, channels multiples
// of 8 (TMA's 16-byte rows), padding and filter within TMA im2col's limits.
bool HopperFpropTakes(const ConvShape& shape, const CudaContext& ctx);

// y = conv(x, w) (+ bias) over the kept K tiles: count[j] tiles of output tile j, listed from
// index[j * stride]. count and index are device arrays from ForwardKeptTiles(shape, grid,
// HopperFpropTileK(config), HopperFpropTileN(config)). x, w, y bf16; bias fp32 or null.
absl::Status HopperFpropRun(int config, const ConvShape& shape, const int* count, const int* index,
                            int stride, const void* x, const void* w, const float* bias, void* y,
                            const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_HOPPER_FPROP_H_
