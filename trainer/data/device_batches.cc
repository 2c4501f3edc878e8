#include "trainer/data/device_batches.h"

#include <numeric>

#include "kernels/image/augment.h"
#include "util/status_macros.h"

namespace topiary {

absl::StatusOr<DeviceBatches> DeviceBatches::Create(const Batcher* batcher, Device* device) {
  DeviceBatches b;
  b.batcher_ = batcher;
  b.device_ = device;
  const ImageSet& set = batcher->set();
  if (set.streamed()) {
    TOPIARY_ASSIGN_OR_RETURN(b.stream_, StreamBatches::Create(batcher, device));
    if (device->cuda() == nullptr) return b;
    TOPIARY_ASSIGN_OR_RETURN(b.lut_, Buffer<float>::Create(device, batcher->lut().size()));
    b.lut_.CopyFromHost(batcher->lut().data());
    return b;
  }
  if (device->cuda() == nullptr) return b;
  TOPIARY_ASSIGN_OR_RETURN(auto pixels, Buffer<uint8_t>::Create(device, set.pixels.size()));
  TOPIARY_ASSIGN_OR_RETURN(auto labels, Buffer<int32_t>::Create(device, set.labels.size()));
  TOPIARY_ASSIGN_OR_RETURN(auto order, Buffer<int32_t>::Create(device, set.labels.size()));
  TOPIARY_ASSIGN_OR_RETURN(auto lut, Buffer<float>::Create(device, batcher->lut().size()));
  b.pixels_ = std::move(pixels);
  b.labels_ = std::move(labels);
  b.order_ = std::move(order);
  b.lut_ = std::move(lut);
  b.pixels_.CopyFromHost(set.pixels.data());
  b.labels_.CopyFromHost(set.labels.data());
  b.lut_.CopyFromHost(batcher->lut().data());
  return b;
}

absl::Status DeviceBatches::SetSequentialOrder() {
  std::vector<int32_t> order(batcher_->set().size());
  std::iota(order.begin(), order.end(), 0);
  return SetOrder(std::move(order));
}

absl::Status DeviceBatches::SetOrder(std::vector<int32_t> order) {
  if (stream_) {
    stream_->SetOrder(std::move(order));
    return absl::OkStatus();
  }
  order_host_ = std::move(order);
  if (device_->cuda() != nullptr) order_.CopyFromHost(order_host_.data());
  return absl::OkStatus();
}

absl::Status DeviceBatches::Stage(int epoch, int64_t first, int count, bool augment,
                                  int64_t stride) {
  if (!stream_) return absl::OkStatus();
  // The staged batch's order, 0, 1, ...: grown here, outside the (captured) training step,
  // so that assembling allocates nothing.
  if (static_cast<int>(identity_host_.size()) < count) {
    identity_host_.resize(count);
    std::iota(identity_host_.begin(), identity_host_.end(), 0);
    if (device_->cuda() != nullptr) {
      TOPIARY_ASSIGN_OR_RETURN(identity_, Buffer<int32_t>::Create(device_, count));
      identity_.CopyFromHost(identity_host_.data());
    }
  }
  return stream_->Stage(epoch, first, count, augment, stride);
}

absl::Status DeviceBatches::AssembleStaged(int count, float* x, int32_t* labels) {
  // The staged images are the batch's already (cropped, scaled, flipped): normalize them.
  kernels::AssembleParams p = batcher_->Params(0, 0, count, false);
  p.h = p.out_h = batcher_->set().batch_h();
  p.w = p.out_w = batcher_->set().batch_w();
  if (const kernels::CudaContext* cuda = device_->cuda()) {
    return kernels::AssembleBatchCuda(p, nullptr, stream_->pixels(), stream_->labels(),
                                      identity_.data(), lut_.data(), x, labels, *cuda);
  }
  kernels::AssembleBatchCpu(p, stream_->pixels(), stream_->labels(), identity_host_.data(),
                            batcher_->lut().data(), x, labels);
  return absl::OkStatus();
}

absl::Status DeviceBatches::Assemble(const kernels::StepClock* clock, int epoch, int64_t first,
                                     int count, bool augment, float* x, int32_t* labels) {
  if (stream_) {
    // With a clock the step's batch was staged before the step (Stage).
    if (clock == nullptr) TOPIARY_RETURN_IF_ERROR(Stage(epoch, first, count, augment, count));
    return AssembleStaged(count, x, labels);
  }
  if (const kernels::CudaContext* cuda = device_->cuda()) {
    return kernels::AssembleBatchCuda(batcher_->Params(epoch, first, count, augment), clock,
                                      pixels_.data(), labels_.data(), order_.data(), lut_.data(), x,
                                      labels, *cuda);
  }
  if (clock != nullptr) {  // on the CPU the clock is host memory
    first += clock->batch_first;
    epoch = clock->epoch;
  }
  batcher_->Assemble(order_host_, epoch, first, count, augment, x, labels);
  return absl::OkStatus();
}

}  // namespace topiary
