// Approximate-convolution throughput on the GPU: the whole forward pass (ranges, codes and
// the table convolution) on resnet20's 3x3 layer shapes, beside the exact cuDNN convolution
// of the same shape (fp32, as Topiary plans it). Prints one JSON line per shape with
// table-MAC/s (N * Ho * Wo * K * R * S * C per second). approx_conv_pytorch.py measures
// PyTorch's LUT emulation and cuDNN on the same shapes; docs/PERFORMANCE.md has results.
//   approx_conv_bench [--batch 512] [--iters 20] [--per_channel]
// --per_channel: weight parameters per output channel (approximation.weight_scales: PER_CHANNEL).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kernels/approx/approx_conv.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/cuda_context.h"
#include "tests/benchmarks/gpu_bench_util.h"

namespace topiary::kernels {
namespace {

using bench::DeviceAlloc;
using bench::TimeMs;

void FillRandom(float* dev, size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> h(n);
  for (auto& v : h) v = d(gen);
  CHECK_OK(CudaStatus(cudaMemcpy(dev, h.data(), n * 4, cudaMemcpyHostToDevice), "copy"));
}

int Main(int argc, char** argv) {
  bench::program = "approx_conv_bench";
  int batch = 512, iters = 20;
  ApproxConvOptions options;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--per_channel")) options.weights.scales = WeightScales::kPerChannel;
    if (i + 1 == argc) break;
    if (!std::strcmp(argv[i], "--batch")) (void)absl::SimpleAtoi(argv[i + 1], &batch);
    if (!std::strcmp(argv[i], "--iters")) (void)absl::SimpleAtoi(argv[i + 1], &iters);
  }
  const CudaContext cuda = bench::MakeContext();
  CHECK_OK(ApproxConvPrepareCuda());
  const std::string gpu = bench::GpuName();

  // resnet20 (CIFAR, 32x32): the 3x3 convolutions of its three stages.
  struct Layer {
    const char* name;
    int hw, c, k, stride;
  };
  const Layer layers[] = {{"stage1 3x3 16->16", 32, 16, 16, 1},
                          {"stage2 3x3 16->32 s2", 32, 16, 32, 2},
                          {"stage2 3x3 32->32", 16, 32, 32, 1},
                          {"stage3 3x3 32->64 s2", 16, 32, 64, 2},
                          {"stage3 3x3 64->64", 8, 64, 64, 1}};
  std::mt19937 gen(1);
  std::vector<uint16_t> table(kMultiplierEntries);
  for (auto& v : table) v = static_cast<uint16_t>(gen());
  auto* d_table = static_cast<uint16_t*>(DeviceAlloc(table.size() * 2));
  cudaMemcpy(d_table, table.data(), table.size() * 2, cudaMemcpyHostToDevice);
  for (const Layer& l : layers) {
    ConvShape s;
    s.n = batch;
    s.h = s.w = l.hw;
    s.c = l.c;
    s.k = l.k;
    s.r = s.s = 3;
    s.stride_h = s.stride_w = l.stride;
    s.pad_h = s.pad_w = 1;
    const size_t xn = static_cast<size_t>(s.n) * s.h * s.w * s.c;
    const size_t wn = static_cast<size_t>(s.k) * s.patch();
    const size_t yn = static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k;
    auto* x = static_cast<float*>(DeviceAlloc(xn * 4));
    auto* w = static_cast<float*>(DeviceAlloc(wn * 4));
    auto* y = static_cast<float*>(DeviceAlloc(yn * 4));
    auto* wq = static_cast<float*>(DeviceAlloc(wn * 4));
    FillRandom(x, xn, 2);
    FillRandom(w, wn, 3);
    void* ws = DeviceAlloc(ApproxConvWorkspaceBytes(s));
    auto* d_params =
        static_cast<QuantParams*>(DeviceAlloc(ApproxParamCount(s) * sizeof(QuantParams)));
    const double approx_ms = TimeMs(cuda, iters, [&] {
      CHECK_OK(ApproxConv2dForwardCuda(s, x, w, nullptr, d_table, y, nullptr, wq, d_params, ws,
                                       cuda, options));
    });
    auto plan = ConvCudaPlan::Create(s, Precision::kFp32, size_t{1} << 30, false, cuda);
    CHECK_OK(plan.status());
    void* cws = DeviceAlloc((*plan)->workspace_bytes());
    const double exact_ms =
        TimeMs(cuda, iters, [&] { CHECK_OK((*plan)->Forward(x, w, nullptr, y, cws, cuda)); });
    const double macs = static_cast<double>(yn) * s.patch();
    absl::PrintF(
        "{\"impl\":\"topiary\",\"gpu\":\"%s\",\"layer\":\"%s\",\"batch\":%d,\"per_channel\":%s,"
        "\"approx_ms\":%.4f,"
        "\"table_macs_per_s\":%.4g,\"cudnn_fp32_ms\":%.4f,\"approx_over_cudnn\":%.2f}\n",
        gpu, l.name, batch, options.weights.scales == WeightScales::kPerChannel ? "true" : "false",
        approx_ms, macs / (approx_ms * 1e-3), exact_ms, approx_ms / exact_ms);
    for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(y),
                    static_cast<void*>(wq), static_cast<void*>(d_params), ws, cws}) {
      cudaFree(p);
    }
  }
  return 0;
}

}  // namespace
}  // namespace topiary::kernels

int main(int argc, char** argv) { return topiary::kernels::Main(argc, argv); }
