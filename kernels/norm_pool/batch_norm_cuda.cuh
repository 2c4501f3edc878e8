// Internal to the batch-norm CUDA kernels (batch_norm_cuda.cu) and the kernels that fold a batch
// norm into another pass (residual_tail_cuda.cu): the row slicing of the reductions, the vector
// walks over channels, and the backward pass's ordered sums and apply kernel. Everything is in
// an unnamed namespace: each .cu file that includes it gets its own copy.
#ifndef TOPIARY_KERNELS_NORM_POOL_BATCH_NORM_CUDA_CUH_
#define TOPIARY_KERNELS_NORM_POOL_BATCH_NORM_CUDA_CUH_

#include <cooperative_groups.h>

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "kernels/norm_pool/batch_norm.h"
#include "kernels/runtime/cuda_launch.cuh"
#include "kernels/runtime/moments.h"

namespace topiary::kernels {
namespace {

// Row slices of the reductions, one block each: enough blocks to keep every SM's loads in
// flight (a resnet50 layer4 batch norm has only 12,544 rows of 2,048 channels), at least
// 64 rows each so that the partial sums ([3][slices][C] floats) stay a small share of the
// traffic.
constexpr int kMaxSlices = 512;
int Slices(const BatchNormShape& sh) {
  return static_cast<int>(std::clamp<int64_t>(sh.m / 64, 1, kMaxSlices));
}

__device__ inline void RowRange(int64_t m, int slices, int slice, int64_t* begin, int64_t* end) {
  *begin = m * slice / slices;
  *end = m * (slice + 1) / slices;
}

// v as stored in type T.
template <typename T>
__device__ __forceinline__ float Rounded(float v) {
  T t;
  St(&t, v);
  return Ld(&t);
}

// Whether the fused ReLU passed the gradient of element x: its output, x * scale + shift
// stored in type T, is positive. The same expression as the forward pass's, so the same bits
// decide, without reading the output back.
template <typename T>
__device__ __forceinline__ bool ReluPasses(float x, float scale, float shift) {
  return Rounded<T>(x * scale + shift) > 0.0f;
}

// The kernels that merge each channel's slices ([P][slices][C] partials, P planes) take
// kMergeC neighbouring channels per block, so that a warp reads 32 consecutive floats of a
// slice (one coalesced access where a block per channel read one float per 32-byte sector), and
// spread the slices over a cluster of kMergeBlocks blocks of kMergeLanes lanes each: lane l of
// the cluster's kMergeBlocks * kMergeLanes adds the terms of slices l, l + that count, ... in
// that order (in double, kMergeBatch slices' loads in flight before they are added), the lanes
// of a block meet along a fixed binary tree in shared memory, and the cluster's first block adds
// the blocks' sums in rank order (sent through distributed shared memory). The same order on every
// run: the same bits. One block of 1,024 threads used to do all of it: a merge is a few dozen
// instructions per slice and channel, and on one SM its issue rate set the time (8 us for
// resnet20's 16 channels at 512 slices); the cluster spreads it over 8 SMs.
// Every merge is one sum (MergeSliceMoments: no division per slice, where Chan's pairwise
// merge of (count, mean, M2) takes two).
constexpr int kMergeC = 32;
constexpr int kMergeLanes = 8;
constexpr int kMergeBlocks = 8;  // a cluster; at most 8 is portable
constexpr int kMergeBatch = 8;
inline dim3 MergeGrid(int c) { return dim3((c + kMergeC - 1) / kMergeC, kMergeBlocks); }
constexpr int kMergeThreads = kMergeC * kMergeLanes;
inline dim3 MergeBlock() { return dim3(kMergeC, kMergeLanes); }
// The merge kernels' launch attributes: their block size and their cluster.
#define TOPIARY_MERGE_KERNEL \
  __global__ void __launch_bounds__(kMergeThreads) __cluster_dims__(1, kMergeBlocks, 1)

// Whether this thread of a merge kernel receives channel ch's sums: the first lane's thread of
// the channel in the cluster's first block, the only one that writes them.
__device__ inline bool HoldsMerge(int c, int ch) {
  return cooperative_groups::this_cluster().block_rank() == 0 && threadIdx.y == 0 && ch < c;
}

// Sums term(slice's P partials) over channel ch's slices of part into v (a cluster of
// MergeGrid's blocks of MergeBlock(), blockIdx.x the channel tile; the partials of a slice past
// the end count as zeros and are not added), for the thread that HoldsMerge. Every thread of the
// cluster calls it once (it synchronizes the cluster).
template <int P, int Q, typename Term>
__device__ void SumSlices(int c, int slices, const float* __restrict__ part, int ch, Term term,
                          double (&v)[Q]) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  constexpr int kClusterLanes = kMergeBlocks * kMergeLanes;
  __shared__ double lanes[Q][kMergeLanes][kMergeC];
  const int rank = static_cast<int>(cluster.block_rank());
  // Distributed shared memory may be written once every block of the cluster runs: each block
  // says it does here and waits for the others only before it writes, behind its loads.
  auto started = cluster.barrier_arrive();
  const size_t plane = static_cast<size_t>(slices) * c;
  for (int q = 0; q < Q; ++q) v[q] = 0.0;
  if (ch < c) {
    for (int first = rank * kMergeLanes + threadIdx.y; first < slices;
         first += kMergeBatch * kClusterLanes) {
      float b[kMergeBatch][P];
#pragma unroll
      for (int k = 0; k < kMergeBatch; ++k) {
        const int s = first + k * kClusterLanes;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          b[k][p] = s < slices ? part[p * plane + static_cast<size_t>(s) * c + ch] : 0.0f;
        }
      }
#pragma unroll
      for (int k = 0; k < kMergeBatch; ++k) {
        if (first + k * kClusterLanes < slices) term(b[k], v);
      }
    }
  }
  for (int q = 0; q < Q; ++q) lanes[q][threadIdx.y][threadIdx.x] = v[q];
  __syncthreads();
  for (int stride = kMergeLanes / 2; stride > 0; stride /= 2) {
    if (threadIdx.y < stride) {
      for (int q = 0; q < Q; ++q) {
        lanes[q][threadIdx.y][threadIdx.x] += lanes[q][threadIdx.y + stride][threadIdx.x];
      }
    }
    __syncthreads();
  }
  // Each block puts its sums into the first block's [Q][kMergeBlocks][kMergeC] (through
  // distributed shared memory); after the one cluster barrier the first block reads its own
  // shared memory, and no block's shared memory is read once it may have exited.
  __shared__ double blocks[Q][kMergeBlocks][kMergeC];
  cluster.barrier_wait(std::move(started));
  if (threadIdx.y == 0) {
    for (int q = 0; q < Q; ++q) {
      *cluster.map_shared_rank(&blocks[q][rank][threadIdx.x], 0) = lanes[q][0][threadIdx.x];
    }
  }
  cluster.sync();
  if (HoldsMerge(c, ch)) {
    for (int q = 0; q < Q; ++q) {
      v[q] = blocks[q][0][threadIdx.x];
      for (int r = 1; r < kMergeBlocks; ++r) v[q] += blocks[q][r][threadIdx.x];
    }
  }
}

// Channel ch's (count, mean, M2) from its slices' (count, mean, M2) partials, in one ordered
// sum with no division per slice: around a shift K (slice 0's mean where it has rows, which is
// within a few standard deviations of the channel's), with d_i = mean_i - K, the sums
// N = sum n_i, S = sum n_i d_i and Q = sum M2_i + n_i d_i^2 give mean = K + S / N and
// M2 = Q - S^2 / N, the exact decomposition of the sum of squares (S / N is small beside
// the spread, so nothing cancels). Empty slices add nothing, whatever their mean and M2 hold
// (an epilogue may leave NaN there).
__device__ inline void MergeSliceMoments(int c, int slices, const float* part, int ch,
                                         double (&v)[3]) {
  const size_t plane = static_cast<size_t>(slices) * c;
  const bool first_rows = ch < c && part[ch] > 0.0f;
  const double shift = first_rows ? part[plane + ch] : 0.0;
  double s[3];
  SumSlices<3>(
      c, slices, part, ch,
      [shift](const float(&b)[3], double(&t)[3]) {
        if (b[0] == 0.0f) return;
        const double d = b[1] - shift, nd = b[0] * d;
        t[0] += b[0];
        t[1] += nd;
        t[2] += b[2] + nd * d;
      },
      s);
  const double md = s[0] > 0.0 ? s[1] / s[0] : 0.0;
  v[0] = s[0];
  v[1] = shift + md;
  v[2] = fmax(s[2] - s[1] * md, 0.0);
}

// Channel ch's two sums (of g and g * xhat) over its slices.
__device__ inline void MergeSliceSums(int c, int slices, const float* part, int ch,
                                      double (&v)[2]) {
  SumSlices<2>(
      c, slices, part, ch,
      [](const float(&b)[2], double(&s)[2]) {
        s[0] += b[0];
        s[1] += b[1];
      },
      v);
}

// Vector forms of the per-element kernels (kernels/runtime/cuda_launch.cuh), used when C is a
// multiple of the vector width so that a vector never straddles two rows: one 16-byte access
// per operand instead of 4 or 8 element accesses.
//
// A thread's vectors are a grid stride apart, so its channel advances by a fixed step each
// iteration (VecChannel): one division per thread, none per vector.
struct VecChannel {
  int64_t first, stride;  // the thread's first vector and the grid stride
  int cv, step, g;        // vectors per row, the step, the current vector of the row
  int loaded = -1;        // the vector of the row whose per-channel values the thread holds
  __device__ VecChannel(int c, int width)
      : first(blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x),
        stride(static_cast<int64_t>(gridDim.x) * blockDim.x),
        cv(c / width),
        step(static_cast<int>(stride % cv)),
        g(static_cast<int>(first % cv)) {}
  __device__ void Next() {
    g += step;
    if (g >= cv) g -= cv;
  }
  // True once per change of channel: the caller loads the channel's values again (never
  // again, when the grid stride is a multiple of the row).
  __device__ bool Moved() {
    if (g == loaded) return false;
    loaded = g;
    return true;
  }
};

template <bool kRelu, typename T>
__global__ void GradApplyVecKernel(int64_t nv, int c, const T* __restrict__ x,
                                   const float* __restrict__ scale_shift, const T* __restrict__ dy,
                                   const float* __restrict__ mean,
                                   const float* __restrict__ inv_std,
                                   const float* __restrict__ coef, T* __restrict__ dx) {
  constexpr int V = kVec<T>;
  VecChannel at(c, V);
  // Per channel, held while the channel stays (as in ScaleShiftVecKernel): dx = a * (g -
  // mean(g) - xhat * mean(g * xhat)) with a = gamma * inv_std; with the ReLU, the forward
  // pass's scale and shift.
  float mu[V], is[V], a[V], mg[V], mgx[V], sc[V], sh[V];
  for (int64_t j = at.first; j < nv; j += at.stride, at.Next()) {
    if (at.Moved()) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int k = at.g * V + e;
        mu[e] = mean[k];
        is[e] = inv_std[k];
        a[e] = coef[k];
        mg[e] = coef[c + k];
        mgx[e] = coef[2 * c + k];
        if (kRelu) {
          sc[e] = scale_shift[k];
          sh[e] = scale_shift[c + k];
        }
      }
    }
    float xv[V], gv[V];
    LdVec(x + j * V, xv);
    LdVec(dy + j * V, gv);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float g = (!kRelu || ReluPasses<T>(xv[e], sc[e], sh[e])) ? gv[e] : 0.0f;
      const float xhat = (xv[e] - mu[e]) * is[e];
      xv[e] = a[e] * (g - mg[e] - xhat * mgx[e]);
    }
    StVec(dx + j * V, xv);
  }
}

// Whether the vector kernels apply: C a multiple of the width, every pointer aligned.
template <typename T>
bool VecOk(int c, std::initializer_list<const void*> ptrs) {
  if (c % kVec<T> != 0) return false;
  for (const void* p : ptrs) {
    if (p != nullptr && !Aligned16(p)) return false;
  }
  return true;
}

// Vector forms of the two reductions, for C a multiple of the vector width (16 bytes) with
// C / width <= kVecThreads: a thread loads one 16-byte vector of a row (all C channels take
// `groups` threads, so a warp reads whole rows, however few channels there are), and a
// block's lanes walk the slice's rows. The scalar kernels above give a warp one channel tile
// of 32 and leave half of it idle at 16 channels (resnet20's first stage). The lanes are
// merged in order per channel, so results are as deterministic as the scalar kernels'.
constexpr int kVecThreads = 256;

template <typename T>
bool VecReduceOk(int c, std::initializer_list<const void*> ptrs) {
  return VecOk<T>(c, ptrs) && c / kVec<T> <= kVecThreads;
}

// Where a thread of the vector reductions works: its vector of channels g (of `groups` per
// row), its row lane (of `lanes`), and its slice's rows [begin, end).
struct VecRows {
  int groups, lanes, g, lane;
  int64_t begin, end;
  __device__ VecRows(int64_t m, int c, int slices, int width)
      : groups(c / width),
        lanes(kVecThreads / groups),
        g(threadIdx.x % groups),
        lane(threadIdx.x / groups) {
    RowRange(m, slices, blockIdx.x, &begin, &end);
  }
  __device__ bool active() const { return lane < lanes; }
};

// Puts a thread's per-channel values in its lane's row of the block's [lanes][C] array.
template <int V>
__device__ void StoreLane(const VecRows& w, int c, const float (&v)[V], float* lanes_by_c) {
  if (!w.active()) return;
  for (int k = 0; k < V; ++k) lanes_by_c[w.lane * c + w.g * V + k] = v[k];
}

// Channel ch's two per-lane sums (two [lanes][C] arrays in shared memory) added in lane order.
__device__ inline void SumLanes(const VecRows& w, int c, int ch, const float* s0, const float* s1,
                                float* t0, float* t1) {
  *t0 = *t1 = 0.0f;
  for (int l = 0; l < w.lanes; ++l) {
    *t0 += s0[l * c + ch];
    *t1 += s1[l * c + ch];
  }
}

// A block's per-lane sums added in lane order (SumLanes) into the slice's row of
// out[2][slices][C].
__device__ void WriteSliceSums(const VecRows& w, int c, int slices, const float* s0,
                               const float* s1, float* out) {
  const size_t plane = static_cast<size_t>(slices) * c;
  for (int ch = threadIdx.x; ch < c; ch += blockDim.x) {
    float t0, t1;
    SumLanes(w, c, ch, s0, s1, &t0, &t1);
    out[static_cast<size_t>(blockIdx.x) * c + ch] = t0;
    out[plane + static_cast<size_t>(blockIdx.x) * c + ch] = t1;
  }
}

// The backward pass's per-channel coefficients from the sums of g and g * xhat over `rows`
// rows (the global batch's, synchronized): coef = {gamma*inv_std, mean(g), mean(g*xhat)}, with
// scale = gamma * inv_std.
__device__ void GradCoef(int c, int ch, double a, double b, double rows, float scale, float* coef) {
  const double inv_rows = 1.0 / rows;
  coef[ch] = scale;
  coef[c + ch] = static_cast<float>(a * inv_rows);
  coef[2 * c + ch] = static_cast<float>(b * inv_rows);
}

// Per channel (MergeGrid, MergeBlock): dgamma and dbeta (this rank's sums of the slices, in
// double), then coef (GradCoef) or, synchronized, the sums into rank_sums[2][C] for the gather.
TOPIARY_MERGE_KERNEL FinishGradKernel(BatchNormShape sh, int slices, const float* part,
                                      const float* gamma, const float* inv_std, float* dgamma,
                                      float* dbeta, float* coef, double* rank_sums) {
  const int ch = blockIdx.x * kMergeC + threadIdx.x;
  const bool holds = HoldsMerge(sh.c, ch);
  // Read before the merge, so that the loads wait alongside its loads.
  const float scale = holds && rank_sums == nullptr ? gamma[ch] * inv_std[ch] : 0.0f;
  double v[2];
  MergeSliceSums(sh.c, slices, part, ch, v);
  if (!holds) return;
  const double a = v[0], b = v[1];
  dbeta[ch] = static_cast<float>(a);
  dgamma[ch] = static_cast<float>(b);
  if (rank_sums != nullptr) {
    rank_sums[ch] = a;
    rank_sums[sh.c + ch] = b;
    return;
  }
  GradCoef(sh.c, ch, a, b, static_cast<double>(sh.m), scale, coef);
}

// Synchronized: a thread per channel adds the ranks' gathered sums (rank r's [2][C] at
// all + r * rank_stride) in rank order and writes coef over the global batch's rows.
__global__ void MergeRankGradKernel(BatchNormShape sh, int ranks, const double* all,
                                    size_t rank_stride, const float* gamma, const float* inv_std,
                                    float* coef) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= sh.c) return;
  const size_t c = sh.c;
  double a = 0, b = 0;
  for (int r = 0; r < ranks; ++r) {
    a += all[rank_stride * r + ch];
    b += all[rank_stride * r + c + ch];
  }
  GradCoef(sh.c, ch, a, b, static_cast<double>(sh.m) * ranks, gamma[ch] * inv_std[ch], coef);
}

}  // namespace
}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_NORM_POOL_BATCH_NORM_CUDA_CUH_
