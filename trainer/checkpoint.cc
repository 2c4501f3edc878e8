#include "trainer/checkpoint.h"

#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/parallel.h"
#include "kernels/status_macros.h"
#include "trainer/masks.h"

namespace topiary {
namespace {

std::string LayerPath(const Parameter& p) { return absl::StrCat("/layers/", p.layer, "/", p.role); }
std::string MaskPath(const Parameter& p) { return absl::StrCat("/layers/", p.layer, "/mask"); }
std::string MomentumPath(const Parameter& p) {
  return absl::StrCat("/optimizer/momentum/", p.layer, "/", p.role);
}

// Conv kernels are [K, R, S, C] in memory and [K, C, R, S] (OIHW) on disk; everything else
// has the same layout in both.
bool IsConvKernel(const Parameter& p) { return p.value.shape().size() == 4; }

std::vector<int64_t> DiskShape(const Parameter& p) {
  const std::vector<int>& s = p.value.shape();
  if (IsConvKernel(p)) return {s[0], s[3], s[1], s[2]};
  return std::vector<int64_t>(s.begin(), s.end());
}

template <typename T>
std::vector<T> ToDisk(const Parameter& p, std::vector<T> mem) {
  if (!IsConvKernel(p)) return mem;  // moved, not copied
  const std::vector<int>& s = p.value.shape();
  const int k = s[0], r = s[1], q = s[2], c = s[3];
  std::vector<T> out(mem.size());
  for (int o = 0; o < k; ++o)
    for (int y = 0; y < r; ++y)
      for (int x = 0; x < q; ++x)
        for (int i = 0; i < c; ++i)
          out[((static_cast<size_t>(o) * c + i) * r + y) * q + x] =
              mem[((static_cast<size_t>(o) * r + y) * q + x) * c + i];
  return out;
}

// Returns the memory-layout copy of a dataset read from disk.
template <typename T>
std::vector<T> FromDisk(const Parameter& p, const std::vector<T>& disk) {
  if (!IsConvKernel(p)) return disk;
  const std::vector<int>& s = p.value.shape();
  const int k = s[0], r = s[1], q = s[2], c = s[3];
  std::vector<T> out(disk.size());
  for (int o = 0; o < k; ++o)
    for (int y = 0; y < r; ++y)
      for (int x = 0; x < q; ++x)
        for (int i = 0; i < c; ++i)
          out[((static_cast<size_t>(o) * r + y) * q + x) * c + i] =
              disk[((static_cast<size_t>(o) * c + i) * r + y) * q + x];
  return out;
}

std::string NowUtc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&out, i ? ", " : "", s[i]);
  return out + "]";
}

// The mask of `p` as stored: the block grid, or the element mask in the disk layout.
H5Dataset MaskDataset(const Parameter& p) {
  H5Dataset d;
  const MaskInfo& info = p.mask_info;
  d.attrs["kind"] = std::string(MaskKindName(info.kind));
  if (info.kind == MaskInfo::Kind::kBlock) {
    d.shape = {info.rows, info.cols};
    d.u8 = info.grid;
    d.attrs["block_in"] = int64_t{info.block_in};
    d.attrs["block_out"] = int64_t{info.block_out};
  } else {
    d.shape = DiskShape(p);
    d.u8 = ToDisk(p, HostMask(p));
    if (info.kind == MaskInfo::Kind::kNofM) {
      d.attrs["n"] = int64_t{info.n};
      d.attrs["m"] = int64_t{info.m};
    }
  }
  return d;
}

// A parsed mask, ready to install.
struct PendingMask {
  Parameter* param;
  std::vector<uint8_t> element;  // memory layout
  MaskInfo info;
};

absl::StatusOr<PendingMask> ParseMask(const std::string& file, Parameter* p, const H5Dataset& d) {
  const std::string where = absl::StrCat(file, ": ", MaskPath(*p));
  if (d.u8.empty()) return absl::DataLossError(where + ": not a uint8 dataset");
  PendingMask m{p, {}, {}};
  const std::string kind = AttrString(d.attrs, "kind");
  if (kind == "block") {
    m.info.kind = MaskInfo::Kind::kBlock;
    m.info.block_in = static_cast<int>(AttrInt(d.attrs, "block_in"));
    m.info.block_out = static_cast<int>(AttrInt(d.attrs, "block_out"));
    const std::vector<int>& s = p->value.shape();
    const int out = s.front(), in = s.back();
    const int taps = s.size() == 4 ? s[1] * s[2] : 1;
    if (m.info.block_in <= 0 || m.info.block_out <= 0 || d.shape.size() != 2 ||
        d.shape[0] != (in + m.info.block_in - 1) / m.info.block_in ||
        d.shape[1] != (out + m.info.block_out - 1) / m.info.block_out) {
      return absl::DataLossError(absl::StrFormat(
          "%s: block grid %s with blocks %dx%d does not fit a kernel of %d inputs and %d outputs",
          where, ShapeText(d.shape), m.info.block_in, m.info.block_out, in, out));
    }
    m.info.rows = static_cast<int>(d.shape[0]);
    m.info.cols = static_cast<int>(d.shape[1]);
    m.info.grid = d.u8;
    m.element.resize(p->size());
    for (int k = 0; k < out; ++k)
      for (int t = 0; t < taps; ++t)
        for (int c = 0; c < in; ++c)
          m.element[(static_cast<size_t>(k) * taps + t) * in + c] =
              d.u8[static_cast<size_t>(c / m.info.block_in) * m.info.cols + k / m.info.block_out];
  } else if (kind == "element" || kind == "n_of_m") {
    if (d.shape != DiskShape(*p)) {
      return absl::DataLossError(absl::StrFormat("%s: shape %s, expected the kernel's %s", where,
                                                 ShapeText(d.shape), ShapeText(DiskShape(*p))));
    }
    m.info.kind = kind == "element" ? MaskInfo::Kind::kElement : MaskInfo::Kind::kNofM;
    m.info.n = static_cast<int>(AttrInt(d.attrs, "n"));
    m.info.m = static_cast<int>(AttrInt(d.attrs, "m"));
    m.element = FromDisk(*p, d.u8);
  } else {
    return absl::DataLossError(
        absl::StrCat(where, ": unknown mask kind '", kind, "' (block, element or n_of_m)"));
  }
  return m;
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& path, const Model& model, CheckpointState state) {
  state.created_at = NowUtc();
  state.model_arch = model.arch();
  H5Document doc;
  H5Attrs& root = doc.groups["/"];
  root["format"] = std::string(kCheckpointFormat);
  root["format_version"] = kCheckpointFormatVersion;
  root["experiment_id"] = state.experiment_id;
  root["round"] = int64_t{state.round};
  root["epoch"] = int64_t{state.epoch};
  root["phase_epoch"] = int64_t{state.phase_epoch};
  root["global_step"] = state.global_step;
  root["model_arch"] = state.model_arch;
  root["spec"] = state.spec_text;
  root["parent"] = state.parent;
  root["created_at"] = state.created_at;
  root["metrics"] = state.metrics_json.empty() ? std::string("{}") : state.metrics_json;
  doc.groups["/optimizer"]["algorithm"] = std::string("sgd");
  doc.groups["/optimizer"]["global_step"] = state.global_step;
  H5Attrs& rng = doc.groups["/rng"];
  rng["generator"] = std::string("philox4x32-10");
  rng["seed"] = static_cast<int64_t>(state.seed);
  rng["streams"] = std::string("init=1 shuffle=2 augment=3 data=4 prune=5");
  // Every draw is keyed by (seed, stream) and counted by (epoch, step, image): the next
  // epoch is the whole generator state.
  rng["next_epoch"] = int64_t{state.epoch};
  std::vector<std::string> order;  // datasets are listed by name; this keeps model order
  for (const Model::Node& node : model.nodes()) order.push_back(node.layer->name());
  root["layer_order"] = absl::StrJoin(order, ",");
  // Copies from the device one by one, layout conversions in parallel (they dominate the
  // time outside HDF5 for large models).
  struct Job {
    const Parameter* param;
    std::string path;
    std::vector<float> data;
  };
  std::vector<Job> jobs;
  for (const Parameter* p : model.parameters()) {
    jobs.push_back({p, LayerPath(*p), p->value.ToHost()});
    if (p->trainable && !p->momentum.empty()) {
      jobs.push_back({p, MomentumPath(*p), p->momentum.ToHost()});
    }
    if (p->mask_info.kind != MaskInfo::Kind::kNone) doc.datasets[MaskPath(*p)] = MaskDataset(*p);
  }
  kernels::ParallelFor(static_cast<int64_t>(jobs.size()), [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      jobs[i].data = ToDisk(*jobs[i].param, std::move(jobs[i].data));
    }
  });
  for (Job& j : jobs) {
    H5Dataset& d = doc.datasets[j.path];
    d.shape = DiskShape(*j.param);
    d.f32 = std::move(j.data);
  }
  return WriteH5File(path, doc);
}

absl::StatusOr<H5Document> ReadCheckpointFile(const std::string& path) {
  auto doc = ReadH5File(path);
  if (!doc.ok()) return doc.status();
  const H5Attrs& root = doc->groups["/"];
  if (AttrString(root, "format") != kCheckpointFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a Topiary checkpoint (the root attribute format is not '",
                     kCheckpointFormat, "')"));
  }
  const int64_t version = AttrInt(root, "format_version", -1);
  if (version != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: checkpoint format_version %d; this build reads version %d", path,
                        version, kCheckpointFormatVersion));
  }
  return doc;
}

CheckpointState CheckpointStateOf(const H5Document& doc) {
  const H5Attrs& root = doc.groups.at("/");
  CheckpointState s;
  s.experiment_id = AttrString(root, "experiment_id");
  s.parent = AttrString(root, "parent");
  s.spec_text = AttrString(root, "spec");
  s.model_arch = AttrString(root, "model_arch");
  s.created_at = AttrString(root, "created_at");
  s.metrics_json = AttrString(root, "metrics");
  s.round = static_cast<int>(AttrInt(root, "round"));
  s.epoch = static_cast<int>(AttrInt(root, "epoch"));
  s.phase_epoch = static_cast<int>(AttrInt(root, "phase_epoch"));
  s.global_step = AttrInt(root, "global_step");
  auto rng = doc.groups.find("/rng");
  if (rng != doc.groups.end()) s.seed = static_cast<uint64_t>(AttrInt(rng->second, "seed"));
  return s;
}

absl::StatusOr<CheckpointState> LoadCheckpoint(const std::string& path, Model* model,
                                               bool with_optimizer) {
  auto doc = ReadCheckpointFile(path);
  if (!doc.ok()) return doc.status();
  const CheckpointState state = CheckpointStateOf(*doc);
  if (state.model_arch != model->arch()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: a checkpoint of %s, not %s", path, state.model_arch, model->arch()));
  }
  // Check everything first; change nothing until all of it fits.
  struct Pending {
    Parameter* param;
    const H5Dataset* value;
    const H5Dataset* momentum;
  };
  std::vector<Pending> values;
  std::vector<PendingMask> masks;
  for (Parameter* p : model->parameters()) {
    const std::string where = absl::StrCat(path, ": ", LayerPath(*p));
    auto it = doc->datasets.find(LayerPath(*p));
    if (it == doc->datasets.end()) return absl::DataLossError(where + ": missing");
    if (it->second.shape != DiskShape(*p) || it->second.f32.size() != p->size()) {
      return absl::DataLossError(absl::StrFormat("%s: shape %s, the model has %s", where,
                                                 ShapeText(it->second.shape),
                                                 ShapeText(DiskShape(*p))));
    }
    const H5Dataset* mom = nullptr;
    if (with_optimizer && p->trainable) {
      auto m = doc->datasets.find(MomentumPath(*p));
      if (m == doc->datasets.end() || m->second.f32.size() != p->size()) {
        return absl::DataLossError(
            absl::StrCat(path, ": ", MomentumPath(*p), ": missing or of the wrong size"));
      }
      mom = &m->second;
    }
    values.push_back({p, &it->second, mom});
    auto mask = doc->datasets.find(MaskPath(*p));
    if (mask != doc->datasets.end() && p->role == "kernel") {
      auto parsed = ParseMask(path, p, mask->second);
      if (!parsed.ok()) return parsed.status();
      masks.push_back(std::move(*parsed));
    }
  }
  // Layout conversion and mask projection in parallel, then the copies to the device.
  std::vector<std::vector<float>> value_host(values.size()), momentum_host(values.size());
  kernels::ParallelFor(static_cast<int64_t>(values.size()), [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const Pending& v = values[i];
      const PendingMask* mask = nullptr;
      for (const PendingMask& m : masks) {
        if (m.param == v.param) mask = &m;
      }
      // Masked entries are zero in a valid file; projecting here makes it so for any file.
      auto convert = [&](const H5Dataset* d) {
        std::vector<float> host =
            d ? FromDisk(*v.param, d->f32) : std::vector<float>(v.param->size());
        if (mask != nullptr) {
          for (size_t j = 0; j < host.size(); ++j) {
            if (!mask->element[j]) host[j] = 0.0f;
          }
        }
        return host;
      };
      value_host[i] = convert(v.value);
      if (v.param->trainable) momentum_host[i] = convert(v.momentum);
    }
  });
  for (size_t i = 0; i < values.size(); ++i) {
    values[i].param->value.CopyFromHost(value_host[i].data());
    if (values[i].param->trainable) values[i].param->momentum.CopyFromHost(momentum_host[i].data());
  }
  for (PendingMask& m : masks) {
    TOPIARY_RETURN_IF_ERROR(
        InstallMask(m.param, m.element, std::move(m.info), /*zero_masked=*/false));
  }
  return state;
}

}  // namespace topiary
