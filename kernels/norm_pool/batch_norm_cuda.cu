// Batch norm on NHWC [M, C]. Statistics: blocks of 32 channels x 8 row lanes (or, for C a
// multiple of a 16-byte vector, 256 threads reading whole rows in vectors) walk a slice of
// rows each; a thread keeps a running (count, mean, M2) (Welford) or plain sums, the 8 lanes
// are merged in order in shared memory, and a second kernel merges the slices per channel in
// order, in double. No atomics: the same input gives the same bits on every run.
#include <algorithm>
#include <initializer_list>

#include "absl/strings/str_format.h"
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/norm_pool/batch_norm_cuda.cuh"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"
#include "kernels/runtime/moments.h"

namespace topiary::kernels {
namespace {

constexpr int kTileC = 32;  // channels per block (one warp across a row: coalesced)
constexpr int kLanes = 8;   // row lanes per block

int Tiles(const BatchNormShape& sh) { return (sh.c + kTileC - 1) / kTileC; }

// Partial summaries per (slice, channel): out[3][slices][C] = count, mean, M2. A thread sums
// x - shift and its square (shift: the first value it sees, which keeps the sums small and
// avoids cancellation) with no division per element, then turns them into (count, mean, M2)
// for the ordered merges.
template <typename T>
__global__ void MomentsKernel(int64_t m, int c, int slices, const T* __restrict__ x,
                              float* __restrict__ out) {
  const int ch = blockIdx.x * kTileC + threadIdx.x;
  const int slice = blockIdx.y;
  int64_t begin, end;
  RowRange(m, slices, slice, &begin, &end);
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;
  if (ch < c && begin + threadIdx.y < end) {
    const float shift = Ld(x + (begin + threadIdx.y) * c + ch);
    float s = 0.0f, sq = 0.0f;
    int count = 0;
    for (int64_t r = begin + threadIdx.y; r < end; r += kLanes) {
      const float d = Ld(x + r * c + ch) - shift;
      s += d;
      sq += d * d;
      ++count;
    }
    n = static_cast<float>(count);
    const float md = s / n;
    mean = shift + md;
    m2 = fmaxf(sq - s * md, 0.0f);
  }
  __shared__ float sn[kLanes][kTileC], smean[kLanes][kTileC], sm2[kLanes][kTileC];
  sn[threadIdx.y][threadIdx.x] = n;
  smean[threadIdx.y][threadIdx.x] = mean;
  sm2[threadIdx.y][threadIdx.x] = m2;
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    for (int l = 1; l < kLanes; ++l) {
      MergeMoments(n, mean, m2, sn[l][threadIdx.x], smean[l][threadIdx.x], sm2[l][threadIdx.x]);
    }
    const size_t plane = static_cast<size_t>(slices) * c;
    out[static_cast<size_t>(slice) * c + ch] = n;
    out[plane + static_cast<size_t>(slice) * c + ch] = mean;
    out[2 * plane + static_cast<size_t>(slice) * c + ch] = m2;
  }
}

// A channel's parameters and running statistics, read before the slices are merged so that
// their loads wait alongside the merge's rather than after it.
struct ChannelParams {
  float gamma, beta, running_mean, running_var;
};
__device__ ChannelParams LoadParams(int ch, const float* gamma, const float* beta,
                                    const float* running_mean, const float* running_var) {
  return {gamma[ch], beta[ch], running_mean[ch], running_var[ch]};
}

// The channel's statistics from the (count, mean, M2) of the whole (global) batch: the saved
// mean and inverse std, the normalization's scale and shift (coef[0..C) and coef[C..2C)), and
// the running statistics. One thread's chain of double operations ends every batch norm's
// statistics, so it takes a reciprocal square root rather than a square root and a division.
__device__ void FinishChannel(const BatchNormShape& sh, int ch, double n, double mean, double m2,
                              const ChannelParams& p, float* running_mean, float* running_var,
                              float* save_mean, float* save_inv_std, float* coef) {
  const double inv_std = rsqrt(m2 / n + sh.eps);
  const double scale = p.gamma * inv_std;
  save_mean[ch] = static_cast<float>(mean);
  save_inv_std[ch] = static_cast<float>(inv_std);
  coef[ch] = static_cast<float>(scale);
  coef[sh.c + ch] = static_cast<float>(p.beta - mean * scale);
  const double unbiased = m2 / (n - 1.0);
  running_mean[ch] = (1.0f - sh.momentum) * p.running_mean + sh.momentum * static_cast<float>(mean);
  running_var[ch] =
      static_cast<float>((1.0 - sh.momentum) * p.running_var + sh.momentum * unbiased);
}

// Per channel (MergeGrid, MergeBlock): merges the slices (MergeSliceMoments, in double), then
// either finishes the channel (FinishChannel) or, synchronized, writes the rank's (count, mean, M2)
// into rank_moments[3][C] for the gather.
TOPIARY_MERGE_KERNEL FinishMomentsKernel(BatchNormShape sh, int slices, const float* part,
                                         const float* gamma, const float* beta, float* running_mean,
                                         float* running_var, float* save_mean, float* save_inv_std,
                                         float* coef, double* rank_moments) {
  const int ch = blockIdx.x * kMergeC + threadIdx.x;
  const bool holds = HoldsMerge(sh.c, ch);
  ChannelParams p{};
  if (holds && rank_moments == nullptr) p = LoadParams(ch, gamma, beta, running_mean, running_var);
  double v[3];
  MergeSliceMoments(sh.c, slices, part, ch, v);
  if (!holds) return;
  if (rank_moments != nullptr) {
    rank_moments[ch] = v[0];
    rank_moments[sh.c + ch] = v[1];
    rank_moments[2 * sh.c + ch] = v[2];
    return;
  }
  FinishChannel(sh, ch, v[0], v[1], v[2], p, running_mean, running_var, save_mean, save_inv_std,
                coef);
}

// Synchronized: a thread per channel merges the ranks' gathered (count, mean, M2)
// (all[ranks][3][C]) in rank order, the same bits on every rank, and finishes the channel.
__global__ void MergeRankMomentsKernel(BatchNormShape sh, int ranks, const double* all,
                                       const float* gamma, const float* beta, float* running_mean,
                                       float* running_var, float* save_mean, float* save_inv_std,
                                       float* coef) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= sh.c) return;
  const size_t c = sh.c;
  double n = all[ch], mean = all[c + ch], m2 = all[2 * c + ch];
  for (int r = 1; r < ranks; ++r) {
    const double* p = all + 3 * c * r;
    MergeMoments(n, mean, m2, p[ch], p[c + ch], p[2 * c + ch]);
  }
  FinishChannel(sh, ch, n, mean, m2, LoadParams(ch, gamma, beta, running_mean, running_var),
                running_mean, running_var, save_mean, save_inv_std, coef);
}

template <bool kRelu, typename Index, typename T>
__global__ void ScaleShiftKernel(Index n, int c, const T* __restrict__ x,
                                 const float* __restrict__ coef, T* __restrict__ y) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const int ch = static_cast<int>(i % c);
    const float v = Ld(x + i) * coef[ch] + coef[c + ch];
    St(y + i, kRelu ? fmaxf(v, 0.0f) : v);
  }
}

template <bool kRelu, typename Index, typename T>
__global__ void EvalKernel(Index n, int c, float eps, const T* __restrict__ x, const float* gamma,
                           const float* beta, const float* rm, const float* rv, T* __restrict__ y) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const int ch = static_cast<int>(i % c);
    const float inv_std = rsqrtf(rv[ch] + eps);
    const float v = (Ld(x + i) - rm[ch]) * inv_std * gamma[ch] + beta[ch];
    St(y + i, kRelu ? fmaxf(v, 0.0f) : v);
  }
}

template <bool kRelu, typename T>
__global__ void ScaleShiftVecKernel(int64_t nv, int c, const T* __restrict__ x,
                                    const float* __restrict__ coef, T* __restrict__ y) {
  constexpr int V = kVec<T>;
  VecChannel at(c, V);
  // The channels' coefficients, held while the channel stays (a warp's scattered coefficient
  // loads per vector saturate L1 at C = 256 and more, halving the kernel's bandwidth).
  float scale[V], shift[V];
  for (int64_t j = at.first; j < nv; j += at.stride, at.Next()) {
    if (at.Moved()) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        scale[e] = coef[at.g * V + e];
        shift[e] = coef[c + at.g * V + e];
      }
    }
    float v[V];
    LdVec(x + j * V, v);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float t = v[e] * scale[e] + shift[e];
      v[e] = kRelu ? fmaxf(t, 0.0f) : t;
    }
    StVec(y + j * V, v);
  }
}

// The vector form of MomentsKernel. Every lane of a block sums x - shift and its square with
// one shift per channel for the whole slice (its first row), so the lanes' sums add: the block
// merges them with additions only. (A shift per lane needed Chan's merge, a division per lane,
// one after another: at 16 channels, 64 lanes and about 2 us per block.)
template <typename T>
__global__ void MomentsVecKernel(int64_t m, int c, int slices, const T* __restrict__ x,
                                 float* __restrict__ out) {
  constexpr int V = kVec<T>;
  const VecRows w(m, c, slices, V);
  float s[V], sq[V];
  for (int v = 0; v < V; ++v) s[v] = sq[v] = 0.0f;
  if (w.active() && w.begin + w.lane < w.end) {
    float shift[V], d[V];
    LdVec(x + w.begin * c + w.g * V, shift);
#pragma unroll 4
    for (int64_t r = w.begin + w.lane; r < w.end; r += w.lanes) {
      LdVec(x + r * c + w.g * V, d);
      for (int v = 0; v < V; ++v) {
        d[v] -= shift[v];
        s[v] += d[v];
        sq[v] += d[v] * d[v];
      }
    }
  }
  // Per lane and channel: the two sums (lanes * c <= kVecThreads * V entries each).
  __shared__ float ss[kVecThreads * V], ssq[kVecThreads * V];
  StoreLane(w, c, s, ss);
  StoreLane(w, c, sq, ssq);
  __syncthreads();
  const size_t plane = static_cast<size_t>(slices) * c;
  const float n = static_cast<float>(w.end - w.begin);
  for (int ch = threadIdx.x; ch < c; ch += blockDim.x) {
    float sum, sum_sq, mean = 0.0f, m2 = 0.0f;
    SumLanes(w, c, ch, ss, ssq, &sum, &sum_sq);
    if (n > 0.0f) {
      const float md = sum / n;
      mean = Ld(x + w.begin * c + ch) + md;
      m2 = fmaxf(sum_sq - sum * md, 0.0f);
    }
    out[static_cast<size_t>(blockIdx.x) * c + ch] = n;
    out[plane + static_cast<size_t>(blockIdx.x) * c + ch] = mean;
    out[2 * plane + static_cast<size_t>(blockIdx.x) * c + ch] = m2;
  }
}

template <bool kRelu, typename T>
__global__ void GradSumsVecKernel(int64_t m, int c, int slices, const T* __restrict__ x,
                                  const float* __restrict__ scale_shift, const T* __restrict__ dy,
                                  const float* __restrict__ mean, const float* __restrict__ inv_std,
                                  float* __restrict__ out) {
  constexpr int V = kVec<T>;
  const VecRows w(m, c, slices, V);
  float a[V], b[V];
  for (int v = 0; v < V; ++v) a[v] = b[v] = 0.0f;
  if (w.active()) {
    float mu[V], is[V], sc[V], sh[V], xv[V], gv[V];
    for (int v = 0; v < V; ++v) {
      mu[v] = mean[w.g * V + v];
      is[v] = inv_std[w.g * V + v];
      if (kRelu) {
        sc[v] = scale_shift[w.g * V + v];
        sh[v] = scale_shift[c + w.g * V + v];
      }
    }
#pragma unroll 4
    for (int64_t r = w.begin + w.lane; r < w.end; r += w.lanes) {
      const int64_t k = r * c + w.g * V;
      LdVec(x + k, xv);
      LdVec(dy + k, gv);
      for (int v = 0; v < V; ++v) {
        const float gg = (!kRelu || ReluPasses<T>(xv[v], sc[v], sh[v])) ? gv[v] : 0.0f;
        a[v] += gg;
        b[v] += gg * (xv[v] - mu[v]) * is[v];
      }
    }
  }
  __shared__ float sa[kVecThreads * V], sb[kVecThreads * V];
  StoreLane(w, c, a, sa);
  StoreLane(w, c, b, sb);
  __syncthreads();
  WriteSliceSums(w, c, slices, sa, sb, out);
}

// Partial sums per (slice, channel): out[2][slices][C] = sum g, sum g * xhat, with g the
// incoming gradient masked by the fused ReLU (ReluPasses).
template <bool kRelu, typename T>
__global__ void GradSumsKernel(int64_t m, int c, int slices, const T* __restrict__ x,
                               const float* __restrict__ scale_shift, const T* __restrict__ dy,
                               const float* __restrict__ mean, const float* __restrict__ inv_std,
                               float* __restrict__ out) {
  const int ch = blockIdx.x * kTileC + threadIdx.x;
  const int slice = blockIdx.y;
  int64_t begin, end;
  RowRange(m, slices, slice, &begin, &end);
  float a = 0.0f, b = 0.0f;
  if (ch < c) {
    const float mu = mean[ch], is = inv_std[ch];
    const float sc = kRelu ? scale_shift[ch] : 0.0f, sh = kRelu ? scale_shift[c + ch] : 0.0f;
    for (int64_t r = begin + threadIdx.y; r < end; r += kLanes) {
      const int64_t k = r * c + ch;
      const float xv = Ld(x + k);
      const float g = (!kRelu || ReluPasses<T>(xv, sc, sh)) ? Ld(dy + k) : 0.0f;
      a += g;
      b += g * (xv - mu) * is;
    }
  }
  __shared__ float sa[kLanes][kTileC], sb[kLanes][kTileC];
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    for (int l = 1; l < kLanes; ++l) {
      a += sa[l][threadIdx.x];
      b += sb[l][threadIdx.x];
    }
    const size_t plane = static_cast<size_t>(slices) * c;
    out[static_cast<size_t>(slice) * c + ch] = a;
    out[plane + static_cast<size_t>(slice) * c + ch] = b;
  }
}

template <bool kRelu, typename Index, typename T>
__global__ void GradApplyKernel(Index n, int c, const T* __restrict__ x,
                                const float* __restrict__ scale_shift, const T* __restrict__ dy,
                                const float* __restrict__ mean, const float* __restrict__ inv_std,
                                const float* __restrict__ coef, T* __restrict__ dx) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const int ch = static_cast<int>(i % c);
    const float xv = Ld(x + i);
    const float g =
        (!kRelu || ReluPasses<T>(xv, scale_shift[ch], scale_shift[c + ch])) ? Ld(dy + i) : 0.0f;
    const float xhat = (xv - mean[ch]) * inv_std[ch];
    St(dx + i, coef[ch] * (g - coef[c + ch] - xhat * coef[2 * c + ch]));
  }
}

// Launches kernel<relu, Index, T> (T: the element type in scope) with 32-bit index arithmetic when
// n allows it (integer division by C is several times cheaper in 32 bits, and these kernels are per
// element).
#define TOPIARY_LAUNCH_ELEMENTWISE(kernel, relu, n, blocks, stream, ...)            \
  do {                                                                              \
    const bool small = (n) < (int64_t{1} << 31);                                    \
    if (relu && small)                                                              \
      kernel<true, int32_t, T>                                                      \
          <<<blocks, kThreads, 0, stream>>>(static_cast<int32_t>(n), __VA_ARGS__);  \
    else if (relu)                                                                  \
      kernel<true, int64_t, T><<<blocks, kThreads, 0, stream>>>((n), __VA_ARGS__);  \
    else if (small)                                                                 \
      kernel<false, int32_t, T>                                                     \
          <<<blocks, kThreads, 0, stream>>>(static_cast<int32_t>(n), __VA_ARGS__);  \
    else                                                                            \
      kernel<false, int64_t, T><<<blocks, kThreads, 0, stream>>>((n), __VA_ARGS__); \
  } while (0)

// The workspace: the slices' partials [3][slices][C], coef [3][C], and for synchronized batch
// norm (from an even float, for the doubles) this rank's moments [3][C] and every rank's
// [ranks][3][C] as doubles; the backward pass uses the first two thirds of each.
struct Workspace {
  float* part;
  float* coef;
  double* mine;
  double* all;
};
size_t SyncOffsetFloats(const BatchNormShape& sh) {
  const size_t floats = static_cast<size_t>(3) * (Slices(sh) + 1) * sh.c;
  return floats + floats % 2;
}
Workspace Carve(const BatchNormShape& sh, float* workspace) {
  double* mine = reinterpret_cast<double*>(workspace + SyncOffsetFloats(sh));
  return {workspace, workspace + static_cast<size_t>(3) * Slices(sh) * sh.c, mine,
          mine + 3 * static_cast<size_t>(sh.c)};
}

// Every rank's doubles[0, n) of w.mine into w.all (as float pairs: the gather moves bits).
absl::Status GatherDoubles(BatchNormSync* sync, const Workspace& w, size_t n) {
  return sync->Gather(reinterpret_cast<const float*>(w.mine), 2 * n,
                      reinterpret_cast<float*>(w.all));
}

}  // namespace

size_t BatchNormWorkspaceFloatsCuda(const BatchNormShape& sh, int sync_ranks) {
  if (sync_ranks <= 1) return static_cast<size_t>(3) * (Slices(sh) + 1) * sh.c;
  return SyncOffsetFloats(sh) + 2 * 3 * static_cast<size_t>(sh.c) * (1 + sync_ranks);
}

absl::Status BatchNormForwardTrainCuda(DType t, const BatchNormShape& sh, const void* x,
                                       const float* gamma, const float* beta, float* running_mean,
                                       float* running_var, float* save_mean, float* save_inv_std,
                                       float* scale_shift, void* y, float* workspace,
                                       const CudaContext& ctx, BatchNormSync* sync,
                                       const BatchNormMoments* moments) {
  if (sh.relu && scale_shift == nullptr) {
    return absl::InvalidArgumentError("batch norm with ReLU: the backward pass needs scale_shift");
  }
  if (moments != nullptr && (moments->part == nullptr || moments->slices < 1 ||
                             moments->slices > kBatchNormMaxMomentSlices)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("batch norm: %d moment slices (want 1 to %d, and their partials)",
                        moments->slices, kBatchNormMaxMomentSlices));
  }
  const Workspace w = Carve(sh, workspace);
  const float* part = moments != nullptr ? moments->part : w.part;
  float* coef = scale_shift != nullptr ? scale_shift : w.coef;
  const int64_t n = sh.m * sh.c;
  return VisitDType(t, [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    const T* xt = static_cast<const T*>(x);
    int slices = moments != nullptr ? moments->slices : Slices(sh);
    if (moments == nullptr) {
      if (VecReduceOk<T>(sh.c, {x})) {
        slices = WholeWaves<MomentsVecKernel<T>>(slices, kVecThreads, ctx.sm_count);
        MomentsVecKernel<<<slices, kVecThreads, 0, ctx.stream>>>(sh.m, sh.c, slices, xt, w.part);
      } else {
        MomentsKernel<<<dim3(Tiles(sh), slices), dim3(kTileC, kLanes), 0, ctx.stream>>>(
            sh.m, sh.c, slices, xt, w.part);
      }
      TOPIARY_RETURN_IF_ERROR(LaunchStatus("batch norm moments"));
    }
    FinishMomentsKernel<<<MergeGrid(sh.c), MergeBlock(), 0, ctx.stream>>>(
        sh, slices, part, gamma, beta, running_mean, running_var, save_mean, save_inv_std, coef,
        sync ? w.mine : nullptr);
    TOPIARY_RETURN_IF_ERROR(LaunchStatus("batch norm statistics"));
    if (sync) {
      TOPIARY_RETURN_IF_ERROR(GatherDoubles(sync, w, 3 * static_cast<size_t>(sh.c)));
      MergeRankMomentsKernel<<<(sh.c + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(
          sh, sync->ranks(), w.all, gamma, beta, running_mean, running_var, save_mean, save_inv_std,
          coef);
      TOPIARY_RETURN_IF_ERROR(LaunchStatus("synchronized batch norm statistics"));
    }
    if (y == nullptr) return absl::OkStatus();
    if (VecOk<T>(sh.c, {x, y})) {
      const int64_t nv = n / kVec<T>;
      auto apply = [&](auto tag) {
        constexpr auto kernel = decltype(tag)::kKernel;
        kernel<<<WaveBlocksFor<kernel>(nv, ctx.sm_count), kThreads, 0, ctx.stream>>>(
            nv, sh.c, xt, coef, static_cast<T*>(y));
      };
      if (sh.relu) {
        apply(KernelTag<ScaleShiftVecKernel<true, T>>{});
      } else {
        apply(KernelTag<ScaleShiftVecKernel<false, T>>{});
      }
    } else {
      TOPIARY_LAUNCH_ELEMENTWISE(ScaleShiftKernel, sh.relu, n, BlocksFor(n, ctx.sm_count),
                                 ctx.stream, sh.c, xt, coef, static_cast<T*>(y));
    }
    return LaunchStatus("batch norm apply");
  });
}

namespace {

__global__ void FoldEvalKernel(BatchNormShape sh, const float* gamma, const float* beta,
                               const float* running_mean, const float* running_var,
                               float* scale_shift) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= sh.c) return;
  const float scale = gamma[ch] * rsqrtf(running_var[ch] + sh.eps);
  scale_shift[ch] = scale;
  scale_shift[sh.c + ch] = beta[ch] - running_mean[ch] * scale;
}

}  // namespace

absl::Status BatchNormFoldEvalCuda(const BatchNormShape& sh, const float* gamma, const float* beta,
                                   const float* running_mean, const float* running_var,
                                   float* scale_shift, const CudaContext& ctx) {
  FoldEvalKernel<<<(sh.c + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(
      sh, gamma, beta, running_mean, running_var, scale_shift);
  return LaunchStatus("batch norm fold (inference)");
}

absl::Status BatchNormForwardEvalCuda(DType t, const BatchNormShape& sh, const void* x,
                                      const float* gamma, const float* beta,
                                      const float* running_mean, const float* running_var, void* y,
                                      const CudaContext& ctx) {
  const int64_t n = sh.m * sh.c;
  VisitDType(t, [&](auto tag) {
    using T = decltype(tag);
    TOPIARY_LAUNCH_ELEMENTWISE(EvalKernel, sh.relu, n, BlocksFor(n, ctx.sm_count), ctx.stream, sh.c,
                               sh.eps, static_cast<const T*>(x), gamma, beta, running_mean,
                               running_var, static_cast<T*>(y));
  });
  return LaunchStatus("batch norm inference");
}

absl::Status BatchNormBackwardCuda(DType t, const BatchNormShape& sh, const void* x, const void* dy,
                                   const float* gamma, const float* save_mean,
                                   const float* save_inv_std, const float* save_scale_shift,
                                   void* dx, float* dgamma, float* dbeta, float* workspace,
                                   const CudaContext& ctx, BatchNormSync* sync) {
  if (sh.relu && save_scale_shift == nullptr) {
    return absl::InvalidArgumentError("batch norm with ReLU: no scale_shift for the mask");
  }
  const float* ss = save_scale_shift;
  const Workspace w = Carve(sh, workspace);
  float* part = w.part;
  float* coef = w.coef;
  const int64_t n = sh.m * sh.c;
  const int blocks = BlocksFor(n, ctx.sm_count);
  return VisitDType(t, [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    const T* xt = static_cast<const T*>(x);
    const T* dyt = static_cast<const T*>(dy);
    int slices = Slices(sh);
    auto vec_sums = [&](auto kernel_tag) {
      constexpr auto kernel = decltype(kernel_tag)::kKernel;
      slices = WholeWaves<kernel>(slices, kVecThreads, ctx.sm_count);
      kernel<<<slices, kVecThreads, 0, ctx.stream>>>(sh.m, sh.c, slices, xt, ss, dyt, save_mean,
                                                     save_inv_std, part);
    };
    const dim3 grid(Tiles(sh), slices), block(kTileC, kLanes);
    if (VecReduceOk<T>(sh.c, {x, dy})) {
      if (sh.relu) {
        vec_sums(KernelTag<GradSumsVecKernel<true, T>>{});
      } else {
        vec_sums(KernelTag<GradSumsVecKernel<false, T>>{});
      }
    } else if (sh.relu) {
      GradSumsKernel<true><<<grid, block, 0, ctx.stream>>>(sh.m, sh.c, slices, xt, ss, dyt,
                                                           save_mean, save_inv_std, part);
    } else {
      GradSumsKernel<false><<<grid, block, 0, ctx.stream>>>(sh.m, sh.c, slices, xt, ss, dyt,
                                                            save_mean, save_inv_std, part);
    }
    TOPIARY_RETURN_IF_ERROR(LaunchStatus("batch norm gradient sums"));
    FinishGradKernel<<<MergeGrid(sh.c), MergeBlock(), 0, ctx.stream>>>(
        sh, slices, part, gamma, save_inv_std, dgamma, dbeta, coef, sync ? w.mine : nullptr);
    TOPIARY_RETURN_IF_ERROR(LaunchStatus("batch norm parameter gradients"));
    if (sync) {
      TOPIARY_RETURN_IF_ERROR(GatherDoubles(sync, w, 2 * static_cast<size_t>(sh.c)));
      MergeRankGradKernel<<<(sh.c + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(
          sh, sync->ranks(), w.all, 2 * static_cast<size_t>(sh.c), gamma, save_inv_std, coef);
      TOPIARY_RETURN_IF_ERROR(LaunchStatus("synchronized batch norm gradient sums"));
    }
    if (VecOk<T>(sh.c, {x, dy, dx})) {
      const int64_t nv = n / kVec<T>;
      auto apply = [&](auto kernel_tag) {
        constexpr auto kernel = decltype(kernel_tag)::kKernel;
        kernel<<<WaveBlocksFor<kernel>(nv, ctx.sm_count), kThreads, 0, ctx.stream>>>(
            nv, sh.c, xt, ss, dyt, save_mean, save_inv_std, coef, static_cast<T*>(dx));
      };
      if (sh.relu) {
        apply(KernelTag<GradApplyVecKernel<true, T>>{});
      } else {
        apply(KernelTag<GradApplyVecKernel<false, T>>{});
      }
    } else {
      TOPIARY_LAUNCH_ELEMENTWISE(GradApplyKernel, sh.relu, n, blocks, ctx.stream, sh.c, xt, ss, dyt,
                                 save_mean, save_inv_std, coef, static_cast<T*>(dx));
    }
    return LaunchStatus("batch norm input gradient");
  });
}

}  // namespace topiary::kernels
