#include "trainer/data/stream_batches.h"

#include <cstdio>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "trainer/data/image_folder.h"
#include "util/status_macros.h"

namespace topiary {

using topiary::v1::ImageFolderSpec;

StreamBatches::StreamBatches(const Batcher* batcher, Device* device)
    : batcher_(batcher),
      device_(device),
      stream_(batcher, batcher->set().files->spec.decode_threads()),
      image_bytes_(static_cast<size_t>(batcher->set().batch_h()) * batcher->set().batch_w() *
                   batcher->set().c),
      prefetch_(std::max(1, batcher->set().files->spec.prefetch_batches())) {}

absl::StatusOr<std::unique_ptr<StreamBatches>> StreamBatches::Create(const Batcher* batcher,
                                                                     Device* device) {
  std::unique_ptr<StreamBatches> b(new StreamBatches(batcher, device));
  const ImageFolderSpec& spec = batcher->set().files->spec;
  const std::string cpu = absl::StrCat(b->stream_.threads(), " CPU threads");
  b->decoder_ = cpu;
  b->slots_.resize(b->prefetch_ + 1);
  if (device->cuda() != nullptr) {
    device->MakeCurrent();
    TOPIARY_ASSIGN_OR_RETURN(b->lane_,
                             kernels::ImageLane::Create(device->ordinal(), b->slots_.size()));
    if (spec.decoder() != ImageFolderSpec::CPU) {
      auto jpeg = kernels::GpuJpegDecoder::Create(batcher->set().c);
      if (jpeg.ok()) {
        b->jpeg_ = std::move(*jpeg);
        b->decoder_ =
            absl::StrCat("nvJPEG (", b->jpeg_->backend(), "), PNGs and other JPEGs on ", cpu);
      } else if (spec.decoder() == ImageFolderSpec::GPU) {
        return absl::FailedPreconditionError(
            absl::StrCat("data.image_folder.decoder: GPU: ", jpeg.status().message()));
      } else {
        b->decoder_ = absl::StrCat(cpu, " (", jpeg.status().message(), ")");
      }
    }
  }
  b->worker_ = std::thread([p = b.get()] { p->Work(); });
  return b;
}

StreamBatches::~StreamBatches() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

int StreamBatches::FindSlot(const Key& key) const {
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].state != Slot::kFree && slots_[s].key == key) return static_cast<int>(s);
  }
  return -1;
}

bool StreamBatches::Known(const Key& key) const {
  if (FindSlot(key) >= 0) return true;
  for (const Key& k : queue_) {
    if (k == key) return true;
  }
  return false;
}

void StreamBatches::SetOrder(std::vector<int32_t> order) {
  std::unique_lock<std::mutex> lock(mu_);
  queue_.clear();
  cv_.wait(lock, [&] {
    for (const Slot& s : slots_) {
      if (s.state == Slot::kWorking) return false;
    }
    return true;
  });
  for (Slot& s : slots_) s.state = Slot::kFree;
  order_ = std::move(order);
}

void StreamBatches::Work() {
  if (lane_ != nullptr) lane_->BindThread();
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    int s = -1;
    cv_.wait(lock, [&] {
      if (stop_) return true;
      if (queue_.empty()) return false;
      for (size_t i = 0; i < slots_.size() && s < 0; ++i) {
        if (slots_[i].state == Slot::kFree) s = static_cast<int>(i);
      }
      return s >= 0;
    });
    if (stop_) return;
    Slot& slot = slots_[s];
    slot.key = queue_.front();
    queue_.pop_front();
    slot.state = Slot::kWorking;
    const Key key = slot.key;
    lock.unlock();
    // The training stream may still be copying this slot's last batch out.
    absl::Status st = lane_ != nullptr ? lane_->WaitConsumed(s) : absl::OkStatus();
    if (st.ok()) st = Prepare(key, &slot);
    lock.lock();
    slot.status = st;
    slot.state = Slot::kReady;
    cv_.notify_all();
  }
}

absl::Status StreamBatches::Stage(int epoch, int64_t first, int count, bool augment,
                                  int64_t stride) {
  const Key key{epoch, first, count, augment};
  std::unique_lock<std::mutex> lock(mu_);
  if (first < 0 || count < 1 || first + count > static_cast<int64_t>(order_.size())) {
    return absl::OutOfRangeError(absl::StrCat("image stream: batch [", first, ", ", first + count,
                                              ") outside the order of ", order_.size()));
  }
  if (!Known(key)) {  // not what was predicted: drop the predictions
    queue_.clear();
    for (Slot& s : slots_) {
      if (s.state == Slot::kReady) s.state = Slot::kFree;
    }
    queue_.push_front(key);
    cv_.notify_all();
  } else if (FindSlot(key) < 0 && !(queue_.front() == key)) {
    queue_.erase(std::find(queue_.begin(), queue_.end(), key));
    queue_.push_front(key);
  }
  int s = -1;
  cv_.wait(lock, [&] {
    s = FindSlot(key);
    return s >= 0 && slots_[s].state == Slot::kReady;
  });
  Slot& slot = slots_[s];
  absl::Status st = slot.status;
  if (st.ok()) st = Hand(&slot, s);
  slot.state = Slot::kFree;
  for (int k = 1; k <= prefetch_ && stride > 0; ++k) {
    const Key next{epoch, first + k * stride, count, augment};
    if (next.first + count > static_cast<int64_t>(order_.size())) break;
    if (!Known(next)) queue_.push_back(next);
  }
  cv_.notify_all();
  return st;
}

absl::Status StreamBatches::Hand(Slot* slot, int index) {
  const int count = slot->key.count;
  const size_t bytes = BatchBytes(count);
  if (count > staged_count_) {  // grows once: training steps keep one count
    if (lane_ != nullptr) {
      TOPIARY_ASSIGN_OR_RETURN(staged_device_, Buffer<uint8_t>::Create(device_, bytes));
      staged_ = staged_device_.data();
    } else {
      staged_host_.resize(bytes);
      staged_ = staged_host_.data();
    }
  }
  staged_count_ = count;
  if (lane_ == nullptr) {
    std::memcpy(staged_, slot->host.data(), bytes);
    return absl::OkStatus();
  }
  // Laid out for this count: labels, then the images at LabelsBytes(count).
  return lane_->Consume(index, *device_->cuda(), slot->device.data(), staged_, bytes);
}

absl::Status StreamBatches::Prepare(const Key& key, Slot* slot) {
  std::vector<StreamedImage> images;
  std::function<bool(const StreamedImage&)> gpu_takes;  // asked on the reading threads
  if (jpeg_ != nullptr) {
    gpu_takes = [this](const StreamedImage& img) {
      int w = 0, h = 0;
      return jpeg_->Supports(reinterpret_cast<const uint8_t*>(img.bytes.data()), img.bytes.size(),
                             &w, &h) &&
             w == img.width && h == img.height;
    };
  }
  TOPIARY_RETURN_IF_ERROR(
      stream_.Read(order_, key.epoch, key.first, key.count, key.augment, &images, gpu_takes));
  const size_t bytes = BatchBytes(key.count);
  if (slot->host.size() < bytes) slot->host.resize(bytes);
  auto* labels = reinterpret_cast<int32_t*>(slot->host.data());
  for (const StreamedImage& img : images) labels[img.out_index] = img.label;
  if (lane_ != nullptr) return PrepareOnGpu(images, slot);
  std::vector<StreamedImage*> todo;
  for (StreamedImage& img : images) {
    if (!img.bad) todo.push_back(&img);
  }
  uint8_t* pixels = slot->host.data() + LabelsBytes(key.count);
  TOPIARY_RETURN_IF_ERROR(stream_.Decode(todo, pixels));
  for (const StreamedImage& img : images) {  // SKIP: a black image
    if (img.bad) std::memset(pixels + img.out_index * image_bytes_, 0, image_bytes_);
  }
  return absl::OkStatus();
}

absl::Status StreamBatches::PrepareOnGpu(std::vector<StreamedImage>& images, Slot* slot) {
  const int count = static_cast<int>(images.size());
  const int c = stream_.channels();
  const size_t bytes = BatchBytes(count);
  if (slot->device.size() < bytes) {
    TOPIARY_ASSIGN_OR_RETURN(slot->device, Buffer<uint8_t>::Create(device_, bytes));
  }
  uint8_t* host_pixels = slot->host.data() + LabelsBytes(count);
  uint8_t* device_pixels = slot->device.data() + LabelsBytes(count);
  std::vector<StreamedImage*> on_gpu, on_cpu;
  size_t arena = 0;
  for (StreamedImage& img : images) {
    if (img.bad) continue;
    if (img.gpu) {
      on_gpu.push_back(&img);
      arena += static_cast<size_t>(img.width) * img.height * c;
    } else {
      on_cpu.push_back(&img);
    }
  }
  std::vector<kernels::ResizeJob> jobs;
  if (!on_gpu.empty()) {
    if (arena_.size() < arena) {
      arena_ = Buffer<uint8_t>();  // free first: the arena is the largest buffer here
      TOPIARY_ASSIGN_OR_RETURN(arena_, Buffer<uint8_t>::Create(device_, arena + arena / 4));
    }
    if (jobs_.size() < on_gpu.size()) {
      TOPIARY_ASSIGN_OR_RETURN(jobs_, Buffer<kernels::ResizeJob>::Create(device_, count));
    }
    std::vector<const uint8_t*> data;
    std::vector<size_t> sizes;
    std::vector<int> widths;
    std::vector<uint8_t*> out;
    size_t offset = 0;
    for (StreamedImage* img : on_gpu) {
      data.push_back(reinterpret_cast<const uint8_t*>(img->bytes.data()));
      sizes.push_back(img->bytes.size());
      widths.push_back(img->width);
      out.push_back(arena_.data() + offset);
      kernels::ResizeJob job;
      job.pixels = out.back();
      job.width = img->width;
      job.height = img->height;
      job.stride = img->width * c;
      job.box = img->box;
      job.out_index = img->out_index;
      jobs.push_back(job);
      offset += static_cast<size_t>(img->width) * img->height * c;
    }
    absl::Status st = jpeg_->Decode(data, sizes, widths, out, lane_->context());
    if (st.ok()) {
      st = lane_->Upload(jobs_.data(), jobs.data(), jobs.size() * sizeof(kernels::ResizeJob));
    }
    if (st.ok()) {
      st = kernels::CropResizeCuda(jobs_.data(), static_cast<int>(jobs.size()), c, stream_.out_h(),
                                   stream_.out_w(), device_pixels, lane_->context());
    }
    if (!st.ok()) {  // e.g. a corrupt body: the CPU decoders then name the file
      TOPIARY_RETURN_IF_ERROR(lane_->Finish());
      for (StreamedImage* img : on_gpu) img->gpu = false;
      on_cpu.insert(on_cpu.end(), on_gpu.begin(), on_gpu.end());
    }
  }
  TOPIARY_RETURN_IF_ERROR(stream_.Decode(on_cpu, host_pixels));
  TOPIARY_RETURN_IF_ERROR(lane_->Upload(slot->device.data(), slot->host.data(), count * 4));
  for (StreamedImage& img : images) {
    if (img.gpu && !img.bad) continue;  // written on the GPU
    uint8_t* row = host_pixels + img.out_index * image_bytes_;
    if (img.bad) std::memset(row, 0, image_bytes_);
    TOPIARY_RETURN_IF_ERROR(
        lane_->Upload(device_pixels + img.out_index * image_bytes_, row, image_bytes_));
  }
  return lane_->Finish();
}

}  // namespace topiary
