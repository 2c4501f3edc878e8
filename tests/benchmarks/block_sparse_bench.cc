// Block-sparse convolution layers beside cuDNN: for each layer shape and fraction of kept
// blocks (8x8, or --block INxOUT such as 64x128, which Hopper's kernels take), the
// forward, backward-data and backward-filter times of cuDNN's fastest algorithm
// (as Topiary plans it) and of the block-sparse kernels (their fastest tile configuration, as
// the engine tunes it), and the ratio. Shapes: resnet50's 3x3 layers at 224 px (batch 256), a
// 1x1 one and the stride-2 ones of a stage's first block, resnet20's 64-channel layers at 32 px
// (batch 128). Grids are balanced as
// pruning { balanced: true } leaves them (block_grid_util.h). One JSON line per case, then per
// shape and pass the crossover: the highest density measured at which sparse is faster.
//   block_sparse_bench [--precision bf16|fp32] [--batch20 128] [--batch50 256] [--iters 20]
//                      [--layer NAME] [--block INxOUT] [--all_configs 1] [--density D]
//                      [--pass forward|backward_data|backward_filter] [--captured 1]
// --density D measures that kept fraction only (e.g. for a profiler), --layer that layer only,
// --pass that pass only. --captured 1 times the calls captured into a CUDA graph and replayed,
// as the trainer runs a step, so neither the host's launch work (a stride-2 backward data
// makes four problems' TMA descriptors per call) nor the gaps between launches count (1-3% on
// resnet50's layers, docs/PERFORMANCE.md); by default each call is launched from the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/sparse/block_sparse_conv.h"
#include "tests/benchmarks/block_grid_util.h"
#include "tests/benchmarks/gpu_bench_util.h"

namespace topiary::kernels {
namespace {

using bench::DeviceAlloc;
using bench::RandomDevice;

int Main(int argc, char** argv) {
  bench::program = "block_sparse_bench";
  const bench::SweepFlags sweep(argc, argv);
  const int iters = sweep.iters;
  Precision p = Precision::kBf16;
  std::string only;  // --layer NAME: just that layer (e.g. for a profiler)
  int block_in = 8, block_out = 8;
  bool all_configs = false;  // --all_configs 1: time every configuration too
  bool captured = false;     // --captured 1: time graph replays (the file's comment)
  double only_density = 0;   // --density D: just that kept fraction
  const SparsePass passes[] = {SparsePass::kForward, SparsePass::kBackwardData,
                               SparsePass::kBackwardFilter};
  bool want[3] = {true, true, true};  // --pass NAME: that pass only
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--density") &&
        (!absl::SimpleAtod(argv[i + 1], &only_density) || only_density <= 0 || only_density > 1)) {
      absl::FPrintF(stderr, "--density wants a kept fraction in (0, 1]\n");
      return 2;
    }
    if (!std::strcmp(argv[i], "--all_configs")) all_configs = std::strcmp(argv[i + 1], "0") != 0;
    if (!std::strcmp(argv[i], "--captured")) captured = std::strcmp(argv[i + 1], "0") != 0;
    if (!std::strcmp(argv[i], "--layer")) only = argv[i + 1];
    if (!std::strcmp(argv[i], "--pass")) {
      bool known = false;
      for (int k = 0; k < 3; ++k) {  // the pass's name with '_' for ' '
        std::string name = SparsePassName(passes[k]);
        std::replace(name.begin(), name.end(), ' ', '_');
        want[k] = name == argv[i + 1];
        known |= want[k];
      }
      if (!known) {
        absl::FPrintF(stderr, "--pass wants forward, backward_data or backward_filter\n");
        return 2;
      }
    }
    if (!std::strcmp(argv[i], "--block") &&
        !topiary::bench::ParseBlockShape(argv[i + 1], &block_in, &block_out)) {
      absl::FPrintF(stderr, "--block wants INxOUT, e.g. 64x128\n");
      return 2;
    }
    if (!std::strcmp(argv[i], "--precision") && !std::strcmp(argv[i + 1], "fp32")) {
      p = Precision::kFp32;
    }
  }
  const DType t = ActivationType(p);
  const CudaContext cuda = bench::MakeContext();
  auto time_ms = [&](int runs, auto&& f) { return bench::TimeMs(cuda, runs, f, captured); };
  const std::string gpu = bench::GpuName();

  const bench::ConvLayer layers[] = {
      {"resnet20", "stage3 3x3 64->64", 8, 64, 64, 3, 1},
      {"resnet20", "stage3 3x3 32->64 s2", 16, 32, 64, 3, 2},
      {"resnet50", "layer1 3x3 64->64", 56, 64, 64, 3, 1},
      {"resnet50", "layer2 3x3 128->128", 28, 128, 128, 3, 1},
      {"resnet50", "layer3 3x3 256->256", 14, 256, 256, 3, 1},
      {"resnet50", "layer4 3x3 512->512", 7, 512, 512, 3, 1},
      {"resnet50", "layer3 1x1 1024->256", 14, 1024, 256, 1, 1},
      // The first block of a stage: stride 2 (backward data phase by phase on Hopper).
      {"resnet50", "layer2 3x3 128->128 s2", 56, 128, 128, 3, 2},
      {"resnet50", "layer3 3x3 256->256 s2", 28, 256, 256, 3, 2},
      {"resnet50", "layer4 3x3 512->512 s2", 14, 512, 512, 3, 2},
      {"resnet50", "layer3 1x1 512->1024 s2", 28, 512, 1024, 1, 2},
  };
  const double densities[] = {1.0, 0.75, 0.5, 0.25, 0.125};
  for (const bench::ConvLayer& l : layers) {
    if (!only.empty() && only != l.name) continue;
    ConvShape s = l.Shape(sweep.Batch(l));
    const size_t xn = static_cast<size_t>(s.n) * s.h * s.w * s.c;
    const size_t yn = static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k;
    const size_t wn = static_cast<size_t>(s.k) * s.patch();
    void* x = RandomDevice(t, xn, 1);
    void* dy = RandomDevice(t, yn, 2);
    void* w = RandomDevice(t, wn, 3);
    void* y = DeviceAlloc(yn * SizeOf(t));
    void* dx = DeviceAlloc(xn * SizeOf(t));
    void* dw = DeviceAlloc(wn * SizeOf(t));
    auto dense = ConvCudaPlan::Create(s, p, size_t{1} << 30, false, cuda);
    CHECK_OK(dense.status());
    void* ws = DeviceAlloc((*dense)->workspace_bytes());
    // Pass i's operands (as Tune takes them: forward x, w -> y; backward data dy, w -> dx;
    // backward filter x, dy -> dw) and one run of it by cuDNN.
    const void* in0[3] = {x, dy, x};
    const void* in1[3] = {w, w, dy};
    void* out[3] = {y, dx, dw};
    auto dense_run = [&](int i) {
      if (i == 0) CHECK_OK((*dense)->Forward(in0[i], in1[i], nullptr, out[i], ws, cuda));
      if (i == 1) CHECK_OK((*dense)->BackwardData(in0[i], in1[i], out[i], ws, cuda));
      if (i == 2) CHECK_OK((*dense)->BackwardFilter(in0[i], in1[i], out[i], nullptr, ws, cuda));
    };
    double dense_ms[3] = {0, 0, 0};
    for (int i = 0; i < 3; ++i) {
      if (want[i]) dense_ms[i] = time_ms(iters, [&] { dense_run(i); });
    }
    double crossover[3] = {0, 0, 0};
    for (double d : densities) {
      if (s.c / block_in < 2 || s.k / block_out < 2) continue;  // one row or column: dense
      if (only_density > 0 && d != only_density) continue;
      std::mt19937 gen(7);
      const BlockGrid grid = topiary::bench::BalancedGrid(s.c, s.k, block_in, block_out, d, gen);
      auto sparse = BlockSparseConvCuda::Create(s, grid, t, cuda);
      CHECK_OK(sparse.status());
      BlockSparseConvCuda& sp = **sparse;
      auto sparse_run = [&](int i) {
        if (i == 0) CHECK_OK(sp.Forward(in0[i], in1[i], nullptr, out[i], cuda));
        if (i == 1) CHECK_OK(sp.BackwardData(in0[i], in1[i], out[i], cuda));
        if (i == 2) CHECK_OK(sp.BackwardFilter(in0[i], in1[i], out[i], nullptr, cuda));
      };
      for (int i = 0; all_configs && i < 3; ++i) {  // every configuration's time too
        if (!want[i]) continue;
        for (int config = 0; config < sp.configs(passes[i]); ++config) {
          if (!sp.tuned(passes[i], config)) continue;  // the plain filter kernel: timed below
          CHECK_OK(sp.set_config(passes[i], config));
          const double ms = time_ms(iters, [&] { sparse_run(i); });
          absl::PrintF(
              "{\"layer\":\"%s\",\"density\":%.3f,\"pass\":\"%s\",\"config\":\"%s\","
              "\"ms\":%.4f}\n",
              l.name, grid.density(), SparsePassName(passes[i]), sp.config_name(passes[i]), ms);
        }
      }
      // Where only the plain filter-gradient kernel takes the grid it is slow: a few runs
      // suffice to show it.
      const bool filter_fast = sp.configs(SparsePass::kBackwardFilter) > 1;
      for (int i = 0; i < 3; ++i) {
        if (!want[i]) continue;
        const bool fast = i < 2 || filter_fast;
        if (fast) CHECK_OK(sp.Tune(passes[i], in0[i], in1[i], out[i], cuda).status());
        const double sparse_ms = time_ms(fast ? iters : 2, [&] { sparse_run(i); });
        const double speedup = dense_ms[i] / sparse_ms;
        if (speedup > 1.0) crossover[i] = std::max(crossover[i], grid.density());
        absl::PrintF(
            "{\"gpu\":\"%s\",\"model\":\"%s\",\"layer\":\"%s\",\"batch\":%d,\"precision\":\"%s\","
            "\"density\":%.3f,\"pass\":\"%s\",\"cudnn_ms\":%.4f,\"sparse_ms\":%.4f,"
            "\"speedup\":%.2f,\"config\":\"%s\",\"block\":\"%dx%d\",\"captured\":%s}\n",
            gpu, l.model, l.name, s.n, PrecisionName(p), grid.density(), SparsePassName(passes[i]),
            dense_ms[i], sparse_ms, speedup, sp.config_name(passes[i]), block_in, block_out,
            captured ? "true" : "false");
      }
    }
    for (int i = 0; i < 3; ++i) {
      if (!want[i]) continue;
      absl::PrintF(
          "{\"model\":\"%s\",\"layer\":\"%s\",\"pass\":\"%s\",\"crossover_density\":%.3f}\n",
          l.model, l.name, SparsePassName(passes[i]), crossover[i]);
    }
    for (void* q : {x, dy, w, y, dx, dw, ws}) cudaFree(q);
  }
  return 0;
}

}  // namespace
}  // namespace topiary::kernels

int main(int argc, char** argv) { return topiary::kernels::Main(argc, argv); }
