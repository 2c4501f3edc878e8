// Batch assembly: gathers uint8 NHWC images by index, applies the training augmentation
// (random crop after zero padding, or a random-resized crop; horizontal flip) and per-channel
// normalization, and writes float NHWC plus labels. Batches may be smaller than the stored
// images (out_h x out_w): evaluation then takes the centre crop. The random draws are stateless:
// image j of the epoch's order uses Philox(key, counter = {epoch, j, 0, 0}), so the CPU and the GPU
// build identical batches and any batch can be rebuilt without replaying the ones before it.
#ifndef TOPIARY_KERNELS_IMAGE_AUGMENT_H_
#define TOPIARY_KERNELS_IMAGE_AUGMENT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/runtime/host_device.h"
#include "kernels/runtime/step_clock.h"

namespace topiary::kernels {

struct CudaContext;

struct AssembleParams {
  int h = 0, w = 0, c = 0;   // stored image shape
  int out_h = 0, out_w = 0;  // the batch's images (<= h, w; 0: h, w)
  int count = 0;             // images in this batch (rows of x)
  int64_t first = 0;         // position in `order` of the batch's first image
  int epoch = 0;
  bool augment = false;
  int crop_padding = 0;
  bool horizontal_flip = false;
  // Training: a random box of 8% to 100% of the image's area with aspect ratio in [3/4, 4/3]
  // (log-uniform; one draw, the whole image when the box does not fit), scaled to out_h x
  // out_w by nearest-neighbour sampling in integer arithmetic, so CPU and GPU agree bit for
  // bit. Replaces crop_padding.
  bool random_resized_crop = false;
  uint32_t key0 = 0, key1 = 0;  // Philox key of the augmentation stream
  TOPIARY_HD int oh() const { return out_h > 0 ? out_h : h; }
  TOPIARY_HD int ow() const { return out_w > 0 ? out_w : w; }
};

// lut[ch * 256 + v]: the normalized value of raw byte v in channel ch (c * 256 floats).
void AssembleBatchCpu(const AssembleParams& p, const uint8_t* pixels, const int32_t* labels,
                      const int32_t* order, const float* lut, float* x, int32_t* batch_labels);

// CUDA twin. When clock is not null, the batch's position and epoch are read from it at run
// time (the position added to p.first, a data-parallel rank's offset; the epoch replacing
// p.epoch): a captured CUDA graph then assembles each step's batch without being rebuilt.
absl::Status AssembleBatchCuda(const AssembleParams& p, const StepClock* clock,
                               const uint8_t* pixels, const int32_t* labels, const int32_t* order,
                               const float* lut, float* x, int32_t* batch_labels,
                               const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_IMAGE_AUGMENT_H_
