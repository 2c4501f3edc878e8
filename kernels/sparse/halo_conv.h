// Block-sparse convolution on Hopper as a shifted-window implicit GEMM, forward and backward
// data at stride 1 or 2:
// the kernel loads a band of input rows (with its halo) once per kept 64-channel input block
// and reads every filter tap from that one copy in shared memory, where an im2col GEMM
// (hopper_conv.h) loads the band again for each tap.
//
// Why: a layer whose blocks are 64 output channels wide multiplies each loaded activation by
// 64 weights only, and im2col loads each activation R x S times; such tiles were bound by their
// loads from L2 (docs/PERFORMANCE.md, issue 44), not by the tensor cores. Here the loads per
// multiply-add fall ~R*S-fold.
//
// The geometry: each image's output rows are laid in a frame Wp = Wo + S - 1 pixels wide (the
// padded input's width), so output pixel (i, j) is frame pixel i * Wp + j, and tap (r, s) reads
// input frame pixel i * Wp + j + r * Wp + s: the same rows of shared memory shifted by a
// constant. A tile is a band of output rows of one image (as many as fit in 256 frame pixels)
// times 64 output channels; the frame's last S - 1 columns are computed and dropped. The
// wgmma's M is the 64 output channels (the filter block, from shared memory) and its N the
// band's pixels (up to 256, one tile per consumer warpgroup in turn); its operands are read
// from shared memory at a start row that need not be a multiple of 8 (the 128-byte swizzle is
// a function of the address, as TMA wrote it). The tile's outputs leave by one TMA store of
// its frame, whose extra columns fall outside the output and are not written.
//
// At stride 2 the input is read as its four phases x[2u + a][2v + b] (each a strided TMA view
// of x): output pixel (i, j) reads, for tap (r, s), phase ((r - pad) mod 2, (s - pad) mod 2)
// at (i + dr, j + ds), so each phase is a stride-1 problem over the taps that land on it (1,
// 2, 2 and 4 of a 3x3 filter), and a tile loads each phase's band once per kept block and
// accumulates all of them; the frame is Wo plus the widest phase's extra columns.
#ifndef TOPIARY_KERNELS_SPARSE_HALO_CONV_H_
#define TOPIARY_KERNELS_SPARSE_HALO_CONV_H_

#include "absl/status/status.h"
#include "kernels/conv/conv.h"

namespace topiary::kernels {

struct CudaContext;

// Its tiles: 64 input channels (K) x 64 output channels (N).
constexpr int kHaloTileK = 64, kHaloTileN = 64;

// Whether the kernel takes the shape: stride 1 or 2 (both ways), channels multiples of 64, a frame
// at most 256 pixels wide, and its buffers within shared memory. (The sm_90 check is the
// caller's.)
bool HaloForwardTakes(const ConvShape& s);

// y = conv(x, w) (+ bias) over the kept K tiles: count / index / stride as MakeKeptTiles makes
// them for kHaloTileK x kHaloTileN tiles, in any order (KeptOrder::kRotated measured fastest:
// kept_tiles.cc). bf16 NHWC x and y, [K, R, S, C] w.
// Without a bias it may also write the batch norm's moments of y as hopper_conv.h's forward
// does: [3][HaloForwardMomentSlices(s, ctx)][K] floats, a (count, mean, M2) summary per channel
// of each consumer warpgroup's tiles, merged in a fixed order (deterministic).
absl::Status HaloForwardRun(const ConvShape& s, const int* count, const int* index, int stride,
                            const void* x, const void* w, const float* bias, void* y,
                            const CudaContext& ctx, float* moments = nullptr);
int HaloForwardMomentSlices(const ConvShape& s, const CudaContext& ctx);

// Backward data, the same kernel on each phase of dx (dgrad_phases.h; stride 1: one): a
// phase's dx pixels (u, v) read dy at (u + d - t, v + d' - t') for its taps (r0 + stride t,
// s0 + stride t'), a stride-1 problem over dy with the filter read transposed, stored through
// a strided view of dx. Taken where every phase of dx with pixels has taps (a 1x1 filter at
// stride 2 leaves three phases zero, which this kernel does not write). count / index /
// stride as MakeKeptTiles makes them for backward data with kHaloTileK x kHaloTileN tiles (64
// output channels of the layer x 64 of its input channels), in any order (KeptOrder::kColoured
// measured fastest).
//
// One launch per phase, or with `one_launch` all of them in one launch (taken by
// HaloBackwardDataPhasesTakes: stride 2), whose tiles come in groups, one tile per phase of
// dx, that read each kept block's band of dy once: phase by phase, the band is loaded once
// per phase for the phase's 1, 2 or 4 taps (of a 3x3 filter), and the loads bound the
// kernel. The group's bands stay in shared memory until its last tile; where the most kept
// blocks' bands do not fit, it runs phase by phase.
bool HaloBackwardDataTakes(const ConvShape& s);
bool HaloBackwardDataPhasesTakes(const ConvShape& s);
absl::Status HaloBackwardDataRun(const ConvShape& s, const int* count, const int* index, int stride,
                                 const void* dy, const void* w, void* dx, const CudaContext& ctx,
                                 bool one_launch = false);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_HALO_CONV_H_
