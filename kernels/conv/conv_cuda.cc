// Convolutions through cuDNN's convolution API and its graph API (conv_graph_cuda.h). The
// convolution API is deprecated in cuDNN 9 but still supported, and its heuristics and fixed
// algorithms are one of the candidates each pass times at plan time; hence the local warning
// suppression.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/conv/conv.h"
#include "kernels/conv/conv_graph_cuda.h"
#include "kernels/conv/direct_conv.h"
#include "kernels/conv/stem_conv.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/runtime/cuda_context.h"
#include "util/status_macros.h"

namespace topiary::kernels {

struct ConvCudaPlan::Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  // One convolution descriptor per pass: each carries the math type its algorithm was
  // measured with (cuDNN refuses to run an algorithm under another math type).
  cudnnConvolutionDescriptor_t conv_fwd = nullptr, conv_bwd_data = nullptr,
                               conv_bwd_filter = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t legacy_workspace[3] = {0, 0, 0};
  // Per pass (ConvPass order): the graph-API plan when it measured faster than the legacy
  // algorithm; null runs the legacy algorithm.
  std::unique_ptr<GraphConvPass> graph[3];
  // Per pass: the direct kernel (direct_conv.h) when it measured fastest of all, and its
  // workspace.
  bool direct[3] = {false, false, false};
  size_t direct_workspace[3] = {0, 0, 0};
  Precision precision = Precision::kFp32;  // which direct kernels: fp32 or TF32
};

namespace {

std::string Describe(const ConvShape& s) {
  return absl::StrFormat("conv [%d,%d,%d,%d] * [%d,%d,%d,%d] stride %d pad %d", s.n, s.h, s.w, s.c,
                         s.k, s.r, s.s, s.c, s.stride_h, s.pad_h);
}

const char* PassName(ConvPass pass) {
  return pass == ConvPass::kForward        ? "forward"
         : pass == ConvPass::kBackwardData ? "backward data"
                                           : "backward filter";
}

// The legacy API's heuristic ranking of a pass's algorithms (no timing), and the first that
// succeeded, fits the workspace limit, is deterministic when asked, and in fp32 uses plain FMA
// math (no TF32).
template <typename Perf, typename Get>
absl::StatusOr<ConvPassAlgo> FirstUsable(Get get, size_t limit, bool deterministic, bool fma_only,
                                         const std::string& what) {
  constexpr int kMaxAlgos = 16;
  std::vector<Perf> results(kMaxAlgos);
  int count = 0;
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(get(kMaxAlgos, &count, results.data()), what + " (algorithm heuristics)"));
  for (int i = 0; i < count; ++i) {
    const Perf& p = results[i];
    if (p.status == CUDNN_STATUS_SUCCESS && p.memory <= limit &&
        (!deterministic || p.determinism == CUDNN_DETERMINISTIC) &&
        (!fma_only || p.mathType == CUDNN_FMA_MATH)) {
      ConvPassAlgo a;
      a.algo = static_cast<int>(p.algo);
      a.math = static_cast<int>(p.mathType);
      return a;
    }
  }
  return absl::InternalError(what + ": cuDNN proposes no usable algorithm");
}

absl::StatusOr<ConvPassAlgo> LegacyHeuristic(const ConvCudaPlan::Descriptors& d, ConvPass pass,
                                             size_t limit, bool deterministic, bool fma_only,
                                             const std::string& what, const CudaContext& ctx) {
  switch (pass) {
    case ConvPass::kForward:
      return FirstUsable<cudnnConvolutionFwdAlgoPerf_t>(
          [&](int n, int* got, cudnnConvolutionFwdAlgoPerf_t* r) {
            return cudnnGetConvolutionForwardAlgorithm_v7(ctx.cudnn, d.x, d.w, d.conv_fwd, d.y, n,
                                                          got, r);
          },
          limit, deterministic, fma_only, what);
    case ConvPass::kBackwardData:
      return FirstUsable<cudnnConvolutionBwdDataAlgoPerf_t>(
          [&](int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* r) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx.cudnn, d.w, d.y, d.conv_bwd_data,
                                                               d.x, n, got, r);
          },
          limit, deterministic, fma_only, what);
    case ConvPass::kBackwardFilter:
      return FirstUsable<cudnnConvolutionBwdFilterAlgoPerf_t>(
          [&](int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* r) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx.cudnn, d.x, d.y,
                                                                 d.conv_bwd_filter, d.w, n, got, r);
          },
          limit, deterministic, fma_only, what);
  }
  return absl::InternalError("unknown convolution pass");
}

// Makes `a` (a legacy algorithm) the pass's: its math type on the pass's descriptor and its
// workspace size. Refuses values out of cuDNN's ranges, FMA-less math in fp32, and algorithms
// whose workspace exceeds the limit (a cached choice may be damaged or from another build).
absl::Status SetLegacy(ConvCudaPlan::Descriptors& d, ConvPass pass, const ConvPassAlgo& a,
                       bool fma_only, size_t limit, const std::string& what,
                       const CudaContext& ctx) {
  const int algo_count =
      pass == ConvPass::kForward        ? static_cast<int>(CUDNN_CONVOLUTION_FWD_ALGO_COUNT)
      : pass == ConvPass::kBackwardData ? static_cast<int>(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT)
                                        : static_cast<int>(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
  if (a.algo < 0 || a.algo >= algo_count || a.math < CUDNN_DEFAULT_MATH ||
      a.math > CUDNN_FMA_MATH || (fma_only && a.math != CUDNN_FMA_MATH)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %s: algorithm %d math %d is not usable",
                                                      what, PassName(pass), a.algo, a.math));
  }
  cudnnConvolutionDescriptor_t conv = pass == ConvPass::kForward        ? d.conv_fwd
                                      : pass == ConvPass::kBackwardData ? d.conv_bwd_data
                                                                        : d.conv_bwd_filter;
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnSetConvolutionMathType(conv, static_cast<cudnnMathType_t>(a.math)), what));
  size_t bytes = 0;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  switch (pass) {
    case ConvPass::kForward:
      d.fwd = static_cast<cudnnConvolutionFwdAlgo_t>(a.algo);
      st = cudnnGetConvolutionForwardWorkspaceSize(ctx.cudnn, d.x, d.w, conv, d.y, d.fwd, &bytes);
      break;
    case ConvPass::kBackwardData:
      d.bwd_data = static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo);
      st = cudnnGetConvolutionBackwardDataWorkspaceSize(ctx.cudnn, d.w, d.y, conv, d.x, d.bwd_data,
                                                        &bytes);
      break;
    case ConvPass::kBackwardFilter:
      d.bwd_filter = static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo);
      st = cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx.cudnn, d.x, d.y, conv, d.w,
                                                          d.bwd_filter, &bytes);
      break;
  }
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(st, what + " " + PassName(pass)));
  if (bytes > limit) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s %s: algorithm %d needs %d bytes of workspace, over the limit", what,
                        PassName(pass), a.algo, bytes));
  }
  d.legacy_workspace[static_cast<int>(pass)] = bytes;
  return absl::OkStatus();
}

// The legacy algorithm of a pass; operands as GraphConvPass::Run.
absl::Status RunLegacy(const ConvCudaPlan::Descriptors& d, ConvPass pass, const void* in0,
                       const void* in1, void* out, void* workspace, size_t workspace_bytes,
                       const CudaContext& ctx) {
  const float one = 1.0f, zero = 0.0f;
  switch (pass) {
    case ConvPass::kForward:
      return CudnnStatus(
          cudnnConvolutionForward(ctx.cudnn, &one, d.x, in0, d.w, in1, d.conv_fwd, d.fwd, workspace,
                                  workspace_bytes, &zero, d.y, out),
          "forward");
    case ConvPass::kBackwardData:
      return CudnnStatus(
          cudnnConvolutionBackwardData(ctx.cudnn, &one, d.w, in1, d.y, in0, d.conv_bwd_data,
                                       d.bwd_data, workspace, workspace_bytes, &zero, d.x, out),
          "backward data");
    case ConvPass::kBackwardFilter:
      return CudnnStatus(
          cudnnConvolutionBackwardFilter(ctx.cudnn, &one, d.x, in0, d.y, in1, d.conv_bwd_filter,
                                         d.bwd_filter, workspace, workspace_bytes, &zero, d.w, out),
          "backward filter");
  }
  return absl::InternalError("unknown convolution pass");
}

// Whether a bf16 plan's direct kernel for the pass is a stem kernel (images of at most 4
// channels; stem_conv.h) rather than the direct kernels' bf16 form (16 or more channels).
bool Bf16Stem(const ConvShape& sh, ConvPass pass) {
  return StemConvSupported(sh, static_cast<int>(pass));
}

// The direct kernel of a pass; operands as GraphConvPass::Run: fp32 data on the direct kernels
// (TF32 plans use their tensor-core forms where there are some), bf16 on the stem kernels or
// the direct kernels' bf16 forms.
absl::Status RunDirect(const ConvShape& sh, Precision precision, ConvPass pass, const void* in0,
                       const void* in1, void* out, void* workspace, const CudaContext& ctx) {
  if (ActivationType(precision) == DType::kBf16) {
    const auto* a = static_cast<const Bf16*>(in0);
    const auto* b = static_cast<const Bf16*>(in1);
    auto* o = static_cast<Bf16*>(out);
    const bool stem = Bf16Stem(sh, pass);
    switch (pass) {
      case ConvPass::kForward:
        return stem ? StemConvForwardCuda(sh, a, b, o, ctx)
                    : DirectConvForwardBf16Cuda(sh, a, b, o, ctx);
      case ConvPass::kBackwardData:
        return DirectConvBackwardDataBf16Cuda(sh, a, b, o, workspace, ctx);
      case ConvPass::kBackwardFilter:
        return stem ? StemConvBackwardFilterCuda(sh, a, b, o, workspace, ctx)
                    : DirectConvBackwardFilterBf16Cuda(sh, a, b, o, workspace, ctx);
    }
    return absl::InternalError("unknown convolution pass");
  }
  const auto* a = static_cast<const float*>(in0);
  const auto* b = static_cast<const float*>(in1);
  auto* o = static_cast<float*>(out);
  const bool tf32 = precision == Precision::kTf32;
  switch (pass) {
    case ConvPass::kForward:
      return DirectConvForwardCuda(sh, a, b, o, tf32, ctx);
    case ConvPass::kBackwardData:
      return DirectConvBackwardDataCuda(sh, a, b, o, workspace, tf32, ctx);
    case ConvPass::kBackwardFilter:
      return DirectConvBackwardFilterCuda(sh, a, b, o, workspace, tf32, ctx);
  }
  return absl::InternalError("unknown convolution pass");
}

// Bytes of workspace RunDirect needs for the pass.
size_t DirectWorkspaceBytes(const ConvShape& sh, Precision precision, ConvPass pass,
                            const CudaContext& ctx) {
  const int p = static_cast<int>(pass);
  return ActivationType(precision) == DType::kBf16 && Bf16Stem(sh, pass)
             ? StemConvWorkspaceBytes(sh, p, ctx.sm_count)
             : DirectConvWorkspaceBytes(sh, p, ctx.sm_count);
}

// Whether a plan may run the pass on a direct kernel: a shape the kernels of its data type take
// (fp32 or TF32 plans: direct_conv.h; bf16: stem_conv.h, or direct_conv.h's bf16 forms), and
// a workspace within the limit.
bool DirectAllowed(const ConvShape& sh, Precision precision, ConvPass pass, size_t limit,
                   const CudaContext& ctx) {
  const int p = static_cast<int>(pass);
  const bool takes = ActivationType(precision) == DType::kBf16
                         ? Bf16Stem(sh, pass) || DirectConvBf16Supported(sh, p)
                         : DirectConvSupported(sh, p);
  return takes && DirectWorkspaceBytes(sh, precision, pass, ctx) <= limit;
}

// Device memory for trying candidates, freed on scope exit.
struct Scratch {
  void* p = nullptr;
  explicit Scratch(size_t bytes) {
    if (cudaMalloc(&p, std::max<size_t>(bytes, 256)) != cudaSuccess) {
      cudaGetLastError();
      p = nullptr;
    }
  }
  ~Scratch() { cudaFree(p); }
};

// Zeroed x, w and y of a convolution for trying candidates on, made once per plan.
struct TrialOperands {
  Scratch x, w, y;
  TrialOperands(const ConvShape& sh, Precision precision, const CudaContext& ctx)
      : x(Bytes(sh, precision, 'x')), w(Bytes(sh, precision, 'w')), y(Bytes(sh, precision, 'y')) {
    if (!ok()) return;
    cudaMemsetAsync(x.p, 0, Bytes(sh, precision, 'x'), ctx.stream);
    cudaMemsetAsync(w.p, 0, Bytes(sh, precision, 'w'), ctx.stream);
    cudaMemsetAsync(y.p, 0, Bytes(sh, precision, 'y'), ctx.stream);
  }
  bool ok() const { return x.p != nullptr && w.p != nullptr && y.p != nullptr; }
  // A pass's operands in GraphConvPass::Run order.
  void* in0(ConvPass pass) const { return pass == ConvPass::kBackwardData ? y.p : x.p; }
  void* in1(ConvPass pass) const { return pass == ConvPass::kBackwardFilter ? y.p : w.p; }
  void* out(ConvPass pass) const {
    return pass == ConvPass::kForward ? y.p : pass == ConvPass::kBackwardData ? x.p : w.p;
  }
  static size_t Bytes(const ConvShape& sh, Precision precision, char which) {
    const size_t elem = SizeOf(ActivationType(precision));
    return which == 'x'   ? static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c * elem
           : which == 'w' ? static_cast<size_t>(sh.k) * sh.patch() * elem
                          : static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k * elem;
  }
};

// Milliseconds of run(). The first call is timed on its own: a candidate over 3x slower than
// `best` stops there (the slow ones are often 10-100x slower, and each of their calls counts
// in the plan's time); the others are timed over two more calls (the first may include
// loading the kernel).
absl::StatusOr<float> TimeCandidate(const std::function<absl::Status()>& run, float best,
                                    const CudaContext& ctx) {
  auto first = TimeOnStream(run, ctx, 1, /*warmup=*/false);
  if (!first.ok() || *first > 3 * best) return first;
  return TimeOnStream(run, ctx, 2, /*warmup=*/false);
}

// Bytes of workspace of what a pass runs.
size_t PassWorkspace(const ConvCudaPlan::Descriptors& d, int p) {
  return d.direct[p]  ? d.direct_workspace[p]
         : d.graph[p] ? d.graph[p]->workspace_bytes()
                      : d.legacy_workspace[p];
}

// Runs what was chosen for a pass: the direct kernel, a graph-API plan or a legacy algorithm.
absl::Status RunChosen(const ConvCudaPlan::Descriptors& d, const ConvShape& sh, ConvPass pass,
                       const void* in0, const void* in1, void* out, void* workspace,
                       const CudaContext& ctx) {
  const int p = static_cast<int>(pass);
  if (d.direct[p]) return RunDirect(sh, d.precision, pass, in0, in1, out, workspace, ctx);
  if (d.graph[p]) return d.graph[p]->Run(in0, in1, out, workspace, ctx);
  return RunLegacy(d, pass, in0, in1, out, workspace, d.legacy_workspace[p], ctx);
}

// Graph-API engines timed per pass: cuDNN's heuristics rank them, and the fastest is almost
// always among the first few (TOPIARY_CONV_LOG shows the ranking's winners).
constexpr int kMaxCandidates = 8;

// Chooses a pass: the legacy heuristics' pick and the graph-API candidates, timed on zeroed
// operands (the fastest kept), or untimed (the first graph engine that runs, else the legacy
// pick). Fills d and `chosen`.
absl::Status ChoosePass(ConvCudaPlan::Descriptors& d, const ConvShape& sh, Precision precision,
                        ConvPass pass, size_t workspace_limit, bool deterministic, bool measure,
                        const TrialOperands& o, const std::string& what, const CudaContext& ctx,
                        ConvPassAlgo* chosen) {
  const bool fma_only = precision == Precision::kFp32;
  TOPIARY_ASSIGN_OR_RETURN(auto legacy_pick, LegacyHeuristic(d, pass, workspace_limit,
                                                             deterministic, fma_only, what, ctx));
  TOPIARY_RETURN_IF_ERROR(SetLegacy(d, pass, legacy_pick, fma_only, workspace_limit, what, ctx));
  *chosen = legacy_pick;
  const int p = static_cast<int>(pass);
  const auto start = std::chrono::steady_clock::now();
  auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  // The direct kernel, when allowed, against the best time so far: chosen when faster.
  auto try_direct = [&](float best) -> absl::Status {
    if (!measure || !DirectAllowed(sh, precision, pass, workspace_limit, ctx) || !o.ok()) {
      return absl::OkStatus();
    }
    const size_t bytes = DirectWorkspaceBytes(sh, precision, pass, ctx);
    Scratch ws(bytes);
    if (ws.p == nullptr) return absl::OkStatus();
    // One untimed call first: TimeCandidate's first call decides whether a candidate is
    // worth timing, and the kernel's first launch would pay for loading its module.
    if (!RunDirect(sh, precision, pass, o.in0(pass), o.in1(pass), o.out(pass), ws.p, ctx).ok()) {
      return CudaStatus(cudaGetLastError(), what);
    }
    auto t = TimeCandidate(
        [&] {
          return RunDirect(sh, precision, pass, o.in0(pass), o.in1(pass), o.out(pass), ws.p, ctx);
        },
        best, ctx);
    if (ConvLogEnabled()) {
      std::fprintf(stderr, "%s %s: direct kernel %.4f ms against %.4f ms\n", what.c_str(),
                   PassName(pass), t.ok() ? *t : -1.0f, best);
    }
    if (!t.ok() || *t >= best) return CudaStatus(cudaGetLastError(), what);
    *chosen = ConvPassAlgo();
    chosen->direct = true;
    chosen->ms = *t;
    d.graph[p].reset();
    d.direct[p] = true;
    d.direct_workspace[p] = bytes;
    return absl::OkStatus();
  };
  auto found = GraphConvPass::Candidates(sh, precision, pass, workspace_limit, deterministic,
                                         measure ? kMaxCandidates : 1, ctx);
  const double candidates_ms = ms_since(start);
  // Without graph-API engines the legacy pick is timed alone (and against the direct kernel).
  std::vector<std::unique_ptr<GraphConvPass>> none;
  auto* candidates = found.ok() ? &*found : &none;
  if (candidates->empty() && ConvLogEnabled()) {
    std::fprintf(stderr, "%s %s: no graph-API engine (%s)\n", what.c_str(), PassName(pass),
                 found.ok() ? "none usable" : found.status().ToString().c_str());
  }
  size_t ws_bytes = d.legacy_workspace[p];
  for (const auto& c : *candidates) ws_bytes = std::max(ws_bytes, c->workspace_bytes());
  Scratch ws(ws_bytes);
  // Too little memory to try them: keep the legacy pick.
  if (!o.ok() || ws.p == nullptr) return absl::OkStatus();
  void *in0 = o.in0(pass), *in1 = o.in1(pass), *out = o.out(pass);
  auto use_graph = [&](size_t i, float ms) {
    chosen->graph = true;
    chosen->engine = (*candidates)[i]->engine();
    chosen->ms = ms;
    d.graph[p] = std::move((*candidates)[i]);
  };
  if (!measure) {
    // Timings vary from run to run, and a different engine gives different bits: take the
    // heuristics' first choice, the same on every run (on the same GPU and cuDNN).
    if (!candidates->empty() && (*candidates)[0]->Run(in0, in1, out, ws.p, ctx).ok()) {
      use_graph(0, -1);
    }
    return CudaStatus(cudaGetLastError(), what);
  }
  auto legacy = TimeCandidate(
      [&] { return RunLegacy(d, pass, in0, in1, out, ws.p, d.legacy_workspace[p], ctx); }, 1e30f,
      ctx);
  float best = legacy.ok() ? *legacy : 1e30f;
  chosen->ms = legacy.ok() ? *legacy : -1;
  int best_index = -1;
  for (size_t i = 0; i < candidates->size(); ++i) {
    const GraphConvPass& c = *(*candidates)[i];
    const auto t0 = std::chrono::steady_clock::now();
    auto t = TimeCandidate([&] { return c.Run(in0, in1, out, ws.p, ctx); }, best, ctx);
    if (ConvLogEnabled()) {
      std::fprintf(stderr, "  %s: %.4f ms (timing took %.0f ms)\n", c.name().c_str(),
                   t.ok() ? *t : -1.0f, ms_since(t0));
    }
    if (t.ok() && *t < best) {
      best = *t;
      best_index = static_cast<int>(i);
    }
  }
  if (ConvLogEnabled()) {
    std::fprintf(stderr,
                 "%s %s: legacy %.4f ms, %zu graph engines, chose %s (%.4f ms); search took "
                 "%.0f ms making candidates, %.0f ms timing\n",
                 what.c_str(), PassName(pass), legacy.ok() ? *legacy : -1.0f, candidates->size(),
                 best_index < 0 ? "legacy" : (*candidates)[best_index]->name().c_str(), best,
                 candidates_ms, ms_since(start) - candidates_ms);
  }
  if (best_index >= 0) use_graph(best_index, best);
  TOPIARY_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), what));
  return try_direct(best);
}

// Makes a pass from a known choice and runs it once on the zeroed operands (the caller waits
// for the stream, once for all passes).
absl::Status RestorePass(ConvCudaPlan::Descriptors& d, const ConvShape& sh, Precision precision,
                         ConvPass pass, size_t workspace_limit, bool deterministic,
                         const ConvPassAlgo& known, const TrialOperands& o, const std::string& what,
                         const CudaContext& ctx) {
  const int p = static_cast<int>(pass);
  d.graph[p].reset();
  d.direct[p] = false;
  if (known.direct) {
    if (!DirectAllowed(sh, precision, pass, workspace_limit, ctx)) {
      return absl::NotFoundError(
          absl::StrFormat("%s %s: the direct kernel does not take it", what, PassName(pass)));
    }
    d.direct[p] = true;
    d.direct_workspace[p] = DirectWorkspaceBytes(sh, precision, pass, ctx);
  } else if (known.graph) {
    TOPIARY_ASSIGN_OR_RETURN(
        auto c, GraphConvPass::Candidates(sh, precision, pass, workspace_limit, deterministic, 1,
                                          ctx, known.engine));
    if (c.empty()) {
      return absl::NotFoundError(absl::StrFormat("%s %s: engine %d is not usable here", what,
                                                 PassName(pass), known.engine));
    }
    d.graph[p] = std::move((c)[0]);
  } else {
    TOPIARY_RETURN_IF_ERROR(
        SetLegacy(d, pass, known, precision == Precision::kFp32, workspace_limit, what, ctx));
  }
  const size_t ws_bytes = PassWorkspace(d, p);
  Scratch ws(ws_bytes);
  if (!o.ok() || ws.p == nullptr) {
    return absl::ResourceExhaustedError(what + ": no memory to try the known plan");
  }
  return RunChosen(d, sh, pass, o.in0(pass), o.in1(pass), o.out(pass), ws.p, ctx);
}

constexpr ConvPass kPasses[3] = {ConvPass::kForward, ConvPass::kBackwardData,
                                 ConvPass::kBackwardFilter};

}  // namespace

std::string ConvDeviceIdentity(const CudaContext&) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  // Asked once per device (every convolution of every plan asks).
  static std::mutex mu;
  static std::map<int, std::string> known;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(device); it != known.end()) return it->second;
  int driver = 0;
  cudaDriverGetVersion(&driver);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return known[device] = absl::StrFormat("%s|sm_%d%d|driver %d|cudnn %d", prop.name, prop.major,
                                         prop.minor, driver, static_cast<int>(cudnnGetVersion()));
}

absl::StatusOr<std::unique_ptr<ConvCudaPlan>> ConvCudaPlan::Create(
    const ConvShape& sh, Precision precision, size_t workspace_limit, bool deterministic,
    const CudaContext& ctx, const ConvSearch& search) {
  TOPIARY_RETURN_IF_ERROR(CheckConvShape(sh));
  std::unique_ptr<ConvCudaPlan> plan(new ConvCudaPlan());
  plan->shape_ = sh;
  plan->dtype_ = ActivationType(precision);
  const cudnnDataType_t data =
      plan->dtype_ == DType::kBf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  plan->d_ = std::make_unique<Descriptors>();
  Descriptors& d = *plan->d_;
  d.precision = precision;
  const std::string what = Describe(sh);
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateTensorDescriptor(&d.x), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateTensorDescriptor(&d.y), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateFilterDescriptor(&d.w), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NHWC, data, sh.n, sh.c, sh.h, sh.w), what));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NHWC, data, sh.n, sh.k, sh.ho(), sh.wo()),
      what));
  // CUDNN_TENSOR_NHWC for a filter means [K, R, S, C]: the engine's layout.
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnSetFilter4dDescriptor(d.w, data, CUDNN_TENSOR_NHWC, sh.k, sh.c, sh.r, sh.s), what));
  // Compute type fp32 (accumulation) for every precision. FMA math forbids TF32 (which
  // cuDNN's default math allows on Ampere and later); bf16 asks for tensor-core algorithms.
  const cudnnMathType_t math = precision == Precision::kFp32   ? CUDNN_FMA_MATH
                               : precision == Precision::kTf32 ? CUDNN_DEFAULT_MATH
                                                               : CUDNN_TENSOR_OP_MATH;
  for (cudnnConvolutionDescriptor_t* c : {&d.conv_fwd, &d.conv_bwd_data, &d.conv_bwd_filter}) {
    TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnCreateConvolutionDescriptor(c), what));
    TOPIARY_RETURN_IF_ERROR(CudnnStatus(
        cudnnSetConvolution2dDescriptor(*c, sh.pad_h, sh.pad_w, sh.stride_h, sh.stride_w, 1, 1,
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        what));
    TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnSetConvolutionMathType(*c, math), what));
  }
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnSetStream(ctx.cudnn, ctx.stream), what));

  const TrialOperands trial(sh, precision, ctx);
  // A known choice that does not run here (another cuDNN, a damaged cache) is searched for.
  auto restore = [&]() -> absl::Status {
    for (int p = 0; p < 3; ++p) {
      TOPIARY_RETURN_IF_ERROR(RestorePass(d, sh, precision, kPasses[p], workspace_limit,
                                          deterministic, search.known->pass[p], trial, what, ctx));
    }
    return CudaStatus(cudaStreamSynchronize(ctx.stream), what);
  };
  absl::Status restored = search.known != nullptr ? restore() : absl::NotFoundError("");
  if (restored.ok()) {
    plan->algos_ = *search.known;
    plan->source_ = ConvPlanSource::kKnown;
  } else {
    cudaGetLastError();  // a failed try leaves nothing behind
    if (search.known != nullptr && ConvLogEnabled()) {
      std::fprintf(stderr, "%s: known plan refused (%s)\n", what.c_str(),
                   restored.ToString().c_str());
    }
    const bool measure = search.measure && !deterministic;
    for (int p = 0; p < 3; ++p) {
      d.graph[p].reset();
      d.direct[p] = false;
      TOPIARY_RETURN_IF_ERROR(ChoosePass(d, sh, precision, kPasses[p], workspace_limit,
                                         deterministic, measure, trial, what, ctx,
                                         &plan->algos_.pass[p]));
    }
    plan->source_ = measure ? ConvPlanSource::kMeasured : ConvPlanSource::kHeuristic;
  }
  for (int p = 0; p < 3; ++p) {
    plan->workspace_bytes_ = std::max(plan->workspace_bytes_, PassWorkspace(d, p));
  }
  return plan;
}

ConvCudaPlan::~ConvCudaPlan() {
  if (!d_) return;
  cudnnDestroyTensorDescriptor(d_->x);
  cudnnDestroyTensorDescriptor(d_->y);
  cudnnDestroyFilterDescriptor(d_->w);
  cudnnDestroyConvolutionDescriptor(d_->conv_fwd);
  cudnnDestroyConvolutionDescriptor(d_->conv_bwd_data);
  cudnnDestroyConvolutionDescriptor(d_->conv_bwd_filter);
}

absl::Status ConvCudaPlan::RunPass(int pass, const void* in0, const void* in1, void* out,
                                   void* workspace, const CudaContext& ctx) const {
  const absl::Status st =
      RunChosen(*d_, shape_, static_cast<ConvPass>(pass), in0, in1, out, workspace, ctx);
  if (st.ok()) return st;
  return absl::Status(st.code(), Describe(shape_) + " " + PassName(static_cast<ConvPass>(pass)) +
                                     ": " + std::string(st.message()));
}

absl::Status ConvCudaPlan::Forward(const void* x, const void* w, const float* bias, void* y,
                                   void* workspace, const CudaContext& ctx) const {
  TOPIARY_RETURN_IF_ERROR(RunPass(0, x, w, y, workspace, ctx));
  if (bias == nullptr) return absl::OkStatus();
  return AddBiasCuda(dtype_, static_cast<int64_t>(shape_.n) * shape_.ho() * shape_.wo(), shape_.k,
                     bias, y, ctx);
}

absl::Status ConvCudaPlan::BackwardData(const void* dy, const void* w, void* dx, void* workspace,
                                        const CudaContext& ctx) const {
  return RunPass(1, dy, w, dx, workspace, ctx);
}

absl::Status ConvCudaPlan::BackwardFilter(const void* x, const void* dy, void* dw, float* dbias,
                                          void* workspace, const CudaContext& ctx) const {
  TOPIARY_RETURN_IF_ERROR(RunPass(2, x, dy, dw, workspace, ctx));
  if (dbias == nullptr) return absl::OkStatus();
  return BiasGradCuda(dtype_, static_cast<int64_t>(shape_.n) * shape_.ho() * shape_.wo(), shape_.k,
                      dy, dbias, ctx);
}

}  // namespace topiary::kernels
