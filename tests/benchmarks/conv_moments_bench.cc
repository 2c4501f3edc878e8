// The batch norm's statistics in the convolution's epilogue (issue 43), per resnet50
// convolution (224 px, bf16; each one feeds a batch norm): what the training forward pass
// runs today, cuDNN's convolution (its fastest algorithm, as Topiary plans it) and then the
// batch norm's statistics pass over y, against Topiary's Hopper implicit GEMM writing y and
// the moments of y (hopper_conv.h) and the batch norm merging them (BatchNormMoments). The
// batch norm's apply pass is the same either way and not timed. Per layer, ms:
//   cudnn      the convolution alone         stats   the statistics pass over y (+ merge)
//   hopper     Topiary's convolution alone   fused   Topiary's with the moments (+ merge)
// and gain = (cudnn + stats) / fused; the last line weighs each layer by how often resnet50
// runs it: the forward pass's time with, per layer, the faster of the two, against today's.
// The two paths' statistics are compared: the largest difference of the means in standard
// deviations, of the inverse standard deviations relative (the fused path sums the fp32
// accumulators, the statistics pass y rounded to bf16).
//   conv_moments_bench [--batch50 256] [--iters 20] [--layer NAME]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/conv/conv.h"
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/sparse/block_sparse_conv.h"
#include "tests/benchmarks/gpu_bench_util.h"

namespace topiary::kernels {
namespace {

using bench::DeviceAlloc;
using bench::RandomDevice;
using bench::TimeMs;

struct Layer {
  bench::ConvLayer conv;
  int count;  // how many of it resnet50 runs
};

std::vector<float> Host(const float* d, int n) {
  std::vector<float> h(n);
  CHECK_OK(CudaStatus(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), "copy"));
  return h;
}

// The largest difference of a from b, in units of 1 / scale (b's standard deviations: pass
// the inverse standard deviations for the means), or relative (scale empty).
double MaxDiff(const std::vector<float>& a, const std::vector<float>& b,
               const std::vector<float>& scale = {}) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    worst = std::max(
        worst, scale.empty() ? d / (std::abs(static_cast<double>(b[i])) + 1e-30) : d * scale[i]);
  }
  return worst;
}

int Main(int argc, char** argv) {
  bench::program = "conv_moments_bench";
  const bench::SweepFlags sweep(argc, argv);
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--layer")) only = argv[i + 1];
  }
  const CudaContext cuda = bench::MakeContext();
  const std::string gpu = bench::GpuName();
  const DType t = DType::kBf16;
  // resnet50 (torchvision's v1.5: the stride on the 3x3), every convolution but the stem.
  const Layer layers[] = {
      {{"resnet50", "layer1 1x1 64->64", 56, 64, 64, 1, 1}, 1},
      {{"resnet50", "layer1 1x1 256->64", 56, 256, 64, 1, 1}, 2},
      {{"resnet50", "layer1 3x3 64->64", 56, 64, 64, 3, 1}, 3},
      {{"resnet50", "layer1 1x1 64->256", 56, 64, 256, 1, 1}, 4},  // 3 + the shortcut
      {{"resnet50", "layer2 1x1 256->128", 56, 256, 128, 1, 1}, 1},
      {{"resnet50", "layer2 3x3 128->128 s2", 56, 128, 128, 3, 2}, 1},
      {{"resnet50", "layer2 1x1 256->512 s2", 56, 256, 512, 1, 2}, 1},
      {{"resnet50", "layer2 1x1 512->128", 28, 512, 128, 1, 1}, 3},
      {{"resnet50", "layer2 3x3 128->128", 28, 128, 128, 3, 1}, 3},
      {{"resnet50", "layer2 1x1 128->512", 28, 128, 512, 1, 1}, 4},
      {{"resnet50", "layer3 1x1 512->256", 28, 512, 256, 1, 1}, 1},
      {{"resnet50", "layer3 3x3 256->256 s2", 28, 256, 256, 3, 2}, 1},
      {{"resnet50", "layer3 1x1 512->1024 s2", 28, 512, 1024, 1, 2}, 1},
      {{"resnet50", "layer3 1x1 1024->256", 14, 1024, 256, 1, 1}, 5},
      {{"resnet50", "layer3 3x3 256->256", 14, 256, 256, 3, 1}, 5},
      {{"resnet50", "layer3 1x1 256->1024", 14, 256, 1024, 1, 1}, 6},
      {{"resnet50", "layer4 1x1 1024->512", 14, 1024, 512, 1, 1}, 1},
      {{"resnet50", "layer4 3x3 512->512 s2", 14, 512, 512, 3, 2}, 1},
      {{"resnet50", "layer4 1x1 1024->2048 s2", 14, 1024, 2048, 1, 2}, 1},
      {{"resnet50", "layer4 1x1 2048->512", 7, 2048, 512, 1, 1}, 2},
      {{"resnet50", "layer4 3x3 512->512", 7, 512, 512, 3, 1}, 2},
      {{"resnet50", "layer4 1x1 512->2048", 7, 512, 2048, 1, 1}, 3},
  };
  double today = 0, best = 0;
  for (const Layer& layer : layers) {
    const bench::ConvLayer& l = layer.conv;
    if (!only.empty() && only != l.name) continue;
    const ConvShape s = l.Shape(sweep.Batch(l));
    const int64_t rows = static_cast<int64_t>(s.n) * s.ho() * s.wo();
    void* x = RandomDevice(t, static_cast<size_t>(s.n) * s.h * s.w * s.c, 1);
    void* w = RandomDevice(t, static_cast<size_t>(s.k) * s.patch(), 3);
    void* y = DeviceAlloc(rows * s.k * SizeOf(t));
    auto dense = ConvCudaPlan::Create(s, Precision::kBf16, size_t{1} << 30, false, cuda);
    CHECK_OK(dense.status());
    void* ws = DeviceAlloc((*dense)->workspace_bytes());
    // The batch norm: its parameters, running and saved statistics (two sets: one per path).
    BatchNormShape bn{rows, s.k};
    bn.relu = true;
    float* bn_ws = static_cast<float*>(DeviceAlloc(BatchNormWorkspaceFloatsCuda(bn) * 4));
    float* gamma = static_cast<float*>(RandomDevice(DType::kF32, s.k, 5));
    float* beta = static_cast<float*>(RandomDevice(DType::kF32, s.k, 6));
    float* stats[2][5];  // running mean, running var, mean, inv std, scale and shift
    for (auto& path : stats) {
      for (float*& p : path) p = static_cast<float*>(DeviceAlloc(2 * s.k * sizeof(float)));
    }
    auto batch_norm = [&](int path, const BatchNormMoments* moments) {
      float* const* st = stats[path];
      CHECK_OK(BatchNormForwardTrainCuda(t, bn, y, gamma, beta, st[0], st[1], st[2], st[3], st[4],
                                         nullptr, bn_ws, cuda, nullptr, moments));
    };
    const double cudnn_ms =
        TimeMs(cuda, sweep.iters, [&] { CHECK_OK((*dense)->Forward(x, w, nullptr, y, ws, cuda)); });
    const double stats_ms = TimeMs(cuda, sweep.iters, [&] { batch_norm(0, nullptr); });

    // Topiary's: the block-sparse plan of one block, kept (a dense convolution).
    const BlockGrid grid = BlockGrid::Dense(s.c, s.k, s.c, s.k);
    auto hopper = BlockSparseConvCuda::Create(s, grid, t, cuda);
    CHECK_OK(hopper.status());
    CHECK_OK((*hopper)->Tune(SparsePass::kForward, x, w, y, cuda).status());
    const int slices = (*hopper)->forward_moment_slices(cuda);
    double hopper_ms = -1, fused_ms = -1, mean_rel = -1, inv_rel = -1;
    if (slices > 0) {
      float* part = static_cast<float*>(DeviceAlloc(3 * static_cast<size_t>(slices) * s.k * 4));
      const BatchNormMoments moments{part, slices};
      hopper_ms =
          TimeMs(cuda, sweep.iters, [&] { CHECK_OK((*hopper)->Forward(x, w, nullptr, y, cuda)); });
      fused_ms = TimeMs(cuda, sweep.iters, [&] {
        CHECK_OK((*hopper)->Forward(x, w, nullptr, y, cuda, part));
        batch_norm(1, &moments);
      });
      batch_norm(0, nullptr);  // on the same y
      CHECK_OK(CudaStatus(cudaStreamSynchronize(cuda.stream), "sync"));
      const std::vector<float> inv = Host(stats[0][3], s.k);
      mean_rel = MaxDiff(Host(stats[1][2], s.k), Host(stats[0][2], s.k), inv);
      inv_rel = MaxDiff(Host(stats[1][3], s.k), inv);
      cudaFree(part);
    }
    const double unfused = cudnn_ms + stats_ms;
    today += layer.count * unfused;
    best += layer.count * (fused_ms > 0 ? std::min(unfused, fused_ms) : unfused);
    absl::PrintF(
        "{\"gpu\":\"%s\",\"layer\":\"%s\",\"batch\":%d,\"count\":%d,\"cudnn_ms\":%.4f,"
        "\"stats_ms\":%.4f,\"hopper_ms\":%.4f,\"fused_ms\":%.4f,\"gain\":%.3f,\"config\":\"%s\","
        "\"slices\":%d,\"mean_diff_in_std\":%.2e,\"inv_std_rel\":%.2e}\n",
        gpu, l.name, s.n, layer.count, cudnn_ms, stats_ms, hopper_ms, fused_ms,
        fused_ms > 0 ? unfused / fused_ms : 0.0, (*hopper)->config_name(SparsePass::kForward),
        slices, mean_rel, inv_rel);
    for (void* p : {x, w, y, ws, static_cast<void*>(bn_ws), static_cast<void*>(gamma),
                    static_cast<void*>(beta)}) {
      cudaFree(p);
    }
    for (auto& path : stats) {
      for (float* p : path) cudaFree(p);
    }
  }
  absl::PrintF(
      "{\"gpu\":\"%s\",\"total\":\"resnet50 forward\",\"today_ms\":%.3f,\"best_ms\":%.3f,"
      "\"saved_ms\":%.3f}\n",
      gpu, today, best, today - best);
  return 0;
}

}  // namespace
}  // namespace topiary::kernels

int main(int argc, char** argv) { return topiary::kernels::Main(argc, argv); }
