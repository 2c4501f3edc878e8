// cuDNN's fused convolution graphs (cudnn-frontend) beside the unfused passes they would
// replace, on the convolutions of resnet50 and resnet20 that read a batch norm + ReLU's
// output (issue 43: choose per layer by measurement). Per layer, each graph's best plan among
// the heuristics' (modes A and fallback, up to --plans of them, each timed):
//   fwd       conv                                   bn_fwd    batch norm + ReLU of the input
//   fwd_sbrcs relu(x*scale+bias) -> conv -> sum, sum of squares of y
//   dgrad     conv backward data                     bn_bwd    batch norm + ReLU backward
//   dgrad_dbn dgrad -> dReLU at bn(x) -> dBN weight (dscale, dbias, the dx coefficients)
//   wgrad     conv backward filter
//   wgrad_sbr relu(x*scale+bias) -> conv backward filter
//   bn_stats  the statistics pass alone (what a fused epilogue replaces)
//   fwd_red   conv -> y, and sum(y), sum(y*y) by generic reduction nodes (fwd_red1: sum(y) only)
//   dgrad_red dgrad -> dy', dReLU at bn(x) -> sum(g), sum(g*x) (dgrad_red1: sum(dy') only)
// Unfused, a layer costs fwd + bn_fwd forward and dgrad + wgrad + bn_bwd backward; fused,
// fwd_sbrcs forward and dgrad_dbn + wgrad_sbr + a pointwise dx pass backward. -1: no plan.
//
//   fused_conv_bench [--batch50 256] [--batch20 512] [--iters 20] [--plans 8] [--io bf16|half]
//                    [--channel_type float|io] [--layers N] [--deterministic 0|1]
//                    [--graphs fwd,fwd_red,...]
// (The data are bf16 bits whatever --io says: timing only.)
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "gpu_bench_util.h"
#include "kernels/norm_pool/batch_norm.h"

// The frontend, built with dynamic loading (so that it loads NVRTC only if an engine needs
// it), finds cuDNN's entry points through this handle: the cuDNN this binary already uses.
namespace cudnn_frontend {
void* cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
}  // namespace cudnn_frontend

namespace topiary::kernels::bench {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using Pack = std::unordered_map<TensorPtr, void*>;

int max_plans = 8, max_layers = 100;
bool deterministic = false;  // --deterministic 1: ask the reduction nodes for determinism
std::string only_graphs;     // --graphs a,b: time only these graphs (the others print -1)
// --io bf16|half: the activations' type; --channel_type float|io: the per-channel operands'
// (scale, bias, mean, inverse std) type.
fe::DataType_t io_type = fe::DataType_t::BFLOAT16;
fe::DataType_t channel_type = fe::DataType_t::FLOAT;

// An NHWC activation [n, c, h, w] (dims in cuDNN's NCHW order, strides NHWC) or a KRSC filter.
TensorPtr Nhwc(fe::graph::Graph& g, const char* name, int64_t n, int64_t c, int64_t h, int64_t w) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_dim({n, c, h, w})
                      .set_stride({c * h * w, 1, c * w, c}));
}
TensorPtr PerChannel(fe::graph::Graph& g, const char* name, int64_t c) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_dim({1, c, 1, 1})
                      .set_stride({c, 1, c, c})
                      .set_data_type(channel_type));
}

// A graph's tensors with device memory of the right size behind each.
struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  Pack pack;
};

// The fastest plan of a built graph (ms), or -1 when none finalizes or runs.
double Best(const std::string& what, Built& b, const CudaContext& cuda, int iters) {
  if (!only_graphs.empty()) {
    const std::string graph = what.substr(what.rfind(' ') + 1);
    if (("," + only_graphs + ",").find("," + graph + ",") == std::string::npos) return -1;
  }
  fe::graph::Graph& g = *b.graph;
  auto ok = [&](fe::error_t e, const char* step) {
    if (e.is_good()) return true;
    absl::FPrintF(stderr, "%s: %s: %s\n", what, step, e.get_message());
    return false;
  };
  if (!ok(g.validate(), "validate") ||
      !ok(g.build_operation_graph(cuda.cudnn), "operation graph") ||
      !ok(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "heuristics") ||
      !ok(g.check_support(cuda.cudnn), "support")) {
    return -1;
  }
  const int64_t count = std::min<int64_t>(g.get_execution_plan_count(), max_plans);
  double best = -1;
  for (int64_t i = 0; i < count; ++i) {
    if (!g.build_plan_at_index(cuda.cudnn, i).is_good()) continue;
    int64_t ws = 0;
    if (!g.get_workspace_size_plan_at_index(i, ws).is_good() || ws > (int64_t{1} << 30)) continue;
    void* workspace = DeviceAlloc(static_cast<size_t>(ws));
    if (g.execute_plan_at_index(cuda.cudnn, b.pack, workspace, i).is_good() &&
        cudaStreamSynchronize(cuda.stream) == cudaSuccess) {
      const double ms = TimeMs(
          cuda, iters, [&] { (void)g.execute_plan_at_index(cuda.cudnn, b.pack, workspace, i); });
      if (best < 0 || ms < best) best = ms;
    }
    cudaGetLastError();
    cudaFree(workspace);
  }
  return best;
}

std::shared_ptr<fe::graph::Graph> NewGraph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

struct Operands {
  ConvShape s;
  int p, q;
  void *x, *w, *y, *dy, *dx, *dw, *drelu;
  float *scale, *bias, *mean, *inv, *sum, *sq, *d[5];
};

// The padding, stride and dilation of any of the three convolution passes' attributes.
template <typename Attributes>
Attributes ConvAttr(const ConvShape& s) {
  Attributes a;
  a.set_padding({s.pad_h, s.pad_w}).set_stride({s.stride_h, s.stride_w}).set_dilation({1, 1});
  return a;
}

// relu(x * scale + bias) as a prologue.
TensorPtr ScaleBiasRelu(fe::graph::Graph& g, TensorPtr x, TensorPtr scale, TensorPtr bias) {
  auto mul =
      g.pointwise(x, scale, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::MUL));
  auto add =
      g.pointwise(mul, bias, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
  return g.pointwise(add,
                     fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::RELU_FWD));
}

void Layer(const ConvLayer& l, int batch, int iters, const CudaContext& cuda) {
  Operands o;
  o.s = l.Shape(batch);
  const ConvShape& s = o.s;
  o.p = (s.h + 2 * s.pad_h - s.r) / s.stride_h + 1;
  o.q = (s.w + 2 * s.pad_w - s.s) / s.stride_w + 1;
  const size_t nx = static_cast<size_t>(s.n) * s.h * s.w * s.c,
               ny = static_cast<size_t>(s.n) * o.p * o.q * s.k,
               nw = static_cast<size_t>(s.k) * s.r * s.s * s.c;
  o.x = RandomDevice(DType::kBf16, nx, 1);
  o.w = RandomDevice(DType::kBf16, nw, 2);
  o.dy = RandomDevice(DType::kBf16, ny, 3);
  o.y = DeviceAlloc(ny * 2);
  o.dx = DeviceAlloc(nx * 2);
  o.drelu = DeviceAlloc(nx * 2);
  o.dw = DeviceAlloc(nw * 2);
  auto floats = [](int n) { return static_cast<float*>(DeviceAlloc(n * sizeof(float))); };
  std::vector<float> ones(std::max(s.c, s.k), 1.0f), halves(std::max(s.c, s.k), 0.5f);
  o.scale = floats(s.c), o.bias = floats(s.c), o.mean = floats(s.c), o.inv = floats(s.c);
  cudaMemcpy(o.scale, ones.data(), s.c * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(o.inv, ones.data(), s.c * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(o.bias, halves.data(), s.c * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(o.mean, halves.data(), s.c * 4, cudaMemcpyHostToDevice);
  o.sum = floats(s.k), o.sq = floats(s.k);
  for (float*& d : o.d) d = floats(s.c);

  auto make = [&](const std::function<void(fe::graph::Graph&, Pack&)>& body) {
    Built b{NewGraph(), {}};
    body(*b.graph, b.pack);
    return b;
  };
  auto x_t = [&](fe::graph::Graph& g, Pack& p) {
    auto t = Nhwc(g, "x", s.n, s.c, s.h, s.w);
    p[t] = o.x;
    return t;
  };
  auto w_t = [&](fe::graph::Graph& g, Pack& p) {
    auto t = Nhwc(g, "w", s.k, s.c, s.r, s.s);
    p[t] = o.w;
    return t;
  };
  auto dy_t = [&](fe::graph::Graph& g, Pack& p) {
    auto t = Nhwc(g, "dy", s.n, s.k, o.p, o.q);
    p[t] = o.dy;
    return t;
  };
  auto chan = [&](fe::graph::Graph& g, Pack& p, const char* name, float* ptr) {
    auto t = PerChannel(g, name, s.c);
    p[t] = ptr;
    return t;
  };
  auto out = [&](Pack& p, TensorPtr t, void* ptr, std::vector<int64_t> dim) {
    t->set_output(true);
    if (!dim.empty()) t->set_dim(dim);
    p[t] = ptr;
  };
  auto stats = [&](fe::graph::Graph& g, Pack& p, TensorPtr y) {
    auto [sum, sq] = g.genstats(y, fe::graph::Genstats_attributes());
    sum->set_output(true).set_data_type(fe::DataType_t::FLOAT);
    sq->set_output(true).set_data_type(fe::DataType_t::FLOAT);
    p[sum] = o.sum;
    p[sq] = o.sq;
  };

  // A per-channel sum of t over [n, h, w] by a generic reduction node, written in fp32.
  auto reduce = [&](fe::graph::Graph& g, Pack& p, TensorPtr t, int64_t channels, float* ptr) {
    auto r = g.reduction(t, fe::graph::Reduction_attributes()
                                .set_mode(fe::ReductionMode_t::ADD)
                                .set_is_deterministic(deterministic)
                                .set_compute_data_type(fe::DataType_t::FLOAT));
    r->set_output(true)
        .set_dim({1, channels, 1, 1})
        .set_stride({channels, 1, channels, channels})
        .set_data_type(fe::DataType_t::FLOAT);
    p[r] = ptr;
  };
  auto mul = [&](fe::graph::Graph& g, TensorPtr a, TensorPtr b) {
    return g.pointwise(a, b, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::MUL));
  };

  Built fwd = make([&](fe::graph::Graph& g, Pack& p) {
    out(p, g.conv_fprop(x_t(g, p), w_t(g, p), ConvAttr<fe::graph::Conv_fprop_attributes>(s)), o.y,
        {});
  });
  Built sbrcs = make([&](fe::graph::Graph& g, Pack& p) {
    auto a = ScaleBiasRelu(g, x_t(g, p), chan(g, p, "scale", o.scale), chan(g, p, "bias", o.bias));
    auto y = g.conv_fprop(a, w_t(g, p), ConvAttr<fe::graph::Conv_fprop_attributes>(s));
    out(p, y, o.y, {});
    stats(g, p, y);
  });
  Built fwd_red = make([&](fe::graph::Graph& g, Pack& p) {
    auto y = g.conv_fprop(x_t(g, p), w_t(g, p), ConvAttr<fe::graph::Conv_fprop_attributes>(s));
    out(p, y, o.y, {});
    reduce(g, p, y, s.k, o.sum);
    reduce(g, p, mul(g, y, y), s.k, o.sq);
  });
  Built fwd_red1 = make([&](fe::graph::Graph& g, Pack& p) {
    auto y = g.conv_fprop(x_t(g, p), w_t(g, p), ConvAttr<fe::graph::Conv_fprop_attributes>(s));
    out(p, y, o.y, {});
    reduce(g, p, y, s.k, o.sum);
  });
  const auto dgrad_attr = ConvAttr<fe::graph::Conv_dgrad_attributes>(s);
  Built dgrad_red = make([&](fe::graph::Graph& g, Pack& p) {
    auto dg = g.conv_dgrad(dy_t(g, p), w_t(g, p), dgrad_attr);
    out(p, dg, o.dx, {s.n, s.c, s.h, s.w});
    auto x = x_t(g, p);
    auto bn = g.pointwise(mul(g, x, chan(g, p, "scale", o.scale)), chan(g, p, "bias", o.bias),
                          fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
    auto m = g.pointwise(dg, bn,
                         fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::RELU_BWD));
    reduce(g, p, m, s.c, o.d[0]);
    reduce(g, p, mul(g, m, x), s.c, o.d[1]);
  });
  Built dgrad_red1 = make([&](fe::graph::Graph& g, Pack& p) {
    auto dg = g.conv_dgrad(dy_t(g, p), w_t(g, p), dgrad_attr);
    out(p, dg, o.dx, {s.n, s.c, s.h, s.w});
    reduce(g, p, dg, s.c, o.d[0]);
  });
  Built dgrad = make([&](fe::graph::Graph& g, Pack& p) {
    out(p, g.conv_dgrad(dy_t(g, p), w_t(g, p), dgrad_attr), o.dx, {s.n, s.c, s.h, s.w});
  });
  Built dgrad_dbn = make([&](fe::graph::Graph& g, Pack& p) {
    auto dg = g.conv_dgrad(dy_t(g, p), w_t(g, p), dgrad_attr);
    dg->set_dim({s.n, s.c, s.h, s.w});
    auto x = x_t(g, p);
    auto mean = chan(g, p, "mean", o.mean), inv = chan(g, p, "inv", o.inv),
         scale = chan(g, p, "scale", o.scale), bias = chan(g, p, "bias", o.bias);
    auto pw = [&](TensorPtr a, TensorPtr b, fe::PointwiseMode_t m) {
      return g.pointwise(a, b, fe::graph::Pointwise_attributes().set_mode(m));
    };
    auto bn = pw(pw(pw(x, mean, fe::PointwiseMode_t::SUB), inv, fe::PointwiseMode_t::MUL), scale,
                 fe::PointwiseMode_t::MUL);
    bn = pw(bn, bias, fe::PointwiseMode_t::ADD);
    auto drelu = pw(dg, bn, fe::PointwiseMode_t::RELU_BWD);
    out(p, drelu, o.drelu, {});
    auto outs = g.dbn_weight(drelu, x, mean, inv, scale, fe::graph::DBN_weight_attributes());
    for (int i = 0; i < 5; ++i) {
      outs[i]->set_output(true).set_dim({1, s.c, 1, 1}).set_stride({s.c, 1, s.c, s.c});
      outs[i]->set_data_type(fe::DataType_t::FLOAT);
      p[outs[i]] = o.d[i];
    }
  });
  const auto wgrad_attr = ConvAttr<fe::graph::Conv_wgrad_attributes>(s);
  Built wgrad = make([&](fe::graph::Graph& g, Pack& p) {
    out(p, g.conv_wgrad(dy_t(g, p), x_t(g, p), wgrad_attr), o.dw, {s.k, s.c, s.r, s.s});
  });
  Built wgrad_sbr = make([&](fe::graph::Graph& g, Pack& p) {
    auto a = ScaleBiasRelu(g, x_t(g, p), chan(g, p, "scale", o.scale), chan(g, p, "bias", o.bias));
    out(p, g.conv_wgrad(dy_t(g, p), a, wgrad_attr), o.dw, {s.k, s.c, s.r, s.s});
  });

  const std::string name = std::string(l.model) + "." + l.name;
  const double t_fwd = Best(name + " fwd", fwd, cuda, iters);
  const double t_sbrcs = Best(name + " fwd_sbrcs", sbrcs, cuda, iters);
  const double t_dgrad = Best(name + " dgrad", dgrad, cuda, iters);
  const double t_dgrad_dbn = Best(name + " dgrad_dbn", dgrad_dbn, cuda, iters);
  const double t_fwd_red = Best(name + " fwd_red", fwd_red, cuda, iters);
  const double t_fwd_red1 = Best(name + " fwd_red1", fwd_red1, cuda, iters);
  const double t_dgrad_red = Best(name + " dgrad_red", dgrad_red, cuda, iters);
  const double t_dgrad_red1 = Best(name + " dgrad_red1", dgrad_red1, cuda, iters);
  const double t_wgrad = Best(name + " wgrad", wgrad, cuda, iters);
  const double t_wgrad_sbr = Best(name + " wgrad_sbr", wgrad_sbr, cuda, iters);

  // Our batch-norm kernels on the layer's input, with the ReLU, as the unfused engine runs them.
  BatchNormShape bn;
  bn.m = static_cast<int64_t>(s.n) * s.h * s.w;
  bn.c = s.c;
  bn.relu = true;
  float* ws = static_cast<float*>(DeviceAlloc(BatchNormWorkspaceFloatsCuda(bn) * sizeof(float)));
  float *rm = floats(s.c), *rv = floats(s.c), *dgamma = floats(s.c), *dbeta = floats(s.c),
        *ss = floats(2 * s.c);
  const double t_bn_fwd = TimeMs(cuda, iters, [&] {
    CHECK_OK(BatchNormForwardTrainCuda(DType::kBf16, bn, o.x, o.scale, o.bias, rm, rv, o.mean,
                                       o.inv, ss, o.drelu, ws, cuda));
  });
  const double t_bn_bwd = TimeMs(cuda, iters, [&] {
    CHECK_OK(BatchNormBackwardCuda(DType::kBf16, bn, o.x, o.dx, o.scale, o.mean, o.inv, ss, o.drelu,
                                   dgamma, dbeta, ws, cuda));
  });
  BatchNormShape plain = bn;
  plain.relu = false;
  const double t_bn_stats = TimeMs(cuda, iters, [&] {
    CHECK_OK(BatchNormForwardTrainCuda(DType::kBf16, plain, o.x, o.scale, o.bias, rm, rv, o.mean,
                                       o.inv, ss, nullptr, ws, cuda));
  });
  absl::PrintF(
      "{\"layer\":\"%s\",\"batch\":%d,\"c\":%d,\"k\":%d,\"r\":%d,\"hw\":%d,\"fwd\":%.4f,"
      "\"fwd_sbrcs\":%.4f,\"bn_fwd\":%.4f,\"bn_stats\":%.4f,\"dgrad\":%.4f,\"dgrad_dbn\":%.4f,"
      "\"wgrad\":%.4f,\"wgrad_sbr\":%.4f,\"bn_bwd\":%.4f,\"fwd_red\":%.4f,\"fwd_red1\":%.4f,"
      "\"dgrad_red\":%.4f,\"dgrad_red1\":%.4f}\n",
      name, batch, s.c, s.k, s.r, s.h, t_fwd, t_sbrcs, t_bn_fwd, t_bn_stats, t_dgrad, t_dgrad_dbn,
      t_wgrad, t_wgrad_sbr, t_bn_bwd, t_fwd_red, t_fwd_red1, t_dgrad_red, t_dgrad_red1);
  std::fflush(stdout);
  for (void* ptr : {o.x, o.w, o.y, o.dy, o.dx, o.dw, o.drelu}) cudaFree(ptr);
  for (float* ptr : {o.scale, o.bias, o.mean, o.inv, o.sum, o.sq, rm, rv, dgamma, dbeta, ss, ws}) {
    cudaFree(ptr);
  }
  for (float* d : o.d) cudaFree(d);
}

}  // namespace
}  // namespace topiary::kernels::bench

int main(int argc, char** argv) {
  using namespace topiary::kernels::bench;  // NOLINT
  program = "fused_conv_bench";
  SweepFlags flags(argc, argv);
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--plans") max_plans = std::atoi(v.c_str());
    if (k == "--layers") max_layers = std::atoi(v.c_str());
    if (k == "--deterministic") deterministic = v == "1";
    if (k == "--graphs") only_graphs = v;
    if (k == "--io" && v == "half") io_type = cudnn_frontend::DataType_t::HALF;
    if (k == "--channel_type" && v == "io") channel_type = io_type;
  }
  const topiary::kernels::CudaContext cuda = MakeContext();
  absl::PrintF("{\"gpu\":\"%s\",\"cudnn\":%d}\n", GpuName(), static_cast<int>(cudnnGetVersion()));
  const ConvLayer layers[] = {
      {"resnet50", "layer1.conv2", 56, 64, 64, 3, 1},
      {"resnet50", "layer1.conv3", 56, 64, 256, 1, 1},
      {"resnet50", "layer2.conv2", 28, 128, 128, 3, 1},
      {"resnet50", "layer2.conv3", 28, 128, 512, 1, 1},
      {"resnet50", "layer3.conv2", 14, 256, 256, 3, 1},
      {"resnet50", "layer3.conv3", 14, 256, 1024, 1, 1},
      {"resnet50", "layer4.conv2", 7, 512, 512, 3, 1},
      {"resnet50", "layer4.conv3", 7, 512, 2048, 1, 1},
      {"resnet20", "layer1.conv2", 32, 16, 16, 3, 1},
      {"resnet20", "layer2.conv2", 16, 32, 32, 3, 1},
      {"resnet20", "layer3.conv2", 8, 64, 64, 3, 1},
  };
  int count = 0;
  for (const ConvLayer& l : layers) {
    if (count++ == max_layers) break;
    Layer(l, flags.Batch(l), flags.iters, cuda);
  }
  return 0;
}
