#include "trainer/dist/replicate.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "trainer/nn/masks.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

// The two models' parameters, pairwise, after checking that they match.
absl::StatusOr<std::vector<std::pair<Parameter*, Parameter*>>> Pairs(const Model& a,
                                                                     const Model& b) {
  const std::vector<Parameter*> pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) {
    return absl::InternalError("ranks hold models with different parameter counts");
  }
  std::vector<std::pair<Parameter*, Parameter*>> out;
  for (size_t i = 0; i < pa.size(); ++i) {
    if (pa[i]->full_name() != pb[i]->full_name() || pa[i]->size() != pb[i]->size()) {
      return absl::InternalError(
          absl::StrCat("ranks disagree on parameter ", i, ": ", pa[i]->full_name()));
    }
    out.emplace_back(pa[i], pb[i]);
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool SameMaskInfo(const MaskInfo& a, const MaskInfo& b) {
  return a.kind == b.kind && a.blocks == b.blocks && a.n == b.n && a.m == b.m;
}

}  // namespace

absl::Status CopyModelState(const Model& from, Model* to) {
  TOPIARY_ASSIGN_OR_RETURN(auto pairs, Pairs(from, *to));
  for (auto [src, dst] : pairs) {
    const std::vector<float> value = src->value.ToHost();
    dst->value.CopyFromHost(value.data());
    if (!src->momentum.empty() && !dst->momentum.empty()) {
      const std::vector<float> momentum = src->momentum.ToHost();
      dst->momentum.CopyFromHost(momentum.data());
    }
    if (src->mask.empty()) continue;
    const std::vector<uint8_t> mask = HostMask(*src);
    if (!dst->mask.empty() && HostMask(*dst) == mask &&
        SameMaskInfo(src->mask_info, dst->mask_info)) {
      continue;
    }
    TOPIARY_RETURN_IF_ERROR(InstallMask(dst, mask, src->mask_info, /*zero_masked=*/false));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FirstDifference(const Model& a, const Model& b) {
  TOPIARY_ASSIGN_OR_RETURN(auto pairs, Pairs(a, b));
  for (auto [pa, pb] : pairs) {
    if (!pa->trainable) continue;
    if (!SameBits(pa->value.ToHost(), pb->value.ToHost())) {
      return absl::StrCat(pa->full_name(), ": value");
    }
    if (!SameBits(pa->momentum.ToHost(), pb->momentum.ToHost())) {
      return absl::StrCat(pa->full_name(), ": momentum");
    }
    if (HostMask(*pa) != HostMask(*pb) || !SameMaskInfo(pa->mask_info, pb->mask_info)) {
      return absl::StrCat(pa->full_name(), ": mask");
    }
  }
  return std::string();
}

}  // namespace topiary
