// DeviceBatches: a Batcher's images where the network runs. On a GPU the dataset (uint8),
// labels and normalization table are uploaded once and batches are assembled (and augmented)
// there; on the CPU the host vectors are used in place.
#ifndef TOPIARY_TRAINER_RUN_DEVICE_BATCHES_H_
#define TOPIARY_TRAINER_RUN_DEVICE_BATCHES_H_

#include <cstdint>
#include <vector>

#include "kernels/step_clock.h"
#include "trainer/core/device.h"
#include "trainer/data/batcher.h"

namespace topiary {

class DeviceBatches {
 public:
  // REQUIRES: batcher outlives the result.
  static absl::StatusOr<DeviceBatches> Create(const Batcher* batcher, Device* device);

  // The order the next batches draw from (the whole set, permuted or not). On a GPU this
  // copies it to the device and waits: once per epoch.
  absl::Status SetOrder(std::vector<int32_t> order);
  // The whole set in its stored order (evaluation).
  absl::Status SetSequentialOrder();

  // Writes `count` images into x and labels (device memory), from position `first` of the
  // order in `epoch`. With a clock, the epoch is the clock's and `first` is added to the
  // clock's batch position (read where the clock lives): a data-parallel rank passes its
  // offset in the global batch.
  absl::Status Assemble(const kernels::StepClock* clock, int epoch, int64_t first, int count,
                        bool augment, float* x, int32_t* labels) const;

 private:
  const Batcher* batcher_ = nullptr;
  Device* device_ = nullptr;
  std::vector<int32_t> order_host_;
  Buffer<uint8_t> pixels_;
  Buffer<int32_t> labels_;
  Buffer<int32_t> order_;
  Buffer<float> lut_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_DEVICE_BATCHES_H_
