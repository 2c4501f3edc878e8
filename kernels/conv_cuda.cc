// Convolutions through cuDNN's convolution API. It is deprecated in cuDNN 9 in favour of the
// graph API but still supported, and it is the direct way to time and pick one algorithm per
// pass at plan time; hence the local warning suppression.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/conv.h"
#include "kernels/conv_graph_cuda.h"
#include "kernels/cuda_context.h"
#include "kernels/elementwise.h"

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
};

namespace {

std::string Describe(const ConvShape& s) {
  return absl::StrFormat("conv [%d,%d,%d,%d] * [%d,%d,%d,%d] stride %d pad %d", s.n, s.h, s.w, s.c,
                         s.k, s.r, s.s, s.c, s.stride_h, s.pad_h);
}

// The fastest result (cuDNN sorts them by time) that succeeded, fits the workspace limit,
// is deterministic when asked, and in fp32 uses plain FMA math (no TF32).
template <typename Perf>
absl::StatusOr<Perf> Pick(const std::vector<Perf>& results, int count, size_t limit,
                          bool deterministic, bool fma_only, const std::string& what) {
  if (std::getenv("TOPIARY_CONV_LOG") != nullptr) {  // what cuDNN measured, for tuning
    for (int i = 0; i < count; ++i) {
      const Perf& p = results[i];
      std::fprintf(stderr, "%s: algo %d math %d status %d time %.4f ms memory %zu det %d\n",
                   what.c_str(), static_cast<int>(p.algo), static_cast<int>(p.mathType),
                   static_cast<int>(p.status), p.time, p.memory, static_cast<int>(p.determinism));
    }
  }
  for (int i = 0; i < count; ++i) {
    const Perf& p = results[i];
    if (p.status == CUDNN_STATUS_SUCCESS && p.memory <= limit &&
        (!deterministic || p.determinism == CUDNN_DETERMINISTIC) &&
        (!fma_only || p.mathType == CUDNN_FMA_MATH)) {
      return p;
    }
  }
  return absl::InternalError(what + ": cuDNN found no usable algorithm");
}

bool ConvLog() { return std::getenv("TOPIARY_CONV_LOG") != nullptr; }

const char* PassName(ConvPass pass) {
  return pass == ConvPass::kForward        ? "forward"
         : pass == ConvPass::kBackwardData ? "backward data"
                                           : "backward filter";
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

// Device memory for timing candidates, freed on scope exit.
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

// Times the legacy algorithm and the graph-API candidates of one pass on scratch operands
// and keeps the graph plan in d.graph[pass] if one is faster. Deterministic plans take the
// heuristics' first engine that runs, untimed.
absl::Status ChoosePass(ConvCudaPlan::Descriptors& d, const ConvShape& sh, Precision precision,
                        ConvPass pass, size_t workspace_limit, bool deterministic,
                        const std::string& what, const CudaContext& ctx) {
  const size_t elem = SizeOf(ActivationType(precision));
  const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c * elem;
  const size_t nw = static_cast<size_t>(sh.k) * sh.patch() * elem;
  const size_t ny = static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k * elem;
  auto candidates =
      GraphConvPass::Candidates(sh, precision, pass, workspace_limit, deterministic, 8, ctx);
  if (!candidates.ok() || candidates->empty()) {
    if (ConvLog()) {
      std::fprintf(stderr, "%s %s: no graph-API engine (%s)\n", what.c_str(), PassName(pass),
                   candidates.ok() ? "none usable" : candidates.status().ToString().c_str());
    }
    return absl::OkStatus();
  }
  const int p = static_cast<int>(pass);
  size_t ws_bytes = d.legacy_workspace[p];
  for (const auto& c : *candidates) ws_bytes = std::max(ws_bytes, c->workspace_bytes());
  Scratch x(nx), w(nw), y(ny), ws(ws_bytes);
  if (x.p == nullptr || w.p == nullptr || y.p == nullptr || ws.p == nullptr) {
    return absl::OkStatus();  // too little memory to compare: keep the legacy algorithm
  }
  cudaMemsetAsync(x.p, 0, nx, ctx.stream);
  cudaMemsetAsync(w.p, 0, nw, ctx.stream);
  cudaMemsetAsync(y.p, 0, ny, ctx.stream);
  // Operands in GraphConvPass::Run order.
  void* in0 = pass == ConvPass::kBackwardData ? y.p : x.p;
  void* in1 = pass == ConvPass::kBackwardFilter ? y.p : w.p;
  void* out = pass == ConvPass::kForward ? y.p : pass == ConvPass::kBackwardData ? x.p : w.p;
  if (deterministic) {
    // Timings vary from run to run, and a different engine gives different bits: take the
    // heuristics' first choice, the same on every run (on the same GPU and cuDNN).
    auto first = TimeOnStream([&] { return (*candidates)[0]->Run(in0, in1, out, ws.p, ctx); }, ctx);
    if (first.ok()) d.graph[p] = std::move((*candidates)[0]);
    return CudaStatus(cudaGetLastError(), what);
  }
  auto legacy = TimeOnStream(
      [&] { return RunLegacy(d, pass, in0, in1, out, ws.p, d.legacy_workspace[p], ctx); }, ctx);
  float best = legacy.ok() ? *legacy : 1e30f;
  int best_index = -1;
  for (size_t i = 0; i < candidates->size(); ++i) {
    const GraphConvPass& c = *(*candidates)[i];
    auto t = TimeOnStream([&] { return c.Run(in0, in1, out, ws.p, ctx); }, ctx);
    if (t.ok() && *t < best) {
      best = *t;
      best_index = static_cast<int>(i);
    }
  }
  if (ConvLog()) {
    std::fprintf(stderr, "%s %s: legacy %.4f ms, %zu graph engines, chose %s (%.4f ms)\n",
                 what.c_str(), PassName(pass), legacy.ok() ? *legacy : -1.0f, candidates->size(),
                 best_index < 0 ? "legacy" : (*candidates)[best_index]->name().c_str(), best);
  }
  if (best_index >= 0) d.graph[p] = std::move((*candidates)[best_index]);
  return CudaStatus(cudaGetLastError(), what);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConvCudaPlan>> ConvCudaPlan::Create(const ConvShape& sh,
                                                                   Precision precision,
                                                                   size_t workspace_limit,
                                                                   bool deterministic,
                                                                   const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(CheckConvShape(sh));
  std::unique_ptr<ConvCudaPlan> plan(new ConvCudaPlan());
  plan->shape_ = sh;
  plan->dtype_ = ActivationType(precision);
  const cudnnDataType_t data =
      plan->dtype_ == DType::kBf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  plan->d_ = std::make_unique<Descriptors>();
  Descriptors& d = *plan->d_;
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
  // cuDNN's default math allows on Ampere and later); bf16 searches tensor-core algorithms.
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
  const bool fma_only = precision == Precision::kFp32;
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnSetStream(ctx.cudnn, ctx.stream), what));

  constexpr int kMaxAlgos = 16;
  int count = 0;
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(kMaxAlgos);
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnFindConvolutionForwardAlgorithm(ctx.cudnn, d.x, d.w, d.conv_fwd, d.y,
                                                       kMaxAlgos, &count, fwd.data()),
                  what + " (forward algorithm search)"));
  auto f = Pick(fwd, count, workspace_limit, deterministic, fma_only, what + " forward");
  if (!f.ok()) return f.status();
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bd(kMaxAlgos);
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnFindConvolutionBackwardDataAlgorithm(ctx.cudnn, d.w, d.y, d.conv_bwd_data,
                                                            d.x, kMaxAlgos, &count, bd.data()),
                  what + " (backward-data algorithm search)"));
  auto b = Pick(bd, count, workspace_limit, deterministic, fma_only, what + " backward data");
  if (!b.ok()) return b.status();
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bf(kMaxAlgos);
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnFindConvolutionBackwardFilterAlgorithm(
                      ctx.cudnn, d.x, d.y, d.conv_bwd_filter, d.w, kMaxAlgos, &count, bf.data()),
                  what + " (backward-filter algorithm search)"));
  auto g = Pick(bf, count, workspace_limit, deterministic, fma_only, what + " backward filter");
  if (!g.ok()) return g.status();
  d.fwd = f->algo;
  d.bwd_data = b->algo;
  d.bwd_filter = g->algo;
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnSetConvolutionMathType(d.conv_fwd, f->mathType), what));
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnSetConvolutionMathType(d.conv_bwd_data, b->mathType), what));
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnSetConvolutionMathType(d.conv_bwd_filter, g->mathType), what));
  d.legacy_workspace[0] = f->memory;
  d.legacy_workspace[1] = b->memory;
  d.legacy_workspace[2] = g->memory;
  for (ConvPass pass : {ConvPass::kForward, ConvPass::kBackwardData, ConvPass::kBackwardFilter}) {
    TOPIARY_RETURN_IF_ERROR(
        ChoosePass(d, sh, precision, pass, workspace_limit, deterministic, what, ctx));
  }
  for (int p = 0; p < 3; ++p) {
    plan->workspace_bytes_ = std::max(
        plan->workspace_bytes_, d.graph[p] ? d.graph[p]->workspace_bytes() : d.legacy_workspace[p]);
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
  const absl::Status st = d_->graph[pass]
                              ? d_->graph[pass]->Run(in0, in1, out, workspace, ctx)
                              : RunLegacy(*d_, static_cast<ConvPass>(pass), in0, in1, out,
                                          workspace, d_->legacy_workspace[pass], ctx);
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
