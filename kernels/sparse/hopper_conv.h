// Hopper (sm_90a) block-sparse convolution passes, bf16 NHWC in and out, fp32 accumulation:
// implicit GEMMs whose producer warp loads, by TMA im2col, only the K tiles that an output
// tile's kept list names (kept_tiles.h), and whose consumer warpgroups multiply them with
// wgmma. Forward (with a per-channel bias) and backward data at stride 1. The pipeline, TMA
// descriptors, shared-memory layouts and epilogue are CUTLASS's (its sm90 implicit-GEMM
// collectives); the kernel around them is Topiary's, because CUTLASS's kernels give every
// output tile the same K count. With every tile kept it is a dense convolution, which is how
// the benchmarks compare it with cuDNN.
//
// Used by BlockSparseConvCuda as extra configurations of those passes on H100/H200.
#ifndef TOPIARY_KERNELS_SPARSE_HOPPER_CONV_H_
#define TOPIARY_KERNELS_SPARSE_HOPPER_CONV_H_

#include <string>

#include "absl/status/status.h"
#include "kernels/conv/conv.h"
#include "kernels/sparse/block_sparse_conv.h"

namespace topiary::kernels {

struct CudaContext;

// A pass's kernel configurations (tile shapes); none for backward filter.
int HopperConvConfigs(SparsePass pass);
std::string HopperConvConfigName(SparsePass pass, int config);  // "wgmma 128x128x64 2wg"
int HopperConvTileK(SparsePass pass, int config);
int HopperConvTileN(SparsePass pass, int config);

// Whether a pass's kernel configuration takes this shape on the current device: an sm_90 GPU,
// channels multiples of 8 (TMA's 16-byte rows), for backward data stride 1, and what
// CUTLASS's collectives check (TMA im2col's padding, corner and offset limits among others).
bool HopperConvTakes(SparsePass pass, int config, const ConvShape& shape, const CudaContext& ctx);

// The pass over the kept K tiles: count[j] tiles of output tile j, listed from index[j *
// stride]; count and index are device arrays from MakeKeptTiles(pass, shape, grid,
// HopperConvTileK(pass, config), HopperConvTileN(pass, config)). Forward: in0 = x, in1 = w,
// out = y (+ bias, fp32, may be null). Backward data: in0 = dy, in1 = w, out = dx, no bias.
absl::Status HopperConvRun(SparsePass pass, int config, const ConvShape& shape, const int* count,
                           const int* index, int stride, const void* in0, const void* in1,
                           const float* bias, void* out, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_HOPPER_CONV_H_
