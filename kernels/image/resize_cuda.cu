#include "kernels/image/resize.h"
#include "kernels/image/resize_impl.h"
#include "kernels/runtime/cuda_context.h"

namespace topiary::kernels {
namespace {

// Grid: (pixel blocks, jobs); each thread one output pixel, all channels.
__global__ void CropResizeKernel(const ResizeJob* __restrict__ jobs, int c, int out_h, int out_w,
                                 uint8_t* __restrict__ out) {
  const ResizeJob job = jobs[blockIdx.y];
  const int pix = blockIdx.x * blockDim.x + threadIdx.x;
  if (pix >= out_h * out_w) return;
  uint8_t* dst = out + (static_cast<int64_t>(job.out_index) * out_h * out_w + pix) * c;
  ResizePixel(job, c, out_h, out_w, pix / out_w, pix % out_w, dst);
}

}  // namespace

absl::Status CropResizeCuda(const ResizeJob* jobs, int count, int c, int out_h, int out_w,
                            uint8_t* out, const CudaContext& ctx) {
  if (count == 0) return absl::OkStatus();
  constexpr int kThreads = 128;
  const dim3 grid((out_h * out_w + kThreads - 1) / kThreads, count);
  CropResizeKernel<<<grid, kThreads, 0, ctx.stream>>>(jobs, c, out_h, out_w, out);
  return LaunchStatus("crop and resize images");
}

}  // namespace topiary::kernels
