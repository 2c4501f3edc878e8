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

// 64-bit FNV-1a over 8-byte words (then the tail bytes): the checksums only need to tell
// copies apart, and words keep a 100 MB model to a fraction of a second.
uint64_t Checksum(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  constexpr uint64_t kPrime = 1099511628211ull;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * kPrime;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * kPrime;
  return h;
}

}  // namespace

std::vector<uint64_t> StateChecksums(const Model& model) {
  std::vector<uint64_t> out;
  for (Parameter* p : model.parameters()) {
    if (!p->trainable) continue;
    const std::vector<float> value = p->value.ToHost(), momentum = p->momentum.ToHost();
    const std::vector<uint8_t> mask = HostMask(*p);
    const MaskInfo& m = p->mask_info;
    const int info[7] = {static_cast<int>(m.kind),
                         m.blocks.block_in,
                         m.blocks.block_out,
                         m.blocks.rows,
                         m.blocks.cols,
                         m.n,
                         m.m};
    out.push_back(Checksum(value.data(), value.size() * sizeof(float)));
    out.push_back(Checksum(momentum.data(), momentum.size() * sizeof(float)));
    const uint64_t h = Checksum(info, sizeof(info), Checksum(mask.data(), mask.size()));
    out.push_back(Checksum(m.blocks.kept.data(), m.blocks.kept.size(), h));
  }
  return out;
}

std::string FirstChecksumDifference(const Model& model, const std::vector<uint64_t>& a,
                                    const std::vector<uint64_t>& b) {
  static const char* kParts[3] = {"value", "momentum", "mask"};
  size_t i = 0;
  for (Parameter* p : model.parameters()) {
    if (!p->trainable) continue;
    for (int part = 0; part < 3; ++part, ++i) {
      if (i >= a.size() || i >= b.size()) return "the parameter count";
      if (a[i] != b[i]) return absl::StrCat(p->full_name(), ": ", kParts[part]);
    }
  }
  return a.size() == b.size() ? "" : "the parameter count";
}

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
