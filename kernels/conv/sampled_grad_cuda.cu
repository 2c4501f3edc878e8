// Sampled weight gradients on the GPU (the method: sampled_grad.h).
//
// 1. Selection: a block per (image, 8 to 32 output channels); its position groups split the
//    output positions into contiguous chunks and each thread (one channel: adjacent threads
//    read adjacent channels, so loads of dY are coalesced) keeps the sum and a sorted list of
//    its chunk's largest |dY| in registers; the first group merges the lists. Lists hold up to 16
//    entries; larger top_k (short of every position) takes a per-(image, channel) bisection on the
//    magnitudes' bit patterns instead.
// 2. Gather: a block per (256 filter elements, output channel, group of images) sums the kept
//    positions' input patches (threads run along C, so the loads are coalesced in NHWC).
// 3. Reduce: the groups' partial sums in a fixed order (deterministic), scale, mask, dbias.
#include "kernels/conv/sampled_grad.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"

namespace topiary::kernels {
namespace {

constexpr int kSelectThreads = 256;
constexpr int kListMax = 16;         // the longest register list
constexpr int kGatherBlocks = 1024;  // gather blocks to aim for (images are split to get there)
constexpr int kIlp = 8;              // loads in flight per thread: these kernels are latency-bound

// Channels per selection block: 32 (one warp's lanes) when K allows, else 16 or 8, so that
// narrow layers spend their threads on more position groups instead of idle lanes.
int SelectWidth(int k) { return k >= 32 ? 32 : (k >= 16 ? 16 : 8); }

// Whether (a, p) ranks before (b, q): larger magnitude, then the earlier position; q < 0 is
// an empty slot.
__device__ __forceinline__ bool Before(float a, int p, float b, int q) {
  return q < 0 || a > b || (a == b && p < q);
}

// A block per (image, `width` output channels): 256 / width position groups each scan a
// contiguous chunk of positions, kIlp loads at a time, keeping the sum and the kCap largest
// |dY| in registers; the first group then merges the lists (kCap 0: sums only).
template <typename T, int kCap>
__global__ void SelectKernel(ConvShape s, int kk, int width, const T* __restrict__ dy, float* sums,
                             int32_t* positions, float* weights) {
  constexpr int kSlots = kCap > 0 ? kCap : 1;
  __shared__ float list_v[kSlots][kSelectThreads];
  __shared__ int list_p[kSlots][kSelectThreads];
  __shared__ float part[kSelectThreads];
  const int lane = threadIdx.x % width, g = threadIdx.x / width;
  const int groups = kSelectThreads / width;
  const int k = blockIdx.x * width + lane;
  const int64_t n = blockIdx.y;
  const int count = s.ho() * s.wo();
  const int chunk = (count + groups - 1) / groups;
  const int begin = min(count, g * chunk), end = min(count, begin + chunk);
  float v[kSlots];
  int p_of[kSlots];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) v[i] = 0.0f, p_of[i] = -1;
  float sum = 0.0f;
  if (k < s.k) {
    const T* g_in = dy + n * count * s.k + k;
    for (int p0 = begin; p0 < end; p0 += kIlp) {
      float batch[kIlp];
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        batch[u] = p0 + u < end ? Ld(g_in + static_cast<int64_t>(p0 + u) * s.k) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        const int p = p0 + u;
        if (p >= end) break;
        const float x = batch[u];
        sum += x;
        if constexpr (kCap > 0) {
          if (Before(fabsf(x), p, fabsf(v[kCap - 1]), p_of[kCap - 1])) {
            v[kCap - 1] = x;
            p_of[kCap - 1] = p;
#pragma unroll
            for (int i = kCap - 1; i > 0; --i) {
              if (Before(fabsf(v[i]), p_of[i], fabsf(v[i - 1]), p_of[i - 1])) {
                const float tv = v[i];
                v[i] = v[i - 1];
                v[i - 1] = tv;
                const int tp = p_of[i];
                p_of[i] = p_of[i - 1];
                p_of[i - 1] = tp;
              }
            }
          }
        }
      }
    }
  }
  part[threadIdx.x] = sum;
#pragma unroll
  for (int i = 0; i < kCap; ++i) list_v[i][threadIdx.x] = v[i], list_p[i][threadIdx.x] = p_of[i];
  __syncthreads();
  if (g != 0 || k >= s.k) return;
  float total = 0.0f;
  for (int q = 0; q < groups; ++q) total += part[q * width + lane];
  const int64_t nk = n * s.k + k;
  sums[nk] = total;
  if constexpr (kCap > 0) {
    // The lists are sorted: take the best head kk times. Up to 32 groups are too many for
    // head indices in registers, so a taken entry is marked in the list itself (position -2)
    // and a group's head is its first entry not taken.
    float kept = 0.0f, kept_abs = 0.0f;
    for (int t = 0; t < kk; ++t) {
      int best = -1, best_p = -1, best_slot = 0;
      float best_a = 0.0f;
      for (int q = 0; q < groups; ++q) {
        const int col = q * width + lane;
        int slot = 0;
        while (slot < kCap && list_p[slot][col] == -2) ++slot;  // -2: taken
        if (slot >= kCap) continue;
        const int p = list_p[slot][col];
        if (p < 0) continue;
        const float a = fabsf(list_v[slot][col]);
        if (Before(a, p, best_a, best_p)) best = col, best_a = a, best_p = p, best_slot = slot;
      }
      const float x = list_v[best_slot][best];
      list_p[best_slot][best] = -2;
      kept += x;
      kept_abs += fabsf(x);
      positions[nk * kk + t] = best_p;
      weights[nk * kk + t] = x;
    }
    const float r = SampleRatio(total, kept, kept_abs, false);
    for (int t = 0; t < kk; ++t) weights[nk * kk + t] *= r;
  }
}

// Any top_k short of every position: per (image, channel), the kk-th largest magnitude by
// bisection on its bit pattern (non-negative floats order as their bits), then the positions
// above it and the earliest ones equal to it.
template <typename T>
__global__ void SelectBisectKernel(ConvShape s, int kk, const T* __restrict__ dy, float* sums,
                                   int32_t* positions, float* weights) {
  const int k = blockIdx.x * 32 + threadIdx.x;
  if (k >= s.k) return;
  const int64_t n = blockIdx.y;
  const int count = s.ho() * s.wo();
  const T* g_in = dy + n * count * s.k + k;
  auto bits = [&](int p) {
    return __float_as_uint(fabsf(Ld(g_in + static_cast<int64_t>(p) * s.k)));
  };
  unsigned threshold = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const unsigned candidate = threshold | (1u << bit);
    int at_least = 0;
    for (int p = 0; p < count; ++p) at_least += bits(p) >= candidate;
    if (at_least >= kk) threshold = candidate;
  }
  int above = 0;
  for (int p = 0; p < count; ++p) above += bits(p) > threshold;
  int ties = kk - above;
  const int64_t nk = n * s.k + k;
  float total = 0.0f, kept = 0.0f, kept_abs = 0.0f;
  int t = 0;
  for (int p = 0; p < count; ++p) {
    const float x = Ld(g_in + static_cast<int64_t>(p) * s.k);
    total += x;
    const unsigned b = __float_as_uint(fabsf(x));
    if (b > threshold || (b == threshold && ties-- > 0)) {
      kept += x;
      kept_abs += fabsf(x);
      positions[nk * kk + t] = p;
      weights[nk * kk + t] = x;
      ++t;
    }
  }
  sums[nk] = total;
  const float r = SampleRatio(total, kept, kept_abs, false);
  for (int i = 0; i < kk; ++i) weights[nk * kk + i] *= r;
}

template <typename T>
__global__ void GatherKernel(ConvShape s, int kk, int splits, const T* __restrict__ x,
                             const T* __restrict__ dy, const int32_t* __restrict__ positions,
                             const float* __restrict__ weights, float* partials) {
  __shared__ int pair_n[kThreads], pair_h[kThreads], pair_w[kThreads];
  __shared__ float pair_weight[kThreads];
  const int patch = s.patch();
  const int e = blockIdx.x * kThreads + threadIdx.x;
  const int k = blockIdx.y, split = blockIdx.z;
  const int c = e % s.c, j = (e / s.c) % s.s, i = e / (s.c * s.s);
  const int count = s.ho() * s.wo();
  const bool all = positions == nullptr;
  const int64_t n0 = static_cast<int64_t>(s.n) * split / splits;
  const int64_t n1 = static_cast<int64_t>(s.n) * (split + 1) / splits;
  const int64_t pairs = (n1 - n0) * kk;
  float acc = 0.0f;
  for (int64_t base = 0; base < pairs; base += kThreads) {
    __syncthreads();  // the previous round's pairs are consumed
    const int64_t q = base + threadIdx.x;
    if (q < pairs) {
      const int64_t n = n0 + q / kk;
      const int t = static_cast<int>(q % kk);
      const int64_t at = (n * s.k + k) * kk + t;
      const int p = all ? t : positions[at];
      pair_n[threadIdx.x] = static_cast<int>(n);
      pair_h[threadIdx.x] = (p / s.wo()) * s.stride_h - s.pad_h;
      pair_w[threadIdx.x] = (p % s.wo()) * s.stride_w - s.pad_w;
      pair_weight[threadIdx.x] = all ? Ld(dy + (n * count + p) * s.k + k) : weights[at];
    }
    __syncthreads();
    if (e >= patch) continue;
    const int in_round = static_cast<int>(pairs - base < kThreads ? pairs - base : kThreads);
    for (int m0 = 0; m0 < in_round; m0 += kIlp) {
      float v[kIlp], wt[kIlp];
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        const int m = m0 + u;
        const int h = pair_h[m] + i, w = pair_w[m] + j;  // stale beyond in_round: masked
        const bool inside = m < in_round && h >= 0 && h < s.h && w >= 0 && w < s.w;
        wt[u] = inside ? pair_weight[m] : 0.0f;
        v[u] = inside ? Ld(x + ((static_cast<int64_t>(pair_n[m]) * s.h + h) * s.w + w) * s.c + c)
                      : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kIlp; ++u) acc += wt[u] * v[u];
    }
  }
  if (e < patch) partials[(static_cast<int64_t>(split) * s.k + k) * patch + e] = acc;
}

template <typename T>
__global__ void ReduceKernel(ConvShape s, int splits, float scale, const float* partials,
                             const float* sums, const uint8_t* mask, T* dw, float* dbias) {
  const int64_t total = static_cast<int64_t>(s.k) * s.patch();
  TOPIARY_GRID_STRIDE(idx, total) {
    float v = 0.0f;
    for (int q = 0; q < splits; ++q) v += partials[q * total + idx];
    St(dw + idx, mask != nullptr && mask[idx] == 0 ? 0.0f : scale * v);
    if (dbias != nullptr && idx < s.k) {
      float b = 0.0f;
      for (int n = 0; n < s.n; ++n) b += sums[static_cast<int64_t>(n) * s.k + idx];
      dbias[idx] = b;
    }
  }
}

// Images per gather block: split so that small layers still launch about kGatherBlocks
// blocks. A function of the shape only, so the workspace can be sized when planning.
int Splits(const ConvShape& s) {
  const int64_t blocks = static_cast<int64_t>((s.patch() + kThreads - 1) / kThreads) * s.k;
  const int64_t want = (kGatherBlocks + blocks - 1) / blocks;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, s.n, 64})));
}

template <typename T>
absl::Status Run(const ConvShape& s, const WeightGradSampling& sampling, const T* x, const T* dy,
                 const uint8_t* mask, T* dw, float* dbias, void* workspace,
                 const CudaContext& cuda) {
  const SampledGradWorkspace ws(s, sampling.top_k, workspace, Splits(s), 0);
  const int kk = ws.kk;
  const int width = SelectWidth(s.k);
  const dim3 select_grid((s.k + width - 1) / width, s.n);
  const dim3 bisect_grid((s.k + 31) / 32, s.n);
  if (ws.positions == nullptr) {
    SelectKernel<T, 0><<<select_grid, kSelectThreads, 0, cuda.stream>>>(s, kk, width, dy, ws.sums,
                                                                        nullptr, nullptr);
  } else if (kk == 1) {
    SelectKernel<T, 1><<<select_grid, kSelectThreads, 0, cuda.stream>>>(s, kk, width, dy, ws.sums,
                                                                        ws.positions, ws.weights);
  } else if (kk <= 4) {
    SelectKernel<T, 4><<<select_grid, kSelectThreads, 0, cuda.stream>>>(s, kk, width, dy, ws.sums,
                                                                        ws.positions, ws.weights);
  } else if (kk <= kListMax) {
    SelectKernel<T, kListMax><<<select_grid, kSelectThreads, 0, cuda.stream>>>(
        s, kk, width, dy, ws.sums, ws.positions, ws.weights);
  } else {
    SelectBisectKernel<T>
        <<<bisect_grid, 32, 0, cuda.stream>>>(s, kk, dy, ws.sums, ws.positions, ws.weights);
  }
  const dim3 gather_grid((s.patch() + kThreads - 1) / kThreads, s.k, ws.splits);
  GatherKernel<T><<<gather_grid, kThreads, 0, cuda.stream>>>(s, kk, ws.splits, x, dy, ws.positions,
                                                             ws.weights, ws.partials);
  const int64_t total = static_cast<int64_t>(s.k) * s.patch();
  ReduceKernel<T><<<BlocksFor(total, cuda.sm_count), kThreads, 0, cuda.stream>>>(
      s, ws.splits, sampling.scale, ws.partials, ws.sums, mask, dw, dbias);
  return LaunchStatus("sampled weight gradient");
}

}  // namespace

size_t SampledWeightGradWorkspaceBytes(const ConvShape& shape, int top_k) {
  return SampledGradWorkspace(shape, top_k, nullptr, Splits(shape), 0).bytes;
}

absl::Status SampledWeightGradCuda(DType dtype, const ConvShape& shape,
                                   const WeightGradSampling& sampling, const void* x,
                                   const void* dy, const uint8_t* mask, void* dw, float* dbias,
                                   void* workspace, const CudaContext& cuda) {
  if (dtype == DType::kBf16) {
    return Run(shape, sampling, static_cast<const Bf16*>(x), static_cast<const Bf16*>(dy), mask,
               static_cast<Bf16*>(dw), dbias, workspace, cuda);
  }
  return Run(shape, sampling, static_cast<const float*>(x), static_cast<const float*>(dy), mask,
             static_cast<float*>(dw), dbias, workspace, cuda);
}

}  // namespace topiary::kernels
