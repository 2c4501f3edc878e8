// A side stream for image batches prepared ahead of training (IMAGE_FOLDER pipeline STREAM):
// uploads, nvJPEG decoding and resizing run there while the training stream computes. The
// preparing thread finishes each batch on the lane (Finish) before handing it over; the
// training stream copies a finished slot into its batch buffer (Consume), and the preparing
// thread waits for that copy before it reuses the slot (WaitConsumed).
#ifndef TOPIARY_KERNELS_IMAGE_IMAGE_LANE_H_
#define TOPIARY_KERNELS_IMAGE_IMAGE_LANE_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"

namespace topiary::kernels {

struct CudaContext;

class ImageLane {
 public:
  // A lane on GPU `ordinal` with `slots` handover slots.
  static absl::StatusOr<std::unique_ptr<ImageLane>> Create(int ordinal, int slots);
  ~ImageLane();
  ImageLane(const ImageLane&) = delete;
  ImageLane& operator=(const ImageLane&) = delete;

  // Makes the lane's GPU the calling thread's current device (the preparing thread's first
  // call).
  void BindThread() const;
  // The lane's stream, for kernels enqueued there (no library handles).
  const CudaContext& context() const;
  // Copies host memory to the device on the lane.
  absl::Status Upload(void* device, const void* host, size_t bytes);
  // Waits for everything enqueued on the lane.
  absl::Status Finish();
  // On the training stream `compute`: copies `bytes` of slot memory `src` to `dst` and marks
  // the slot consumed once the copy has run.
  absl::Status Consume(int slot, const CudaContext& compute, const void* src, void* dst,
                       size_t bytes);
  // Waits until the last Consume of `slot` has run (at once when it never was).
  absl::Status WaitConsumed(int slot);

 private:
  struct Impl;
  explicit ImageLane(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_IMAGE_IMAGE_LANE_H_
