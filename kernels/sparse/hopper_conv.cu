// Hopper block-sparse convolution passes (hopper_conv.h): CUTLASS's sm90 implicit-GEMM
// collectives (TMA im2col producer, wgmma consumer, TMA-store epilogue with a per-channel
// bias) inside Topiary's kernel, which hands each output tile its own list of kept K tiles
// and walks the output tiles with a persistent grid.
//
// Why a kernel of our own: CUTLASS's kernels give every output tile the same K-tile count and
// walk K in order. Here the producer's K iterator yields the tile's kept K-tile coordinates
// (the collective's load copies tile *it, then ++it), and both producer and consumers run the
// tile's own count. The pipeline stays in step because both sides advance by that count.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cute/tensor.hpp>
#include <limits>
#include <string>
#include <utility>

// clang-format off
// Before the builders, which use it without including it.
#include "cutlass/kernel_hardware_info.hpp"
// clang-format on
#include "absl/strings/str_format.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/detail.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/pipeline/pipeline.hpp"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"
#include "kernels/runtime/fast_divmod.h"
#include "kernels/runtime/moments.h"
#include "kernels/sparse/dgrad_phases.h"
#include "kernels/sparse/halo_conv.h"
#include "kernels/sparse/hopper_conv.h"
#include "kernels/sparse/persistent_ctas.h"
#include "util/status_macros.h"

namespace topiary::kernels {
namespace {

using namespace cute;  // NOLINT: CuTe's layout algebra reads as a language

using cutlass::conv::Operator;

// The divisors that turn a kept-tile list entry t = c_tile + c_tiles * (s + S * r) (kept_tiles.h)
// into the collective's K-tile coordinate (c_tile, s, r), by a multiply-high each
// (FastDivmod: a runtime division is about 20 instructions): its K-tile shape's first two
// modes, set on the host from the problem each phase runs (LaunchPhases).
struct KTileDivisors {
  FastDivmod channel_tiles, columns;
  CUTE_DEVICE auto Coord(int entry) const {
    int taps, row;
    const int channel_tile = channel_tiles.Mod(entry, &taps);
    const int column = columns.Mod(taps, &row);
    return make_coord(channel_tile, column, row);
  }
};

// The collective's producer walk over one output tile's `count` kept K tiles: *it is the
// coordinate of the current one in the collective's K-tile shape. The collective asks for it
// after it has waited for a free stage and issues the stage's loads right after, so that is
// the work between a freed stage and its loads: the decode above, on an entry ++ has already
// read (the list's load overlaps the wait). Measured (H200, 2026-12-03, against idx2crd after
// the wait): every im2col configuration faster, the 64-wide tiles most (layer4 at 50% kept,
// 128x64x64: 0.080 -> 0.059 ms), the pingpong 128x128 tiles 5% (layer3 s2 forward 0.0541 ->
// 0.0516); reading the entry after the wait instead gave about half of that.
struct KeptTileWalk {
  const int* next;  // the entry after the current one
  int entry;        // the current one
  int left;         // entries from the current one on
  KTileDivisors div;
  CUTE_DEVICE KeptTileWalk(const int* list, int count, const KTileDivisors& d)
      : next(list + 1), entry(count > 0 ? *list : 0), left(count), div(d) {}
  CUTE_DEVICE auto operator*() const { return div.Coord(entry); }
  CUTE_DEVICE KeptTileWalk& operator++() {
    if (--left > 0) entry = *next++;
    return *this;
  }
};

// CUTLASS's sm90 implicit-GEMM mainloop of pass Op for a CTA tile, with two consumer
// warpgroups along M. CUTLASS builds conv mainloops for one consumer warpgroup only (its
// dispatch policy rejects the cooperative schedule because its kernel is not persistent); the
// collective itself runs any warpgroup count: the same mainloop with a TiledMma of two
// warpgroups. kMajorA/B: which of the operands' modes is contiguous (K or MN), as CUTLASS's
// builder lays them out; kCarveout: shared memory the kernel keeps for its epilogue.
template <Operator Op, class Tile, GMMA::Major kMajorA, GMMA::Major kMajorB, int kCarveout>
struct TwoGroupMainloop {
  using Bf16 = cutlass::bfloat16_t;
  using Nhwc = cutlass::layout::TensorNHWC;
  using OneGroup = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Op, Bf16, Nhwc, 8, Bf16, Nhwc, 8, float,
      Tile, Shape<_1, _1, _1>, cutlass::conv::collective::StageCountAutoCarveout<kCarveout>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using TiledMma =
      decltype(make_tiled_mma(GMMA::ss_op_selector<Bf16, Bf16, float, Tile, kMajorA, kMajorB>(),
                              Layout<Shape<_2, _1, _1>>{}));
  using OneGroupType = OneGroup;
  using Type = cutlass::conv::collective::CollectiveConv<
      typename OneGroup::DispatchPolicy, Tile, Bf16, Bf16, TiledMma,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<
          typename OneGroup::GmemTiledCopyA, typename OneGroup::SmemLayoutA>,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<
          typename OneGroup::GmemTiledCopyB, typename OneGroup::SmemLayoutB>>;
};

// Pingpong: the consumer warpgroups take turns to multiply and to store. Multiplying in turn
// keeps each within one round of the pipeline's stages of the producer (a warpgroup waiting for
// stages more than a round ahead would see an earlier fill's phase and read the wrong tile);
// storing in turn, because they share the epilogue's shared memory and barrier.
using Turns = cutlass::OrderedSequenceBarrier<2, 2>;

// One configuration of pass Op (kFprop or kDgrad): a CTA tile of BM output pixels x BN output
// channels x BK reduction channels of one tap, computed by two consumer warpgroups that split
// BM (one warpgroup measured at half cuDNN's speed: it cannot hide the epilogue). Pingpong:
// each warpgroup takes every other BM x BN tile of the CTA instead, so that one stores its
// tile while the other multiplies the next: the epilogue no longer stalls the tensor cores,
// which matters most where few K tiles are kept.
//
// kWideStores (pingpong only): the epilogue stores the tile in 64 x BN pieces (a 128-pixel
// tile in two, both staged in shared memory at once; a 256-pixel one in four, two at a time)
// instead of CUTLASS's choice, 64 x 32 pieces two at a time (each store waits for the TMA unit
// to have read the piece two before it, behind the producer's loads). Measured (H200, 2026-12-03,
// docs/PERFORMANCE.md): faster for 64-wide pingpong tiles (layer4 64x64 forward at 50% kept 0.0487
// -> 0.0477 ms) and in the phased launches, whose one-tap tiles are mostly stores (layer4 s2
// 128x128 backward data at 25%, 128x128x64 pingpong 0.0399 -> 0.0372), slower for 128-wide tiles
// elsewhere (layer4 128x128 forward 0.0403 -> 0.0420: the staging takes a stage) and for
// cooperative tiles.
template <Operator Op, int BM, int BN, int BK, bool kPingpongTiles = false,
          bool kWideStores = false>
struct Config {
  static_assert(kPingpongTiles || !kWideStores, "wide stores are measured for pingpong tiles");
  static constexpr Operator kOp = Op;
  static constexpr bool kPingpong = kPingpongTiles;
  using Problem = cutlass::conv::ConvProblemShape<Op, 2>;
  using Tile = Shape<Int<BM>, Int<BN>, Shape<Int<BK>>>;
  using Cluster = Shape<_1, _1, _1>;
  using Bf16 = cutlass::bfloat16_t;
  using Nhwc = cutlass::layout::TensorNHWC;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      std::conditional_t<kWideStores, Shape<_64, Int<BN>>,
                         cutlass::epilogue::collective::EpilogueTileAuto>,
      float, float, void, Nhwc, 8, Bf16, Nhwc, 8,
      std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized,
                         cutlass::epilogue::TmaWarpSpecializedCooperative>,
      cutlass::epilogue::fusion::LinCombPerColBias<Bf16, float, float, void, float>>::CollectiveOp;
  // The filter is K-major for forward and MN-major for backward data (its [K, R, S, C]
  // layout read transposed). The carveout leaves room for the epilogue and the warpgroups'
  // turns.
  // The forward pass's batch-norm moments: per warp and output channel, a sum and a sum of
  // squares (MomentSums below).
  static constexpr int kMomentBytes = 8 * BN * 2 * sizeof(float);
  using Mainloops = TwoGroupMainloop<Op, Tile, GMMA::Major::K,
                                     Op == Operator::kFprop ? GMMA::Major::K : GMMA::Major::MN,
                                     static_cast<int>(sizeof(typename Epilogue::SharedStorage) +
                                                      sizeof(Turns::SharedStorage) + kMomentBytes)>;
  using Mainloop =
      std::conditional_t<kPingpong, typename Mainloops::OneGroupType, typename Mainloops::Type>;
};

// Who a thread is in the warp-specialized CTA: warpgroup 0 produces (one warp issues the TMA
// loads), the others consume (wgmma and the output).
struct Roles {
  int warp = cutlass::canonical_warp_idx_sync();
  int warp_group = cutlass::canonical_warp_group_idx();
  int group_thread = static_cast<int>(threadIdx.x) % cutlass::NumThreadsPerWarpGroup;
  bool producer = warp_group == 0 && warp % cutlass::NumWarpsPerWarpGroup == 0;
  bool consumer = warp_group > 0;
};

// The mainloop pipeline's parameters for this thread: producer or consumer, the warpgroup
// leader, how many threads consume and the bytes each stage's TMA loads bring.
template <class Mainloop>
CUTLASS_DEVICE typename Mainloop::MainloopPipeline::Params MainloopPipelineParams(
    const Roles& roles, int mma_threads, uint32_t transaction_bytes) {
  using Pipeline = typename Mainloop::MainloopPipeline;
  typename Pipeline::Params mp;
  if (roles.producer) mp.role = Pipeline::ThreadCategory::Producer;
  if (roles.consumer) mp.role = Pipeline::ThreadCategory::Consumer;
  mp.is_leader = roles.group_thread == 0;
  mp.num_consumers = mma_threads;
  mp.transaction_bytes = transaction_bytes;
  return mp;
}

// Per thread after setmaxnreg: the register file is 64K, so 128 x 40 + 256 x 232 fits. The
// producer warpgroup needs few registers; the consumers hold the accumulators.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;

// kPhased: the launch runs the phases of backward data at stride > 1 (Params::phases); else
// one problem, whose operands' views and epilogue are set up once per CTA (per tile they
// cost the forward 30% at layer4: measured).
template <class C, bool kPhased = false>
struct SparseConv {
  using Mainloop = typename C::Mainloop;
  using Epilogue = typename C::Epilogue;
  using Tile = typename C::Tile;
  using TiledMma = typename Mainloop::TiledMma;
  using ProblemMNKL = decltype(Mainloop::get_problem_shape_MNKL(typename C::Problem{}));
  static constexpr bool kPingpong = C::kPingpong;
  // Threads that consume each pipeline stage: a tile's warpgroups (one pingpong, else two).
  static constexpr int kMmaThreads = size(TiledMma{});
  static constexpr int kThreads = 3 * cutlass::NumThreadsPerWarpGroup;  // producer, 2 consumers
  static constexpr int kBM = size<0>(Tile{}), kBN = size<1>(Tile{});
  // Warps whose sums one moment slot merges: a tile's (cooperative) or a warpgroup's.
  static constexpr int kMomentWarps = kMmaThreads / cutlass::NumThreadsPerWarp;

  struct SharedStorage {
    struct Pipelines {
      alignas(16) typename Mainloop::PipelineStorage mainloop;
      alignas(16) typename Epilogue::PipelineStorage epi_load;
      alignas(16) typename Turns::SharedStorage turns;
    } pipelines;
    // Per consumer warp (8) and output channel of the tile: the sum and sum of squares of
    // its rows (forward with moments).
    float moment_sums[8][kBN][2];
    struct Tensors : cute::aligned_struct<128, _1> {
      typename Epilogue::TensorStorage epilogue;
      typename Mainloop::TensorStorage mainloop;
    } tensors;
  };
  // What the carveout must have left: sm_90's most shared memory per block.
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "the stages overflow shared memory");

  // One problem of the launch: the layer's, or one phase of backward data at stride > 1
  // (dgrad_phases.h), whose filter and dx are strided views of the layer's. Its output tiles
  // are the launch's tiles [tile_begin, tile_begin + its tiles).
  struct Phase {
    ProblemMNKL problem;
    typename Mainloop::Params mainloop;
    typename Epilogue::Params epilogue;
    int taps;  // the filter taps of its problem
    int tile_begin;
    KTileDivisors k_tiles;  // of its K-tile shape
  };
  // A launch runs up to a 2 x 2 stride's phases: one persistent grid over all their tiles, so
  // that the small phases share one tail instead of each leaving the GPU idle at its end.
  static constexpr int kMaxPhases = kPhased ? 4 : 1;

  struct Params {
    Phase phases[kMaxPhases];
    int phase_count;
    int tiles;         // over all phases
    const int* count;  // kept K tiles per output-channel tile
    const int* index;  // their numbers, `stride` per output-channel tile
    int stride;
    // The lists are made for list_taps filter taps (the layer's); a phase reads the first
    // `taps` of them: the lists name the same channel tiles at every tap, in tap order.
    int list_taps;
    CUTLASS_DEVICE int k_tiles(int n, int taps) const { return count[n] / list_taps * taps; }
    // The phase of a launch tile: the last whose first tile is at most it.
    CUTLASS_DEVICE int phase_of(int tile) const {
      int p = 0;
      while (p + 1 < phase_count && phases[p + 1].tile_begin <= tile) ++p;
      return p;
    }
    // Whether the phases' tiles interleave: pixel tile by pixel tile, each phase's channel
    // tiles in turn (phases of equal extent). Then the CTAs at work read one stretch of dy at a
    // time, as one phase's would, not one per phase: measured 1-15% faster at 50% and 25% kept
    // than phase after phase (docs/PERFORMANCE.md).
    bool interleaved = false;
    // Forward: the batch-norm moments of the output (hopper_conv.h), [3][slots][channels]
    // (count, mean, M2), or null; `pixels` rows (the GEMM's M) of `channels`.
    float* moments = nullptr;
    int64_t pixels = 0;
    int channels = 0;
  };

  // The moments' slot a consumer thread merges into: one per CTA, or per warpgroup with
  // pingpong tiles (the warpgroups merge different tiles at the same time), and the thread's
  // column within a tile (it owns every channel congruent to it modulo kBN: so it alone reads
  // and writes them, in program order).
  static CUTLASS_DEVICE int MomentSlot(int group) {
    return kPingpong ? 2 * static_cast<int>(blockIdx.x) + group : static_cast<int>(blockIdx.x);
  }

  // Adds this tile's output to the slot's per-channel (count, mean, M2). Each thread sums its
  // rows of each of its columns; the 8 lanes that share a set of columns reduce-scatter those
  // sums by shuffles (three halvings: each lane ends with one column of every 8); the warps'
  // sums meet in shared memory, and the owner of each column adds them in warp order and
  // merges the tile into `run`, the slot's running summary of that column, which it loaded
  // before the tile's mainloop. Deterministic: a CTA's tiles come in a fixed order.
  //
  // The sums are of y as stored: the accumulators rounded to bf16, as the epilogue rounds them
  // (no bias, alpha 1), so that the batch norm normalizes y with y's own statistics, as it
  // would computing them itself, up to the order of the fp32 sums. (Statistics of the fp32
  // accumulators differ by a fraction of a bf16 step; measured in a narrow resnet50, enough
  // to flip the rounding of a few percent of the normalized values, which a network at
  // initialization amplifies tenfold.) Rows past the output (the last pixel tile) hold exact
  // zeros:
  // TMA fills the pixels past the batch with zeros, so they add nothing; only the count
  // excludes them. REQUIRES: every consumer thread of the tile (both warpgroups, or this
  // pingpong warpgroup) calls it.
  template <class Acc>
  static CUTLASS_DEVICE void AddMoments(const Params& p, const Acc& acc, int tile, int n_tiles,
                                        int mma_thread, int group, const float (&run)[3],
                                        float (&sums)[8][kBN][2]) {
    // Value (c, h, j) of mode 0 of an m64nN atom's accumulators: row h * 8 + lane / 4 of the
    // warp's 16, column 8j + 2 (lane % 4) + c.
    static_assert(rank(Acc{}) == 3 && size<0, 0>(Acc{}) == 2 && size<0, 1>(Acc{}) == 2 &&
                      size<2>(Acc{}) == 1 && size<0, 2>(Acc{}) * 8 == kBN,
                  "wgmma accumulators: ((2 columns, 2 rows, BN/8), M repeats, 1) per thread");
    constexpr int kJ = size<0, 2>(Acc{});  // column groups of 8: a chunk is 4 of them
    static_assert(kJ % 4 == 0, "chunks of 32 columns");
    const int lane = static_cast<int>(threadIdx.x) % cutlass::NumThreadsPerWarp;
    const int warp = kPingpong ? group * kMomentWarps + mma_thread / cutlass::NumThreadsPerWarp
                               : mma_thread / cutlass::NumThreadsPerWarp;
    const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
    CUTE_UNROLL
    for (int chunk = 0; chunk < kJ / 4; ++chunk) {
      // a[2i], a[2i + 1]: the sum and sum of squares of the chunk's column i (j = 4 chunk +
      // i / 2, c = i % 2) over this thread's rows.
      float a[16];
      CUTE_UNROLL
      for (int jj = 0; jj < 4; ++jj) {  // columns i = 2 jj and 2 jj + 1: one bf16 pair
        float s0 = 0.0f, q0 = 0.0f, s1 = 0.0f, q1 = 0.0f;
        CUTE_UNROLL
        for (int mm = 0; mm < size<1>(acc); ++mm) {
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            const int j = 4 * chunk + jj;
            const float2 v = __bfloat1622float2(
                __float22bfloat162_rn(make_float2(acc(make_coord(make_coord(0, h, j), mm, 0)),
                                                  acc(make_coord(make_coord(1, h, j), mm, 0)))));
            s0 += v.x;
            q0 = fmaf(v.x, v.x, q0);
            s1 += v.y;
            q1 = fmaf(v.y, v.y, q1);
          }
        }
        a[4 * jj] = s0;
        a[4 * jj + 1] = q0;
        a[4 * jj + 2] = s1;
        a[4 * jj + 3] = q1;
      }
      // Halvings over lane bits 4, 3 and 2: keep the half the bit names, send the other.
      float b[8], c[4], d[2];
      CUTE_UNROLL
      for (int i = 0; i < 8; ++i) {
        const float got = __shfl_xor_sync(0xffffffffu, b4 ? a[i] : a[8 + i], 16);
        b[i] = (b4 ? a[8 + i] : a[i]) + got;
      }
      CUTE_UNROLL
      for (int i = 0; i < 4; ++i) {
        const float got = __shfl_xor_sync(0xffffffffu, b3 ? b[i] : b[4 + i], 8);
        c[i] = (b3 ? b[4 + i] : b[i]) + got;
      }
      CUTE_UNROLL
      for (int i = 0; i < 2; ++i) {
        const float got = __shfl_xor_sync(0xffffffffu, b2 ? c[i] : c[2 + i], 4);
        d[i] = (b2 ? c[2 + i] : c[i]) + got;
      }
      // This lane's column of the chunk: i = 4 b4 + 2 b3 + b2.
      const int i = 4 * b4 + 2 * b3 + b2;
      const int col = 8 * (4 * chunk + i / 2) + 2 * (lane % 4) + i % 2;
      sums[warp][col][0] = d[0];
      sums[warp][col][1] = d[1];
    }
    const int64_t m0 = static_cast<int64_t>(tile / n_tiles) * kBM;
    const int rows = static_cast<int>(cute::min(static_cast<int64_t>(kBM), p.pixels - m0));
    const int barrier = static_cast<int>(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier) +
                        (kPingpong ? group : 0);
    cutlass::arch::NamedBarrier::sync(kMmaThreads, barrier);
    const int owner = mma_thread;
    float s = 0.0f, q = 0.0f;
    if (owner < kBN) {
      const int first = kPingpong ? group * kMomentWarps : 0;
      for (int w = first; w < first + kMomentWarps; ++w) {
        s += sums[w][owner][0];
        q += sums[w][owner][1];
      }
    }
    cutlass::arch::NamedBarrier::sync(kMmaThreads, barrier);  // the sums may be written again
    const int channel = (tile % n_tiles) * kBN + owner;
    if (owner >= kBN || channel >= p.channels || rows <= 0) return;
    float n = run[0], mean = run[1], m2 = run[2];
    const float nb = static_cast<float>(rows), meanb = s / nb;
    MergeMoments(n, mean, m2, nb, meanb, fmaxf(q - s * meanb, 0.0f));
    const int64_t plane = static_cast<int64_t>(MomentSlots(p)) * p.channels;
    float* at = p.moments + static_cast<int64_t>(MomentSlot(group)) * p.channels + channel;
    at[0] = n;
    at[plane] = mean;
    at[2 * plane] = m2;
  }
  static CUTLASS_DEVICE int MomentSlots(const Params&) {
    return kPingpong ? 2 * static_cast<int>(gridDim.x) : static_cast<int>(gridDim.x);
  }

  // The producer's loads of an output tile's `count` kept K tiles (`list`) for the 64-wide
  // tiles and the phased launches: the collective's load (KeptTileWalk above) with each stage's TMA
  // coordinates made before the wait for the free stage, so that after the wait come only the
  // loads. (The collective makes both coordinates after the wait, through the im2col view, which
  // divides the tile's pixel index into image, row and column again for every K tile.) Here the
  // pixel part is made once per tile (pixel tile 0's view at the K tile plus the tile's pixels less
  // pixel tile 0's: the two parts of an im2col coordinate add), and the next K tile's
  // coordinates right after this one's loads, from an entry read a K tile earlier. Measured
  // (H200, 2026-12-03, against KeptTileWalk): the 64-wide tiles 2-10% faster (layer4 at 50%
  // kept, 128x64x64 pingpong 0.0587 -> 0.0552 ms, its stride-2 backward data 0.086 -> 0.079),
  // but the 128-wide tiles of one-problem launches 2-3% slower (layer3 s2's forward, 128x128x64
  // pingpong, 0.0517 -> 0.0527; Nsight shows the same memory throughput and fewer issued
  // instructions, why we have not found), while in phased launches (backward data at stride 2)
  // they gain too (layer4 s2 at 50% kept, 128x128x64 pingpong 0.0620 -> 0.0576, 256x128x64 2wg
  // 0.0575 -> 0.0572): so the 64-wide tiles and the phased launches take it.
  template <class Pipeline, class State, class Inputs, class BlockCoord>
  static CUTLASS_DEVICE void Load(const typename Mainloop::Params& mp, Pipeline& pipeline,
                                  State state, const Inputs& inputs, const BlockCoord& blk,
                                  const int* list, int count, const KTileDivisors& div,
                                  typename Mainloop::TensorStorage& smem) {
    if (!cute::elect_one_sync() || count <= 0) return;
    auto tma_a = mp.tma_load_a.get_slice(0);
    auto tma_b = mp.tma_load_b.get_slice(0);
    Tensor gA = tma_a.partition_S(get<0>(inputs)(_, _, get<0>(blk), _));  // (TMA, M, K, k)
    Tensor gA0 = tma_a.partition_S(get<0>(inputs)(_, _, 0, _));
    Tensor gB = tma_b.partition_S(get<1>(inputs)(_, _, get<1>(blk), _));
    Tensor sA = tma_a.partition_D(
        make_tensor(make_smem_ptr(smem.smem_A.data()), typename Mainloop::SmemLayoutA{}));
    Tensor sB = tma_b.partition_D(
        make_tensor(make_smem_ptr(smem.smem_B.data()), typename Mainloop::SmemLayoutB{}));
    const auto k0 = make_coord(0, 0, 0);
    const auto pixels = gA(_, _, _, k0)(Int<0>{}) - gA0(_, _, _, k0)(Int<0>{});
    auto coords = [&](int entry) {
      const auto k = div.Coord(entry);
      return cute::make_tuple(gA0(_, _, _, k)(Int<0>{}) + pixels, gB(_, _, _, k)(Int<0>{}));
    };
    // TMA views at these coordinates: A's, whose one box's coordinate the copy reads from
    // its first element, and B's, the slice's boxes (an MN-major filter tile may take two)
    // moved to the coordinate.
    static_assert(decltype(size<1>(gA) * size<2>(gA))::value == 1, "one im2col box per stage");
    auto at_a = [](const auto& coord, const auto& like) {
      const auto s = shape(like);
      return make_tensor(make_inttuple_iter(coord), make_layout(s, repeat_like(s, Int<0>{})));
    };
    auto at_b = [](const auto& coord, const auto& like) {
      return make_tensor(make_inttuple_iter(coord), like.layout());
    };
    auto next = coords(list[0]);
    int ahead = count > 1 ? list[1] : 0;
    for (int i = 0; i < count; ++i) {
      const auto now = next;
      pipeline.producer_acquire(state);
      auto* barrier = pipeline.producer_get_barrier(state);
      const int stage = state.index();
      copy(mp.tma_load_a.with(*barrier), at_a(get<0>(now), gA(_, _, _, k0)), sA(_, _, _, stage));
      copy(mp.tma_load_b.with(*barrier), at_b(get<1>(now), gB(_, _, _, k0)), sB(_, _, _, stage));
      ++state;
      if (i + 1 < count) {
        next = coords(ahead);
        if (i + 2 < count) ahead = list[i + 2];
      }
    }
  }

  static CUTLASS_DEVICE void Run(const Params& params, char* smem) {
    using Pipeline = typename Mainloop::MainloopPipeline;
    using EpiLoadPipeline = typename Epilogue::LoadPipeline;
    using EpiStorePipeline = typename Epilogue::StorePipeline;
    SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem);
    const Roles roles;
    const bool producer = roles.producer, consumer = roles.consumer;
    if (roles.warp == 0 && cute::elect_one_sync()) {
      for (int p = 0; p < params.phase_count; ++p) {
        Mainloop::prefetch_tma_descriptors(params.phases[p].mainloop);
        Epilogue::prefetch_tma_descriptors(params.phases[p].epilogue);
      }
    }
    // The tiles' shapes, and so the bytes a stage brings, are the same in every phase.
    const Phase& first = params.phases[0];
    Pipeline pipeline(
        ss.pipelines.mainloop,
        MainloopPipelineParams<Mainloop>(roles, kMmaThreads, first.mainloop.tma_transaction_bytes),
        typename C::Cluster{});

    typename EpiLoadPipeline::Params ep;
    if (producer) ep.role = EpiLoadPipeline::ThreadCategory::Producer;
    if (consumer) ep.role = EpiLoadPipeline::ThreadCategory::Consumer;
    ep.dst_blockid = cute::block_rank_in_cluster();
    ep.producer_arv_count = cutlass::NumThreadsPerWarp;
    ep.consumer_arv_count = kMmaThreads;
    if constexpr (Epilogue::RequiresTransactionBytes) {
      ep.transaction_bytes = first.epilogue.tma_transaction_bytes;
    }
    EpiLoadPipeline epi_load(ss.pipelines.epi_load, ep);
    typename EpiStorePipeline::Params sp;
    sp.always_wait = true;
    EpiStorePipeline epi_store(sp);
    const int group = roles.consumer ? roles.warp_group - 1 : 0;  // consumer warpgroup 0 or 1
    typename Turns::Params tp;
    tp.group_id = group;
    tp.group_size = cutlass::NumThreadsPerWarpGroup;
    Turns turns(ss.pipelines.turns, tp);
    __syncthreads();  // the barriers are initialized before anyone waits on them

    Mainloop mainloop;
    // Output tiles phase by phase (or interleaved, Params::interleaved), and within a phase
    // output-channel tiles fastest (neighbouring CTAs share activations in L2), each CTA
    // taking every gridDim.x-th: a persistent grid, so that the producer loads the next tile's
    // operands while the consumers store this one's. A tile's place: its phase, its number
    // there and its channel tile. The phase is an index into params.phases, not a pointer: with
    // a pointer the compiler read the phase's fields through generic loads (52 LD.E per phased
    // kernel, where an index gives indexed constant loads), which made the phased launches 1-7%
    // slower (H200, 2026-12-03; docs/PERFORMANCE.md).
    struct Place {
      int phase;
      int local, n;
    };
    // The first problem's operand views and epilogue; a phased launch makes each tile's own.
    const auto first_inputs = mainloop.load_init(first.problem, first.mainloop);
    Epilogue first_epilogue(first.epilogue, ss.tensors.epilogue);
    auto inputs = [&](const Phase& ph) {
      if constexpr (kPhased) {
        return mainloop.load_init(ph.problem, ph.mainloop);
      } else {
        return first_inputs;
      }
    };
    auto with_epilogue = [&](const Phase& ph, auto&& f) {
      if constexpr (kPhased) {
        Epilogue epilogue(ph.epilogue, ss.tensors.epilogue);
        return f(epilogue);
      } else {
        return f(first_epilogue);
      }
    };
    // Every phase has the layer's channels, so the same channel tiles.
    const int n_tiles = size(shape<2>(get<1>(first_inputs)));
    auto place = [&](int tile) {
      if constexpr (!kPhased) return Place{0, tile, tile % n_tiles};
      if (params.interleaved) {
        const int group = params.phase_count * n_tiles;
        const int m = tile / group, rem = tile % group;
        return Place{rem / n_tiles, m * n_tiles + rem % n_tiles, rem % n_tiles};
      }
      const int p = params.phase_of(tile);
      const int local = tile - params.phases[p].tile_begin;
      return Place{p, local, local % n_tiles};
    };
    // (BM, BK, m tiles, (channel tiles, S, R)) and (BN, BK, n tiles, (channel tiles, S, R)).
    auto coord = [&](const auto& load_inputs, const Place& at) {
      return make_coord(idx2crd(at.local / n_tiles, shape<2>(get<0>(load_inputs))),
                        idx2crd(at.n, shape<2>(get<1>(load_inputs))), _, Int<0>{});
    };
    TiledMma tiled_mma;

    if (roles.warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
      if (producer) {
        typename Mainloop::PipelineState state = cutlass::make_producer_start_state<Pipeline>();
        auto epi_state = cutlass::make_producer_start_state<EpiLoadPipeline>();
        for (int tile = blockIdx.x; tile < params.tiles; tile += gridDim.x) {
          const Place at = place(tile);
          const Phase& ph = params.phases[at.phase];
          const int k_tiles = params.k_tiles(at.n, ph.taps);
          const auto load_inputs = inputs(ph);
          const int* list = params.index + at.n * params.stride;
          if constexpr (kBN == 64 || kPhased) {  // measured: Load's comment
            Load(ph.mainloop, pipeline, state, load_inputs, coord(load_inputs, at), list, k_tiles,
                 ph.k_tiles, ss.tensors.mainloop);
          } else {
            mainloop.load(ph.mainloop, pipeline, state, load_inputs, coord(load_inputs, at),
                          KeptTileWalk(list, k_tiles, ph.k_tiles), k_tiles,
                          cutlass::canonical_lane_idx(), cute::block_rank_in_cluster(),
                          ss.tensors.mainloop);
          }
          state.advance(k_tiles);
          with_epilogue(ph, [&](Epilogue& epilogue) {
            if (epilogue.is_producer_load_needed()) {
              epi_state =
                  epilogue.load(epi_load, epi_state, ph.problem, Tile{}, coord(load_inputs, at),
                                tiled_mma, cutlass::canonical_lane_idx(), ss.tensors.epilogue);
            }
          });
        }
        mainloop.load_tail(pipeline, state);
        if (first_epilogue.is_producer_load_needed()) {
          first_epilogue.load_tail(epi_load, epi_state);
        }
      }
      return;
    }
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
    const int mma_thread =
        kPingpong ? roles.group_thread : threadIdx.x - cutlass::NumThreadsPerWarpGroup;
    typename Mainloop::PipelineState state;
    typename Epilogue::LoadPipelineState epi_load_state;
    auto epi_store_state = cutlass::make_producer_start_state<EpiStorePipeline>();
    // The moments' slot row, and the running summary of this thread's column of the tile.
    const bool moments = params.moments != nullptr;
    const int64_t slot_row = static_cast<int64_t>(MomentSlot(group)) * params.channels;
    const int64_t plane = static_cast<int64_t>(MomentSlots(params)) * params.channels;
    if (moments && mma_thread < kBN) {  // empty: count 0
      for (int c = mma_thread; c < params.channels; c += kBN) params.moments[slot_row + c] = 0.0f;
    }
    int turn = 0;  // the CTA's tiles so far
    for (int tile = blockIdx.x; tile < params.tiles; tile += gridDim.x, ++turn) {
      const Place at = place(tile);
      const Phase& ph = params.phases[at.phase];
      const int k_tiles = params.k_tiles(at.n, ph.taps);
      if (kPingpong && turn % 2 != group) {  // the other warpgroup's tile: skip its stages
        state.advance(k_tiles);
        continue;
      }
      float run[3] = {0.0f, 0.0f, 0.0f};  // loaded now, used after the mainloop
      const int channel = at.n * kBN + mma_thread;
      if (moments && mma_thread < kBN && channel < params.channels) {
        const float* at = params.moments + slot_row + channel;
        run[0] = at[0];
        run[1] = at[plane];
        run[2] = at[2 * plane];
      }
      Tensor acc = partition_fragment_C(tiled_mma, take<0, 2>(Tile{}));
      if constexpr (kPingpong) turns.wait();  // to multiply
      if (k_tiles > 0) {
        mainloop.mma(pipeline, state, acc, k_tiles, mma_thread, ss.tensors.mainloop, ph.mainloop);
        mainloop.mma_tail(pipeline, state, k_tiles);
        state.advance(k_tiles);
      } else {
        clear(acc);  // every block of this output tile pruned: the bias alone
      }
      if constexpr (kPingpong) {
        turns.arrive();
        turns.wait();  // to store
      }
      if (moments) {
        AddMoments(params, acc, at.local, n_tiles, mma_thread, group, run, ss.moment_sums);
      }
      with_epilogue(ph, [&](Epilogue& epilogue) {
        auto [load_next, store_next] =
            epilogue.store(epi_load, epi_load_state, epi_store, epi_store_state, ph.problem, Tile{},
                           coord(inputs(ph), at), acc, tiled_mma, mma_thread, ss.tensors.epilogue);
        epi_load_state = load_next;
        epi_store_state = store_next;
        if constexpr (kPingpong) {
          // Only the thread that issued a TMA store can wait for it: drain this tile's before
          // the other warpgroup writes the epilogue's shared memory.
          auto [load_tail, store_tail] =
              epilogue.store_tail(epi_load, epi_load_state, epi_store, epi_store_state);
          epi_load_state = load_tail;
          epi_store_state = store_tail;
        }
      });
      if constexpr (kPingpong) turns.arrive();
    }
    // Every CTA ran a tile: the grid never exceeds the tile count (PersistentCtas).
    if constexpr (!kPingpong) {
      first_epilogue.store_tail(epi_load, epi_load_state, epi_store, epi_store_state);
    }
  }
};

// The filter gradient's configuration: a CTA tile of BM output channels x BN input channels
// of one tap x BK output pixels. Both operands are MN-major (dy's channels and x's channels
// are contiguous; the pixels are the reduction), dy loaded by plain TMA and x by im2col.
template <int BM, int BN, int BK>
struct FilterConfig {
  static constexpr Operator kOp = Operator::kWgrad;
  // Two running sums besides the accumulators fit in registers up to 128 x 64 tiles (3 x 32
  // floats a thread); larger tiles run one phase.
  static constexpr bool kTwoPieces = BM * BN <= 128 * 64;
  using Problem = cutlass::conv::ConvProblemShape<kOp, 2>;
  using Tile = Shape<Int<BM>, Shape<Int<BN>>, Shape<Int<BK>>>;
  using Cluster = Shape<_1, _1, _1>;
  // No epilogue shared memory: the partial sums go from registers to global memory.
  using Mainloop = typename TwoGroupMainloop<kOp, Tile, GMMA::Major::MN, GMMA::Major::MN, 0>::Type;
};

// The producer's walk over a segment's pixel tiles: consecutive K tiles from `k`.
struct KTileRange {
  int k;
  CUTE_DEVICE int operator*() const { return k; }
  CUTE_DEVICE KTileRange& operator++() {
    ++k;
    return *this;
  }
};

// Backward filter over the kept tiles: CTA b runs segments cta_begin[b] .. cta_begin[b + 1]
// of the FilterSplit, each a run of one kept tile's pixel tiles, adds each segment's sums to
// its piece's running sum and, after the piece's last segment, stores that (row-major tile_m
// x tile_n fp32) to the piece's partial slot. Two running sums when kTwoPieces (several
// phases), one otherwise: each costs a tile's accumulators in registers.
template <class C>
struct SparseFilter {
  using Mainloop = typename C::Mainloop;
  using Tile = typename C::Tile;
  using TiledMma = typename Mainloop::TiledMma;
  using ProblemMNKL = decltype(Mainloop::get_problem_shape_MNKL(typename C::Problem{}));
  static constexpr int kMmaThreads = size(TiledMma{});
  static constexpr int kThreads = cutlass::NumThreadsPerWarpGroup + kMmaThreads;
  static constexpr int kBM = size<0>(Tile{}), kBN = size<1>(Tile{});
  static constexpr bool kTwoPieces = C::kTwoPieces;

  struct SharedStorage {
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    typename Mainloop::TensorStorage tensors;
  };

  struct Params {
    ProblemMNKL problem;
    typename Mainloop::Params mainloop;
    HopperFilterWork work;
  };

  static CUTLASS_DEVICE void Run(const Params& params, char* smem) {
    using Pipeline = typename Mainloop::MainloopPipeline;
    SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem);
    const Roles roles;
    if (roles.warp == 0 && cute::elect_one_sync()) {
      Mainloop::prefetch_tma_descriptors(params.mainloop);
    }
    Pipeline pipeline(
        ss.pipeline,
        MainloopPipelineParams<Mainloop>(roles, kMmaThreads, params.mainloop.tma_transaction_bytes),
        typename C::Cluster{});
    __syncthreads();  // the barriers are initialized before anyone waits on them

    const HopperFilterWork& w = params.work;
    Mainloop mainloop;
    auto load_inputs = mainloop.load_init(params.problem, params.mainloop);
    Tensor gA = get<0>(load_inputs);  // (BM, BK, output-channel tiles, pixel tiles)
    Tensor gB = get<1>(load_inputs);  // (BN, BK, (channel tiles, S, R), pixel tiles)
    auto coord = [&](int seg) {
      const int tile = w.kept_tiles[w.seg_tile[seg]];
      return make_coord(idx2crd(tile / w.n_tiles, shape<2>(gA)),
                        idx2crd(tile % w.n_tiles, shape<2>(gB)), _, Int<0>{});
    };
    const int first = w.cta_begin[blockIdx.x], last = w.cta_begin[blockIdx.x + 1];

    if (roles.warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
      if (roles.producer) {
        typename Mainloop::PipelineState state = cutlass::make_producer_start_state<Pipeline>();
        for (int seg = first; seg < last; ++seg) {
          const int k_tiles = w.seg_count[seg];
          mainloop.load(params.mainloop, pipeline, state, load_inputs, coord(seg),
                        KTileRange{w.seg_k[seg]}, k_tiles, cutlass::canonical_lane_idx(),
                        cute::block_rank_in_cluster(), ss.tensors);
          state.advance(k_tiles);
        }
        mainloop.load_tail(pipeline, state);
      }
      return;
    }
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
    const int mma_thread = threadIdx.x - cutlass::NumThreadsPerWarpGroup;
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_thread_slice(mma_thread);
    typename Mainloop::PipelineState state;
    Tensor sum0 = partition_fragment_C(tiled_mma, take<0, 2>(Tile{}));
    Tensor sum1 = partition_fragment_C(tiled_mma, take<0, 2>(Tile{}));
    clear(sum0);
    if constexpr (kTwoPieces) clear(sum1);
    for (int seg = first; seg < last; ++seg) {
      const int k_tiles = w.seg_count[seg], store = w.seg_store[seg];
      Tensor acc = partition_fragment_C(tiled_mma, take<0, 2>(Tile{}));
      mainloop.mma(pipeline, state, acc, k_tiles, mma_thread, ss.tensors, params.mainloop);
      mainloop.mma_tail(pipeline, state, k_tiles);
      state.advance(k_tiles);
      auto add_and_store = [&](auto& sum) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc); ++i) sum(i) += acc(i);
        if (store < 0) return;
        Tensor out = make_tensor(
            make_gmem_ptr(w.partials + static_cast<int64_t>(store) * kBM * kBN),
            make_layout(take<0, 2>(Tile{}), make_stride(Int<kBN>{}, make_stride(Int<1>{}))));
        Tensor thread_out = thread_mma.partition_C(out);
        CUTE_UNROLL
        for (int i = 0; i < size(sum); ++i) thread_out(i) = sum(i);
        clear(sum);
      };
      if (kTwoPieces && w.seg_piece[seg] == 1) {
        add_and_store(sum1);
      } else {
        add_and_store(sum0);
      }
    }
  }
};

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1)
    SparseConvKernel(const __grid_constant__ typename K::Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem[];
  K::Run(params, smem);
#endif
}

// dw[k, tap, c] for 8 channels per thread: its kept tile's partial slots added in order, or
// 0 outside the kept tiles. REQUIRES C % tile_n == 0 (8 channels lie in one tile).
__global__ void GatherFilterKernel(ConvShape s, HopperFilterWork w, uint4* __restrict__ dw) {
  const int row = s.r * s.s * s.c, c_tiles = s.c / w.tile_n;
  const int64_t groups = static_cast<int64_t>(s.k) * row / 8;
  const int64_t tile = static_cast<int64_t>(w.tile_m) * w.tile_n;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = g * 8;
    const int k = static_cast<int>(e / row), in_row = static_cast<int>(e % row);
    const int tap = in_row / s.c, c = in_row % s.c;
    const int slot = w.slot[(k / w.tile_m) * w.n_tiles + c / w.tile_n + c_tiles * tap];
    float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (slot >= 0) {
      const int64_t at = static_cast<int64_t>(k % w.tile_m) * w.tile_n + c % w.tile_n;
      for (int p = w.tile_begin[slot]; p < w.tile_begin[slot + 1]; ++p) {
        const float4* q = reinterpret_cast<const float4*>(w.partials + p * tile + at);
        const float4 lo = q[0], hi = q[1];
        sum[0] += lo.x, sum[1] += lo.y, sum[2] += lo.z, sum[3] += lo.w;
        sum[4] += hi.x, sum[5] += hi.y, sum[6] += hi.z, sum[7] += hi.w;
      }
    }
    uint4 packed;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&packed);
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(sum[2 * i], sum[2 * i + 1]);
    dw[g] = packed;
  }
}

// CUTLASS's problem for a shape, with its upper padding (ConvShape's is the lower's).
template <class P>
P Problem(const ConvShape& s, int pad_h_hi, int pad_w_hi) {
  return P(cutlass::conv::Mode::kCrossCorrelation, {s.n, s.h, s.w, s.c}, {s.k, s.r, s.s, s.c},
           {s.pad_h, s.pad_w}, {pad_h_hi, pad_w_hi}, {s.stride_h, s.stride_w}, {1, 1}, 1);
}
template <class P>
P Problem(const ConvShape& s) {
  return Problem<P>(s, s.pad_h, s.pad_w);
}

// A pass's CUTLASS arguments for these operands (null pointers: for the checks alone). With a
// phase (backward data at stride > 1 on `s`): the phase's unit-stride problem, whose filter
// and dx are strided views of the layer's: every stride-th tap from (r0, s0), every stride-th
// dx row and column from (ph, pw).
template <class C>
struct Arguments {
  using K = SparseConv<C>;
  using Mainloop = typename K::Mainloop;
  using Epilogue = typename K::Epilogue;
  using ConvProblem = typename C::Problem;
  ConvProblem problem;
  typename Mainloop::Arguments mainloop;
  typename Epilogue::Arguments epilogue;

  Arguments(const ConvShape& s, const void* in0, const void* w, const float* bias, void* out,
            const DgradPhase* phase = nullptr)
      : problem(phase == nullptr
                    ? Problem<ConvProblem>(s)
                    : Problem<ConvProblem>(phase->shape, phase->pad_h_hi, phase->pad_w_hi)),
        mainloop{static_cast<const cutlass::bfloat16_t*>(in0),
                 static_cast<const cutlass::bfloat16_t*>(w)} {
    if (phase != nullptr) {
      const int64_t c = s.c;
      problem.stride_B = {s.r * s.s * c, s.stride_h * s.s * c, s.stride_w * c, 1};
      problem.stride_C = {s.h * s.w * c, s.stride_h * s.w * c, s.stride_w * c, 1};
      if (w != nullptr) mainloop.ptr_B += (phase->r0 * s.s + phase->s0) * c;
      if (out != nullptr) {
        out = static_cast<cutlass::bfloat16_t*>(out) + (phase->ph * s.w + phase->pw) * c;
      }
    }
    // The output's strides, M's modes (output column, row, image) innermost first.
    typename Epilogue::StrideD stride_d{};
    cute::for_each(cute::make_seq<cute::rank<0>(typename Epilogue::StrideD{})>{}, [&](auto i) {
      cute::get<0, i>(stride_d) = problem.stride_C[ConvProblem::RankT - 2 - i];
    });
    epilogue = {{},
                nullptr,
                typename Epilogue::StrideC{},
                static_cast<cutlass::bfloat16_t*>(out),
                stride_d};
    epilogue.thread.alpha = 1.0f;
    epilogue.thread.beta = 0.0f;
    epilogue.thread.bias_ptr = bias;
  }
  auto xformed() const {
    return cutlass::conv::detail::get_transformed_problem_shape_MNKL(problem);
  }
  // Whether CUTLASS's collectives take the shape (TMA im2col's corner, offset and alignment
  // limits among others; padding >= 0, which refuses a phase whose last dy rows reach no dx row
  // of it).
  bool Implementable() const {
    return Mainloop::can_implement(problem, mainloop) &&
           Epilogue::can_implement(xformed(), epilogue);
  }
};

// Backward data at stride > 1 runs phase by phase (dgrad_phases.h); each other pass, and
// backward data at stride 1, is one phase of its own.
bool Phased(Operator op, const ConvShape& s) {
  return op == Operator::kDgrad && (s.stride_h > 1 || s.stride_w > 1);
}

// C runs the layer as one problem, P its phases (Make).
template <class C, class P>
bool Implementable(const ConvShape& s) {
  if (!Phased(C::kOp, s))
    return Arguments<C>(s, nullptr, nullptr, nullptr, nullptr).Implementable();
  if constexpr (C::kOp == Operator::kDgrad) {  // only backward data has phases
    for (const DgradPhase& p : DgradPhases(s)) {
      if (p.empty()) continue;
      if (!Arguments<P>(s, nullptr, nullptr, nullptr, nullptr, &p).Implementable()) return false;
    }
  }
  return true;
}

// A pass's GEMM over the problem q (the layer's, or a phase's): M output pixels x N output
// channels, in tiles.
template <class C>
struct Gemm {
  int64_t pixels;
  int channels;
  int n_tiles;
  int64_t tiles;
  Gemm(const ConvShape& s, const ConvShape& q) {
    constexpr bool kForward = C::kOp == Operator::kFprop;
    pixels = static_cast<int64_t>(q.n) * (kForward ? q.ho() * q.wo() : q.h * q.w);
    channels = kForward ? s.k : s.c;
    constexpr int kBM = size<0>(typename C::Tile{}), kBN = size<1>(typename C::Tile{});
    n_tiles = (channels + kBN - 1) / kBN;
    tiles = ((pixels + kBM - 1) / kBM) * n_tiles;
  }
};

// Slots of the forward pass's moments (SparseConv::MomentSlots): one per CTA, or per warpgroup.
template <class C>
int MomentSlots(const ConvShape& s, const CudaContext& ctx) {
  const Gemm<C> gemm(s, s);
  const int ctas = PersistentCtas(gemm.tiles, gemm.n_tiles, ctx);
  return C::kPingpong ? 2 * ctas : ctas;
}

// One launch over the problems `phases` names (null: the layer's own; else phases of backward
// data, at most SparseConv::kMaxPhases), their tiles in that order.
template <class C, bool kPhased>
absl::Status LaunchPhases(const ConvShape& s, const std::vector<const DgradPhase*>& phases,
                          const int* count, const int* index, int stride, const void* in0,
                          const void* w, const float* bias, void* out, float* moments,
                          const CudaContext& ctx) {
  using K = SparseConv<C, kPhased>;
  using Mainloop = typename K::Mainloop;
  using Epilogue = typename K::Epilogue;
  if (phases.empty() || phases.size() > K::kMaxPhases) {
    return absl::InternalError(
        absl::StrFormat("hopper conv: 1 to %d problems per launch", K::kMaxPhases));
  }
  typename K::Params params{};
  params.phase_count = static_cast<int>(phases.size());
  params.count = count;
  params.index = index;
  params.stride = stride;
  params.list_taps = s.r * s.s;
  params.moments = moments;
  int64_t tiles = 0, first_tiles = 0;
  int n_tiles = 1;
  bool all_equal = true;  // phases of equal extent interleave (Params::interleaved)
  for (size_t i = 0; i < phases.size(); ++i) {
    const DgradPhase* phase = phases[i];
    const Arguments<C> a(s, in0, w, bias, out, phase);
    if (!a.Implementable()) {
      return absl::InvalidArgumentError("hopper conv: the shape is outside TMA im2col's limits");
    }
    const ConvShape& q = phase != nullptr ? phase->shape : s;  // the problem the kernel runs
    const Gemm<C> gemm(s, q);
    typename K::Phase& ph = params.phases[i];
    ph.problem = Mainloop::get_problem_shape_MNKL(a.problem);
    ph.mainloop = Mainloop::to_underlying_arguments(a.problem, a.mainloop, nullptr);
    ph.epilogue = Epilogue::to_underlying_arguments(a.xformed(), a.epilogue, nullptr);
    ph.taps = q.r * q.s;
    ph.tile_begin = static_cast<int>(tiles);
    // The collective's K-tile shape: its K mode (C, S, R), or (K, S, R) for backward data,
    // cut into tiles of BK channels.
    const auto k_mode = get<2>(ph.problem);
    constexpr int kBK = size<2>(typename C::Tile{});
    ph.k_tiles = {FastDivmod((static_cast<int>(get<0>(k_mode)) + kBK - 1) / kBK),
                  FastDivmod(static_cast<int>(get<1>(k_mode)))};
    tiles += gemm.tiles;
    if (i == 0) first_tiles = gemm.tiles;
    all_equal = all_equal && gemm.tiles == first_tiles;
    n_tiles = gemm.n_tiles;
    params.pixels = gemm.pixels;  // read with moments only: forward, one problem
    params.channels = gemm.channels;
  }
  if (tiles > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError("hopper conv: more than 2^31 output tiles");
  }
  params.tiles = static_cast<int>(tiles);
  params.interleaved = phases.size() > 1 && all_equal;
  constexpr bool kForward = C::kOp == Operator::kFprop;
  const dim3 grid(static_cast<unsigned>(PersistentCtas(tiles, n_tiles, ctx)));
  const int smem = static_cast<int>(sizeof(typename K::SharedStorage));
  TOPIARY_RETURN_IF_ERROR(
      CudaStatus(AllowDynamicSmem<SparseConvKernel<K>>(smem), "hopper conv shared memory"));
  SparseConvKernel<K><<<grid, K::kThreads, smem, ctx.stream>>>(params);
  return LaunchStatus(kForward ? "hopper block-sparse conv forward"
                               : "hopper block-sparse conv backward data");
}

// The phases of backward data without taps (dx = 0 there), for ZeroPhasesKernel.
struct EmptyPhases {
  static constexpr int kMax = 16;  // strides up to 4 x 4; beyond, the whole dx is cleared
  int count = 0;
  int ph[kMax], pw[kMax];      // the phase's first dx row and column
  int rows[kMax], cols[kMax];  // its dx rows and columns (DgradPhase::shape's h and w)
};

// Writes zeros over the dx pixels of the empty phases, and only there (a 1x1 filter at stride 2
// reaches the even rows and columns only: three quarters of dx are zeros, the last quarter the
// phase kernel's to write; clearing all of dx first wrote that quarter twice). Block (x, y):
// pixel row x % rows of image x / rows of phase y; its threads walk the row's 16-byte vectors.
__global__ void ZeroPhasesKernel(ConvShape s, EmptyPhases e, FastDivmod vecs_per_pixel,
                                 uint4* __restrict__ dx) {
  const int ph = e.ph[blockIdx.y], pw = e.pw[blockIdx.y];
  const int rows = e.rows[blockIdx.y], cols = e.cols[blockIdx.y];
  const int n = blockIdx.x / rows, h = ph + blockIdx.x % rows * s.stride_h;
  if (n >= s.n) return;
  uint4* row = dx + (static_cast<int64_t>(n) * s.h + h) * s.w * vecs_per_pixel.divisor();
  for (int j = threadIdx.x; j < cols * vecs_per_pixel.divisor(); j += blockDim.x) {
    int col;
    const int v = vecs_per_pixel.Mod(j, &col);
    row[static_cast<int64_t>(pw + col * s.stride_w) * vecs_per_pixel.divisor() + v] =
        make_uint4(0, 0, 0, 0);
  }
}

absl::Status ZeroEmptyPhases(const ConvShape& s, const std::vector<DgradPhase>& phases, void* dx,
                             const CudaContext& ctx) {
  EmptyPhases e;
  int max_rows = 0;
  for (const DgradPhase& p : phases) {
    // A phase with no taps has dx = 0 on its pixels; one with no pixels (a map of fewer rows or
    // columns than the stride) has nothing to write.
    const int rows = p.shape.h, cols = p.shape.w;
    if (!p.empty() || rows == 0 || cols == 0) continue;
    if (e.count == EmptyPhases::kMax) {
      const size_t bytes = static_cast<size_t>(s.n) * s.h * s.w * s.c * sizeof(cutlass::bfloat16_t);
      return CudaStatus(cudaMemsetAsync(dx, 0, bytes, ctx.stream), "hopper conv backward data");
    }
    e.ph[e.count] = p.ph, e.pw[e.count] = p.pw;
    e.rows[e.count] = rows, e.cols[e.count] = cols;
    ++e.count;
    max_rows = std::max(max_rows, rows);
  }
  if (e.count == 0) return absl::OkStatus();
  // TMA's 16-byte rows: C is a multiple of 8 bf16 values (HopperConvTakes).
  const dim3 grid(static_cast<unsigned>(s.n * max_rows), static_cast<unsigned>(e.count));
  ZeroPhasesKernel<<<grid, kThreads, 0, ctx.stream>>>(s, e, FastDivmod(s.c / 8),
                                                      static_cast<uint4*>(dx));
  return LaunchStatus("hopper conv backward data (the phases without taps)");
}

// Backward data at stride > 1: zeros over the phases without taps, then the others in one
// launch (up to 4 at a time).
template <class C>
absl::Status LaunchPhased(const ConvShape& s, const int* count, const int* index, int stride,
                          const void* dy, const void* w, void* dx, const CudaContext& ctx) {
  const std::vector<DgradPhase> phases = DgradPhases(s);
  TOPIARY_RETURN_IF_ERROR(ZeroEmptyPhases(s, phases, dx, ctx));
  // The phases with taps, most taps first: the persistent grid takes tiles in order, so the
  // longest tiles start first (within each pixel tile, when the phases interleave) and the
  // one-tap phase's short ones fill the tail.
  std::vector<const DgradPhase*> run;
  for (const DgradPhase& p : phases) {
    if (!p.empty()) run.push_back(&p);
  }
  std::stable_sort(run.begin(), run.end(), [](const DgradPhase* a, const DgradPhase* b) {
    return a->shape.r * a->shape.s > b->shape.r * b->shape.s;
  });
  constexpr size_t kMax = SparseConv<C, true>::kMaxPhases;
  for (size_t first = 0; first < run.size(); first += kMax) {
    const std::vector<const DgradPhase*> some(run.begin() + first,
                                              run.begin() + std::min(run.size(), first + kMax));
    const absl::Status status =
        LaunchPhases<C, true>(s, some, count, index, stride, dy, w, nullptr, dx, nullptr, ctx);
    TOPIARY_RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

template <class C, class P>
absl::Status Launch(const ConvShape& s, const int* count, const int* index, int stride,
                    const void* in0, const void* w, const float* bias, void* out, float* moments,
                    const CudaContext& ctx) {
  if (!Phased(C::kOp, s)) {
    return LaunchPhases<C, false>(s, {nullptr}, count, index, stride, in0, w, bias, out, moments,
                                  ctx);
  }
  if constexpr (C::kOp == Operator::kDgrad) {
    return LaunchPhased<P>(s, count, index, stride, in0, w, out, ctx);
  } else {
    return absl::InternalError("hopper conv: phases are backward data's");
  }
}

// Backward filter's CUTLASS arguments: dy is the GEMM's A, x its B (null pointers: for the
// checks alone).
template <class C>
struct FilterArguments {
  using Mainloop = typename SparseFilter<C>::Mainloop;
  typename C::Problem problem;
  typename Mainloop::Arguments mainloop;
  FilterArguments(const ConvShape& s, const void* x, const void* dy)
      : problem(Problem<typename C::Problem>(s)),
        mainloop{static_cast<const cutlass::bfloat16_t*>(dy),
                 static_cast<const cutlass::bfloat16_t*>(x)} {}
  bool Implementable() const { return Mainloop::can_implement(problem, mainloop); }
};

template <class C>
bool FilterImplementable(const ConvShape& s) {
  return FilterArguments<C>(s, nullptr, nullptr).Implementable();
}

template <class C>
absl::Status LaunchFilter(const ConvShape& s, const HopperFilterWork& work, const void* x,
                          const void* dy, void* dw, const CudaContext& ctx) {
  using K = SparseFilter<C>;
  using Mainloop = typename K::Mainloop;
  const FilterArguments<C> a(s, x, dy);
  if (!a.Implementable()) {
    return absl::InvalidArgumentError("hopper conv: the shape is outside TMA im2col's limits");
  }
  if (work.ctas > 0) {  // else nothing is kept: the gather writes zeros alone
    typename K::Params params{Mainloop::get_problem_shape_MNKL(a.problem),
                              Mainloop::to_underlying_arguments(a.problem, a.mainloop, nullptr),
                              work};
    const int smem = static_cast<int>(sizeof(typename K::SharedStorage));
    TOPIARY_RETURN_IF_ERROR(
        CudaStatus(AllowDynamicSmem<SparseConvKernel<K>>(smem), "hopper conv shared memory"));
    SparseConvKernel<K><<<work.ctas, K::kThreads, smem, ctx.stream>>>(params);
    TOPIARY_RETURN_IF_ERROR(LaunchStatus("hopper block-sparse conv backward filter"));
  }
  const int64_t groups = static_cast<int64_t>(s.k) * s.r * s.s * s.c / 8;
  const int threads = 256;
  const int blocks = static_cast<int>(
      std::min<int64_t>((groups + threads - 1) / threads, 8 * std::max(ctx.sm_count, 1)));
  GatherFilterKernel<<<std::max(blocks, 1), threads, 0, ctx.stream>>>(s, work,
                                                                      static_cast<uint4*>(dw));
  return LaunchStatus("hopper block-sparse conv backward filter (gather)");
}

struct Entry {
  const char* name;
  int tile_m, tile_k, tile_n;
  // Forward and backward data.
  absl::Status (*launch)(const ConvShape&, const int*, const int*, int, const void*, const void*,
                         const float*, void*, float*, const CudaContext&);
  int (*moment_slots)(const ConvShape&, const CudaContext&);  // forward
  // Backward filter.
  absl::Status (*launch_filter)(const ConvShape&, const HopperFilterWork&, const void*, const void*,
                                void*, const CudaContext&);
  bool (*implementable)(const ConvShape&);
  bool phased = false;  // backward filter: runs several phases (FilterConfig::kTwoPieces)
  KeptOrder order = KeptOrder::kAscending;  // of the kept lists it walks (kept_tiles.cc)
};

// A configuration: C for one problem, P for the phases of backward data at stride > 1, each
// with the stores measured faster there (Config's kWideStores).
template <Operator Op, int BM, int BN, int BK, bool kPingpong = false>
constexpr Entry Make(const char* name) {
  using C = Config<Op, BM, BN, BK, kPingpong, kPingpong && BN == 64>;
  using P = Config<Op, BM, BN, BK, kPingpong, kPingpong>;
  return {name, BM, BK, BN, Launch<C, P>, MomentSlots<C>, nullptr, Implementable<C, P>};
}

// The shifted-window kernels (halo_conv.h): 256 frame pixels at most x 64 output channels x 64
// reduction channels of every tap; the forward with the batch norm's moments too.
absl::Status LaunchHalo(const ConvShape& s, const int* count, const int* index, int stride,
                        const void* in0, const void* w, const float* bias, void* out,
                        float* moments, const CudaContext& ctx) {
  return HaloForwardRun(s, count, index, stride, in0, w, bias, out, ctx, moments);
}
absl::Status LaunchHaloData(const ConvShape& s, const int* count, const int* index, int stride,
                            const void* dy, const void* w, const float*, void* dx, float*,
                            const CudaContext& ctx) {
  return HaloBackwardDataRun(s, count, index, stride, dy, w, dx, ctx);
}
absl::Status LaunchHaloDataPhases(const ConvShape& s, const int* count, const int* index,
                                  int stride, const void* dy, const void* w, const float*, void* dx,
                                  float*, const CudaContext& ctx) {
  return HaloBackwardDataRun(s, count, index, stride, dy, w, dx, ctx, /*one_launch=*/true);
}
int NoMoments(const ConvShape&, const CudaContext&) { return 0; }
// A halo configuration (the kernels above), walking its lists in `order` (kept_tiles.cc:
// measured per kernel).
constexpr Entry MakeHalo(const char* name, decltype(Entry::launch) launch,
                         decltype(Entry::moment_slots) moment_slots,
                         decltype(Entry::implementable) takes, KeptOrder order) {
  return {name, 256, kHaloTileK, kHaloTileN, launch, moment_slots, nullptr, takes, false, order};
}
constexpr Entry kHalo = MakeHalo("halo 256x64x64", LaunchHalo, HaloForwardMomentSlices,
                                 HaloForwardTakes, KeptOrder::kRotated);
constexpr Entry kHaloData = MakeHalo("halo 256x64x64", LaunchHaloData, NoMoments,
                                     HaloBackwardDataTakes, KeptOrder::kColoured);
constexpr Entry kHaloDataPhases = MakeHalo("halo phases 256x64x64", LaunchHaloDataPhases, NoMoments,
                                           HaloBackwardDataPhasesTakes, KeptOrder::kColoured);

template <int BM, int BN, int BK>
constexpr Entry MakeFilter(const char* name) {
  using C = FilterConfig<BM, BN, BK>;
  return {name,         BM, BK, BN, nullptr, nullptr, LaunchFilter<C>, FilterImplementable<C>,
          C::kTwoPieces};
}

// Forward's N is output channels (64 or 128 per block), backward data's input channels (64 or
// 128). Pingpong tiles win where few K tiles are kept (layer4 forward at 50% kept: 0.044 ms
// against 0.046 cooperative; at 25% 0.027 against 0.028), cooperative ones elsewhere: the
// dispatch measures both. 64-wide tiles multiplied turned around (channels as wgmma's M, so
// that each instruction reads fewer shared-memory bytes per multiply-add) measured 10-25%
// slower with 128 pixels and the same speed with 256 (2026-12-03); two 64-channel tiles
// sharing each K tile's pixels (cooperative, three stages) measured 50% slower (branch
// turned-tiles, docs/PERFORMANCE.md). So 64-wide tiles stay at 0.74-0.77x cuDNN dense: each K
// step loads 40 KB for 1M multiply-adds, against 32 KB at 128 x 128, and their loads pace them:
// without their wgmma they run as fast (a ceiling build, branch exp-ceiling, 2026-12-03),
// though Nsight finds no unit saturated. 128-channel input blocks allow backward data the 128-wide
// tiles, at 0.89-0.96x. A 128-deep K tile (64 x 128 blocks) measured 3x slower. The 256x64x64
// pingpong tiles (each warpgroup a whole 256 x 64 tile, 128 accumulators a thread) are the fastest
// 64-wide ones on layer4 (7x7 maps), 3-5% faster than 256x64x64 2wg (H200, 2026-12-03).
const Entry kForward[] = {
    Make<Operator::kFprop, 128, 128, 64>("wgmma 128x128x64 2wg"),
    Make<Operator::kFprop, 256, 128, 64>("wgmma 256x128x64 2wg"),
    Make<Operator::kFprop, 128, 256, 64>("wgmma 128x256x64 2wg"),
    Make<Operator::kFprop, 128, 64, 64>("wgmma 128x64x64 2wg"),
    Make<Operator::kFprop, 256, 64, 64>("wgmma 256x64x64 2wg"),
    Make<Operator::kFprop, 128, 128, 64, true>("wgmma 128x128x64 pingpong"),
    Make<Operator::kFprop, 128, 64, 64, true>("wgmma 128x64x64 pingpong"),
    Make<Operator::kFprop, 256, 64, 64, true>("wgmma 256x64x64 pingpong"),
    kHalo,
};
const Entry kBackwardData[] = {
    Make<Operator::kDgrad, 128, 64, 64>("wgmma 128x64x64 2wg"),
    Make<Operator::kDgrad, 256, 64, 64>("wgmma 256x64x64 2wg"),
    Make<Operator::kDgrad, 128, 128, 64>("wgmma 128x128x64 2wg"),
    Make<Operator::kDgrad, 256, 128, 64>("wgmma 256x128x64 2wg"),
    Make<Operator::kDgrad, 128, 64, 64, true>("wgmma 128x64x64 pingpong"),
    Make<Operator::kDgrad, 128, 128, 64, true>("wgmma 128x128x64 pingpong"),
    Make<Operator::kDgrad, 256, 64, 64, true>("wgmma 256x64x64 pingpong"),
    kHaloData,
    kHaloDataPhases,
};

// Backward filter's M is output channels (a 128-channel block, or 64), its N input channels
// of one tap (64 or 128), its K output pixels.
const Entry kBackwardFilter[] = {
    MakeFilter<128, 64, 64>("wgmma 128x64x64 2wg"),
    MakeFilter<128, 128, 64>("wgmma 128x128x64 2wg"),
};

std::pair<const Entry*, int> Entries(SparsePass pass) {
  if (pass == SparsePass::kForward) return {kForward, sizeof(kForward) / sizeof(Entry)};
  if (pass == SparsePass::kBackwardData) {
    return {kBackwardData, sizeof(kBackwardData) / sizeof(Entry)};
  }
  return {kBackwardFilter, sizeof(kBackwardFilter) / sizeof(Entry)};
}

}  // namespace

int HopperConvConfigs(SparsePass pass) { return Entries(pass).second; }
std::string HopperConvConfigName(SparsePass pass, int config) {
  return Entries(pass).first[config].name;
}
int HopperConvTileM(SparsePass pass, int config) { return Entries(pass).first[config].tile_m; }
int HopperConvTileK(SparsePass pass, int config) { return Entries(pass).first[config].tile_k; }
int HopperConvTileN(SparsePass pass, int config) { return Entries(pass).first[config].tile_n; }
KeptOrder HopperConvKeptOrder(SparsePass pass, int config) {
  return Entries(pass).first[config].order;
}

bool HopperConvTakes(SparsePass pass, int config, const ConvShape& s, const CudaContext& ctx) {
  const auto [entries, n] = Entries(pass);
  if (config < 0 || config >= n) return false;
  (void)ctx;
  // TMA needs 16-byte channel rows. Backward filter's gather wants whole channel tiles.
  const bool tiles_ok = pass != SparsePass::kBackwardFilter || s.c % entries[config].tile_n == 0;
  return CurrentComputeCapability() == 90 && s.c % 8 == 0 && s.k % 8 == 0 && tiles_ok &&
         entries[config].implementable(s);
}

int HopperConvMomentSlices(int config, const ConvShape& s, const CudaContext& ctx) {
  const auto [entries, n] = Entries(SparsePass::kForward);
  if (config < 0 || config >= n) return 0;
  return entries[config].moment_slots(s, ctx);
}

absl::Status HopperConvRun(SparsePass pass, int config, const ConvShape& s, const int* count,
                           const int* index, int stride, const void* in0, const void* in1,
                           const float* bias, void* out, const CudaContext& ctx, float* moments) {
  const auto [entries, n] = Entries(pass);
  if (config < 0 || config >= n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("hopper conv %s: no configuration %d", SparsePassName(pass), config));
  }
  if (pass == SparsePass::kBackwardFilter) {
    return absl::InvalidArgumentError("hopper conv backward filter: use HopperFilterRun");
  }
  if (moments != nullptr && (pass != SparsePass::kForward || bias != nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("hopper conv %s: batch-norm moments are the forward pass's, without a bias",
                        SparsePassName(pass)));
  }
  return entries[config].launch(s, count, index, stride, in0, in1,
                                pass == SparsePass::kForward ? bias : nullptr, out, moments, ctx);
}

int HopperFilterPhases(int config, const ConvShape& s) {
  const auto [entries, n] = Entries(SparsePass::kBackwardFilter);
  if (config < 0 || config >= n || !entries[config].phased) return 1;
  int device = 0, l2 = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) != cudaSuccess || l2 <= 0) {
    cudaGetLastError();
    l2 = 50 << 20;
  }
  const int64_t bytes = 2 * (static_cast<int64_t>(s.n) * s.h * s.w * s.c +
                             static_cast<int64_t>(s.n) * s.ho() * s.wo() * s.k);
  const int64_t window = std::max(l2 / 3, 1);
  return static_cast<int>(std::min<int64_t>((bytes + window - 1) / window, 1 << 16));
}

absl::Status HopperFilterRun(int config, const ConvShape& s, const HopperFilterWork& work,
                             const void* x, const void* dy, void* dw, const CudaContext& ctx) {
  const auto [entries, n] = Entries(SparsePass::kBackwardFilter);
  if (config < 0 || config >= n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("hopper conv backward filter: no configuration %d", config));
  }
  if (work.tile_m != entries[config].tile_m || work.tile_n != entries[config].tile_n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("hopper conv backward filter: work split for %dx%d tiles, not %s",
                        work.tile_m, work.tile_n, entries[config].name));
  }
  return entries[config].launch_filter(s, work, x, dy, dw, ctx);
}

}  // namespace topiary::kernels
