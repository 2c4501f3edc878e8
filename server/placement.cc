#include "server/placement.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace topiary::server {

Placement::Placement(std::vector<int> gpus, int cpu_slots)
    : gpus_(std::move(gpus)), holder_(gpus_.size()), cpu_holder_(std::max(1, cpu_slots)) {}

Need Placement::NeedOf(const topiary::v1::ExperimentSpec& spec) const {
  Need need;
  const auto& d = spec.device();
  if (gpus_.empty() || d.kind() == topiary::v1::DeviceSpec::CPU) {
    need.cpu = true;
    return need;
  }
  need.ordinals.assign(d.gpus().begin(), d.gpus().end());
  need.count = need.ordinals.empty() ? std::max(1, d.gpu_count()) : d.gpus_size();
  return need;
}

absl::Status Placement::Feasible(const Need& need) const {
  if (need.cpu) return absl::OkStatus();
  const std::string have = absl::StrCat("this daemon schedules GPU", gpus_.size() == 1 ? " " : "s ",
                                        absl::StrJoin(gpus_, ", "));
  for (int o : need.ordinals) {
    if (std::find(gpus_.begin(), gpus_.end(), o) == gpus_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device.gpus: GPU ", o, " is not available; ", have));
    }
  }
  if (need.count > static_cast<int>(gpus_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("device.gpu_count: ", need.count, " GPUs asked for; ", have));
  }
  return absl::OkStatus();
}

std::optional<std::vector<int>> Placement::TryTake(const std::string& id, const Need& need) {
  if (need.cpu) {
    for (std::string& h : cpu_holder_) {
      if (h.empty()) {
        h = id;
        return std::vector<int>{};
      }
    }
    return std::nullopt;
  }
  std::vector<size_t> picked;
  if (!need.ordinals.empty()) {
    for (int o : need.ordinals) {
      const size_t i = std::find(gpus_.begin(), gpus_.end(), o) - gpus_.begin();
      if (i == gpus_.size() || !holder_[i].empty()) return std::nullopt;
      picked.push_back(i);
    }
  } else {
    for (size_t i = 0; i < gpus_.size() && static_cast<int>(picked.size()) < need.count; ++i) {
      if (holder_[i].empty()) picked.push_back(i);
    }
    if (static_cast<int>(picked.size()) < need.count) return std::nullopt;
  }
  std::vector<int> granted;
  for (size_t i : picked) {
    holder_[i] = id;
    granted.push_back(gpus_[i]);
  }
  return granted;
}

void Placement::Release(const std::string& id) {
  for (auto* holders : {&holder_, &cpu_holder_}) {
    for (std::string& h : *holders) {
      if (h == id) h.clear();
    }
  }
}

int Placement::running() const {
  std::set<std::string> ids;
  for (const auto* holders : {&holder_, &cpu_holder_}) {
    for (const std::string& h : *holders) {
      if (!h.empty()) ids.insert(h);
    }
  }
  return static_cast<int>(ids.size());
}

}  // namespace topiary::server
