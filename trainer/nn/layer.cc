#include "trainer/nn/layer.h"

#include "util/status_macros.h"

namespace topiary {

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kConv2d:
      return "conv2d";
    case LayerKind::kBatchNorm:
      return "batch_norm";
    case LayerKind::kLinear:
      return "linear";
    case LayerKind::kMaxPool:
      return "max_pool";
    case LayerKind::kAvgPool:
      return "avg_pool";
    case LayerKind::kGlobalAvgPool:
      return "global_avg_pool";
    case LayerKind::kGroupedConv2d:
      return "grouped_conv2d";
    case LayerKind::kRelu6:
      return "relu6";
    case LayerKind::kConcat:
      return "concat";
    case LayerKind::kRelu:
      return "relu";
    case LayerKind::kAdd:
      return "add";
    case LayerKind::kFlatten:
      return "flatten";
  }
  return "";
}

std::optional<LayerKind> LayerKindFromName(absl::string_view name) {
  for (int k = 0; k <= static_cast<int>(LayerKind::kConcat); ++k) {
    if (name == LayerKindName(static_cast<LayerKind>(k))) return static_cast<LayerKind>(k);
  }
  return std::nullopt;
}

absl::StatusOr<Parameter*> Layer::AddParameter(Device* device, ParamRole role,
                                               std::vector<int> shape, bool trainable, bool decay) {
  auto p = std::make_unique<Parameter>();
  p->layer = name_;
  p->role = role;
  p->trainable = trainable;
  p->decay = decay;
  TOPIARY_ASSIGN_OR_RETURN(auto value, Tensor::Create(device, shape));
  p->value = std::move(value);
  if (trainable) {
    TOPIARY_ASSIGN_OR_RETURN(auto grad, Tensor::Create(device, shape));
    TOPIARY_ASSIGN_OR_RETURN(auto mom, Tensor::Create(device, shape));
    p->grad = std::move(grad);
    p->momentum = std::move(mom);
  }
  params_.push_back(std::move(p));
  return params_.back().get();
}

const void* WeightFor(const Parameter& p, kernels::DType t) {
  return t == kernels::DType::kBf16 ? static_cast<const void*>(p.value_bf16.data())
                                    : static_cast<const void*>(p.value.data());
}

void* WeightGradFor(const Parameter& p, kernels::DType t) {
  return t == kernels::DType::kBf16 ? static_cast<void*>(p.grad_bf16.data())
                                    : static_cast<void*>(p.grad.data());
}

absl::Status AddBf16Copies(Parameter* p, Device* device) {
  if (!p->value_bf16.empty()) return absl::OkStatus();
  TOPIARY_ASSIGN_OR_RETURN(auto value, Buffer<kernels::Bf16>::Create(device, p->size()));
  TOPIARY_ASSIGN_OR_RETURN(auto grad, Buffer<kernels::Bf16>::Create(device, p->size()));
  p->value_bf16 = std::move(value);
  p->grad_bf16 = std::move(grad);
  return absl::OkStatus();
}

}  // namespace topiary
