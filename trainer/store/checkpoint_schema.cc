#include "trainer/store/checkpoint_schema.h"

#include <atomic>
#include <climits>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/runtime/parallel.h"
#include "trainer/core/parameter.h"
#include "trainer/util/crc32c.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

absl::Status Bad(const std::string& file, const std::string& where, const std::string& what) {
  return absl::DataLossError(absl::StrCat(file, ": ", where, ": ", what));
}

// A root or group attribute that must be an integer in [lo, hi].
absl::Status CheckInt(const std::string& file, const std::string& group, const H5Attrs& attrs,
                      const std::string& name, int64_t lo, int64_t hi) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return Bad(file, group + "@" + name, "missing");
  const auto* v = std::get_if<int64_t>(&it->second);
  if (v == nullptr) return Bad(file, group + "@" + name, "not an integer");
  if (*v < lo || *v > hi) {
    return Bad(file, group + "@" + name, absl::StrCat(*v, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckString(const std::string& file, const std::string& group, const H5Attrs& attrs,
                         const std::string& name) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return Bad(file, group + "@" + name, "missing");
  if (!std::holds_alternative<std::string>(it->second)) {
    return Bad(file, group + "@" + name, "not a string");
  }
  return absl::OkStatus();
}

constexpr int64_t kMaxInt32 = 2147483647;

absl::Status CheckRoot(const std::string& file, const H5Document& doc) {
  const H5Attrs& root = doc.groups.at(kRootGroup);
  for (const char* name : {kRoundAttr, kEpochAttr, kPhaseEpochAttr, kEpochStepAttr}) {
    if (auto st = CheckInt(file, kRootGroup, root, name, 0, kMaxInt32); !st.ok()) return st;
  }
  if (auto st = CheckInt(file, kRootGroup, root, kGlobalStepAttr, 0, int64_t{1} << 62); !st.ok())
    return st;
  for (const char* name : {kExperimentIdAttr, kModelArchAttr, kSpecAttr, kParentAttr,
                           kCreatedAtAttr, kMetricsAttr, kLayerOrderAttr}) {
    if (auto st = CheckString(file, kRootGroup, root, name); !st.ok()) return st;
  }
  // Optional: files written before checkpoints recorded their network have none.
  if (root.count(kNetworkAttr)) {
    if (auto st = CheckString(file, kRootGroup, root, kNetworkAttr); !st.ok()) return st;
  }
  auto rng = doc.groups.find(kRngGroup);
  if (rng == doc.groups.end()) {
    return Bad(file, kRngGroup, "missing (the generator state a resumed run continues from)");
  }
  if (auto st = CheckInt(file, kRngGroup, rng->second, kSeedAttr, INT64_MIN, INT64_MAX); !st.ok()) {
    return st;
  }
  return CheckInt(file, kRngGroup, rng->second, kNextEpochAttr, 0, kMaxInt32);
}

// Roles of the datasets under /layers/<layer>/ and the ranks they may have.
bool KnownRole(const std::string& role, size_t rank) {
  const std::optional<ParamRole> r = ParamRoleFromName(role);
  if (!r) return false;
  return *r == ParamRole::kKernel ? rank == 2 || rank == 4 : rank == 1;
}

absl::Status CheckMask(const std::string& file, const std::string& path, const H5Dataset& mask,
                       const H5Dataset& kernel) {
  if (mask.u8.empty()) return Bad(file, path, "a mask must be uint8");
  const std::optional<MaskInfo::Kind> kind =
      MaskKindFromName(AttrString(mask.attrs, kMaskKindAttr));
  if (kind == MaskInfo::Kind::kBlock) {
    if (mask.attrs.count(kMaskAxesAttr) &&
        AttrString(mask.attrs, kMaskAxesAttr) != std::string(kBlockMaskAxes)) {
      return Bad(file, path + "@" + kMaskAxesAttr,
                 absl::StrCat("'", AttrString(mask.attrs, kMaskAxesAttr), "'; block grids are [",
                              kBlockMaskAxes, "]"));
    }
    for (const char* name : {kBlockInAttr, kBlockOutAttr}) {
      if (auto st = CheckInt(file, path, mask.attrs, name, 1, 1024); !st.ok()) return st;
    }
    const int64_t bi = AttrInt(mask.attrs, kBlockInAttr), bo = AttrInt(mask.attrs, kBlockOutAttr);
    const int64_t k = kernel.shape[0], c = kernel.shape[1];
    const std::vector<int64_t> want = {(c + bi - 1) / bi, (k + bo - 1) / bo};
    if (mask.shape != want) {
      return Bad(file, path,
                 absl::StrCat("block grid ", ShapeText(mask.shape), " with blocks ", bi, "x", bo,
                              " does not fit the kernel ", ShapeText(kernel.shape), " (expected ",
                              ShapeText(want), ")"));
    }
  } else if (kind == MaskInfo::Kind::kElement || kind == MaskInfo::Kind::kNofM) {
    if (mask.shape != kernel.shape) {
      return Bad(file, path,
                 absl::StrCat("shape ", ShapeText(mask.shape), ", expected the kernel's ",
                              ShapeText(kernel.shape)));
    }
    if (kind == MaskInfo::Kind::kNofM) {
      if (auto st = CheckInt(file, path, mask.attrs, kMAttr, 2, 64); !st.ok()) return st;
      if (auto st = CheckInt(file, path, mask.attrs, kNAttr, 1, AttrInt(mask.attrs, kMAttr) - 1);
          !st.ok()) {
        return st;
      }
    }
  } else {
    return Bad(file, path,
               absl::StrCat("unknown mask kind '", AttrString(mask.attrs, kMaskKindAttr),
                            "' (block, element or n_of_m)"));
  }
  return absl::OkStatus();
}

// The first value that breaks the rule, or OK. Large arrays are scanned in parallel.
absl::Status CheckValues(const std::string& file, const std::string& path, const H5Dataset& d,
                         bool non_negative, bool binary) {
  const int64_t n = static_cast<int64_t>(binary ? d.u8.size() : d.f32.size());
  std::atomic<int64_t> first_bad{n};
  kernels::ParallelFor(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e && i < first_bad.load(std::memory_order_relaxed); ++i) {
      const bool ok =
          binary ? d.u8[i] <= 1 : std::isfinite(d.f32[i]) && (!non_negative || d.f32[i] >= 0.0f);
      if (!ok) {
        int64_t cur = first_bad.load();
        while (i < cur && !first_bad.compare_exchange_weak(cur, i)) {
        }
        break;
      }
    }
  });
  const int64_t i = first_bad.load();
  if (i == n) return absl::OkStatus();
  if (binary) {
    return Bad(
        file, path,
        absl::StrCat("mask value ", int{d.u8[i]}, " at element ", i, " (masks hold 0 or 1)"));
  }
  return Bad(file, path,
             absl::StrCat("value ", d.f32[i], " at element ", i,
                          non_negative ? " (must be finite and >= 0)" : " (must be finite)"));
}

}  // namespace

std::string ShapeText(const std::vector<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ", ") + "]";
}

int64_t MetadataChecksum(const H5Document& doc) {
  const std::string text = MetadataText(doc, kMetadataChecksumAttr);
  return static_cast<int64_t>(Crc32c(text.data(), text.size()));
}

namespace {

// A layer group's enum attributes hold one of their names (a reader maps them without a
// fallback).
absl::Status CheckLayerEnums(const std::string& file, const H5Document& doc) {
  // A plain pair, not a structured binding: C++17 lambdas cannot capture those.
  for (const auto& entry : doc.groups) {
    const std::string& group = entry.first;
    const H5Attrs& attrs = entry.second;
    if (group.rfind(kLayersPrefix, 0) != 0) continue;
    auto check = [&](const char* attr, auto& names) -> absl::Status {
      auto it = attrs.find(attr);
      if (it == attrs.end()) return absl::OkStatus();
      const std::string value = AttrString(attrs, attr);
      if (FirstOf(names, value)) return absl::OkStatus();
      std::vector<std::string> known;
      for (const auto& n : names) known.push_back(n.second);
      return Bad(
          file, absl::StrCat(group, "/@", attr),
          absl::StrCat("'", value.substr(0, 40), "' is not one of ", absl::StrJoin(known, ", ")));
    };
    TOPIARY_RETURN_IF_ERROR(check(kWeightCodeAttr, kWeightCodeNames));
    TOPIARY_RETURN_IF_ERROR(check(kWeightScalesAttr, kWeightScalesNames));
    TOPIARY_RETURN_IF_ERROR(check(kActivationRangeAttr, kRangeNames));
    TOPIARY_RETURN_IF_ERROR(check(kWeightGradientScaleAttr, kSamplingScaleNames));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateCheckpointDocument(const std::string& file, const H5Document& doc) {
  const H5Attrs& root = doc.groups.at(kRootGroup);
  auto stored = root.find(kMetadataChecksumAttr);
  if (stored == root.end() || !std::holds_alternative<int64_t>(stored->second)) {
    return Bad(file, std::string("/@") + kMetadataChecksumAttr, "missing");
  }
  if (std::get<int64_t>(stored->second) != MetadataChecksum(doc)) {
    return Bad(file, "metadata",
               "checksum mismatch: an attribute, shape or name was changed or damaged");
  }
  if (auto st = CheckRoot(file, doc); !st.ok()) return st;
  if (auto st = CheckLayerEnums(file, doc); !st.ok()) return st;
  for (const auto& [path, d] : doc.datasets) {
    const std::vector<std::string> parts = absl::StrSplit(path, '/');  // "", top, ...
    const bool layer = parts.size() == 4 && parts[1] == "layers";
    const bool momentum = parts.size() == 5 && parts[1] == "optimizer" && parts[2] == "momentum";
    if (!layer && !momentum) return Bad(file, path, "not a dataset a checkpoint holds");
    const std::string& role = parts.back();
    const std::string layer_dir = absl::StrCat(kLayersPrefix, parts[parts.size() - 2]);
    if (layer && role == kMaskRole) {
      auto kernel =
          doc.datasets.find(absl::StrCat(layer_dir, "/", ParamRoleName(ParamRole::kKernel)));
      if (kernel == doc.datasets.end()) return Bad(file, path, "a mask without a kernel");
      if (auto st = CheckMask(file, path, d, kernel->second); !st.ok()) return st;
      if (auto st = CheckValues(file, path, d, false, true); !st.ok()) return st;
      continue;
    }
    if (d.f32.empty()) return Bad(file, path, "must be float32");
    if (!KnownRole(role, d.shape.size())) {
      return Bad(
          file, path,
          absl::StrCat("unexpected role or rank ", d.shape.size(),
                       " (kernel: 2 or 4; bias, gamma, beta, running_mean, running_var: 1)"));
    }
    if (momentum) {
      auto value = doc.datasets.find(layer_dir + "/" + role);
      if (value == doc.datasets.end() || value->second.shape != d.shape) {
        return Bad(file, path, "momentum without a parameter of the same shape");
      }
    }
    if (auto st = CheckValues(file, path, d, role == "running_var", false); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace topiary
