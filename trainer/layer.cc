#include "trainer/layer.h"

namespace topiary {

absl::StatusOr<Parameter*> Layer::AddParameter(Device* device, const std::string& role,
                                               std::vector<int> shape, bool trainable, bool decay) {
  auto p = std::make_unique<Parameter>();
  p->layer = name_;
  p->role = role;
  p->trainable = trainable;
  p->decay = decay;
  auto value = Tensor::Create(device, shape);
  if (!value.ok()) return value.status();
  p->value = std::move(*value);
  if (trainable) {
    auto grad = Tensor::Create(device, shape);
    if (!grad.ok()) return grad.status();
    auto mom = Tensor::Create(device, shape);
    if (!mom.ok()) return mom.status();
    p->grad = std::move(*grad);
    p->momentum = std::move(*mom);
  }
  params_.push_back(std::move(p));
  return params_.back().get();
}

}  // namespace topiary
