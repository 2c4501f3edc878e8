// The direct small-channel convolutions (kernels/conv/direct_conv.h; fp32, and TF32 forward
// and backward data) beside cuDNN's fastest fp32 and TF32 plans, pass by pass, on resnet20's
// convolutions (issue 43). Each line also gives the direct passes' largest difference from
// cuDNN's fp32 result, relative to its largest magnitude. -1: the direct kernels do not take
// that pass.
//
//   small_conv_bench [--batch20 128] [--iters 50]
#include <cmath>
#include <vector>

#include "gpu_bench_util.h"
#include "kernels/conv/direct_conv.h"

namespace topiary::kernels::bench {
namespace {

// max |a - b| / max |b| over n floats on the device.
double RelDiff(const float* a, const float* b, size_t n) {
  std::vector<float> ha(n), hb(n);
  cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost);
  double diff = 0, mag = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(ha[i]) - hb[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(hb[i])));
  }
  return mag > 0 ? diff / mag : diff;
}

void Layer(const ConvLayer& l, int batch, int iters, const CudaContext& cuda) {
  const ConvShape s = l.Shape(batch);
  const size_t nx = static_cast<size_t>(s.n) * s.h * s.w * s.c,
               ny = static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k,
               nw = static_cast<size_t>(s.k) * s.r * s.s * s.c;
  auto* x = static_cast<float*>(RandomDevice(DType::kF32, nx, 1));
  auto* w = static_cast<float*>(RandomDevice(DType::kF32, nw, 2));
  auto* dy = static_cast<float*>(RandomDevice(DType::kF32, ny, 3));
  auto* y = static_cast<float*>(DeviceAlloc(ny * 4));
  auto* dx = static_cast<float*>(DeviceAlloc(nx * 4));
  auto* dw = static_cast<float*>(DeviceAlloc(nw * 4));
  auto* y2 = static_cast<float*>(DeviceAlloc(ny * 4));
  auto* dx2 = static_cast<float*>(DeviceAlloc(nx * 4));
  auto* dw2 = static_cast<float*>(DeviceAlloc(nw * 4));

  double cudnn_ms[2][3];
  for (int p = 0; p < 2; ++p) {
    auto plan = ConvCudaPlan::Create(s, p == 0 ? Precision::kFp32 : Precision::kTf32,
                                     size_t{1} << 30, false, cuda);
    CHECK_OK(plan.status());
    void* ws = DeviceAlloc((*plan)->workspace_bytes());
    cudnn_ms[p][0] =
        TimeMs(cuda, iters, [&] { CHECK_OK((*plan)->Forward(x, w, nullptr, y, ws, cuda)); });
    cudnn_ms[p][1] =
        TimeMs(cuda, iters, [&] { CHECK_OK((*plan)->BackwardData(dy, w, dx, ws, cuda)); });
    cudnn_ms[p][2] = TimeMs(
        cuda, iters, [&] { CHECK_OK((*plan)->BackwardFilter(x, dy, dw, nullptr, ws, cuda)); });
    cudaFree(ws);
    if (p == 0) continue;
    // Leave the fp32 results in y, dx, dw for the comparison below.
    auto fp32 = ConvCudaPlan::Create(s, Precision::kFp32, size_t{1} << 30, false, cuda);
    CHECK_OK(fp32.status());
    void* ws32 = DeviceAlloc((*fp32)->workspace_bytes());
    CHECK_OK((*fp32)->Forward(x, w, nullptr, y, ws32, cuda));
    CHECK_OK((*fp32)->BackwardData(dy, w, dx, ws32, cuda));
    CHECK_OK((*fp32)->BackwardFilter(x, dy, dw, nullptr, ws32, cuda));
    cudaStreamSynchronize(cuda.stream);
    cudaFree(ws32);
  }

  double direct_ms[3] = {-1, -1, -1}, diff[3] = {-1, -1, -1}, tf32_ms[3] = {-1, -1, -1},
         tf32_diff[3] = {-1, -1, -1};
  size_t ws_bytes = 0;
  for (int p = 0; p < 3; ++p)
    ws_bytes = std::max(ws_bytes, DirectConvWorkspaceBytes(s, p, cuda.sm_count));
  void* ws = DeviceAlloc(ws_bytes);
  if (DirectConvSupported(s, 0)) {
    direct_ms[0] =
        TimeMs(cuda, iters, [&] { CHECK_OK(DirectConvForwardCuda(s, x, w, y2, false, cuda)); });
    diff[0] = RelDiff(y2, y, ny);
    tf32_ms[0] =
        TimeMs(cuda, iters, [&] { CHECK_OK(DirectConvForwardCuda(s, x, w, y2, true, cuda)); });
    tf32_diff[0] = RelDiff(y2, y, ny);
  }
  if (DirectConvSupported(s, 1)) {
    direct_ms[1] = TimeMs(
        cuda, iters, [&] { CHECK_OK(DirectConvBackwardDataCuda(s, dy, w, dx2, ws, false, cuda)); });
    diff[1] = RelDiff(dx2, dx, nx);
    tf32_ms[1] = TimeMs(
        cuda, iters, [&] { CHECK_OK(DirectConvBackwardDataCuda(s, dy, w, dx2, ws, true, cuda)); });
    tf32_diff[1] = RelDiff(dx2, dx, nx);
  }
  if (DirectConvSupported(s, 2)) {
    direct_ms[2] = TimeMs(cuda, iters, [&] {
      CHECK_OK(DirectConvBackwardFilterCuda(s, x, dy, dw2, ws, false, cuda));
    });
    diff[2] = RelDiff(dw2, dw, nw);
    tf32_ms[2] = TimeMs(cuda, iters, [&] {
      CHECK_OK(DirectConvBackwardFilterCuda(s, x, dy, dw2, ws, true, cuda));
    });
    tf32_diff[2] = RelDiff(dw2, dw, nw);
  }
  const double gflop = 2.0 * ny * s.r * s.s * s.c / 1e9;
  absl::PrintF(
      "{\"layer\":\"%s.%s\",\"batch\":%d,\"c\":%d,\"k\":%d,\"r\":%d,\"stride\":%d,\"hw\":%d,"
      "\"gflop\":%.3f,\"fp32_ms\":[%.4f,%.4f,%.4f],\"tf32_ms\":[%.4f,%.4f,%.4f],"
      "\"direct_ms\":[%.4f,%.4f,%.4f],\"direct_rel_diff\":[%.2e,%.2e,%.2e],"
      "\"direct_tf32_ms\":[%.4f,%.4f,%.4f],\"direct_tf32_rel_diff\":[%.2e,%.2e,%.2e]}\n",
      l.model, l.name, batch, s.c, s.k, s.r, s.stride_h, s.h, gflop, cudnn_ms[0][0], cudnn_ms[0][1],
      cudnn_ms[0][2], cudnn_ms[1][0], cudnn_ms[1][1], cudnn_ms[1][2], direct_ms[0], direct_ms[1],
      direct_ms[2], diff[0], diff[1], diff[2], tf32_ms[0], tf32_ms[1], tf32_ms[2], tf32_diff[0],
      tf32_diff[1], tf32_diff[2]);
  std::fflush(stdout);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(dy),
                  static_cast<void*>(y), static_cast<void*>(dx), static_cast<void*>(dw),
                  static_cast<void*>(y2), static_cast<void*>(dx2), static_cast<void*>(dw2), ws}) {
    cudaFree(p);
  }
}

}  // namespace
}  // namespace topiary::kernels::bench

int main(int argc, char** argv) {
  using namespace topiary::kernels::bench;  // NOLINT
  program = "small_conv_bench";
  SweepFlags flags(argc, argv);
  if (flags.iters == 20) flags.iters = 50;
  const topiary::kernels::CudaContext cuda = MakeContext();
  absl::PrintF("{\"gpu\":\"%s\"}\n", GpuName());
  const ConvLayer layers[] = {
      {"resnet20", "layer1.conv", 32, 16, 16, 3, 1},
      {"resnet20", "layer2.0.conv1", 32, 16, 32, 3, 2},
      {"resnet20", "layer2.0.shortcut", 32, 16, 32, 1, 2},
      {"resnet20", "layer2.conv", 16, 32, 32, 3, 1},
      {"resnet20", "layer3.0.conv1", 16, 32, 64, 3, 2},
      {"resnet20", "layer3.0.shortcut", 16, 32, 64, 1, 2},
      {"resnet20", "layer3.conv", 8, 64, 64, 3, 1},
  };
  for (const ConvLayer& l : layers) Layer(l, flags.batch20, flags.iters, cuda);
  return 0;
}
