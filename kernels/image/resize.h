// Crop-and-resize of decoded images into a batch of uint8 images, for image folders read every
// epoch (pipeline STREAM). Each output pixel is a triangle (bilinear) filter over the source
// box, widened to the scale when shrinking so that it averages every source pixel it covers
// (antialiased, like PIL's and torchvision's antialiased resize). Weights and sums are integers
// (Q12 weights, 64-bit sums), so the CPU and the GPU produce the same bytes.
#ifndef TOPIARY_KERNELS_IMAGE_RESIZE_H_
#define TOPIARY_KERNELS_IMAGE_RESIZE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace topiary::kernels {

struct CudaContext;

// The part of a source image an output image shows, in source pixels, and whether mirrored.
struct CropBox {
  int x0 = 0, y0 = 0, w = 0, h = 0;
  bool flip = false;
};

// One image to crop, scale and write: rows of width * c bytes, `stride` bytes apart.
struct ResizeJob {
  const uint8_t* pixels = nullptr;
  int width = 0, height = 0, stride = 0;
  CropBox box;        // REQUIRES: inside the image, w and h >= 1
  int out_index = 0;  // the batch image it fills
};

// Writes image job.out_index of `out` ([*, out_h, out_w, c]).
void CropResizeCpu(const ResizeJob& job, int c, int out_h, int out_w, uint8_t* out);

// CUDA twin for `count` jobs (the array and the pixels in device memory), on ctx.stream.
absl::Status CropResizeCuda(const ResizeJob* jobs, int count, int c, int out_h, int out_w,
                            uint8_t* out, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_IMAGE_RESIZE_H_
