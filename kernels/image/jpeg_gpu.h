// JPEG decoding on the GPU through nvJPEG, for image folders read every epoch (pipeline
// STREAM). libnvjpeg is loaded at run time (dlopen), so binaries run without it and fall back
// to the CPU decoders: TOPIARY_NVJPEG_LIBRARY names the library file, else libnvjpeg.so.13 is
// looked up on the library path (pip's nvidia-nvjpeg puts it in site-packages/nvidia/cu13/lib).
// GPUs with hardware JPEG engines (A100, H100) decode batches there; others on CUDA cores.
#ifndef TOPIARY_KERNELS_IMAGE_JPEG_GPU_H_
#define TOPIARY_KERNELS_IMAGE_JPEG_GPU_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace topiary::kernels {

struct CudaContext;

class GpuJpegDecoder {
 public:
  // A decoder of `channels` (1: luma, 3: RGB) images on the calling thread's current device;
  // FAILED_PRECONDITION saying why when nvJPEG cannot be used.
  static absl::StatusOr<std::unique_ptr<GpuJpegDecoder>> Create(int channels);
  ~GpuJpegDecoder();
  GpuJpegDecoder(const GpuJpegDecoder&) = delete;
  GpuJpegDecoder& operator=(const GpuJpegDecoder&) = delete;

  // "hardware" (the JPEG engines) or "cuda".
  const std::string& backend() const;

  // Whether batches decode `data` (a JPEG the backend supports: baseline where the engines
  // decode, 1 or 3 components), and its size. Reads headers only; callable from several
  // threads at once.
  bool Supports(const uint8_t* data, size_t size, int* width, int* height);

  // Decodes data[i] (host memory, valid until ctx.stream has passed this work) into out[i]
  // (device memory, rows of width * channels bytes), on ctx.stream. REQUIRES: Supports() held.
  absl::Status Decode(const std::vector<const uint8_t*>& data, const std::vector<size_t>& sizes,
                      const std::vector<int>& widths, const std::vector<uint8_t*>& out,
                      const CudaContext& ctx);

 private:
  struct Impl;
  explicit GpuJpegDecoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_IMAGE_JPEG_GPU_H_
