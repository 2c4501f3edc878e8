#include "trainer/dist/rank_group.h"

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer/dist/replicate.h"
#include "util/status_macros.h"

namespace topiary {

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Create(
    std::vector<std::unique_ptr<Device>> devices, bool deterministic, const World& world,
    double timeout_s) {
  std::unique_ptr<RankGroup> group(new RankGroup());
  group->devices_ = std::move(devices);
  group->models_.resize(group->devices_.size());
  group->world_ = world;
  const std::vector<Device*> raw = group->devices();
  if (world.multi()) {
    if (raw.size() != 1) {
      return absl::InternalError("a process of a world of processes holds one rank");
    }
    if (raw[0]->cuda() != nullptr) {
      TOPIARY_ASSIGN_OR_RETURN(group->collective_,
                               MakeNcclWorldCollective(raw[0], world, deterministic, timeout_s));
    } else {
      TOPIARY_ASSIGN_OR_RETURN(group->collective_, MakeGlooCollective(world, timeout_s));
    }
  } else if (raw.size() > 1) {
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
  if (world_.multi()) {
    for (Parameter* p : model(0)->parameters()) {
      TOPIARY_RETURN_IF_ERROR(collective_->Broadcast(0, p->value.data(), p->size()));
      if (!p->momentum.empty()) {
        TOPIARY_RETURN_IF_ERROR(collective_->Broadcast(0, p->momentum.data(), p->size()));
      }
    }
  }
  for (int r = 1; r < size(); ++r) TOPIARY_RETURN_IF_ERROR(CopyModelState(*model(0), model(r)));
  return absl::OkStatus();
}

absl::Status RankGroup::CheckIdentical(const std::string& what) const {
  auto differs = [&](int rank, const std::string& device, const std::string& diff) {
    return absl::InternalError(
        absl::StrFormat("data parallelism: rank %d (%s) differs from rank 0 at %s; not writing %s",
                        rank, device, diff, what));
  };
  if (world_.multi()) {
    const std::vector<uint64_t> mine = StateChecksums(*model(0));
    std::vector<uint64_t> all(mine.size() * world_.size);
    TOPIARY_RETURN_IF_ERROR(
        collective_->ExchangeHost(0, mine.data(), mine.size() * sizeof(uint64_t), all.data()));
    const std::vector<uint64_t> first(all.begin(), all.begin() + mine.size());
    for (int r = 1; r < world_.size; ++r) {
      const std::vector<uint64_t> theirs(all.begin() + r * mine.size(),
                                         all.begin() + (r + 1) * mine.size());
      const std::string diff = FirstChecksumDifference(*model(0), first, theirs);
      if (!diff.empty()) return differs(r, "another process", diff);
    }
    return absl::OkStatus();
  }
  for (int r = 1; r < size(); ++r) {
    TOPIARY_ASSIGN_OR_RETURN(const std::string diff, FirstDifference(*model(0), *model(r)));
    if (!diff.empty()) return differs(r, device(r)->name(), diff);
  }
  return absl::OkStatus();
}

}  // namespace topiary
