// cuDNN backend descriptors for one convolution pass. Tensors are described in cuDNN's
// logical NCHW / KCRS order with strides that make them NHWC / KRSC in memory.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // the operation graph's handle

#include "kernels/conv/conv_graph_cuda.h"

#include <chrono>
#include <cstdio>
#include <set>

#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace topiary::kernels {
namespace {

constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

// Descriptors that must outlive the plans made from them, destroyed together.
struct Owned {
  std::vector<cudnnBackendDescriptor_t> all;
  ~Owned() {
    for (auto it = all.rbegin(); it != all.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  absl::StatusOr<cudnnBackendDescriptor_t> Make(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    TOPIARY_RETURN_IF_ERROR(
        CudnnStatus(cudnnBackendCreateDescriptor(type, &d), "graph descriptor"));
    all.push_back(d);
    return d;
  }
};

absl::Status Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                 cudnnBackendAttributeType_t type, int64_t count, const void* value) {
  return CudnnStatus(cudnnBackendSetAttribute(d, name, type, count, value), "graph attribute");
}

absl::Status SetInts(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     std::vector<int64_t> v) {
  return Set(d, name, CUDNN_TYPE_INT64, static_cast<int64_t>(v.size()), v.data());
}

absl::StatusOr<cudnnBackendDescriptor_t> Tensor(Owned& owned, int64_t uid, cudnnDataType_t type,
                                                int64_t n, int64_t c, int64_t h, int64_t w) {
  TOPIARY_ASSIGN_OR_RETURN(auto t, owned.Make(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
  TOPIARY_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
  TOPIARY_RETURN_IF_ERROR(SetInts(t, CUDNN_ATTR_TENSOR_DIMENSIONS, {n, c, h, w}));
  TOPIARY_RETURN_IF_ERROR(SetInts(t, CUDNN_ATTR_TENSOR_STRIDES, {h * w * c, 1, w * c, c}));
  TOPIARY_RETURN_IF_ERROR(SetInts(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, {uid}));
  TOPIARY_RETURN_IF_ERROR(SetInts(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, {16}));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnBackendFinalize(t), "graph tensor"));
  return t;
}

// The operation graph of one pass: a single convolution node.
absl::StatusOr<cudnnBackendDescriptor_t> Graph(Owned& owned, const ConvShape& s, Precision p,
                                               ConvPass pass, const CudaContext& ctx) {
  const cudnnDataType_t data =
      ActivationType(p) == DType::kBf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  auto x = Tensor(owned, kUidX, data, s.n, s.c, s.h, s.w);
  auto w = Tensor(owned, kUidW, data, s.k, s.c, s.r, s.s);
  auto y = Tensor(owned, kUidY, data, s.n, s.k, s.ho(), s.wo());
  if (!x.ok()) return x.status();
  if (!w.ok()) return w.status();
  if (!y.ok()) return y.status();

  TOPIARY_ASSIGN_OR_RETURN(auto conv, owned.Make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR));
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  TOPIARY_RETURN_IF_ERROR(
      Set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute));
  TOPIARY_RETURN_IF_ERROR(
      Set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  TOPIARY_RETURN_IF_ERROR(SetInts(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, {2}));
  TOPIARY_RETURN_IF_ERROR(SetInts(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, {1, 1}));
  TOPIARY_RETURN_IF_ERROR(
      SetInts(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {s.stride_h, s.stride_w}));
  TOPIARY_RETURN_IF_ERROR(SetInts(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {s.pad_h, s.pad_w}));
  TOPIARY_RETURN_IF_ERROR(SetInts(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {s.pad_h, s.pad_w}));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnBackendFinalize(conv), "graph convolution"));

  struct Names {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t alpha, beta, conv, a, b, c;  // a, b, c: x, w, y roles
  };
  const Names names = pass == ConvPass::kForward
                          ? Names{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y}
                      : pass == ConvPass::kBackwardData
                          ? Names{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY}
                          : Names{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY};
  TOPIARY_ASSIGN_OR_RETURN(auto op, owned.Make(names.type));
  const float one = 1.0f, zero = 0.0f;
  TOPIARY_RETURN_IF_ERROR(Set(op, names.alpha, CUDNN_TYPE_FLOAT, 1, &one));
  TOPIARY_RETURN_IF_ERROR(Set(op, names.beta, CUDNN_TYPE_FLOAT, 1, &zero));
  TOPIARY_RETURN_IF_ERROR(Set(op, names.conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
  TOPIARY_RETURN_IF_ERROR(Set(op, names.a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &*x));
  TOPIARY_RETURN_IF_ERROR(Set(op, names.b, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &*w));
  TOPIARY_RETURN_IF_ERROR(Set(op, names.c, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &*y));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnBackendFinalize(op), "graph operation"));

  TOPIARY_ASSIGN_OR_RETURN(auto graph, owned.Make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
  TOPIARY_RETURN_IF_ERROR(
      Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op));
  TOPIARY_RETURN_IF_ERROR(
      Set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &ctx.cudnn));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnBackendFinalize(graph), "graph"));
  return graph;
}

// The engine configurations the heuristics of `mode` propose, best first.
absl::StatusOr<std::vector<cudnnBackendDescriptor_t>> Configs(Owned& owned,
                                                              cudnnBackendDescriptor_t graph,
                                                              cudnnBackendHeurMode_t mode) {
  TOPIARY_ASSIGN_OR_RETURN(auto heur, owned.Make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
  TOPIARY_RETURN_IF_ERROR(
      Set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
  TOPIARY_RETURN_IF_ERROR(Set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnBackendFinalize(heur), "engine heuristics"));
  int64_t count = 0;
  TOPIARY_RETURN_IF_ERROR(
      CudnnStatus(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                  "engine heuristics"));
  std::vector<cudnnBackendDescriptor_t> configs;
  for (int64_t i = 0; i < count; ++i) {
    TOPIARY_ASSIGN_OR_RETURN(auto c, owned.Make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    configs.push_back(c);
  }
  int64_t got = 0;
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               count, &got, configs.data()),
      "engine heuristics"));
  configs.resize(got);
  return configs;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<GraphConvPass>>> GraphConvPass::Candidates(
    const ConvShape& shape, Precision precision, ConvPass pass, size_t workspace_limit,
    bool deterministic, int max_plans, const CudaContext& ctx, int64_t only_engine) {
  auto owned = std::make_shared<Owned>();
  TOPIARY_ASSIGN_OR_RETURN(auto graph, Graph(*owned, shape, precision, pass, ctx));
  std::vector<cudnnBackendDescriptor_t> configs;
  // Mode A ranks the fast engines; the fallback list adds engines without tensor cores,
  // which fp32 (no TF32) needs. Elsewhere the fallback engines only cost plan time: on
  // resnet50 in bf16 its engine 0 ran 0.2-1.2 s per call where mode A's best took 0.1 ms.
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    if (mode == CUDNN_HEUR_MODE_FALLBACK && precision != Precision::kFp32 && !configs.empty() &&
        only_engine < 0) {
      break;
    }
    auto c = Configs(*owned, graph, mode);
    if (c.ok()) configs.insert(configs.end(), c->begin(), c->end());
  }
  std::vector<std::unique_ptr<GraphConvPass>> out;
  std::set<int64_t> seen;
  for (cudnnBackendDescriptor_t cfg : configs) {
    if (static_cast<int>(out.size()) >= max_plans) break;
    TOPIARY_ASSIGN_OR_RETURN(auto engine, owned->Make(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
    int64_t n = 0;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &n, &engine) != CUDNN_STATUS_SUCCESS) {
      continue;
    }
    int64_t index = -1;
    cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                             &index);
    if (only_engine >= 0 && index != only_engine) continue;
    if (!seen.insert(index).second) continue;
    std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
    int64_t note_count = 0;
    cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                             CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &note_count, notes.data());
    bool usable = true;
    for (int64_t i = 0; i < note_count; ++i) {
      const cudnnBackendNumericalNote_t note = notes[i];
      if (note == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) usable = false;
      if (note == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC && deterministic) usable = false;
      if ((note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
           note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) &&
          precision == Precision::kFp32) {
        usable = false;
      }
    }
    // Engines compiled at run time (NVRTC) take 0.3-1 s each to finalize and won no pass of
    // resnet50 by more than noise: searched only when asked for by name (a cached choice).
    std::vector<cudnnBackendBehaviorNote_t> behavior(CUDNN_BEHAVIOR_NOTE_TYPE_COUNT);
    int64_t behavior_count = 0;
    cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                             CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &behavior_count, behavior.data());
    for (int64_t i = 0; i < behavior_count && only_engine < 0; ++i) {
      if (behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) usable = false;
    }
    if (!usable) continue;
    cudnnBackendDescriptor_t plan = nullptr;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
        CUDNN_STATUS_SUCCESS) {
      continue;
    }
    std::unique_ptr<GraphConvPass> p(new GraphConvPass());
    p->plan_ = plan;  // destroyed with p
    const auto start = std::chrono::steady_clock::now();
    if (Set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &ctx.cudnn).ok() &&
        Set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg)
            .ok() &&
        cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS) {
      int64_t ws = 0;
      cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                               &n, &ws);
      if (ConvLogEnabled()) {
        std::fprintf(
            stderr, "  engine %ld finalized in %.0f ms\n", static_cast<long>(index),
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
      }
      if (ws < 0 || static_cast<size_t>(ws) > workspace_limit) continue;
      p->workspace_bytes_ = static_cast<size_t>(ws);
      p->graph_ = owned;
      p->engine_ = index;
      p->name_ = absl::StrFormat("engine %d", index);
      switch (pass) {
        case ConvPass::kForward:
          p->uid_in0_ = kUidX, p->uid_in1_ = kUidW, p->uid_out_ = kUidY;
          break;
        case ConvPass::kBackwardData:
          p->uid_in0_ = kUidY, p->uid_in1_ = kUidW, p->uid_out_ = kUidX;
          break;
        case ConvPass::kBackwardFilter:
          p->uid_in0_ = kUidX, p->uid_in1_ = kUidY, p->uid_out_ = kUidW;
          break;
      }
      out.push_back(std::move(p));
    }
  }
  return out;
}

GraphConvPass::~GraphConvPass() {
  if (plan_ != nullptr) cudnnBackendDestroyDescriptor(plan_);
}

absl::Status GraphConvPass::Run(const void* in0, const void* in1, void* out, void* workspace,
                                const CudaContext& ctx) const {
  cudnnBackendDescriptor_t pack = nullptr;
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(
      cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "variant pack"));
  const std::unique_ptr<void, cudnnStatus_t (*)(cudnnBackendDescriptor_t)> guard(
      pack, cudnnBackendDestroyDescriptor);
  const int64_t uids[3] = {uid_in0_, uid_in1_, uid_out_};
  void* ptrs[3] = {const_cast<void*>(in0), const_cast<void*>(in1), out};
  TOPIARY_RETURN_IF_ERROR(Set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids));
  TOPIARY_RETURN_IF_ERROR(
      Set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs));
  TOPIARY_RETURN_IF_ERROR(
      Set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
  TOPIARY_RETURN_IF_ERROR(CudnnStatus(cudnnBackendFinalize(pack), "variant pack"));
  return CudnnStatus(cudnnBackendExecute(ctx.cudnn, plan_, pack), name_);
}

}  // namespace topiary::kernels
