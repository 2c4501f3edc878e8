// Sampled weight gradients on the GPU beside cuDNN's exact backward-filter pass (the fastest
// algorithm cuDNN measures for the shape, as Topiary plans it) on resnet20's (28x28, as the
// Fashion-MNIST runs) and resnet50's (224x224) layer shapes, fp32 and bf16, top_k 1 and 4.
// Prints one JSON line per case; docs/PERFORMANCE.md has results.
//   sampled_grad_bench [--batch20 128] [--batch50 256] [--iters 20]
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/conv/conv.h"
#include "kernels/conv/sampled_grad.h"
#include "kernels/runtime/cuda_context.h"
#include "tests/benchmarks/gpu_bench_util.h"

namespace topiary::kernels {
namespace {

using bench::DeviceAlloc;
using bench::RandomDevice;
using bench::TimeMs;

int Main(int argc, char** argv) {
  bench::program = "sampled_grad_bench";
  const bench::SweepFlags sweep(argc, argv);
  const int iters = sweep.iters;
  const CudaContext cuda = bench::MakeContext();
  const std::string gpu = bench::GpuName();

  const bench::ConvLayer layers[] = {
      {"resnet20", "stem 3x3 1->16", 28, 1, 16, 3, 1},
      {"resnet20", "stage1 3x3 16->16", 28, 16, 16, 3, 1},
      {"resnet20", "stage2 3x3 16->32 s2", 28, 16, 32, 3, 2},
      {"resnet20", "stage2 3x3 32->32", 14, 32, 32, 3, 1},
      {"resnet20", "stage3 3x3 32->64 s2", 14, 32, 64, 3, 2},
      {"resnet20", "stage3 3x3 64->64", 7, 64, 64, 3, 1},
      {"resnet50", "conv1 7x7 3->64 s2", 224, 3, 64, 7, 2},
      {"resnet50", "layer1 3x3 64->64", 56, 64, 64, 3, 1},
      {"resnet50", "layer1 1x1 64->256", 56, 64, 256, 1, 1},
      {"resnet50", "layer2 3x3 128->128", 28, 128, 128, 3, 1},
      {"resnet50", "layer3 3x3 256->256", 14, 256, 256, 3, 1},
      {"resnet50", "layer4 3x3 512->512", 7, 512, 512, 3, 1},
  };
  for (const bench::ConvLayer& l : layers) {
    ConvShape s = l.Shape(sweep.Batch(l));
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      const DType t = p == Precision::kBf16 ? DType::kBf16 : DType::kF32;
      const size_t xn = static_cast<size_t>(s.n) * s.h * s.w * s.c;
      const size_t yn = static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k;
      const size_t wn = static_cast<size_t>(s.k) * s.patch();
      void* x = RandomDevice(t, xn, 1);
      void* dy = RandomDevice(t, yn, 2);
      void* dw = DeviceAlloc(wn * SizeOf(t));
      auto plan = ConvCudaPlan::Create(s, p, size_t{1} << 30, false, cuda);
      CHECK_OK(plan.status());
      void* cws = DeviceAlloc((*plan)->workspace_bytes());
      const double exact_ms = TimeMs(
          cuda, iters, [&] { CHECK_OK((*plan)->BackwardFilter(x, dy, dw, nullptr, cws, cuda)); });
      for (int top_k : {1, 4}) {
        void* ws = DeviceAlloc(SampledWeightGradWorkspaceBytes(s, top_k));
        const WeightGradSampling sampling{top_k, 1.0f};
        const double sampled_ms = TimeMs(cuda, iters, [&] {
          CHECK_OK(SampledWeightGradCuda(t, s, sampling, x, dy, nullptr, dw, nullptr, ws, cuda));
        });
        absl::PrintF(
            "{\"gpu\":\"%s\",\"model\":\"%s\",\"layer\":\"%s\",\"batch\":%d,\"precision\":\"%s\","
            "\"top_k\":%d,\"cudnn_backward_filter_ms\":%.4f,\"sampled_ms\":%.4f,"
            "\"speedup\":%.2f}\n",
            gpu, l.model, l.name, s.n, PrecisionName(p), top_k, exact_ms, sampled_ms,
            exact_ms / sampled_ms);
        cudaFree(ws);
      }
      for (void* q : {x, dy, dw, cws}) cudaFree(q);
    }
  }
  return 0;
}

}  // namespace
}  // namespace topiary::kernels

int main(int argc, char** argv) { return topiary::kernels::Main(argc, argv); }
