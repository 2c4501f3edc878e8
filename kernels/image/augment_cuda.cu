#include "kernels/image/augment.h"
#include "kernels/image/augment_impl.h"
#include "kernels/runtime/cuda_context.h"

namespace topiary::kernels {
namespace {

// One block per image; threads walk its pixels.
__global__ void AssembleKernel(AssembleParams p, const StepClock* clock,
                               const uint8_t* __restrict__ pixels,
                               const int32_t* __restrict__ labels,
                               const int32_t* __restrict__ order, const float* __restrict__ lut,
                               float* __restrict__ x, int32_t* __restrict__ batch_labels) {
  const int i = blockIdx.x;
  if (clock != nullptr) {
    p.first += clock->batch_first;  // first: this rank's offset in the global batch
    p.epoch = clock->epoch;
  }
  const int64_t first = p.first;
  const int64_t j = first + i;
  const int32_t idx = order[j];
  if (threadIdx.x == 0) batch_labels[i] = labels[idx];
  const Placement pl = DrawPlacement(p, j);
  const int64_t image = static_cast<int64_t>(p.h) * p.w * p.c;
  const int oh = p.oh(), ow = p.ow();
  const uint8_t* src = pixels + idx * image;
  float* dst = x + i * static_cast<int64_t>(oh) * ow * p.c;
  for (int pix = threadIdx.x; pix < oh * ow; pix += blockDim.x) {
    const int s = SourcePixel(p, pl, pix / ow, pix % ow);
    for (int ch = 0; ch < p.c; ++ch) {
      dst[static_cast<int64_t>(pix) * p.c + ch] = lut[ch * 256 + (s < 0 ? 0 : src[s + ch])];
    }
  }
}

}  // namespace

absl::Status AssembleBatchCuda(const AssembleParams& p, const StepClock* clock,
                               const uint8_t* pixels, const int32_t* labels, const int32_t* order,
                               const float* lut, float* x, int32_t* batch_labels,
                               const CudaContext& ctx) {
  AssembleKernel<<<p.count, 256, 0, ctx.stream>>>(p, clock, pixels, labels, order, lut, x,
                                                  batch_labels);
  return LaunchStatus("assemble batch");
}

}  // namespace topiary::kernels
