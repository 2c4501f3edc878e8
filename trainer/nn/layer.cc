#include "trainer/nn/layer.h"

#include "trainer/util/enum_pairs.h"
#include "util/status_macros.h"

namespace topiary {

namespace {

constexpr std::pair<LayerKind, topiary::v1::NodeKind> kNodeKinds[] = {
    {LayerKind::kConv2d, topiary::v1::conv2d},
    {LayerKind::kBatchNorm, topiary::v1::batch_norm},
    {LayerKind::kLinear, topiary::v1::linear},
    {LayerKind::kMaxPool, topiary::v1::max_pool},
    {LayerKind::kAvgPool, topiary::v1::avg_pool},
    {LayerKind::kGlobalAvgPool, topiary::v1::global_avg_pool},
    {LayerKind::kRelu, topiary::v1::relu},
    {LayerKind::kAdd, topiary::v1::add},
    {LayerKind::kFlatten, topiary::v1::flatten},
    {LayerKind::kGroupedConv2d, topiary::v1::grouped_conv2d},
    {LayerKind::kRelu6, topiary::v1::relu6},
    {LayerKind::kConcat, topiary::v1::concat},
    {LayerKind::kSigmoid, topiary::v1::sigmoid},
    {LayerKind::kSilu, topiary::v1::silu},
    {LayerKind::kLeakyRelu, topiary::v1::leaky_relu},
    {LayerKind::kHardSigmoid, topiary::v1::hard_sigmoid},
    {LayerKind::kHardSwish, topiary::v1::hard_swish},
    {LayerKind::kMul, topiary::v1::mul},
};

}  // namespace

topiary::v1::NodeKind NodeKindOf(LayerKind kind) {
  return SecondOf(kNodeKinds, kind).value_or(topiary::v1::NODE_KIND_UNSPECIFIED);
}

std::optional<LayerKind> LayerKindOf(topiary::v1::NodeKind kind) {
  return FirstOf(kNodeKinds, kind);
}

const std::string& LayerKindName(LayerKind kind) {
  return topiary::v1::NodeKind_Name(NodeKindOf(kind));
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
