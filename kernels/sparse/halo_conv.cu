// The shifted-window block-sparse convolution, forward and backward data (halo_conv.h).
//
// A CTA is one producer warpgroup (one thread issues the halo loads, another the weights') and
// two consumer warpgroups (wgmma), over a persistent grid of tiles (image, band of output rows,
// 64 output channels), channel tiles fastest so that neighbouring CTAs read the same band from
// L2. The grid's unit is two tiles of the same channels and band, of two images, which the
// consumers take in turn: each warpgroup then gets tiles of the same channels, and so the same
// work (with units of one tile and the grid's CTA count odd, one warpgroup of a CTA would get
// every other channel tile, and where their kept blocks differ, as backward data's rows may, it
// would multiply while the other idled instead of storing). Per kept input block of the tile's
// output channels the halo producer loads the band's input rows once (a 4-D TMA box: 64 channels x
// Wp columns x band + R - 1 rows, zeros outside the image, so the padding costs nothing) into a
// ring of two or three halo buffers, and the weight producer each of the R x S filter taps' 64 x 64
// weight tiles into a ring of stages. The consumers multiply each tap's weight tile by the halo
// rows shifted by r * Wp + s, then stage the tile's outputs in shared memory in the output's own
// layout (the frame's rows of 64 channels, swizzled as TMA reads them) and store them with one TMA
// box, which drops the frame's extra columns and the rows past the image as out of bounds.
//
// Backward data at stride 2 may run all phases of dx in one launch: the grid's unit is then a
// group of tiles (image, band of dy, 64 channels), one tile per phase of dx, which the
// consumers take in turn as any tiles; the group's halos are loaded once, stay in their
// buffers for all of its tiles (a ring that holds a group's halos at once) and are released
// by both consumers after their last tile of the group.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cute/arch/mma_sm90_gmma_ext.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cuda_host_adapter.hpp"
#include "cutlass/pipeline/sm90_pipeline.hpp"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"
#include "kernels/runtime/moments.h"
#include "kernels/sparse/dgrad_phases.h"
#include "kernels/sparse/halo_conv.h"
#include "kernels/sparse/persistent_ctas.h"
#include "util/status_macros.h"

namespace topiary::kernels {
namespace {

constexpr int kRowBytes = 128;  // one pixel's 64 bf16 channels: a swizzle row
constexpr int kPixels = 256;    // frame pixels per tile at most: the wgmma's N
// Weight tiles in flight: eight measured 4-6% faster than six on the halo rows (layer3 64x64
// at 50% kept 0.0522 -> 0.0494 ms), though layer2's halos then fit two buffers, not three.
constexpr int kStages = 8;
constexpr int kMaxHalos = 8;                          // halo buffers at most (HaloBuffers)
constexpr int kWeightBytes = kHaloTileN * kRowBytes;  // 64 output channels x 64 inputs
constexpr int kStagingBytes = kPixels * kRowBytes;    // a tile's outputs, per warpgroup
constexpr int kCtaThreads = 3 * 128;                  // producers, two consumers
constexpr int kMaxPhases = 4;                         // stride 2: x's four pixel phases
constexpr int kMaxTaps = 64;                          // R x S at most
constexpr uint32_t kSmemLimit = 227 * 1024;           // shared memory per block on sm_90

// A phase of the input (at stride 2, the pixels x[2u + a][2v + b]; at stride 1, x itself):
// output pixel (i, j) reads phase pixel (i + dr, j + ds) for a tap, dr and ds from `row` to
// `row` + its extent - 1.
struct HaloPhase {
  int row, col;    // the box's first phase row (less the band's first output row) and column
  uint32_t bytes;  // its box's: 64 channels x Wp x (band + row extent - 1)
};

struct HaloParams {
  const int* count;
  const int* index;
  int stride;
  const float* bias;
  // The forward's batch-norm moments of y (as stored, in bf16), [3][2 x gridDim.x][K]: a
  // (count, mean, M2) summary per channel of each consumer warpgroup's tiles; or null.
  float* moments;
  int taps;    // R x S: a tile's kept blocks are its count / taps
  int phases;  // the input phases with taps and pixels
  HaloPhase phase[kMaxPhases];
  // The output phases (backward data at stride 2, fused: the phases of dx; otherwise one): a
  // group of tiles (image, band, output channels) is one tile per output phase, in turn, all
  // reading the group's halos, which stay until the group's last tiles release them.
  int out_phases;
  // The tap table's entries of output phase o and input phase i: tap0[o][i] on, tap_count[o][i]
  // of them.
  int tap0[kMaxPhases][kMaxPhases], tap_count[kMaxPhases][kMaxPhases];
  int out_taps[kMaxPhases];  // output phase o's taps over every input phase
  int tap_column[kMaxTaps];  // a tap's column of the filter as [rows][R * S * C], less the
                             // tile's channels (forward: the input block's; backward data: nt's)
  int tap_shift[kMaxTaps];   // the halo row its operand starts at (frame pixel 0's)
  int k, ho, wo;             // y's channels, rows and columns
  int wp, band, bands, n_tiles;
  int units;           // the grid's: a channel tile and band of `unit_images` images (Tiles)
  int n, unit_images;  // the images, and those of a unit of the grid (a group: 1 or 2)
  int halo_rows;       // per buffer, a multiple of 8 (1024-byte aligned buffers)
  int halo_buffers;    // HaloBuffers' (kMaxHalos at most)
  // The tensor maps last: the scalars and tables the loops read come first.
  CUtensorMap x_map[kMaxPhases];  // each phase as [N][H'][W'][C], boxes of 64 x Wp x rows x 1
  CUtensorMap w_map;              // w as [K][R * S * C], boxes of 64 x 64
  CUtensorMap y_map[kMaxPhases];  // each output phase as [N][Ho][Wo][K], boxes of 64 x Wp x band
};

// The consumer warpgroups' turns to multiply: one multiplies a tile while the other writes the
// one before. (Taking turns also keeps each within one round of the ring of stages of the
// producer: a warpgroup waiting for stages more than a round ahead would see an earlier
// fill's phase and read the wrong weights.)
using Turns = cutlass::OrderedSequenceBarrier<1, 2>;

// Shared memory, from a 1024-byte aligned base: the halo buffers, the weight stages, the two
// warpgroups' output staging, the barriers and the turns. Every buffer is 1024-byte aligned
// (the 128-byte swizzle's period).
struct Layout {
  uint32_t halo_bytes_each, weights, staging, bars, turns, total;
  __host__ __device__ Layout(int halo_rows, int halo_buffers) {
    halo_bytes_each = static_cast<uint32_t>(halo_rows) * kRowBytes;
    weights = halo_buffers * halo_bytes_each;
    staging = weights + kStages * kWeightBytes;
    bars = staging + 2 * kStagingBytes;
    turns = bars + (2 * kMaxHalos + 2 * kStages) * 8;  // fixed slots: see HaloKernel
    total = turns + sizeof(Turns::SharedStorage);
  }
};

// An operand in 128-byte rows with the 128-byte swizzle, starting at `addr` (any 128-byte row
// of a buffer TMA wrote with the same swizzle), groups of 8 rows 1024 bytes apart. The same
// descriptor serves both majors; the wgmma's transpose flag says what a row is:
// - K-major (the halo, and the forward's weights): a row is one M or N index's 64 K values; a
//   16-deep K step starts 32 bytes further along the rows;
// - MN-major (backward data's weights, the [K, R, S, C] filter read transposed): a row is one
//   K index's 64 M values; a 16-deep K step starts 16 rows (2048 bytes) further.
// The swizzle is taken from the address bits, as TMA applied it, so a start row that is not a
// multiple of 8 needs no base offset (measured on an H200: with the offset set the results are
// wrong).
__device__ __forceinline__ uint64_t Operand(uint32_t addr) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>(addr >> 4);
  d.bitfield.leading_byte_offset_ = 1;  // unused: one swizzle atom wide
  d.bitfield.stride_byte_offset_ = 1024 >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = 1;  // 128-byte swizzle
  return d.desc_;
}

// The multiply loop keeps descriptors' low words (the start address in 16-byte units, bits
// 0-13, and the leading offset) and steps them by adding; the high word (the stride between
// 8-row groups and the swizzle) is the same for every operand. Building each descriptor from
// its address took 6 instructions per operand, and in Nsight Compute's source view of the halo
// kernels the multiplying warps spend most of their samples on their own instructions, not
// waiting for the tensor cores. Both words come from Operand, so the fields are set in one
// place (the compiler folds Desc's high word to a constant).
static_assert(kSmemLimit / 16 < (1u << 14), "a start address fits the low word's 14 bits");
__device__ __forceinline__ uint32_t DescLo(uint32_t addr) {
  return static_cast<uint32_t>(Operand(addr));
}
__device__ __forceinline__ uint64_t Desc(uint32_t lo) {
  return (Operand(0) & ~uint64_t{0xffffffffu}) | lo;
}

// The wgmma of N frame pixels: 64 x N x 16, both operands K-major from shared memory. A tile's
// N is the band's pixels rounded up to one of these (ChooseTiling).
// The weights (operand A) are K-major in the forward pass (a tile's 64 input channels
// contiguous) and MN-major in backward data (its 64 output rows, the layer's input channels,
// contiguous: the filter read transposed).
template <int N>
struct HaloMma;
#define TOPIARY_HALO_MMA(N)                                                                      \
  template <>                                                                                    \
  struct HaloMma<N> {                                                                            \
    template <cute::SM90::GMMA::Major kA>                                                        \
    using Op = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_SS<kA, cute::SM90::GMMA::Major::K>; \
  };
TOPIARY_HALO_MMA(64)
TOPIARY_HALO_MMA(128)
TOPIARY_HALO_MMA(192)
TOPIARY_HALO_MMA(216)
TOPIARY_HALO_MMA(224)
TOPIARY_HALO_MMA(232)
TOPIARY_HALO_MMA(256)
#undef TOPIARY_HALO_MMA
constexpr int kTileWidths[] = {64, 128, 192, 216, 224, 232, 256};

template <int N, bool kData, size_t... I>
__device__ __forceinline__ void Fma(uint64_t a, uint64_t b, float (&d)[N / 2], bool accumulate,
                                    std::index_sequence<I...>) {
  constexpr auto kA = kData ? cute::SM90::GMMA::Major::MN : cute::SM90::GMMA::Major::K;
  HaloMma<N>::template Op<kA>::fma(
      a, b, d[I]...,
      accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

// Merges a tile's outputs into the moments' slot (HaloParams::moments): y as stored (the
// accumulators rounded to bf16; moments come without a bias) over the frame pixels inside the
// output, each channel's sums over a thread's pixels added across the 4 lanes that share it
// (accumulator 4 j + 2 h + c is channel `channel` + 8 h, frame pixel 8 j + 2 (lane % 4) + c).
// The lane with lane % 4 == 0 owns the two channels: it alone reads and writes their slot
// entries, tile after tile in the CTA's order, so the result is deterministic.
template <int N>
__device__ __forceinline__ void Moments(const HaloParams& p, const float (&acc)[N / 2], int band,
                                        int channel, int lane, int64_t slot, int64_t plane) {
  const int rows = min(p.band, p.ho - band * p.band);
  float sum[2] = {0.0f, 0.0f}, sq[2] = {0.0f, 0.0f};
  int row = 0, col = 2 * (lane % 4);  // frame pixel 8 j + 2 (lane % 4), j = 0
  while (col >= p.wp) col -= p.wp, ++row;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      int r = row, x = col + c;
      if (x >= p.wp) x -= p.wp, ++r;
      if (r >= rows || x >= p.wo) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v = __bfloat162float(__float2bfloat16_rn(acc[4 * j + 2 * h + c]));
        sum[h] += v;
        sq[h] = fmaf(v, v, sq[h]);
      }
    }
    col += 8;
    while (col >= p.wp) col -= p.wp, ++row;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    for (int mask = 1; mask <= 2; mask <<= 1) {
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], mask);
      sq[h] += __shfl_xor_sync(0xffffffffu, sq[h], mask);
    }
  }
  const float count = static_cast<float>(rows * p.wo);
  if (lane % 4 != 0 || count == 0.0f) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* at = p.moments + slot + channel + 8 * h;
    float n = at[0], mean = at[plane], m2 = at[2 * plane];
    const float mean_b = sum[h] / count;
    MergeMoments(n, mean, m2, count, mean_b, fmaxf(sq[h] - sum[h] * mean_b, 0.0f));
    at[0] = n;
    at[plane] = mean;
    at[2 * plane] = m2;
  }
}

// Walks a CTA's groups of tiles in the grid's order, for every role alike: body(nt, band, image,
// kept) per image of each of its units (channel tile nt, band of output rows, `unit_images`
// images), `kept` the channel tile's kept blocks.
template <class Body>
__device__ __forceinline__ void ForEachGroup(const HaloParams& p, Body&& body) {
  for (int unit = blockIdx.x; unit < p.units; unit += gridDim.x) {
    const int nt = unit % p.n_tiles, rest = unit / p.n_tiles;
    const int band = rest % p.bands, first = rest / p.bands * p.unit_images;
    const int last = min(first + p.unit_images, p.n);
    const int kept = p.count[nt] / p.taps;
    for (int image = first; image < last; ++image) body(nt, band, image, kept);
  }
}

// What a kernel computes:
// - kForward, kForwardMoments: the forward, the latter with the batch norm's moments
//   (p.moments set);
// - kData: backward data, one phase of dx as a stride-1 problem over dy with the filter read
//   transposed, its taps from the table (DgradGeometry, HaloBackwardDataRun);
// - kDataPhases: backward data, every phase of dx (p.out_phases) in turn per band of dy, its
//   halos shared by the group's tiles.
// Template parameters, so that a kernel carries none of the others' code: the forward measured
// 5% slower with the moments' code in (layer2 64x64 at 50% kept, 0.0561 -> 0.0588 ms).
enum class Variant { kForward, kForwardMoments, kData, kDataPhases };

template <int N, Variant V>
__global__ void __launch_bounds__(kCtaThreads, 1) HaloKernel(const __grid_constant__ HaloParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kData = V == Variant::kData || V == Variant::kDataPhases;
  constexpr bool kMoments = V == Variant::kForwardMoments;
  constexpr bool kShared = V == Variant::kDataPhases;
  const int out_phases = kShared ? p.out_phases : 1;
  constexpr int kAcc = N / 2;  // accumulators per thread: 64 x N over 128 threads
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  extern __shared__ char raw[];
  const uint32_t raw_addr = cute::cast_smem_ptr_to_uint(raw);
  char* base = raw + ((1024 - raw_addr % 1024) % 1024);
  const uint32_t base_addr = cute::cast_smem_ptr_to_uint(base);
  const Layout layout(p.halo_rows, p.halo_buffers);
  const int halo_buffers = p.halo_buffers;
  uint64_t* bars = reinterpret_cast<uint64_t*>(base + layout.bars);
  // Fixed slots, not sized by the buffers used: a barrier's address is then a constant
  // offset, not a load of the buffer count on the multiply loop's release path.
  uint64_t* halo_full = bars;
  uint64_t* halo_empty = bars + kMaxHalos;
  uint64_t* weight_full = bars + 2 * kMaxHalos;
  uint64_t* weight_empty = bars + 2 * kMaxHalos + kStages;
  const int warp_group = threadIdx.x / 128, group_thread = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int i = 0; i < halo_buffers; ++i) {
      FullBarrier::init(&halo_full[i], 1);
      // Released by the warpgroup that used it, or with several output phases by both.
      EmptyBarrier::init(&halo_empty[i], kShared ? 2 : 1);
    }
    for (int i = 0; i < kStages; ++i) {
      FullBarrier::init(&weight_full[i], 1);
      EmptyBarrier::init(&weight_empty[i], 1);
    }
    cutlass::arch::fence_barrier_init();
  }
  Turns::Params turn_params;
  turn_params.group_id = warp_group == 0 ? 0 : warp_group - 1;
  turn_params.group_size = 128;
  Turns turns(*reinterpret_cast<Turns::SharedStorage*>(base + layout.turns), turn_params);
  __syncthreads();

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    // Two producers, each walking all the CTA's tiles: thread 0 loads the halos, thread 32 the
    // weights. Apart, a halo load waits only for a free halo buffer, not behind the weight
    // stages of the tiles before it, so it starts up to two tiles ahead.
    const bool halos = threadIdx.x == 0;
    if (threadIdx.x != 0 && threadIdx.x != 32) return;
    if (halos) {
      for (int ph = 0; ph < p.phases; ++ph) cute::prefetch_tma_descriptor(&p.x_map[ph]);
    } else {
      cute::prefetch_tma_descriptor(&p.w_map);
    }
    int loads = 0;  // weight tiles loaded so far
    // The halo producer's next buffer and the fills it has had, stepped (as the consumers do),
    // not divided per load.
    int h = 0, fills = 0;
    ForEachGroup(p, [&](int nt, int band, int image, int kept) {
      // The first channel of the tile's b-th kept block, as both producers walk them: tap 0's
      // entries of the index, in the order MakeKeptTiles chose for the pass (kept_tiles.cc:
      // the channel tiles of a band run side by side on neighbouring CTAs, and the order
      // decides which blocks' bands they read from DRAM at the same time).
      const int* blocks = p.index + nt * p.stride;
      auto block_channel = [&](int b) { return blocks[b] * kHaloTileK; };
      if (halos) {  // once per group: every output phase's tile reads them
        for (int b = 0; b < kept; ++b) {
          const int c0 = block_channel(b);
          for (int ph = 0; ph < p.phases; ++ph) {
            // The load's parameters, read before the wait for a free buffer, so that the
            // constant cache's latency overlaps it (as the weights' producer does).
            const HaloPhase phase = p.phase[ph];
            const int row = band * p.band + phase.row;
            if (fills > 0) EmptyBarrier::wait(&halo_empty[h], (fills - 1) & 1);
            FullBarrier::arrive_and_expect_tx(&halo_full[h], phase.bytes);
            cute::SM90_TMA_LOAD_4D::copy(&p.x_map[ph], &halo_full[h], 0,
                                         base + h * layout.halo_bytes_each, c0, phase.col, row,
                                         image);
            if (++h == halo_buffers) h = 0, ++fills;
          }
        }
        return;
      }
      // In the consumers' order: output phase, block, input phase, tap.
      for (int op = 0; op < out_phases; ++op) {
        for (int b = 0; b < kept; ++b) {
          const int c0 = block_channel(b);
          for (int ph = 0; ph < p.phases; ++ph) {
            const int tap_end = p.tap0[op][ph] + p.tap_count[op][ph];
            for (int tap = p.tap0[op][ph]; tap < tap_end; ++tap, ++loads) {
              // Forward: rows nt's 64 output channels, columns the block's input channels of
              // this tap. Backward data: rows the block's output channels, columns nt's input
              // channels of this tap. (Read before the wait for a free stage, so that the
              // constant cache's latency overlaps it.)
              const int column = p.tap_column[tap] + (kData ? nt * kHaloTileN : c0);
              const int stage = loads % kStages;
              if (loads >= kStages) {
                EmptyBarrier::wait(&weight_empty[stage], (loads / kStages - 1) & 1);
              }
              FullBarrier::arrive_and_expect_tx(&weight_full[stage], kWeightBytes);
              cute::SM90_TMA_LOAD_2D::copy(&p.w_map, &weight_full[stage], 0,
                                           base + layout.weights + stage * kWeightBytes, column,
                                           kData ? c0 : nt * kHaloTileN);
            }
          }
        }
      }
    });
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  // Pingpong: consumer warpgroup g takes the CTA's tiles 2i + g, so that one writes a tile's
  // outputs while the other multiplies the next.
  const int group = warp_group - 1;
  const int warp = group_thread / 32, lane = group_thread % 32;
  const uint32_t staging = base_addr + layout.staging + group * kStagingBytes;
  // This warpgroup's slot of the moments: every channel's count 0 (empty) until its tiles
  // merge in; the one thread that owns a channel of a tile (Moments) reads and writes it.
  const int64_t slot = (2 * static_cast<int64_t>(blockIdx.x) + group) * p.k;
  const int64_t plane = 2 * static_cast<int64_t>(gridDim.x) * p.k;
  if constexpr (kMoments) {
    for (int c = group_thread; c < p.k; c += 128) p.moments[slot + c] = 0.0f;
    cutlass::arch::NamedBarrier::sync(128, 1 + group);
  }
  int halos = 0, weights = 0;  // the next halo and weight tile to use, counted as loaded
  // The operand descriptors' low words (DescLo) of the first halo buffer and weight stage.
  const uint32_t halo_lo = DescLo(base_addr), weights_lo = DescLo(base_addr + layout.weights);
  int turn = 0;
  // With one output phase a halo is released as soon as its taps are done; with several, each
  // warpgroup releases the group's halos after its last tile of the group.
  ForEachGroup(p, [&](int nt, int band, int image, int kept) {
    const int group_halos = halos;  // the group's first halo
    halos += kept * p.phases;
    for (int op = 0; op < out_phases; ++op, ++turn) {
      int batches = kept * p.out_taps[op];  // the tile's: one per kept block and tap
      if (turn % 2 != group) {              // the other warpgroup's tile: skip its weights
        weights += batches;
        continue;
      }
      // What the tile's first batch needs, before the turn: from the turn on, the tensor cores
      // run only the other warpgroup's last batches until this one issues its first.
      // The first batch overwrites the accumulators (accumulate = false): only a tile without
      // taps stores them as they are.
      float acc[kAcc];
      if (batches == 0) {
        for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
      }
      // The tile's first halo buffer and weight stage and the parities of their fills, then
      // stepped (dividing per batch measured 1% slower: layer3 64x64 0.0478 against 0.0472 ms).
      int h = group_halos % halo_buffers, h_parity = (group_halos / halo_buffers) & 1;
      int stage = weights % kStages, w_parity = (weights / kStages) & 1;
      weights += batches;
      // Each tap's operand row is read one tap ahead, across phases and blocks (after an input
      // phase's last tap, the next phase's first; every phase of the table has taps): an
      // indexed load of the parameters waits on the constant cache, here behind the batch in
      // flight instead of before it.
      int shift = p.tap_shift[p.tap0[op][0]];
      // Likewise each input phase's taps, read a phase ahead: at stride 2 a phase has 1-4 taps.
      int tap0 = p.tap0[op][0], tap_end = tap0 + p.tap_count[op][0];
      int last_stage = -1, last_halo = -1;  // the batch in flight: released once it completes
      bool accumulate = false;
      turns.wait();
      for (int b = 0; b < kept; ++b) {
        for (int ph = 0; ph < p.phases; ++ph) {
          const int next_phase = ph + 1 < p.phases ? ph + 1 : 0;
          const int next_tap0 = p.tap0[op][next_phase];
          const int next_end = next_tap0 + p.tap_count[op][next_phase];
          FullBarrier::wait(&halo_full[h], h_parity);
          const uint32_t halo = halo_lo + h * (layout.halo_bytes_each / 16);
          for (int tap = tap0; tap < tap_end; ++tap) {
            const int next_shift = p.tap_shift[tap + 1 < tap_end ? tap + 1 : next_tap0];
            FullBarrier::wait(&weight_full[stage], w_parity);
            const uint32_t a = weights_lo + stage * (kWeightBytes / 16);  // descriptors' low words
            const uint32_t bb = halo + shift * (kRowBytes / 16);
            shift = next_shift;
            for (int i = 0; i < kAcc; ++i) cute::warpgroup_fence_operand(acc[i]);
            cute::warpgroup_arrive();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {  // 16 channels a step: 32 bytes along the rows
              Fma<N, kData>(Desc(a + (kData ? 2048 : 32) / 16 * kk), Desc(bb + 2 * kk), acc,
                            accumulate || kk > 0, std::make_index_sequence<kAcc>{});
            }
            cute::warpgroup_commit_batch();
            // The tile's last batch issued: the other warpgroup's turn, its multiplies queued
            // behind this one's last two (as CUTLASS's pingpong kernels hand over, one batch
            // earlier), so that the tensor cores do not wait for this tile's tail.
            if (--batches == 0) turns.arrive();
            cute::warpgroup_wait<1>();  // the batch before this one is done: release its operands
            for (int i = 0; i < kAcc; ++i) cute::warpgroup_fence_operand(acc[i]);
            if (last_stage >= 0 && group_thread == 0) {
              EmptyBarrier::arrive(&weight_empty[last_stage]);
              if (last_halo >= 0) EmptyBarrier::arrive(&halo_empty[last_halo]);
            }
            last_stage = stage;
            last_halo = !kShared && tap == tap_end - 1 ? h : -1;
            accumulate = true;
            if (++stage == kStages) stage = 0, w_parity ^= 1;
          }
          if (++h == halo_buffers) h = 0, h_parity ^= 1;
          tap0 = next_tap0, tap_end = next_end;
        }
      }
      if (!accumulate) turns.arrive();  // no batches: the turn passes at once
      cute::warpgroup_wait<0>();
      for (int i = 0; i < kAcc; ++i) cute::warpgroup_fence_operand(acc[i]);
      if (last_stage >= 0 && group_thread == 0) {
        EmptyBarrier::arrive(&weight_empty[last_stage]);
        if (last_halo >= 0) EmptyBarrier::arrive(&halo_empty[last_halo]);
      }
      // Output phases alternate between the warpgroups, so each has one of the group's last two.
      if (kShared && op + 2 >= out_phases && group_thread == 0) {
        for (int i = group_halos; i < halos; ++i)
          EmptyBarrier::arrive(&halo_empty[i % halo_buffers]);
      }

      // The epilogue. Accumulator 4 j + 2 h + c of this thread is output channel 16 warp + lane /
      // 4 + 8 h, frame pixel 8 j + 2 (lane % 4) + c: for each (j, h) the warp holds an 8 x 8
      // matrix (channels x pixels) in the layout stmatrix takes, and its transposed form stores
      // it as 8 pixel rows of 8 channels (16 bytes), into the staging's 128-byte pixel rows with
      // the 128-byte swizzle (16-byte chunk c of row px at chunk c ^ (px % 8)). Lane l gives the
      // row address of matrix l / 8: (j + l / 16, h = l / 8 % 2), pixel row l % 8.
      if (group_thread == 0) cute::tma_store_wait<0>();  // the last store has read the staging
      cutlass::arch::NamedBarrier::sync(128, 1 + group);
      if constexpr (kMoments) {
        Moments<N>(p, acc, band, nt * kHaloTileN + 16 * warp + lane / 4, lane, slot, plane);
      }
      float bias[2] = {0.0f, 0.0f};
      if (p.bias != nullptr) {
        for (int hh = 0; hh < 2; ++hh)
          bias[hh] = p.bias[nt * kHaloTileN + 16 * warp + lane / 4 + 8 * hh];
      }
      auto pack = [&](int j, int hh) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(acc[4 * j + 2 * hh] + bias[hh],
                                                       acc[4 * j + 2 * hh + 1] + bias[hh]);
        return *reinterpret_cast<const uint32_t*>(&v);
      };
      const int row = lane % 8, chunk = (2 * warp + lane / 8 % 2) ^ row;
#pragma unroll
      for (int j = 0; j + 1 < N / 8; j += 2) {
        const uint32_t at = staging + (8 * (j + lane / 16) + row) * kRowBytes + chunk * 16;
        asm volatile(
            "stmatrix.sync.aligned.x4.trans.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(at),
            "r"(pack(j, 0)), "r"(pack(j, 1)), "r"(pack(j + 1, 0)), "r"(pack(j + 1, 1)));
      }
      if constexpr (N / 8 % 2 == 1) {
        constexpr int j = N / 8 - 1;
        const uint32_t at = staging + (8 * j + row) * kRowBytes + chunk * 16;
        asm volatile("stmatrix.sync.aligned.x2.trans.m8n8.shared.b16 [%0], {%1, %2};\n" ::"r"(at),
                     "r"(pack(j, 0)), "r"(pack(j, 1)));
      }
      cute::tma_store_fence();  // the stores above, seen by the TMA engine
      cutlass::arch::NamedBarrier::sync(128, 1 + group);
      if (group_thread == 0) {
        cute::SM90_TMA_STORE_4D::copy(&p.y_map[op], base + layout.staging + group * kStagingBytes,
                                      nt * kHaloTileN, 0, band * p.band, image);
        cute::tma_store_arrive();
      }
    }
  });
  if (group_thread == 0) cute::tma_store_wait<0>();  // the staging stays until it is read
#endif
}

// A tile: `band` output rows of one image, `width` frame pixels (the wgmma's N, at least band
// x Wp). The band that computes the fewest frame pixels over the image (the last band may be
// short), a tile's fixed costs counted as 32 pixels; 0 when no band fits.
struct Tiling {
  int band = 0, width = 0;
};
Tiling ChooseTiling(int ho, int wp) {
  Tiling best;
  int64_t best_cost = 0;
  for (int band = 1; band <= ho && band * wp <= kPixels; ++band) {
    int width = 0;
    for (int n : kTileWidths) {
      if (n >= band * wp) {
        width = n;
        break;
      }
    }
    const int64_t cost = static_cast<int64_t>((ho + band - 1) / band) * (width + 32);
    if (best.band == 0 || cost < best_cost) {
      best = {band, width};
      best_cost = cost;
    }
  }
  return best;
}

// A phase of the input, as HaloPhase (the taps' offsets dr from `row` to `row` + `rows` - 1,
// ds likewise), with its first pixel of the input.
struct PhaseGeometry {
  int a = 0, b = 0;       // input[step u + a][step v + b]
  int row = 0, rows = 0;  // the taps' row offsets
  int col = 0, cols = 0;  // and column offsets
};

// A phase of the output: the pixels y[out_step u + a][out_step v + b], ho x wo of them.
struct OutGeometry {
  int a = 0, b = 0, ho = 0, wo = 0;
};

// How the kernel runs one problem: the input's phases that taps read (at stride `step`), the
// output's phases (at stride out_step), each tap's filter tap (r S + s), offsets and phases
// (the table in output phase then input phase order), the largest output phase's size, the
// frame (Wp wide: that width plus the widest input phase's extra columns), the tiling and the
// halo buffers' rows; band 0 when no band fits.
struct Geometry {
  int step = 1, phases = 0;
  PhaseGeometry phase[kMaxPhases];
  int out_step = 1, out_phases = 0;
  OutGeometry out[kMaxPhases];
  int taps = 0;
  int tap_filter[kMaxTaps], tap_dr[kMaxTaps], tap_ds[kMaxTaps];
  int tap_phase[kMaxTaps], tap_out[kMaxTaps];
  int ho = 0, wo = 0;
  int wp = 0, halo_rows = 0;
  Tiling tiling;

  void AddTap(int filter_tap, int dr, int ds, int in_phase, int out_phase) {
    tap_filter[taps] = filter_tap, tap_dr[taps] = dr, tap_ds[taps] = ds;
    tap_phase[taps] = in_phase, tap_out[taps] = out_phase;
    ++taps;
  }
  void AddOut(int a, int b, int rows, int cols) {
    out[out_phases++] = {a, b, rows, cols};
    ho = std::max(ho, rows);
    wo = std::max(wo, cols);
  }
  // Once the phases and taps are in: the frame, the tiling and the halo rows.
  void Finish() {
    int cols = 1;
    for (int i = 0; i < phases; ++i) cols = std::max(cols, phase[i].cols);
    wp = wo + cols - 1;
    tiling = ChooseTiling(ho, wp);
    // Halo rows per buffer: those TMA writes (the band's phase rows) and those the last tap's
    // shifted tile reads, a multiple of 8 (1024-byte aligned buffers). Rows past the box hold
    // stale data; they reach only frame pixels past the band, which are not stored.
    for (int i = 0; i < phases; ++i) {
      halo_rows = std::max({halo_rows, tiling.width + (phase[i].rows - 1) * wp + phase[i].cols - 1,
                            (tiling.band + phase[i].rows - 1) * wp});
    }
    halo_rows = (halo_rows + 7) / 8 * 8;
  }
};

int FloorMod(int x, int m) { return (x % m + m) % m; }

// Tap r of a filter `taps` long reads row stride i + r - pad of x: phase (r - pad) mod stride,
// its row i + (r - pad - phase) / stride. The first such offset of `phase`'s taps and their
// count (consecutive offsets), {0, 0} when none lands on it.
std::pair<int, int> PhaseOffsets(int taps, int pad, int stride, int phase) {
  int first = 0, count = 0;
  for (int r = 0; r < taps; ++r) {
    if (FloorMod(r - pad, stride) != phase) continue;
    if (count++ == 0) first = (r - pad - phase) / stride;
  }
  return {first, count};
}

// The forward convolution `v` (stride 1, or 2 both ways): x's phases, each with the taps that
// land on it, into y itself.
Geometry ForwardGeometry(const ConvShape& v) {
  Geometry g;
  g.step = v.stride_h;
  g.AddOut(0, 0, v.ho(), v.wo());
  for (int a = 0; a < g.step; ++a) {
    for (int b = 0; b < g.step; ++b) {
      PhaseGeometry ph;
      ph.a = a;
      ph.b = b;
      std::tie(ph.row, ph.rows) = PhaseOffsets(v.r, v.pad_h, g.step, a);
      std::tie(ph.col, ph.cols) = PhaseOffsets(v.s, v.pad_w, g.step, b);
      // No tap reads it, or it has no pixels (an image narrower than the stride): it adds
      // nothing.
      if (ph.rows <= 0 || ph.cols <= 0 || a >= v.h || b >= v.w) continue;
      for (int r = 0; r < v.r; ++r) {
        for (int c = 0; c < v.s; ++c) {
          if (FloorMod(r - v.pad_h, g.step) != a || FloorMod(c - v.pad_w, g.step) != b) continue;
          g.AddTap(r * v.s + c, (r - v.pad_h - a) / g.step, (c - v.pad_w - b) / g.step, g.phases,
                   0);
        }
      }
      g.phase[g.phases++] = ph;
    }
  }
  g.Finish();
  return g;
}

// Backward data's phases `ds` of dx (dgrad_phases.h), each with pixels and taps: dy itself as
// the one input phase, read at (u + dr, v + ds) by phase d's tap (r0 + stride t, s0 + stride
// t') with dr = d.pad_h - t (likewise columns), into each phase's dx pixels. One phase is one
// launch's problem; all of them at once share each band of dy (the halo spans every phase's
// offsets).
Geometry DgradGeometry(const ConvShape& s, const std::vector<DgradPhase>& ds) {
  Geometry g;
  g.out_step = s.stride_h;
  int lo_r = 0, hi_r = 0, lo_c = 0, hi_c = 0;
  for (const DgradPhase& d : ds) {
    const int out = g.out_phases;
    g.AddOut(d.ph, d.pw, d.shape.h, d.shape.w);
    for (int t = 0; t < d.shape.r; ++t) {
      for (int u = 0; u < d.shape.s; ++u) {
        g.AddTap((d.r0 + s.stride_h * t) * s.s + d.s0 + s.stride_w * u, d.shape.pad_h - t,
                 d.shape.pad_w - u, 0, out);
      }
    }
    const int r_lo = d.shape.pad_h - (d.shape.r - 1), c_lo = d.shape.pad_w - (d.shape.s - 1);
    if (out == 0 || r_lo < lo_r) lo_r = r_lo;
    if (out == 0 || d.shape.pad_h > hi_r) hi_r = d.shape.pad_h;
    if (out == 0 || c_lo < lo_c) lo_c = c_lo;
    if (out == 0 || d.shape.pad_w > hi_c) hi_c = d.shape.pad_w;
  }
  PhaseGeometry ph;
  ph.row = lo_r;
  ph.rows = hi_r - lo_r + 1;
  ph.col = lo_c;
  ph.cols = hi_c - lo_c + 1;
  g.phase[g.phases++] = ph;
  g.Finish();
  return g;
}

// The most halo buffers, from `most` down to `least`, that fit in shared memory; 0 when not
// even `least` do. With one output phase (each halo released after its taps) three where they
// fit (kStreamHalos: a band's load starts two tiles ahead), else two; with several, at least a
// group's halos at once (kept blocks x input phases).
constexpr int kStreamHalos = 3;
int HaloBuffers(int halo_rows, int most, int least) {
  for (int buffers = most; buffers >= least; --buffers) {
    if (Layout(halo_rows, buffers).total + 1024 <= kSmemLimit) return buffers;
  }
  return 0;
}

// The halo buffers of a problem with one output phase (each halo released after its taps):
// three where they fit, else two; 0 when not even two do.
int StreamHaloBuffers(const Geometry& g) { return HaloBuffers(g.halo_rows, kStreamHalos, 2); }

// Whether the kernel fits the problem: a band, TMA boxes of at most 256 rows, the halo
// buffers in shared memory.
bool Fits(const Geometry& g) {
  if (g.phases == 0 || g.tiling.band == 0) return false;
  for (int i = 0; i < g.phases; ++i) {
    if (g.tiling.band + g.phase[i].rows - 1 > 256) return false;
  }
  return StreamHaloBuffers(g) != 0;
}

template <int N, Variant V>
absl::Status Launch(const HaloParams& p, int ctas, const CudaContext& ctx) {
  const int smem = static_cast<int>(Layout(p.halo_rows, p.halo_buffers).total) + 1024;
  TOPIARY_RETURN_IF_ERROR(
      CudaStatus(AllowDynamicSmem<HaloKernel<N, V>>(smem), "halo conv shared memory"));
  HaloKernel<N, V><<<ctas, kCtaThreads, smem, ctx.stream>>>(p);
  return LaunchStatus(V == Variant::kData || V == Variant::kDataPhases
                          ? "halo block-sparse conv backward data"
                          : "halo block-sparse conv forward");
}

template <Variant V>
absl::Status LaunchWidth(int width, const HaloParams& p, int ctas, const CudaContext& ctx) {
  switch (width) {
    case 64:
      return Launch<64, V>(p, ctas, ctx);
    case 128:
      return Launch<128, V>(p, ctas, ctx);
    case 192:
      return Launch<192, V>(p, ctas, ctx);
    case 216:
      return Launch<216, V>(p, ctas, ctx);
    case 224:
      return Launch<224, V>(p, ctas, ctx);
    case 232:
      return Launch<232, V>(p, ctas, ctx);
    default:
      return Launch<256, V>(p, ctas, ctx);
  }
}

absl::Status Encode(CUtensorMap* map, const void* data, int rank, const cuuint64_t* dims,
                    const cuuint64_t* strides, const cuuint32_t* box) {
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUresult r = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(data), dims, strides, box,
      unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrFormat("halo conv: cuTensorMapEncodeTiled failed (%d)", static_cast<int>(r)));
  }
  return absl::OkStatus();
}

// An [N][H][W][C] bf16 tensor.
struct Nhwc {
  const void* data;
  int n, h, w, c;
};

// Pixels (step u + a, step v + b) of `t` as a tensor of their own ([N][H'][W'][C], strided), in
// boxes of 64 channels x box_w x box_h x 1 image.
absl::Status EncodeNhwc(CUtensorMap* map, const Nhwc& t, int step, int a, int b, int box_w,
                        int box_h) {
  const int64_t pixel = static_cast<int64_t>(t.c) * 2, row = pixel * t.w;
  const cuuint64_t dims[4] = {
      static_cast<cuuint64_t>(t.c), static_cast<cuuint64_t>((t.w - b + step - 1) / step),
      static_cast<cuuint64_t>((t.h - a + step - 1) / step), static_cast<cuuint64_t>(t.n)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(pixel * step),
                                 static_cast<cuuint64_t>(row * step),
                                 static_cast<cuuint64_t>(row * t.h)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_w), static_cast<cuuint32_t>(box_h), 1};
  return Encode(map, static_cast<const char*>(t.data) + a * row + b * pixel, 4, dims, strides, box);
}

// The tiles of problem `g` over `images` images into `channels` output channels: bands of
// output rows x images x 64-channel tiles, in units of two images (the two warpgroups' tiles)
// or, with several output phases, of one (a group of tiles already). Run's grid and
// HaloForwardMomentSlices' count of it (the moments' slots are two per CTA) both come from
// here, so they agree.
struct Tiles {
  int bands, n_tiles, unit_images;
  int64_t count;  // the grid's units
};
Tiles CountTiles(const Geometry& g, int images, int channels) {
  const int bands = (g.ho + g.tiling.band - 1) / g.tiling.band, n_tiles = channels / kHaloTileN;
  const int unit_images = g.out_phases == 1 ? 2 : 1;
  const int64_t units = (static_cast<int64_t>(images) + unit_images - 1) / unit_images;
  return {bands, n_tiles, unit_images, units * bands * n_tiles};
}

// The halo buffers the fused phases of problem `g` run with where its tiles keep at most
// `most_kept` blocks: a group's halos at once (kept blocks x input phases); 0 when they do not
// fit.
int GroupHaloBuffers(const Geometry& g, int most_kept) {
  return HaloBuffers(g.halo_rows, kMaxHalos, std::max(1, most_kept * g.phases));
}

// The problem `g` over the input x (read through g's phases) into y's phases (forward: y
// itself), with the [rows][R * S * filter_c] filter w (forward: rows K; backward data: the
// layer's K, read transposed), in `halo_buffers` halo buffers (StreamHaloBuffers' or
// GroupHaloBuffers', not 0).
template <bool kData>
absl::Status Run(const Geometry& g, int halo_buffers, const Nhwc& x, const Nhwc& y, const void* w,
                 int filter_rows, int filter_taps, int filter_c, const int* count, const int* index,
                 int stride, const float* bias, float* moments, const CudaContext& ctx) {
  HaloParams p{};
  p.count = count;
  p.index = index;
  p.stride = stride;
  p.bias = bias;
  p.moments = moments;
  p.k = y.c;
  p.ho = g.ho;
  p.wo = g.wo;
  p.taps = filter_taps;
  p.phases = g.phases;
  p.out_phases = g.out_phases;
  p.wp = g.wp;
  p.band = g.tiling.band;
  const Tiles tiles = CountTiles(g, x.n, y.c);
  if (tiles.count * g.out_phases > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("halo conv: too many tiles");
  }
  p.bands = tiles.bands;
  p.n_tiles = tiles.n_tiles;
  p.units = static_cast<int>(tiles.count);
  p.n = x.n;
  p.unit_images = tiles.unit_images;
  p.halo_rows = g.halo_rows;
  p.halo_buffers = halo_buffers;
  for (int i = 0; i < g.phases; ++i) {
    const PhaseGeometry& ph = g.phase[i];
    const int box_rows = p.band + ph.rows - 1;
    p.phase[i] = {ph.row, ph.col, static_cast<uint32_t>(kRowBytes) * p.wp * box_rows};
    TOPIARY_RETURN_IF_ERROR(EncodeNhwc(&p.x_map[i], x, g.step, ph.a, ph.b, p.wp, box_rows));
  }
  // The tap table, in output phase then input phase order (as the geometries add the taps).
  for (int t = 0; t < g.taps; ++t) {
    const int o = g.tap_out[t], i = g.tap_phase[t];
    const PhaseGeometry& ph = g.phase[i];
    if (p.tap_count[o][i]++ == 0) p.tap0[o][i] = t;
    ++p.out_taps[o];
    p.tap_column[t] = g.tap_filter[t] * filter_c;
    p.tap_shift[t] = (g.tap_dr[t] - ph.row) * p.wp + (g.tap_ds[t] - ph.col);
  }
  {
    const int64_t row = static_cast<int64_t>(filter_taps) * filter_c;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row), static_cast<cuuint64_t>(filter_rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row) * 2};
    const cuuint32_t box[2] = {kHaloTileK, kHaloTileN};
    TOPIARY_RETURN_IF_ERROR(Encode(&p.w_map, w, 2, dims, strides, box));
  }
  // A tile's output box is its frame (band rows of Wp pixels), whose columns past the view's
  // width and rows past its height TMA leaves unwritten.
  for (int o = 0; o < g.out_phases; ++o) {
    TOPIARY_RETURN_IF_ERROR(
        EncodeNhwc(&p.y_map[o], y, g.out_step, g.out[o].a, g.out[o].b, p.wp, p.band));
  }
  const int ctas = PersistentCtas(tiles.count, p.n_tiles, ctx);
  if constexpr (kData) {
    if (g.out_phases > 1) return LaunchWidth<Variant::kDataPhases>(g.tiling.width, p, ctas, ctx);
    return LaunchWidth<Variant::kData>(g.tiling.width, p, ctas, ctx);
  } else {
    if (moments != nullptr)
      return LaunchWidth<Variant::kForwardMoments>(g.tiling.width, p, ctas, ctx);
    return LaunchWidth<Variant::kForward>(g.tiling.width, p, ctas, ctx);
  }
}

// What both passes ask of a shape before its geometry: equal strides of 1 or 2, channels in
// whole 64-channel tiles on both sides (input channels are the forward's K and backward data's
// N, and the other way round for output channels), a filter within the tap table, and tensors
// small enough for 32-bit tile counts and TMA's coordinates.
static_assert(kHaloTileK == kHaloTileN, "one channel check serves both passes");
bool ShapeTaken(const ConvShape& s) {
  if (s.stride_h != s.stride_w || s.stride_h < 1 || s.stride_h > 2 || s.c % kHaloTileK != 0 ||
      s.k % kHaloTileK != 0 || s.r * s.s > kMaxTaps) {
    return false;
  }
  return static_cast<int64_t>(s.n) * s.h * s.w * std::max(s.c, s.k) < (int64_t{1} << 40);
}

// The forward's geometry where the kernel takes shape `s` (ShapeTaken, Fits), else none: what
// both the check and the run use, built once per call.
std::optional<Geometry> ForwardTaken(const ConvShape& s) {
  if (!ShapeTaken(s)) return std::nullopt;
  Geometry g = ForwardGeometry(s);
  if (!Fits(g)) return std::nullopt;
  return g;
}

// Backward data where the kernel takes shape `s`: the geometry of each phase of dx that has
// pixels (one launch each), and of all of them at once (stride 2; one launch whose tiles share
// each band of dy, where a group's halos fit: GroupHaloBuffers).
struct DgradPlan {
  std::vector<Geometry> phases;
  std::optional<Geometry> fused;
};
std::optional<DgradPlan> BackwardDataTaken(const ConvShape& s) {
  if (!ShapeTaken(s)) return std::nullopt;
  DgradPlan plan;
  std::vector<DgradPhase> with_pixels;
  for (const DgradPhase& d : DgradPhases(s)) {
    if (d.shape.h == 0 || d.shape.w == 0) continue;  // no dx pixels in the phase
    // A phase no tap reaches has dx = 0 there, which this kernel does not write.
    if (d.shape.r == 0 || d.shape.s == 0) return std::nullopt;
    Geometry g = DgradGeometry(s, {d});
    if (!Fits(g)) return std::nullopt;
    plan.phases.push_back(g);
    with_pixels.push_back(d);
  }
  if (with_pixels.size() > 1) {
    Geometry g = DgradGeometry(s, with_pixels);
    if (Fits(g)) plan.fused = g;
  }
  return plan;
}

}  // namespace

bool HaloForwardTakes(const ConvShape& s) { return ForwardTaken(s).has_value(); }

absl::Status HaloForwardRun(const ConvShape& s, const int* count, const int* index, int stride,
                            const void* x, const void* w, const float* bias, void* y,
                            const CudaContext& ctx, float* moments) {
  const std::optional<Geometry> g = ForwardTaken(s);
  if (!g) return absl::InvalidArgumentError("halo conv: shape not taken");
  if (moments != nullptr && bias != nullptr) {
    return absl::InvalidArgumentError("halo conv: moments are of an output without a bias");
  }
  return Run<false>(*g, StreamHaloBuffers(*g), {x, s.n, s.h, s.w, s.c},
                    {y, s.n, s.ho(), s.wo(), s.k}, w, s.k, s.r * s.s, s.c, count, index, stride,
                    bias, moments, ctx);
}

int HaloForwardMomentSlices(const ConvShape& s, const CudaContext& ctx) {
  const std::optional<Geometry> g = ForwardTaken(s);
  if (!g) return 0;
  const Tiles tiles = CountTiles(*g, s.n, s.k);
  return 2 * PersistentCtas(tiles.count, tiles.n_tiles, ctx);
}

bool HaloBackwardDataTakes(const ConvShape& s) { return BackwardDataTaken(s).has_value(); }

bool HaloBackwardDataPhasesTakes(const ConvShape& s) {
  const std::optional<DgradPlan> plan = BackwardDataTaken(s);
  return plan && plan->fused;
}

absl::Status HaloBackwardDataRun(const ConvShape& s, const int* count, const int* index, int stride,
                                 const void* dy, const void* w, void* dx, const CudaContext& ctx,
                                 bool one_launch) {
  const std::optional<DgradPlan> plan = BackwardDataTaken(s);
  if (!plan) return absl::InvalidArgumentError("halo conv backward data: shape not taken");
  const Nhwc in{dy, s.n, s.ho(), s.wo(), s.k}, out{dx, s.n, s.h, s.w, s.c};
  const int taps = s.r * s.s;
  if (one_launch && plan->fused) {
    const int buffers = GroupHaloBuffers(*plan->fused, stride / taps);
    if (buffers > 0) {
      return Run<true>(*plan->fused, buffers, in, out, w, s.k, taps, s.c, count, index, stride,
                       nullptr, nullptr, ctx);
    }
  }
  // One launch per phase of dx, each over all of dy, stored through a strided view of dx.
  for (const Geometry& g : plan->phases) {
    TOPIARY_RETURN_IF_ERROR(Run<true>(g, StreamHaloBuffers(g), in, out, w, s.k, taps, s.c, count,
                                      index, stride, nullptr, nullptr, ctx));
  }
  return absl::OkStatus();
}

}  // namespace topiary::kernels
