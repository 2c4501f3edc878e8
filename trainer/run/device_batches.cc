#include "trainer/run/device_batches.h"

#include <numeric>

#include "kernels/augment.h"
#include "util/status_macros.h"

namespace topiary {

absl::StatusOr<DeviceBatches> DeviceBatches::Create(const Batcher* batcher, Device* device) {
  DeviceBatches b;
  b.batcher_ = batcher;
  b.device_ = device;
  if (device->cuda() == nullptr) return b;
  const ImageSet& set = batcher->set();
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
  order_host_ = std::move(order);
  if (device_->cuda() != nullptr) order_.CopyFromHost(order_host_.data());
  return absl::OkStatus();
}

absl::Status DeviceBatches::Assemble(const kernels::StepClock* clock, int epoch, int64_t first,
                                     int count, bool augment, float* x, int32_t* labels) const {
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
