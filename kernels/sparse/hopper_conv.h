// Hopper (sm_90a) block-sparse convolution passes, bf16 NHWC in and out, fp32 accumulation:
// implicit GEMMs whose producer warp loads, by TMA im2col, only the K tiles that an output
// tile's kept list names (kept_tiles.h), and whose consumer warpgroups multiply them with
// wgmma. Forward (with a per-channel bias) and backward data (at stride > 1 phase by phase,
// dgrad_phases.h); backward filter computes only the filter's kept tiles, its pixel loop
// split evenly over the CTAs. The
// pipeline, TMA descriptors, shared-memory layouts and the forward epilogue are CUTLASS's (its
// sm90 implicit-GEMM collectives); the kernels around them are Topiary's, because CUTLASS's
// give every output tile the same K count. With every tile kept it is a dense convolution,
// which is how the benchmarks compare it with cuDNN.
//
// Used by BlockSparseConvCuda as extra configurations of those passes on H100/H200.
#ifndef TOPIARY_KERNELS_SPARSE_HOPPER_CONV_H_
#define TOPIARY_KERNELS_SPARSE_HOPPER_CONV_H_

#include <string>

#include "absl/status/status.h"
#include "kernels/conv/conv.h"
#include "kernels/sparse/block_sparse_conv.h"
#include "kernels/sparse/kept_tiles.h"

namespace topiary::kernels {

struct CudaContext;

// A pass's kernel configurations (tile shapes: M x N x K of its implicit GEMM).
int HopperConvConfigs(SparsePass pass);
std::string HopperConvConfigName(SparsePass pass, int config);  // "wgmma 128x128x64 2wg"
int HopperConvTileM(SparsePass pass, int config);
int HopperConvTileK(SparsePass pass, int config);
int HopperConvTileN(SparsePass pass, int config);
// The order of the kept lists its kernel walks fastest (kept_tiles.h: measured).
KeptOrder HopperConvKeptOrder(SparsePass pass, int config);

// Whether a pass's kernel configuration takes this shape on the current device: an sm_90 GPU,
// channels multiples of 8 (TMA's 16-byte rows), for backward data at stride > 1 phases whose
// problems keep the layer's dy extent (DgradPhase::pad_h_hi >= 0), for backward
// filter input channels a multiple of the tile's N, and what CUTLASS's collectives check (TMA
// im2col's padding, corner and offset limits among others).
bool HopperConvTakes(SparsePass pass, int config, const ConvShape& shape, const CudaContext& ctx);

// The pass over the kept K tiles: count[j] tiles of output tile j, listed from index[j *
// stride]; count and index are device arrays from MakeKeptTiles(pass, shape, grid,
// HopperConvTileK(pass, config), HopperConvTileN(pass, config), HopperConvKeptOrder(pass,
// config)) (any order computes the same sums, up to fp32 rounding). Forward: in0 = x, in1 = w,
// out = y (+ bias, fp32, may be null). Backward data: in0 = dy, in1 = w, out = dx, no bias.
// Forward without a bias may also write the batch norm's moments of its output (of y as
// stored, in bf16) for BatchNormForwardTrainCuda (batch_norm.h), which then reads y only to
// apply them: `moments` holds [3][slices][K] floats, slices =
// HopperConvMomentSlices(config, shape, ctx) (at most twice the SM count), each slice a (count,
// mean, M2) summary per channel of the output tiles that one CTA (or warpgroup) ran, merged in a
// fixed order: deterministic.
absl::Status HopperConvRun(SparsePass pass, int config, const ConvShape& shape, const int* count,
                           const int* index, int stride, const void* in0, const void* in1,
                           const float* bias, void* out, const CudaContext& ctx,
                           float* moments = nullptr);
int HopperConvMomentSlices(int config, const ConvShape& shape, const CudaContext& ctx);

// Backward filter's work in device memory: a FilterSplit (kept_tiles.h) made for the
// configuration's tile shape and HopperFilterPhases, and room for its partial sums.
struct HopperFilterWork {
  int tile_m = 0, tile_n = 0;
  int n_tiles = 0, ctas = 0;        // FilterSplit's
  const int* slot = nullptr;        // [m_tiles * n_tiles]
  const int* kept_tiles = nullptr;  // [kept]
  const int* tile_begin = nullptr;  // [kept + 1]
  const int* seg_tile = nullptr;    // per segment
  const int* seg_k = nullptr;
  const int* seg_count = nullptr;
  const int* seg_piece = nullptr;
  const int* seg_store = nullptr;
  const int* cta_begin = nullptr;  // [ctas + 1]
  float* partials = nullptr;       // [partial slots][tile_m * tile_n]
};

// The phases (pixel windows, kept_tiles.h) a backward-filter configuration wants for a shape:
// windows of dy and x that fit in a third of the device's L2 cache, so that the CTAs, all in
// one window at a time, read them from L2; 1 for tiles too large to hold two running sums.
int HopperFilterPhases(int config, const ConvShape& shape);

// The filter gradient dw ([K, R, S, C], bf16) from x and dy: each CTA multiplies its pieces
// of the kept tiles' pixel loops and stores each piece's sum to its partial slot; then a
// second kernel adds each kept tile's slots in order into dw and writes 0 everywhere else.
// Deterministic.
absl::Status HopperFilterRun(int config, const ConvShape& shape, const HopperFilterWork& work,
                             const void* x, const void* dy, void* dw, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_HOPPER_CONV_H_
