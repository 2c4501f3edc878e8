#include "trainer/dist/rank_group.h"

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer/dist/replicate.h"
#include "util/status_macros.h"

namespace topiary {

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Create(
    std::vector<std::unique_ptr<Device>> devices, bool deterministic) {
  std::unique_ptr<RankGroup> group(new RankGroup());
  group->devices_ = std::move(devices);
  group->models_.resize(group->devices_.size());
  const std::vector<Device*> raw = group->devices();
  if (raw.size() > 1) {
    if (raw[0]->cuda() != nullptr) {
      TOPIARY_ASSIGN_OR_RETURN(group->collective_, MakeNcclCollective(raw, deterministic));
    } else {
      group->collective_ = MakeHostCollective(static_cast<int>(raw.size()));
    }
  }
  Collective* collective = group->collective_.get();
  group->threads_ = std::make_unique<RankThreads>(raw, [collective] {
    if (collective != nullptr) collective->Abort();
  });
  return group;
}

std::vector<Device*> RankGroup::devices() const {
  std::vector<Device*> out;
  for (const auto& d : devices_) out.push_back(d.get());
  return out;
}

std::string RankGroup::names() const {
  return absl::StrJoin(devices_, ", ", [](std::string* out, const std::unique_ptr<Device>& d) {
    out->append(d->name());
  });
}

absl::Status RankGroup::Replicate() {
  for (int r = 1; r < size(); ++r) TOPIARY_RETURN_IF_ERROR(CopyModelState(*model(0), model(r)));
  return absl::OkStatus();
}

absl::Status RankGroup::CheckIdentical(const std::string& what) const {
  for (int r = 1; r < size(); ++r) {
    TOPIARY_ASSIGN_OR_RETURN(const std::string diff, FirstDifference(*model(0), *model(r)));
    if (!diff.empty()) {
      return absl::InternalError(absl::StrFormat(
          "data parallelism: rank %d (%s) differs from rank 0 at %s; not writing %s", r,
          device(r)->name(), diff, what));
    }
  }
  return absl::OkStatus();
}

}  // namespace topiary
