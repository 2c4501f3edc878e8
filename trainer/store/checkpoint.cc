#include "trainer/store/checkpoint.h"

#include <cstring>
#include <ctime>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/runtime/parallel.h"
#include "trainer/nn/graph.h"
#include "trainer/nn/layers.h"
#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/store/checkpoint_schema.h"
#include "trainer/util/file_util.h"
#include "trainer/util/json.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

std::string LayerPath(const Parameter& p) {
  return absl::StrCat(kLayersPrefix, p.layer, "/", ParamRoleName(p.role));
}
std::string LayerGroup(const std::string& layer) { return absl::StrCat(kLayersPrefix, layer); }

const ConvApproximation* ApproximationOf(const Layer& layer) {
  if (layer.kind() != LayerKind::kConv2d) return nullptr;
  return static_cast<const Conv2d&>(layer).approximation();
}

const GradientSampling* SamplingOf(const Layer& layer) {
  if (layer.kind() != LayerKind::kConv2d) return nullptr;
  return static_cast<const Conv2d&>(layer).gradient_sampling();
}

// What a checkpoint says of an approximate layer (attributes of its group).
void AddApproximationAttrs(const ConvApproximation& a, H5Attrs& attrs) {
  attrs[kMultiplierAttr] = a.multiplier;
  attrs[kMultiplierSha256Attr] = a.sha256;
  attrs[kWeightTuningAttr] = int64_t{a.weight_tuning ? 1 : 0};
  attrs[kWeightCodeAttr] = std::string(*SecondOf(kWeightCodeNames, a.weights.code));
  attrs[kWeightScalesAttr] = std::string(*SecondOf(kWeightScalesNames, a.weights.scales));
  attrs[kActivationRangeAttr] = std::string(*SecondOf(kRangeNames, a.range));
}

// ... and of a layer whose weight gradient the run sampled (provenance only: loading ignores
// it, as the spec decides how a run trains).
void AddSamplingAttrs(const GradientSampling& g, H5Attrs& attrs) {
  attrs[kWeightGradientAttr] = std::string("sampled");
  attrs[kWeightGradientTopKAttr] = int64_t{g.top_k};
  attrs[kWeightGradientScaleAttr] = std::string(*SecondOf(kSamplingScaleNames, g.scale));
}

std::string MaskPath(const Parameter& p) {
  return absl::StrCat(kLayersPrefix, p.layer, "/", kMaskRole);
}
std::string MomentumPath(const Parameter& p) {
  return absl::StrCat(kMomentumPrefix, p.layer, "/", ParamRoleName(p.role));
}

// Conv kernels are [K, R, S, C] in memory and [K, C, R, S] (OIHW) on disk; everything else
// has the same layout in both.
bool IsConvKernel(const Parameter& p) { return p.value.shape().size() == 4; }

std::vector<int64_t> DiskShape(const Parameter& p) {
  const std::vector<int>& s = p.value.shape();
  if (IsConvKernel(p)) return {s[0], s[3], s[1], s[2]};
  return std::vector<int64_t>(s.begin(), s.end());
}

// Copies a conv kernel between the memory layout [K, R, S, C] (`krsc` is that shape) and
// the disk layout [K, C, R, S], in the direction `to_oihw` says.
template <typename T>
void Permute(const std::vector<int>& krsc, const T* src, T* dst, bool to_oihw) {
  const int k = krsc[0], r = krsc[1], q = krsc[2], c = krsc[3];
  for (int o = 0; o < k; ++o)
    for (int y = 0; y < r; ++y)
      for (int x = 0; x < q; ++x)
        for (int i = 0; i < c; ++i) {
          const size_t mem = ((static_cast<size_t>(o) * r + y) * q + x) * c + i;
          const size_t disk = ((static_cast<size_t>(o) * c + i) * r + y) * q + x;
          if (to_oihw) {
            dst[disk] = src[mem];
          } else {
            dst[mem] = src[disk];
          }
        }
}

}  // namespace

FloatArray ToDisk(const Parameter& p, const float* mem, size_t n) {
  FloatArray out(n);
  if (IsConvKernel(p)) {
    Permute(p.value.shape(), mem, out.data(), /*to_oihw=*/true);
  } else {
    std::memcpy(out.data(), mem, n * sizeof(float));
  }
  return out;
}

namespace {

std::vector<uint8_t> MaskToDisk(const Parameter& p, const std::vector<uint8_t>& mem) {
  if (!IsConvKernel(p)) return mem;
  std::vector<uint8_t> out(mem.size());
  Permute(p.value.shape(), mem.data(), out.data(), /*to_oihw=*/true);
  return out;
}

// Host memory holding a tensor's values: the tensor itself on the CPU device, else a copy.
class HostValues {
 public:
  explicit HostValues(const Tensor& t) {
    if (t.device()->kind() == DeviceKind::kCpu) {
      ptr_ = t.data();
    } else {
      copy_ = t.ToHost();
      ptr_ = copy_.data();
    }
  }
  const float* data() const { return ptr_; }

 private:
  std::vector<float> copy_;
  const float* ptr_ = nullptr;
};

// Writes the memory layout of a dataset read from disk into `dst`, zeroing masked entries.
void FromDisk(const Parameter& p, const FloatArray& disk, const uint8_t* mask, float* dst) {
  if (IsConvKernel(p)) {
    Permute(p.value.shape(), disk.data(), dst, /*to_oihw=*/false);
  } else {
    std::memcpy(dst, disk.data(), disk.size() * sizeof(float));
  }
  if (mask != nullptr) {
    for (size_t i = 0; i < disk.size(); ++i) {
      if (!mask[i]) dst[i] = 0.0f;
    }
  }
}

std::vector<uint8_t> MaskFromDisk(const Parameter& p, const std::vector<uint8_t>& disk) {
  if (!IsConvKernel(p)) return disk;
  std::vector<uint8_t> out(disk.size());
  Permute(p.value.shape(), disk.data(), out.data(), /*to_oihw=*/false);
  return out;
}

// The mask of `p` as stored: the block grid, or the element mask in the disk layout.
H5Dataset MaskDataset(const Parameter& p) {
  H5Dataset d;
  const MaskInfo& info = p.mask_info;
  d.attrs[kMaskKindAttr] = std::string(MaskKindName(info.kind));
  if (info.kind == MaskInfo::Kind::kBlock) {
    d.shape = {info.blocks.rows, info.blocks.cols};
    d.u8 = info.blocks.kept;
    d.attrs[kBlockInAttr] = int64_t{info.blocks.block_in};
    d.attrs[kBlockOutAttr] = int64_t{info.blocks.block_out};
    d.attrs[kMaskAxesAttr] = std::string(kBlockMaskAxes);
  } else {
    d.shape = DiskShape(p);
    d.u8 = MaskToDisk(p, HostMask(p));
    if (info.kind == MaskInfo::Kind::kNofM) {
      d.attrs[kNAttr] = int64_t{info.n};
      d.attrs[kMAttr] = int64_t{info.m};
    }
  }
  return d;
}

// A checked mask; `element` (memory layout) is filled by Expand().
struct PendingMask {
  Parameter* param;
  std::vector<uint8_t> element;
  MaskInfo info;
  const H5Dataset* disk;
};

// Runs work(i) for every job on the CPU threads: largest first, dealt round-robin, so that
// a few large layers do not all land on one thread.
void ParallelBySize(const std::vector<size_t>& sizes, absl::FunctionRef<void(size_t)> work) {
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  const int64_t threads = std::max(1, kernels::CpuThreads());
  kernels::ParallelFor(threads, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      for (size_t k = static_cast<size_t>(t); k < order.size(); k += threads) work(order[k]);
    }
  });
}

// The element mask of a checked block or element mask, in memory layout.
void Expand(PendingMask* m) {
  const Parameter& p = *m->param;
  if (m->info.kind != MaskInfo::Kind::kBlock) {
    m->element = MaskFromDisk(p, m->disk->u8);
    return;
  }
  const std::vector<int>& s = p.value.shape();
  m->element = m->info.blocks.Expand(s.front(), s.size() == 4 ? s[1] * s[2] : 1, s.back());
}

// The mask of `p` read from `d`. ReadCheckpointFile has checked its type, kind, block sizes
// and its fit to the file's kernel, and the loader the kernel's fit to the model.
PendingMask ParseMask(Parameter* p, const H5Dataset& d) {
  PendingMask m{p, {}, {}, &d};
  m.info.kind =
      MaskKindFromName(AttrString(d.attrs, kMaskKindAttr)).value_or(MaskInfo::Kind::kNone);
  if (m.info.kind == MaskInfo::Kind::kBlock) {
    m.info.blocks.block_in = static_cast<int>(AttrInt(d.attrs, kBlockInAttr));
    m.info.blocks.block_out = static_cast<int>(AttrInt(d.attrs, kBlockOutAttr));
    m.info.blocks.rows = static_cast<int>(d.shape[0]);
    m.info.blocks.cols = static_cast<int>(d.shape[1]);
    m.info.blocks.kept = d.u8;
  } else {
    m.info.n = static_cast<int>(AttrInt(d.attrs, kNAttr));
    m.info.m = static_cast<int>(AttrInt(d.attrs, kMAttr));
  }
  return m;
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& path, const Model& model, CheckpointState state,
                            WriteMode mode) {
  state.created_at = NowIso8601();
  state.model_arch = model.arch();
  state.network = DescribeModel(model);
  H5Document doc;
  H5Attrs& root = doc.groups[kRootGroup];
  root[kFormatAttr] = std::string(kCheckpointFormat);
  root[kFormatVersionAttr] = kCheckpointFormatVersion;
  root[kExperimentIdAttr] = state.experiment_id;
  const RunPosition& at = state.position;
  root[kRoundAttr] = int64_t{at.round};
  root[kEpochAttr] = int64_t{at.epoch};
  root[kPhaseEpochAttr] = int64_t{at.phase_epoch};
  root[kEpochStepAttr] = int64_t{at.epoch_step};
  root[kGlobalStepAttr] = at.global_step();
  root[kModelArchAttr] = state.model_arch;
  root[kSpecAttr] = state.spec_text;
  root[kParentAttr] = state.parent;
  root[kCreatedAtAttr] = state.created_at;
  root[kMetricsAttr] = ToJson(state.metrics);
  if (state.input) root[kInputAttr] = ToJson(*state.input);
  root[kNetworkAttr] = ToJson(*state.network);
  doc.groups[kOptimizerGroup][kAlgorithmAttr] = std::string("sgd");
  doc.groups[kOptimizerGroup][kGlobalStepAttr] = at.global_step();
  H5Attrs& rng = doc.groups[kRngGroup];
  rng[kGeneratorAttr] = std::string("philox4x32-10");
  rng[kSeedAttr] = static_cast<int64_t>(state.seed);
  rng[kStreamsAttr] = std::string("init=1 shuffle=2 augment=3 data=4 prune=5 gradient_sampling=6");
  // Every draw is keyed by (seed, stream) and counted by (epoch, step, image): the next
  // epoch is the whole generator state.
  rng[kNextEpochAttr] = int64_t{at.epoch};
  std::vector<std::string> order;  // datasets are listed by name; this keeps model order
  for (const Model::Node& node : model.nodes()) {
    order.push_back(node.layer->name());
    if (const ConvApproximation* a = ApproximationOf(*node.layer)) {
      AddApproximationAttrs(*a, doc.groups[LayerGroup(node.layer->name())]);
    }
    if (const GradientSampling* g = SamplingOf(*node.layer)) {
      AddSamplingAttrs(*g, doc.groups[LayerGroup(node.layer->name())]);
    }
  }
  root[kLayerOrderAttr] = absl::StrJoin(order, ",");
  // Copies from the device one by one, layout conversions in parallel (they dominate the
  // time outside HDF5 for large models).
  struct Job {
    const Parameter* param;
    const Tensor* tensor;
    H5Dataset* dataset;
  };
  std::vector<Job> jobs;
  for (const Parameter* p : model.parameters()) {
    jobs.push_back({p, &p->value, &doc.datasets[LayerPath(*p)]});
    if (p->trainable && !p->momentum.empty()) {
      jobs.push_back({p, &p->momentum, &doc.datasets[MomentumPath(*p)]});
    }
    if (p->mask_info.kind != MaskInfo::Kind::kNone) doc.datasets[MaskPath(*p)] = MaskDataset(*p);
  }
  // On a GPU the copies to the host come first, one by one on the device's stream.
  std::vector<std::unique_ptr<HostValues>> host(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) host[i] = std::make_unique<HostValues>(*jobs[i].tensor);
  std::vector<size_t> sizes;
  for (const Job& j : jobs) sizes.push_back(j.param->size());
  ParallelBySize(sizes, [&](size_t i) {
    jobs[i].dataset->shape = DiskShape(*jobs[i].param);
    jobs[i].dataset->f32 = ToDisk(*jobs[i].param, host[i]->data(), jobs[i].param->size());
  });
  root[kMetadataChecksumAttr] = MetadataChecksum(doc);
  return WriteH5File(path, doc, mode);
}

absl::StatusOr<H5Document> ReadCheckpointFile(const std::string& path) {
  TOPIARY_ASSIGN_OR_RETURN(auto doc, ReadH5File(path));
  const H5Attrs& root = doc.groups[kRootGroup];
  if (AttrString(root, kFormatAttr) != kCheckpointFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a Topiary checkpoint (the root attribute format is not '",
                     kCheckpointFormat, "')"));
  }
  const int64_t version = AttrInt(root, kFormatVersionAttr, -1);
  if (version != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: checkpoint format_version %d; this build reads version %d%s", path, version,
        kCheckpointFormatVersion,
        version == 1 ? " (version 1 has no metadata checksum; docs/checkpoint-format.md shows how "
                       "to add one)"
                     : ""));
  }
  if (auto st = ValidateCheckpointDocument(path, doc); !st.ok()) return st;
  return doc;
}

namespace {

// The root's JSON attribute `name` into `out`.
absl::Status ParseRootJson(const H5Attrs& root, const char* name, const std::string& path,
                           JsonUnknown unknown, google::protobuf::Message* out) {
  return FromJson(AttrString(root, name), out, absl::StrCat(path, ": /@", name), unknown);
}

absl::StatusOr<CheckpointState> StateOfRoot(const H5Attrs& root, const std::string& path) {
  CheckpointState s;
  s.experiment_id = AttrString(root, kExperimentIdAttr);
  s.parent = AttrString(root, kParentAttr);
  s.spec_text = AttrString(root, kSpecAttr);
  s.model_arch = AttrString(root, kModelArchAttr);
  s.created_at = AttrString(root, kCreatedAtAttr);
  // Metrics are a record (a newer writer's keys are ignored); the input and the network say
  // what runs, so a key this build does not know is refused.
  if (root.count(kMetricsAttr)) {
    TOPIARY_RETURN_IF_ERROR(
        ParseRootJson(root, kMetricsAttr, path, JsonUnknown::kIgnore, &s.metrics));
  }
  if (root.count(kInputAttr)) {
    TOPIARY_RETURN_IF_ERROR(
        ParseRootJson(root, kInputAttr, path, JsonUnknown::kRefuse, &s.input.emplace()));
  }
  if (root.count(kNetworkAttr)) {
    TOPIARY_RETURN_IF_ERROR(
        ParseRootJson(root, kNetworkAttr, path, JsonUnknown::kRefuse, &s.network.emplace()));
  }
  RunPosition& at = s.position;
  at.round = static_cast<int>(AttrInt(root, kRoundAttr));
  at.epoch = static_cast<int>(AttrInt(root, kEpochAttr));
  at.phase_epoch = static_cast<int>(AttrInt(root, kPhaseEpochAttr));
  at.epoch_step = static_cast<int>(AttrInt(root, kEpochStepAttr));
  at.epoch_start_step = AttrInt(root, kGlobalStepAttr) - at.epoch_step;
  return s;
}

}  // namespace

absl::StatusOr<CheckpointState> CheckpointStateOf(const H5Document& doc, const std::string& path) {
  TOPIARY_ASSIGN_OR_RETURN(CheckpointState s, StateOfRoot(doc.groups.at(kRootGroup), path));
  auto rng = doc.groups.find(kRngGroup);
  if (rng != doc.groups.end()) s.seed = static_cast<uint64_t>(AttrInt(rng->second, kSeedAttr));
  s.stored_parameter_values = 0;
  for (const auto& [path, dataset] : doc.datasets) {
    if (path.rfind(kLayersPrefix, 0) == 0) s.stored_parameter_values += dataset.f32.size();
  }
  return s;
}

absl::StatusOr<CheckpointState> ReadCheckpointState(const std::string& path) {
  TOPIARY_ASSIGN_OR_RETURN(auto root, ReadH5RootAttrs(path));
  if (AttrString(root, kFormatAttr) != kCheckpointFormat) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a Topiary checkpoint"));
  }
  return StateOfRoot(root, path);
}

absl::StatusOr<CheckpointFile> OpenCheckpoint(const std::string& path) {
  CheckpointFile file;
  file.path = path;
  TOPIARY_ASSIGN_OR_RETURN(file.doc, ReadCheckpointFile(path));
  TOPIARY_ASSIGN_OR_RETURN(file.state, CheckpointStateOf(file.doc, path));
  return file;
}

absl::StatusOr<CheckpointState> LoadCheckpoint(const std::string& path, Model* model,
                                               bool with_optimizer) {
  TOPIARY_ASSIGN_OR_RETURN(auto file, OpenCheckpoint(path));
  return LoadCheckpoint(file, model, with_optimizer);
}

absl::StatusOr<CheckpointState> LoadCheckpoint(const CheckpointFile& file, Model* model,
                                               bool with_optimizer) {
  const H5Document& doc = file.doc;
  const std::string& path = file.path;
  const CheckpointState& state = file.state;
  if (state.model_arch != model->arch()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: a checkpoint of %s, not %s", path, state.model_arch, model->arch()));
  }
  // A run resumes with the multipliers it was trained with (a table file may have changed).
  if (with_optimizer) {
    for (const Model::Node& node : model->nodes()) {
      const ConvApproximation* a = ApproximationOf(*node.layer);
      auto group = doc.groups.find(LayerGroup(node.layer->name()));
      const std::string had = group == doc.groups.end()
                                  ? std::string()
                                  : AttrString(group->second, kMultiplierSha256Attr);
      const std::string has = a ? a->sha256 : std::string();
      if (had != has) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "%s: layer %s was trained with multiplier %s, the run now has %s: resuming would "
            "not continue the same run",
            path, node.layer->name(), had.empty() ? "(exact)" : had.substr(0, 16) + "...",
            has.empty() ? "(exact)" : has.substr(0, 16) + "..."));
      }
    }
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
    auto it = doc.datasets.find(LayerPath(*p));
    // A checkpoint of the layer before it was approximate: the range starts unobserved.
    if (it == doc.datasets.end() && p->role == ParamRole::kActivationRange) continue;
    if (it == doc.datasets.end()) return absl::DataLossError(where + ": missing");
    if (it->second.shape != DiskShape(*p) || it->second.f32.size() != p->size()) {
      return absl::DataLossError(absl::StrFormat("%s: shape %s, the model has %s", where,
                                                 ShapeText(it->second.shape),
                                                 ShapeText(DiskShape(*p))));
    }
    const H5Dataset* mom = nullptr;
    if (with_optimizer && p->trainable) {
      auto m = doc.datasets.find(MomentumPath(*p));
      if (m == doc.datasets.end() || m->second.f32.size() != p->size()) {
        return absl::DataLossError(
            absl::StrCat(path, ": ", MomentumPath(*p), ": missing or of the wrong size"));
      }
      mom = &m->second;
    }
    values.push_back({p, &it->second, mom});
    auto mask = doc.datasets.find(MaskPath(*p));
    if (mask != doc.datasets.end() && p->role == ParamRole::kKernel) {
      masks.push_back(ParseMask(p, mask->second));
    }
  }
  // Layout conversion and mask projection in parallel, straight into the model's memory on
  // the CPU device, else into host buffers copied to the device afterwards.
  struct Job {
    Tensor* tensor;
    const Parameter* param;
    const H5Dataset* disk;  // null: zeros (momentum not loaded)
    const uint8_t* mask;
    std::vector<float> staging;
  };
  std::vector<size_t> mask_sizes;
  for (const PendingMask& m : masks) mask_sizes.push_back(m.param->size());
  ParallelBySize(mask_sizes, [&](size_t i) { Expand(&masks[i]); });
  std::vector<Job> jobs;
  for (const Pending& v : values) {
    const uint8_t* mask = nullptr;
    for (const PendingMask& m : masks) {
      if (m.param == v.param) mask = m.element.data();
    }
    // Masked entries are zero in a valid file; projecting here makes it so for any file.
    jobs.push_back({&v.param->value, v.param, v.value, mask, {}});
    if (v.param->trainable) jobs.push_back({&v.param->momentum, v.param, v.momentum, mask, {}});
  }
  const bool on_cpu = model->device()->kind() == DeviceKind::kCpu;
  std::vector<size_t> sizes;
  for (const Job& j : jobs) sizes.push_back(j.tensor->size());
  ParallelBySize(sizes, [&](size_t i) {
    Job& j = jobs[i];
    float* dst = j.tensor->data();
    if (!on_cpu) {
      j.staging.resize(j.tensor->size());
      dst = j.staging.data();
    }
    if (j.disk != nullptr) {
      FromDisk(*j.param, j.disk->f32, j.mask, dst);
    } else {
      std::fill(dst, dst + j.tensor->size(), 0.0f);
    }
  });
  if (!on_cpu) {
    for (Job& j : jobs) j.tensor->CopyFromHost(j.staging.data());
  }
  for (PendingMask& m : masks) {
    TOPIARY_RETURN_IF_ERROR(
        InstallMask(m.param, m.element, std::move(m.info), /*zero_masked=*/false));
  }
  return state;
}

absl::StatusOr<std::unique_ptr<Model>> BuildCheckpointModel(const CheckpointState& state,
                                                            const std::string& path, float width,
                                                            Shape4 input, int classes,
                                                            Device* device) {
  if (!state.network) return BuildModel(state.model_arch, width, input, classes, device);
  const topiary::v1::NetworkGraph& graph = *state.network;
  if (graph.height() != input.h || graph.width() != input.w || graph.channels() != input.c ||
      graph.classes() != classes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: its network (%s) reads %dx%dx%d images into %d classes; the data here is %dx%dx%d "
        "with %d classes",
        path, graph.arch(), graph.height(), graph.width(), graph.channels(), graph.classes(),
        input.h, input.w, input.c, classes));
  }
  return BuildModelFromGraph(graph, device, path + ": /@network", state.stored_parameter_values);
}

}  // namespace topiary
