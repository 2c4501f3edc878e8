#include "trainer/core/parameter.h"

namespace topiary {

const char* MaskKindName(MaskInfo::Kind kind) {
  switch (kind) {
    case MaskInfo::Kind::kBlock:
      return "block";
    case MaskInfo::Kind::kElement:
      return "element";
    case MaskInfo::Kind::kNofM:
      return "n_of_m";
    case MaskInfo::Kind::kNone:
      break;
  }
  return "";
}

std::optional<MaskInfo::Kind> MaskKindFromName(absl::string_view name) {
  for (MaskInfo::Kind k :
       {MaskInfo::Kind::kBlock, MaskInfo::Kind::kElement, MaskInfo::Kind::kNofM}) {
    if (name == MaskKindName(k)) return k;
  }
  return std::nullopt;
}

namespace {
constexpr ParamRole kRoles[] = {
    ParamRole::kKernel,      ParamRole::kBias,       ParamRole::kGamma,          ParamRole::kBeta,
    ParamRole::kRunningMean, ParamRole::kRunningVar, ParamRole::kActivationRange};
}  // namespace

const char* ParamRoleName(ParamRole role) {
  switch (role) {
    case ParamRole::kKernel:
      return "kernel";
    case ParamRole::kBias:
      return "bias";
    case ParamRole::kGamma:
      return "gamma";
    case ParamRole::kBeta:
      return "beta";
    case ParamRole::kRunningMean:
      return "running_mean";
    case ParamRole::kRunningVar:
      return "running_var";
    case ParamRole::kActivationRange:
      return "activation_range";
  }
  return "";
}

std::optional<ParamRole> ParamRoleFromName(absl::string_view name) {
  for (ParamRole r : kRoles) {
    if (name == ParamRoleName(r)) return r;
  }
  return std::nullopt;
}

}  // namespace topiary
