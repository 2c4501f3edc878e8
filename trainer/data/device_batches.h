// DeviceBatches: a Batcher's images where the network runs. On a GPU the dataset (uint8),
// labels and normalization table are uploaded once and batches are assembled (and augmented)
// there; on the CPU the host vectors are used in place. A streamed set (IMAGE_FOLDER pipeline
// STREAM) has no images in memory: its batches are read and decoded ahead of training
// (StreamBatches) and staged, and assembly normalizes the staged batch.
#ifndef TOPIARY_TRAINER_DATA_DEVICE_BATCHES_H_
#define TOPIARY_TRAINER_DATA_DEVICE_BATCHES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/runtime/step_clock.h"
#include "trainer/core/device.h"
#include "trainer/data/batcher.h"
#include "trainer/data/stream_batches.h"

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
  // offset in the global batch. A streamed set then assembles the batch Stage() staged.
  absl::Status Assemble(const kernels::StepClock* clock, int epoch, int64_t first, int count,
                        bool augment, float* x, int32_t* labels);

  // Before a (captured) training step that assembles with a clock: a streamed set stages the
  // step's batch (position `first` of the order, `count` images) and prepares the ones
  // `stride` further on. Nothing to do for sets in memory.
  absl::Status Stage(int epoch, int64_t first, int count, bool augment, int64_t stride);

  // How a streamed set is decoded (StreamBatches::decoder); empty for sets in memory.
  std::string decoder() const { return stream_ ? stream_->decoder() : ""; }

 private:
  // Normalizes the batch Stage() staged (REQUIRES: staged for at least `count` images).
  absl::Status AssembleStaged(int count, float* x, int32_t* labels);

  const Batcher* batcher_ = nullptr;
  Device* device_ = nullptr;
  std::vector<int32_t> order_host_;
  Buffer<uint8_t> pixels_;
  Buffer<int32_t> labels_;
  Buffer<int32_t> order_;
  Buffer<float> lut_;
  std::shared_ptr<StreamBatches> stream_;  // streamed sets
  Buffer<int32_t> identity_;               // the staged batch's order: 0, 1, ...
  std::vector<int32_t> identity_host_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DATA_DEVICE_BATCHES_H_
