// The residual tail (residual_tail.h) on the vector walks of the batch-norm kernels
// (batch_norm_cuda.cuh). The forward pass rounds each folded batch norm's output to the
// activation type before adding, as the unfused layers do when they store it, so fused and
// unfused networks compute the same values; the backward pass rounds g as the add's backward
// stores it, and sums the batch norms' gradients in the slices and order of
// BatchNormBackwardCuda.
#include "kernels/norm_pool/batch_norm_cuda.cuh"
#include "kernels/norm_pool/residual_tail.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/cuda_launch.cuh"

namespace topiary::kernels {
namespace {

template <bool kRelu, bool kProj, typename T>
__global__ void TailForwardKernel(int64_t nv, int c, const T* __restrict__ xa,
                                  const float* __restrict__ ssa, const T* __restrict__ xb,
                                  const float* __restrict__ ssb, T* __restrict__ y) {
  constexpr int V = kVec<T>;
  VecChannel at(c, V);
  float sa[V], ha[V], sb[V], hb[V];
  for (int64_t j = at.first; j < nv; j += at.stride, at.Next()) {
    if (at.Moved()) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        sa[e] = ssa[at.g * V + e];
        ha[e] = ssa[c + at.g * V + e];
        if (kProj) {
          sb[e] = ssb[at.g * V + e];
          hb[e] = ssb[c + at.g * V + e];
        }
      }
    }
    float a[V], b[V];
    LdVec(xa + j * V, a);
    LdVec(xb + j * V, b);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float bn_b = kProj ? Rounded<T>(b[e] * sb[e] + hb[e]) : b[e];
      const float v = Rounded<T>(a[e] * sa[e] + ha[e]) + bn_b;
      a[e] = kRelu ? fmaxf(v, 0.0f) : v;
    }
    StVec(y + j * V, a);
  }
}

// g = (dy + dy2) masked by y > 0, stored; with it, per slice and channel, sum g and
// sum g * xhat of each folded batch norm (a always, b with a projection).
template <bool kRelu, bool kDy2, bool kProj, typename T>
__global__ void TailGradSumsKernel(int64_t m, int c, int slices, const T* __restrict__ y,
                                   const T* __restrict__ dy, const T* __restrict__ dy2,
                                   const T* __restrict__ xa, const float* __restrict__ mean_a,
                                   const float* __restrict__ inv_a, const T* __restrict__ xb,
                                   const float* __restrict__ mean_b,
                                   const float* __restrict__ inv_b, T* __restrict__ g,
                                   float* __restrict__ part_a, float* __restrict__ part_b) {
  constexpr int V = kVec<T>;
  const VecRows w(m, c, slices, V);
  float ga[V], gxa[V], gb[V], gxb[V];
  for (int v = 0; v < V; ++v) ga[v] = gxa[v] = gb[v] = gxb[v] = 0.0f;
  if (w.active()) {
    float mua[V], isa[V], mub[V], isb[V];
    for (int v = 0; v < V; ++v) {
      mua[v] = mean_a[w.g * V + v];
      isa[v] = inv_a[w.g * V + v];
      if (kProj) {
        mub[v] = mean_b[w.g * V + v];
        isb[v] = inv_b[w.g * V + v];
      }
    }
#pragma unroll 2
    for (int64_t r = w.begin + w.lane; r < w.end; r += w.lanes) {
      const int64_t k = r * c + w.g * V;
      float gv[V], t[V];
      LdVec(dy + k, gv);
      if (kDy2) {
        LdVec(dy2 + k, t);
        for (int v = 0; v < V; ++v) gv[v] += t[v];
      }
      if (kRelu) {
        LdVec(y + k, t);
        for (int v = 0; v < V; ++v) gv[v] = t[v] > 0.0f ? gv[v] : 0.0f;
      }
      for (int v = 0; v < V; ++v) gv[v] = Rounded<T>(gv[v]);
      StVec(g + k, gv);
      LdVec(xa + k, t);
      for (int v = 0; v < V; ++v) {
        ga[v] += gv[v];
        gxa[v] += gv[v] * (t[v] - mua[v]) * isa[v];
      }
      if (kProj) {
        LdVec(xb + k, t);
        for (int v = 0; v < V; ++v) {
          gb[v] += gv[v];
          gxb[v] += gv[v] * (t[v] - mub[v]) * isb[v];
        }
      }
    }
  }
  __shared__ float s0[kVecThreads * V], s1[kVecThreads * V];
  StoreLane(w, c, ga, s0);
  StoreLane(w, c, gxa, s1);
  __syncthreads();
  WriteSliceSums(w, c, slices, s0, s1, part_a);
  if (!kProj) return;
  __syncthreads();
  StoreLane(w, c, gb, s0);
  StoreLane(w, c, gxb, s1);
  __syncthreads();
  WriteSliceSums(w, c, slices, s0, s1, part_b);
}

// The workspace: per batch norm (a, then b) the slices' partials [2][slices][C] and coef
// [3][C]; synchronized, from an even float, this rank's sums [2 or 4][C] and every rank's
// [ranks][2 or 4][C] as doubles.
struct TailWorkspace {
  float* part[2];
  float* coef[2];
  double* mine;
  double* all;
};
size_t TailSyncOffsetFloats(const BatchNormShape& bn) {
  const size_t floats = static_cast<size_t>(2) * (2 * Slices(bn) + 3) * bn.c;
  return floats + floats % 2;
}
TailWorkspace CarveTail(const BatchNormShape& bn, float* ws) {
  const size_t part = static_cast<size_t>(2) * Slices(bn) * bn.c, coef = 3 * bn.c;
  double* mine = reinterpret_cast<double*>(ws + TailSyncOffsetFloats(bn));
  return {{ws, ws + part},
          {ws + 2 * part, ws + 2 * part + coef},
          mine,
          mine + 4 * static_cast<size_t>(bn.c)};
}

BatchNormShape BnShape(const ResidualTailShape& sh) {
  BatchNormShape bn;
  bn.m = sh.m;
  bn.c = sh.c;
  return bn;
}

}  // namespace

bool ResidualTailFusableCuda(DType t, int c) {
  return VisitDType(t, [&](auto tag) { return VecReduceOk<decltype(tag)>(c, {}); });
}

size_t ResidualTailWorkspaceFloatsCuda(const ResidualTailShape& sh, int sync_ranks) {
  const BatchNormShape bn = BnShape(sh);
  if (sync_ranks <= 1) return TailSyncOffsetFloats(bn);
  return TailSyncOffsetFloats(bn) + 2 * 4 * static_cast<size_t>(sh.c) * (1 + sync_ranks);
}

absl::Status ResidualTailForwardCuda(DType t, const ResidualTailShape& sh, const FoldedBatchNorm& a,
                                     const FoldedBatchNorm& b, void* y, const CudaContext& ctx) {
  if (a.identity()) return absl::InvalidArgumentError("residual tail: input a has no batch norm");
  return VisitDType(t, [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    if (!VecReduceOk<T>(sh.c, {a.x, b.x, y})) {
      return absl::InvalidArgumentError("residual tail: channels or alignment not vectorizable");
    }
    const int64_t nv = sh.m * sh.c / kVec<T>;
    const T* xa = static_cast<const T*>(a.x);
    const T* xb = static_cast<const T*>(b.x);
    T* yt = static_cast<T*>(y);
    auto launch = [&](auto kernel_tag) {
      constexpr auto kernel = decltype(kernel_tag)::kKernel;
      kernel<<<WaveBlocksFor<kernel>(nv, ctx.sm_count), kThreads, 0, ctx.stream>>>(
          nv, sh.c, xa, a.scale_shift, xb, b.scale_shift, yt);
    };
    const bool proj = !b.identity();
    if (sh.relu && proj) launch(KernelTag<TailForwardKernel<true, true, T>>{});
    if (sh.relu && !proj) launch(KernelTag<TailForwardKernel<true, false, T>>{});
    if (!sh.relu && proj) launch(KernelTag<TailForwardKernel<false, true, T>>{});
    if (!sh.relu && !proj) launch(KernelTag<TailForwardKernel<false, false, T>>{});
    return LaunchStatus("residual tail");
  });
}

absl::Status ResidualTailBackwardCuda(DType t, const ResidualTailShape& sh, const void* y,
                                      const void* dy, const void* dy2, const FoldedBatchNorm& a,
                                      const FoldedBatchNorm& b, void* g, float* workspace,
                                      const CudaContext& ctx, BatchNormSync* sync) {
  if (a.identity()) return absl::InvalidArgumentError("residual tail: input a has no batch norm");
  const BatchNormShape bn = BnShape(sh);
  int slices = Slices(bn);
  const TailWorkspace w = CarveTail(bn, workspace);
  const bool proj = !b.identity();
  const int folded = proj ? 2 : 1;
  const FoldedBatchNorm* norms[2] = {&a, &b};
  return VisitDType(t, [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    if (!VecReduceOk<T>(sh.c, {y, dy, dy2, a.x, a.dx, b.x, b.dx, g})) {
      return absl::InvalidArgumentError("residual tail: channels or alignment not vectorizable");
    }
    auto sums = [&](auto kernel_tag) {
      constexpr auto kernel = decltype(kernel_tag)::kKernel;
      slices = WholeWaves<kernel>(slices, kVecThreads, ctx.sm_count);
      kernel<<<slices, kVecThreads, 0, ctx.stream>>>(
          sh.m, sh.c, slices, static_cast<const T*>(y), static_cast<const T*>(dy),
          static_cast<const T*>(dy2), static_cast<const T*>(a.x), a.save_mean, a.save_inv_std,
          static_cast<const T*>(b.x), b.save_mean, b.save_inv_std, static_cast<T*>(g), w.part[0],
          w.part[1]);
    };
    // Every combination of ReLU, second gradient and projection: 8 instantiations.
    const int variant = (sh.relu ? 4 : 0) + (dy2 != nullptr ? 2 : 0) + (proj ? 1 : 0);
    switch (variant) {
      case 0:
        sums(KernelTag<TailGradSumsKernel<false, false, false, T>>{});
        break;
      case 1:
        sums(KernelTag<TailGradSumsKernel<false, false, true, T>>{});
        break;
      case 2:
        sums(KernelTag<TailGradSumsKernel<false, true, false, T>>{});
        break;
      case 3:
        sums(KernelTag<TailGradSumsKernel<false, true, true, T>>{});
        break;
      case 4:
        sums(KernelTag<TailGradSumsKernel<true, false, false, T>>{});
        break;
      case 5:
        sums(KernelTag<TailGradSumsKernel<true, false, true, T>>{});
        break;
      case 6:
        sums(KernelTag<TailGradSumsKernel<true, true, false, T>>{});
        break;
      default:
        sums(KernelTag<TailGradSumsKernel<true, true, true, T>>{});
        break;
    }
    TOPIARY_RETURN_IF_ERROR(LaunchStatus("residual tail gradient sums"));
    for (int i = 0; i < folded; ++i) {
      const FoldedBatchNorm& f = *norms[i];
      FinishGradKernel<<<MergeGrid(sh.c), MergeBlock(), 0, ctx.stream>>>(
          bn, slices, w.part[i], f.gamma, f.save_inv_std, f.dgamma, f.dbeta, w.coef[i],
          sync ? w.mine + 2 * static_cast<size_t>(sh.c) * i : nullptr);
    }
    TOPIARY_RETURN_IF_ERROR(LaunchStatus("residual tail parameter gradients"));
    if (sync) {
      const size_t per_rank = 2 * static_cast<size_t>(sh.c) * folded;  // doubles
      TOPIARY_RETURN_IF_ERROR(sync->Gather(reinterpret_cast<const float*>(w.mine), 2 * per_rank,
                                           reinterpret_cast<float*>(w.all)));
      for (int i = 0; i < folded; ++i) {
        const FoldedBatchNorm& f = *norms[i];
        MergeRankGradKernel<<<(sh.c + kThreads - 1) / kThreads, kThreads, 0, ctx.stream>>>(
            bn, sync->ranks(), w.all + 2 * static_cast<size_t>(sh.c) * i, per_rank, f.gamma,
            f.save_inv_std, w.coef[i]);
      }
      TOPIARY_RETURN_IF_ERROR(LaunchStatus("synchronized residual tail gradient sums"));
    }
    const int64_t nv = sh.m * sh.c / kVec<T>;
    constexpr auto apply = GradApplyVecKernel<false, T>;
    const int blocks = WaveBlocksFor<apply>(nv, ctx.sm_count);
    for (int i = 0; i < folded; ++i) {
      const FoldedBatchNorm& f = *norms[i];
      apply<<<blocks, kThreads, 0, ctx.stream>>>(nv, sh.c, static_cast<const T*>(f.x), nullptr,
                                                 static_cast<const T*>(g), f.save_mean,
                                                 f.save_inv_std, w.coef[i], static_cast<T*>(f.dx));
    }
    return LaunchStatus("residual tail input gradients");
  });
}

}  // namespace topiary::kernels
