// StreamBatches: batches of a streamed image set (IMAGE_FOLDER pipeline STREAM) prepared a few
// batches ahead of training on a thread of their own. Each batch's files are read and their
// boxes drawn (trainer/data/image_stream.h); on a GPU, JPEGs that nvJPEG takes are decoded
// there and scaled by the CUDA resize kernel on a side stream (kernels/image/image_lane.h), the
// rest decoded and scaled on CPU threads and uploaded. The training stream then copies the batch
// into buffers at fixed addresses, which a captured CUDA graph's batch assembly reads.
#ifndef TOPIARY_TRAINER_DATA_STREAM_BATCHES_H_
#define TOPIARY_TRAINER_DATA_STREAM_BATCHES_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/image/image_lane.h"
#include "kernels/image/jpeg_gpu.h"
#include "trainer/core/device.h"
#include "trainer/data/image_stream.h"

namespace topiary {

class StreamBatches {
 public:
  // Batches of batcher's (streamed) set on `device`, decoded as the set's spec says.
  static absl::StatusOr<std::unique_ptr<StreamBatches>> Create(const Batcher* batcher,
                                                               Device* device);
  ~StreamBatches();

  // "nvJPEG (hardware) + 16 CPU threads", "16 CPU threads", with why nvJPEG is not used.
  const std::string& decoder() const { return decoder_; }
  int64_t skipped() const { return stream_.skipped(); }

  // The order later batches draw from; drops batches prepared from the previous one.
  void SetOrder(std::vector<int32_t> order);

  // Makes batch (epoch, first, count, augment) of the order current: labels() and pixels()
  // hold it for work enqueued after this call. Then prepares the batches `stride`, 2 stride,
  // ... further on (prefetch_batches of them, within the order).
  absl::Status Stage(int epoch, int64_t first, int count, bool augment, int64_t stride);
  // Training steps keep one count, so these stay where a captured graph reads them.
  const int32_t* labels() const { return reinterpret_cast<const int32_t*>(staged_); }
  const uint8_t* pixels() const { return staged_ + LabelsBytes(staged_count_); }

 private:
  struct Key {
    int epoch = -1;
    int64_t first = -1;
    int count = 0;
    bool augment = false;
    bool operator==(const Key& o) const {
      return epoch == o.epoch && first == o.first && count == o.count && augment == o.augment;
    }
  };
  struct Slot {
    Key key;
    enum State { kFree, kWorking, kReady } state = kFree;
    absl::Status status;
    std::vector<uint8_t> host;  // labels, then pixels
    Buffer<uint8_t> device;     // the same layout, on a GPU
  };

  StreamBatches(const Batcher* batcher, Device* device);
  // A batch of `count`: labels (padded to 256 bytes), then the images.
  static size_t LabelsBytes(int count) {
    return (static_cast<size_t>(count) * 4 + 255) / 256 * 256;
  }
  size_t BatchBytes(int count) const { return LabelsBytes(count) + count * image_bytes_; }
  void Work();                                       // the preparing thread
  absl::Status Prepare(const Key& key, Slot* slot);  // one batch into a slot
  absl::Status PrepareOnGpu(std::vector<StreamedImage>& images, Slot* slot);
  absl::Status Hand(Slot* slot, int index);  // the slot's batch into the staged buffers
  int FindSlot(const Key& key) const;
  bool Known(const Key& key) const;  // queued or in a slot

  const Batcher* batcher_;
  Device* device_;
  ImageStream stream_;
  size_t image_bytes_;
  int prefetch_;
  std::string decoder_;
  std::unique_ptr<kernels::ImageLane> lane_;       // GPU only
  std::unique_ptr<kernels::GpuJpegDecoder> jpeg_;  // when nvJPEG is used
  Buffer<uint8_t> arena_;                          // nvJPEG's full-size images
  Buffer<kernels::ResizeJob> jobs_;
  Buffer<uint8_t> staged_device_;
  std::vector<uint8_t> staged_host_;
  uint8_t* staged_ = nullptr;
  int staged_count_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> order_;
  std::deque<Key> queue_;
  std::vector<Slot> slots_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DATA_STREAM_BATCHES_H_
