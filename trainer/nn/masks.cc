#include "trainer/nn/masks.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace topiary {

absl::Status InstallMask(Parameter* p, const std::vector<uint8_t>& mask, MaskInfo info,
                         bool zero_masked) {
  if (mask.size() != p->size()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: mask has %d entries, expected %d",
                                                      p->full_name(), mask.size(), p->size()));
  }
  if (p->mask.empty()) {
    TOPIARY_ASSIGN_OR_RETURN(auto buffer, Buffer<uint8_t>::Create(p->value.device(), mask.size()));
    p->mask = std::move(buffer);
  }
  p->mask.CopyFromHost(mask.data());
  // W <- W * mask and momentum <- momentum * mask, here once; the optimizer keeps it so.
  for (Tensor* t : {&p->value, &p->momentum}) {
    if (t->empty() || !zero_masked) continue;
    std::vector<float> v = t->ToHost();
    for (size_t i = 0; i < v.size(); ++i) {
      if (!mask[i]) v[i] = 0.0f;
    }
    t->CopyFromHost(v.data());
  }
  p->mask_info = std::move(info);
  ++p->mask_version;
  return absl::OkStatus();
}

std::vector<uint8_t> HostMask(const Parameter& p) {
  if (p.mask.empty()) return std::vector<uint8_t>(p.size(), 1);
  return p.mask.ToHost();
}

int64_t MaskedCount(const Parameter& p) {
  if (p.mask.empty()) return 0;
  const std::vector<uint8_t> m = p.mask.ToHost();
  return static_cast<int64_t>(std::count(m.begin(), m.end(), 0));
}

}  // namespace topiary
