#include "trainer/dist/gradient_sync.h"

#include <cstring>

#include "util/status_macros.h"

namespace topiary {
namespace {

absl::Status Upload(Device* device, const std::vector<kernels::CastItem>& items,
                    Buffer<kernels::CastItem>* out) {
  TOPIARY_ASSIGN_OR_RETURN(auto b, Buffer<kernels::CastItem>::Create(device, items.size()));
  *out = std::move(b);
  if (!items.empty()) out->CopyFromHost(items.data());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GradientSync>> GradientSync::Create(Model* model,
                                                                   Collective* collective, int rank,
                                                                   bool bf16) {
  std::unique_ptr<GradientSync> sync(new GradientSync(collective, rank));
  Device* device = model->device();
  const auto& nodes = model->nodes();
  // Buckets in backward order: a bucket closes at the first layer boundary past its size.
  std::vector<std::vector<Parameter*>> members;  // per bucket
  size_t open_bytes = 0;                         // of the bucket being filled; 0: none open
  for (int j = static_cast<int>(nodes.size()) - 1; j >= 0; --j) {
    for (Parameter* p : nodes[j].layer->parameters()) {
      if (!p->trainable) continue;
      if (open_bytes == 0) {
        members.emplace_back();
        sync->buckets_.emplace_back();
      }
      members.back().push_back(p);
      sync->buckets_.back().last_node = j;
      open_bytes += p->size() * sizeof(float);
    }
    const size_t cap = sync->buckets_.size() <= 1 ? kFirstBucketBytes : kBucketBytes;
    if (open_bytes >= cap) open_bytes = 0;
  }
  size_t largest = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    Bucket& b = sync->buckets_[i];
    for (Parameter* p : members[i]) b.floats += p->size();
    TOPIARY_ASSIGN_OR_RETURN(auto flat, Buffer<float>::Create(device, b.floats));
    b.flat = std::move(flat);
    size_t offset = 0;
    for (Parameter* p : members[i]) {
      float* slot = b.flat.data() + offset;
      const int64_t n = static_cast<int64_t>(p->size());
      if (bf16 && !p->grad_bf16.empty()) {
        b.gather_bf16.push_back({p->grad_bf16.data(), slot, n});
      } else {
        b.gather_f32.push_back({p->grad.data(), slot, n});
      }
      b.scatter.push_back({slot, p->grad.data(), n});
      offset += p->size();
    }
    largest = std::max(largest, b.floats);
    if (device->cuda() != nullptr) {
      TOPIARY_RETURN_IF_ERROR(Upload(device, b.gather_bf16, &b.gather_bf16_dev));
      TOPIARY_RETURN_IF_ERROR(Upload(device, b.gather_f32, &b.gather_f32_dev));
      TOPIARY_RETURN_IF_ERROR(Upload(device, b.scatter, &b.scatter_dev));
    }
  }
  TOPIARY_RETURN_IF_ERROR(collective->Reserve(rank, largest));
  return sync;
}

absl::Status GradientSync::LayerDone(int node) {
  for (Bucket& b : buckets_) {
    if (b.last_node == node) TOPIARY_RETURN_IF_ERROR(Reduce(b));
  }
  return absl::OkStatus();
}

absl::Status GradientSync::Reduce(Bucket& b) {
  const kernels::CudaContext* side = collective_->side(rank_);
  if (side == nullptr) {  // CPU ranks: host memory throughout
    for (const kernels::CastItem& it : b.gather_f32) {
      std::memcpy(it.dst, it.src, it.n * sizeof(float));
    }
    TOPIARY_RETURN_IF_ERROR(collective_->AllReduceMean(rank_, b.flat.data(), b.floats));
    for (const kernels::CastItem& it : b.scatter) std::memcpy(it.dst, it.src, it.n * sizeof(float));
    return absl::OkStatus();
  }
  using kernels::DType;
  TOPIARY_RETURN_IF_ERROR(collective_->Fork(rank_));
  TOPIARY_RETURN_IF_ERROR(kernels::CastManyCuda(DType::kBf16, DType::kF32, b.gather_bf16_dev.data(),
                                                static_cast<int>(b.gather_bf16.size()), *side));
  TOPIARY_RETURN_IF_ERROR(kernels::CastManyCuda(DType::kF32, DType::kF32, b.gather_f32_dev.data(),
                                                static_cast<int>(b.gather_f32.size()), *side));
  TOPIARY_RETURN_IF_ERROR(collective_->AllReduceMean(rank_, b.flat.data(), b.floats));
  return kernels::CastManyCuda(DType::kF32, DType::kF32, b.scatter_dev.data(),
                               static_cast<int>(b.scatter.size()), *side);
}

absl::Status GradientSync::Finish() { return collective_->Join(rank_); }

}  // namespace topiary
