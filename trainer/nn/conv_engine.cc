#include "trainer/nn/conv_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/approx/approx_conv.h"
#include "kernels/conv/conv_onednn.h"
#include "kernels/conv/sampled_grad.h"
#include "kernels/sparse/block_sparse_conv.h"
#include "trainer/nn/moments_dispatch.h"
#include "trainer/nn/plan_cache.h"
#include "trainer/nn/sparse_dispatch.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

// "forward: direct kernel (0.0300 ms); backward data: cuDNN engine 25 (0.0350 ms); backward
// filter: cuDNN algorithm 1 (untimed)": what each pass of a cuDNN plan runs.
std::string DescribeAlgos(const kernels::ConvAlgos& algos) {
  std::vector<std::string> parts;
  for (int p = 0; p < 3; ++p) {
    const char* pass = kernels::SparsePassName(static_cast<kernels::SparsePass>(p));
    const kernels::ConvPassAlgo& a = algos.pass[p];
    const std::string what = a.direct  ? "direct kernel"
                             : a.graph ? absl::StrFormat("cuDNN engine %d", a.engine)
                                       : absl::StrFormat("cuDNN algorithm %d", a.algo);
    const std::string ms = a.ms < 0 ? "untimed" : absl::StrFormat("%.4f ms", a.ms);
    parts.push_back(absl::StrFormat("%s: %s (%s)", pass, what, ms));
  }
  return absl::StrJoin(parts, "; ");
}

// "block mask (50% of blocks kept): forward block-sparse tc 128x64/4 (0.0200 ms against
// cuDNN's 0.0300 ms), ...": the block-sparse dispatch's measured (or forced) choice.
std::string DescribeSparse(const SparseConvChoice& c) {
  std::vector<std::string> parts;
  for (int p = 0; p < 3; ++p) {
    const char* pass = kernels::SparsePassName(static_cast<kernels::SparsePass>(p));
    const char* side = c.sparse[p] ? "block-sparse" : "dense";
    if (c.dense_ms[p] < 0) {
      parts.push_back(absl::StrFormat("%s %s (untimed)", pass, side));
    } else if (c.dense_ms[p] == 0 && c.sparse_ms[p] == 0) {
      parts.push_back(absl::StrFormat("%s %s %s (forced)", pass, side, c.config[p]));
    } else if (p == 0 && c.forward_with_statistics) {
      parts.push_back(absl::StrFormat(
          "%s %s (%s %.4f ms against the moments route's %.4f ms, both with the statistics)", pass,
          side, c.config[p], c.sparse_ms[p], c.dense_ms[p]));
    } else {
      parts.push_back(absl::StrFormat("%s %s (%s %.4f ms against cuDNN's %.4f ms)", pass, side,
                                      c.config[p], c.sparse_ms[p], c.dense_ms[p]));
    }
  }
  return absl::StrFormat("block mask (%.0f%% of blocks kept): %s", 100 * c.density,
                         absl::StrJoin(parts, ", "));
}

// On a GPU: the cuDNN plan (descriptors and measured algorithms) for this batch size, and
// for the exact engine the dispatch to block-sparse kernels (used once the kernel has a block
// mask; see sparse_dispatch.h).
struct ConvState : LayerState {
  std::unique_ptr<kernels::ConvCudaPlan> plan;
  // On the CPU: oneDNN's primitives, when this build has them (else the reference kernels).
  std::unique_ptr<kernels::ConvOneDnnPlan> cpu;
  std::unique_ptr<SparseConvDispatch> sparse;
  // A training network's convolution that one batch norm alone reads (LayerIo::moments).
  std::unique_ptr<MomentsDispatch> moments;
  const SparseConvChoice* sparse_choice() const override {
    return sparse != nullptr && sparse->choice().dense_ms[0] >= 0 ? &sparse->choice() : nullptr;
  }
  std::string Describe() const override {
    std::string s = plan != nullptr  ? DescribeAlgos(plan->algos())
                    : cpu != nullptr ? "oneDNN"
                                     : "im2col + GEMM";
    if (const SparseConvChoice* c = sparse_choice()) {
      s += "; " + DescribeSparse(*c);
    } else if (sparse != nullptr) {
      s += "; once block-masked, each pass times the block-sparse kernels against this";
    }
    if (moments != nullptr && sparse_choice() != nullptr && sparse_choice()->sparse[0]) {
      // A block-masked layer whose forward runs block-sparse.
      s += sparse->wrote_moments() ? "; its block-sparse forward writes the batch norm's moments"
                                   : "; the batch norm reads y for its statistics";
    } else if (moments != nullptr) {
      s += "; " + moments->Describe();
    }
    return s;
  }
};

const kernels::ConvCudaPlan& Plan(const LayerIo& io) {
  return *static_cast<const ConvState*>(io.state)->plan;
}

kernels::ConvOneDnnPlan* CpuPlan(const LayerIo& io) {
  return io.state != nullptr ? static_cast<const ConvState*>(io.state)->cpu.get() : nullptr;
}

SparseConvDispatch* Sparse(const LayerIo& io) {
  return static_cast<const ConvState*>(io.state)->sparse.get();
}
MomentsDispatch* Moments(const LayerIo& io) {
  return static_cast<const ConvState*>(io.state)->moments.get();
}

// Runs a pass with the block-sparse kernels when the layer's dispatch measured them faster
// for its current mask, else with `dense` (cuDNN); see sparse_dispatch.h. `moments`: the
// training forward's moments request (null: none), whose route runs the pass where a layer
// has no block-sparse dispatch (with one, the dispatch falls back to the route itself).
absl::Status Dispatch(SparseConvDispatch* sparse, kernels::SparsePass pass, const ConvOperands& op,
                      const LayerIo& io, const void* in0, const void* in1, void* out,
                      const float* bias, float* dbias, const std::function<absl::Status()>& dense,
                      const SparseConvDispatch::MomentsRequest* moments = nullptr) {
  bool ran = false;
  if (sparse != nullptr) {
    TOPIARY_ASSIGN_OR_RETURN(
        ran, sparse->Run(pass, *op.kernel, in0, in1, out, bias, dbias, dense, *io.cuda, moments));
  } else if (moments != nullptr) {
    TOPIARY_ASSIGN_OR_RETURN(ran, moments->route->Run(in0, in1, out, moments->workspace,
                                                      moments->moments, dense, *io.cuda));
  }
  return ran ? absl::OkStatus() : dense();
}

absl::Status Named(const std::string& layer, const absl::Status& st) {
  return absl::Status(st.code(), absl::StrCat(layer, ": ", st.message()));
}

// The workspace a sampled weight gradient needs (0 for a layer that never samples).
absl::StatusOr<size_t> SampledWorkspace(const ConvOperands& op, Device* device) {
  if (op.sampling == nullptr) return 0;
  if (auto st = kernels::CheckSampledWeightGradShape(op.shape, op.sampling->top_k); !st.ok()) {
    return Named(op.layer, st);
  }
  return device->cuda() != nullptr
             ? kernels::SampledWeightGradWorkspaceBytes(op.shape, op.sampling->top_k)
             : kernels::SampledWeightGradWorkspaceBytesCpu(op.shape, op.sampling->top_k);
}

// The cuDNN plan of a convolution: from the plan cache when it knows the shape on this GPU,
// else searched (timed while the network's search budget lasts) and added to the cache. A
// cached choice made untimed is timed while the (shorter) refine budget lasts.
absl::StatusOr<std::unique_ptr<kernels::ConvCudaPlan>> CachedConvPlan(
    const ConvOperands& op, const kernels::CudaContext& cuda, const PlanOptions& options) {
  ConvPlanCache& cache = ConvPlanCache::Global();
  const std::string key =
      ConvPlanCache::Key(kernels::ConvDeviceIdentity(cuda), op.shape, options.precision,
                         options.conv_workspace_limit, options.deterministic);
  const auto known = cache.Find(key);
  const auto now = std::chrono::steady_clock::now();
  kernels::ConvSearch search;
  search.measure = now < options.search_deadline;
  bool untimed = false;
  for (int p = 0; known && p < 3; ++p) untimed = untimed || known->pass[p].ms < 0;
  const bool refine = untimed && !options.deterministic && now < options.refine_deadline;
  if (known && !refine) search.known = &*known;
  auto plan =
      kernels::ConvCudaPlan::Create(op.shape, options.precision, options.conv_workspace_limit,
                                    options.deterministic, cuda, search);
  if (!plan.ok()) return plan.status();
  const kernels::ConvPlanSource source = (*plan)->source();
  if (source != kernels::ConvPlanSource::kKnown) cache.Store(key, (*plan)->algos());
  if (options.stats != nullptr) {
    ++(source == kernels::ConvPlanSource::kKnown      ? options.stats->convs_cached
       : source == kernels::ConvPlanSource::kMeasured ? options.stats->convs_measured
                                                      : options.stats->convs_untimed);
  }
  return plan;
}

// The exact convolution's resources: the CPU workspace, or the cuDNN plan and its workspace,
// with room for a sampled weight gradient.
absl::StatusOr<LayerResources> PrepareExact(const ConvOperands& op, Device* device,
                                            const PlanOptions& options, bool block_sparse) {
  TOPIARY_ASSIGN_OR_RETURN(auto sampled, SampledWorkspace(op, device));
  LayerResources r;
  if (device->cuda() == nullptr) {
    r.workspace_bytes =
        std::max(kernels::ConvWorkspaceFloatsCpu(op.shape) * sizeof(float), sampled);
    if (kernels::ConvOneDnnPlan::Enabled()) {
      auto cpu = kernels::ConvOneDnnPlan::Create(op.shape);
      if (cpu.ok()) {
        auto state = std::make_unique<ConvState>();
        state->cpu = std::move(*cpu);
        r.state = std::move(state);
      } else if (kernels::ConvLogEnabled()) {  // the reference runs it
        std::fprintf(stderr, "%s: %s\n", op.layer.c_str(), cpu.status().ToString().c_str());
      }
    }
    return r;
  }
  auto plan = CachedConvPlan(op, *device->cuda(), options);
  if (!plan.ok()) return Named(op.layer, plan.status());
  if (options.precision == kernels::Precision::kBf16) {
    TOPIARY_RETURN_IF_ERROR(AddBf16Copies(op.kernel, device));
  }
  auto state = std::make_unique<ConvState>();
  r.workspace_bytes = std::max((*plan)->workspace_bytes(), sampled);
  state->plan = std::move(*plan);
  const BlockSparseMode mode = EffectiveSparseMode(options.block_sparse);
  if (block_sparse && SparseDispatchEnabled(true, options.deterministic, mode)) {
    state->sparse = std::make_unique<SparseConvDispatch>(
        op.layer, op.shape, kernels::ActivationType(options.precision), mode);
  }
  // The exact engine's convolutions (block_sparse) that feed a batch norm alone: the batch
  // norm's moments from a Hopper kernel's epilogue (bf16, without a bias).
  if (block_sparse && options.moments_for_batch_norm &&
      options.precision == kernels::Precision::kBf16 && op.bias == nullptr) {
    auto moments = MomentsDispatch::Create(op.layer, op.shape, options.deterministic, device);
    if (!moments.ok()) return Named(op.layer, moments.status());
    state->moments = std::move(*moments);
    if (state->moments != nullptr) {
      r.workspace_bytes = std::max(r.workspace_bytes, MomentsDispatch::WorkspaceBytes(op.shape));
    }
  }
  r.state = std::move(state);
  return r;
}

// The sampled filter (and exact bias) gradient at input x.
absl::Status BackwardSampled(const ConvOperands& op, const LayerIo& io, const void* x) {
  float* dbias = op.bias ? op.bias->grad.data() : nullptr;
  const kernels::WeightGradSampling sampling{
      op.sampling->top_k,
      op.sampling->scale == GradientSampling::Scale::kReference ? 1.0f / op.shape.n : 1.0f};
  const uint8_t* mask = op.kernel->mask.empty() ? nullptr : op.kernel->mask.data();
  if (io.cuda) {
    return kernels::SampledWeightGradCuda(io.dtype, op.shape, sampling, x, io.dy, mask,
                                          WeightGradFor(*op.kernel, io.dtype), dbias, io.workspace,
                                          *io.cuda);
  }
  kernels::SampledWeightGradCpu(op.shape, sampling, static_cast<const float*>(x), io.dyf(), mask,
                                op.kernel->grad.data(), dbias, io.workspace);
  return absl::OkStatus();
}

// The gradients at input x and filter w: the filter's (and bias's) from x and dy, exact or
// sampled, the input's from dy and w when the layer below wants one.
absl::Status BackwardExact(const ConvOperands& op, const LayerIo& io, const void* x,
                           const void* w) {
  float* dbias = op.bias ? op.bias->grad.data() : nullptr;
  const bool sample = op.sample && op.sampling != nullptr;
  if (sample) TOPIARY_RETURN_IF_ERROR(BackwardSampled(op, io, x));
  if (io.cuda) {
    using kernels::SparsePass;
    if (!sample) {
      void* dw = WeightGradFor(*op.kernel, io.dtype);
      TOPIARY_RETURN_IF_ERROR(Dispatch(
          Sparse(io), SparsePass::kBackwardFilter, op, io, x, io.dy, dw, nullptr, dbias,
          [&] { return Plan(io).BackwardFilter(x, io.dy, dw, dbias, io.workspace, *io.cuda); }));
    }
    if (io.dx[0] == nullptr) return absl::OkStatus();
    return Dispatch(
        Sparse(io), SparsePass::kBackwardData, op, io, io.dy, w, io.dx[0], nullptr, nullptr,
        [&] { return Plan(io).BackwardData(io.dy, w, io.dx[0], io.workspace, *io.cuda); });
  }
  const auto* xf = static_cast<const float*>(x);
  const auto* wf = static_cast<const float*>(w);
  if (kernels::ConvOneDnnPlan* cpu = CpuPlan(io)) {
    if (!sample) {
      TOPIARY_RETURN_IF_ERROR(cpu->BackwardFilter(xf, io.dyf(), op.kernel->grad.data(), dbias));
    }
    if (io.dx[0] == nullptr) return absl::OkStatus();
    return cpu->BackwardData(io.dyf(), wf, io.dxf(0));
  }
  float* ws = static_cast<float*>(io.workspace);
  if (!sample) {
    kernels::Conv2dBackwardFilterCpu(op.shape, xf, io.dyf(), op.kernel->grad.data(), dbias, ws);
  }
  if (io.dx[0] != nullptr) kernels::Conv2dBackwardDataCpu(op.shape, io.dyf(), wf, io.dxf(0), ws);
  return absl::OkStatus();
}

class ExactConvEngine : public ConvEngine {
 public:
  absl::StatusOr<LayerResources> Prepare(const ConvOperands& op, Device* device,
                                         const PlanOptions& options) override {
    return PrepareExact(op, device, options, /*block_sparse=*/true);
  }

  absl::Status Forward(const ConvOperands& op, const LayerIo& io, bool training) override {
    const float* bias = op.bias ? op.bias->value.data() : nullptr;
    if (io.cuda) {
      const void* w = WeightFor(*op.kernel, io.dtype);
      auto dense = [&] { return Plan(io).Forward(io.x[0], w, bias, io.y, io.workspace, *io.cuda); };
      MomentsDispatch* moments = training && io.moments != nullptr ? Moments(io) : nullptr;
      // The block-sparse dispatch times a block-masked forward against the moments route and
      // writes the moments where it runs block-sparse; otherwise the route runs the pass.
      SparseConvDispatch::MomentsRequest request;
      if (moments != nullptr) request = {moments, io.workspace, io.moments};
      return Dispatch(Sparse(io), kernels::SparsePass::kForward, op, io, io.x[0], w, io.y, bias,
                      nullptr, dense, moments != nullptr ? &request : nullptr);
    }
    if (kernels::ConvOneDnnPlan* cpu = CpuPlan(io)) {
      return cpu->Forward(io.xf(0), op.kernel->value.data(), bias, io.yf());
    }
    kernels::Conv2dForwardCpu(op.shape, io.xf(0), op.kernel->value.data(), bias, io.yf(),
                              static_cast<float*>(io.workspace));
    return absl::OkStatus();
  }

  absl::Status Backward(const ConvOperands& op, const LayerIo& io) override {
    return BackwardExact(op, io, io.x[0], WeightFor(*op.kernel, io.dtype));
  }
};

// Where the approximate forward pass leaves, in the layer's scratch, what the straight-through
// backward pass reads: the quantization parameters (kernels::ApproxParamCount of them, two
// floats' room each) and the fake-quantized filter and input. Each part starts on a 256-byte
// boundary (the scratch itself does): cuDNN reads wq and xq, and refuses operands that are
// not at least 16-byte aligned (CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER).
struct ApproxScratch {
  kernels::QuantParams* params;
  float* wq;
  float* xq;
  static size_t Aligned(size_t floats) { return (floats + 63) / 64 * 64; }
  static size_t ParamFloats(const kernels::ConvShape& s) {
    return Aligned(2 * static_cast<size_t>(kernels::ApproxParamCount(s)));
  }
  static size_t FilterFloats(const kernels::ConvShape& s) {
    return Aligned(static_cast<size_t>(s.k) * s.patch());
  }
  static size_t Floats(const kernels::ConvShape& s) {
    return ParamFloats(s) + FilterFloats(s) + static_cast<size_t>(s.n) * s.h * s.w * s.c;
  }
  ApproxScratch(const kernels::ConvShape& s, float* scratch)
      : params(reinterpret_cast<kernels::QuantParams*>(scratch)),
        wq(scratch + ParamFloats(s)),
        xq(wq + FilterFloats(s)) {}
};
static_assert(sizeof(kernels::QuantParams) == 2 * sizeof(float));

class ApproxConvEngine : public ConvEngine {
 public:
  ApproxConvEngine(Buffer<uint16_t> table, Parameter* range, kernels::ApproxWeights weights)
      : table_(std::move(table)), range_(range), weights_(weights) {}

  absl::StatusOr<LayerResources> Prepare(const ConvOperands& op, Device* device,
                                         const PlanOptions& options) override {
    if (options.precision == kernels::Precision::kBf16) {
      return absl::InvalidArgumentError(absl::StrCat(
          op.layer,
          ": an approximate convolution reads fp32 activations; train.precision BF16 cannot be "
          "combined with approximation (use FP32 or TF32)"));
    }
    if (auto st = kernels::CheckApproxConvShape(op.shape); !st.ok()) return Named(op.layer, st);
    // The backward pass's plan and workspace (the table convolution has no block-sparse form).
    TOPIARY_ASSIGN_OR_RETURN(auto r, PrepareExact(op, device, options, /*block_sparse=*/false));
    size_t approx_bytes;
    if (device->cuda() != nullptr) {
      TOPIARY_RETURN_IF_ERROR(kernels::ApproxConvPrepareCuda());
      approx_bytes = kernels::ApproxConvWorkspaceBytes(op.shape);
    } else {
      approx_bytes = kernels::ApproxConvWorkspaceBytesCpu(op.shape);
    }
    r.workspace_bytes = std::max(r.workspace_bytes, approx_bytes);
    r.scratch_floats = ApproxScratch::Floats(op.shape);
    return r;
  }

  absl::Status Forward(const ConvOperands& op, const LayerIo& io, bool training) override {
    const ApproxScratch saved(op.shape, io.scratch);
    const float* bias = op.bias ? op.bias->value.data() : nullptr;
    kernels::ApproxConvOptions o;
    o.running_range = range_ ? range_->value.data() : nullptr;
    o.update_range = training;
    o.weights = weights_;
    float* xq = training ? saved.xq : nullptr;  // only the backward pass reads it
    if (io.cuda) {
      return kernels::ApproxConv2dForwardCuda(op.shape, io.xf(0), op.kernel->value.data(), bias,
                                              table_.data(), io.yf(), xq, saved.wq, saved.params,
                                              io.workspace, *io.cuda, o);
    }
    kernels::ApproxConv2dForwardCpu(op.shape, io.xf(0), op.kernel->value.data(), bias,
                                    table_.data(), io.yf(), xq, saved.wq, saved.params,
                                    io.workspace, o);
    return absl::OkStatus();
  }

  absl::Status Backward(const ConvOperands& op, const LayerIo& io) override {
    const ApproxScratch saved(op.shape, io.scratch);
    return BackwardExact(op, io, saved.xq, saved.wq);
  }

 private:
  Buffer<uint16_t> table_;  // on the layer's device
  Parameter* range_;
  kernels::ApproxWeights weights_;
};

}  // namespace

std::unique_ptr<ConvEngine> MakeExactConvEngine() { return std::make_unique<ExactConvEngine>(); }

absl::StatusOr<std::unique_ptr<ConvEngine>> MakeApproxConvEngine(const ConvApproximation& approx,
                                                                 Parameter* range, Device* device) {
  if (approx.table.size() != static_cast<size_t>(kernels::kMultiplierEntries)) {
    return absl::InvalidArgumentError(absl::StrCat("multiplier ", approx.multiplier, ": ",
                                                   approx.table.size(), " entries, not 65536"));
  }
  TOPIARY_ASSIGN_OR_RETURN(auto table, Buffer<uint16_t>::Create(device, approx.table.size()));
  table.CopyFromHost(approx.table.data());
  return std::make_unique<ApproxConvEngine>(std::move(table), range, approx.weights);
}

}  // namespace topiary
