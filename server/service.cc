#include "server/service.h"

#include <dirent.h>
#include <google/protobuf/text_format.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "protos/version.h"
#include "server/auth_interceptor.h"
#include "server/command_runner.h"
#include "server/file_transfer.h"
#include "trainer/approx/approximation.h"
#include "trainer/approx/multiplier_info.h"
#include "trainer/data/dataset.h"
#include "trainer/import/onnx_import.h"
#include "trainer/spec/catalog.h"
#include "trainer/spec/spec.h"
#include "trainer/store/checkpoint.h"
#include "trainer/store/checkpoint_report.h"
#include "trainer/util/file_util.h"

namespace topiary::server {
namespace {

using grpc::Status;
using grpc::StatusCode;

constexpr int kMaxPageSize = 1000;
constexpr int kMaxImports = 2;    // ImportModel calls at once
constexpr int kMaxTransfers = 8;  // upload and download streams at once
constexpr int kMaxCommands = 16;  // RunCommand calls at once (each holds a thread)
using topiary::v1::ExperimentState_Name;

// Lexically normalized absolute path ("a/./b/../c" -> "a/c"); empty if ".." leaves the root.
std::string Normalize(const std::string& path) {
  std::vector<std::string> parts;
  for (absl::string_view p : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (p == ".") continue;
    if (p == "..") {
      if (parts.empty()) return "";
      parts.pop_back();
      continue;
    }
    parts.emplace_back(p);
  }
  return "/" + absl::StrJoin(parts, "/");
}

std::string RealOrSelf(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : path;
}

// One of at most `max` calls of a kind at once (Watch streams, imports): taken when made,
// given back when it goes out of scope.
class CallSlot {
 public:
  CallSlot(std::atomic<int>* count, int max) : count_(count), taken_(++*count <= max) {}
  ~CallSlot() { --*count_; }
  CallSlot(const CallSlot&) = delete;
  CallSlot& operator=(const CallSlot&) = delete;
  bool taken() const { return taken_; }

 private:
  std::atomic<int>* count_;
  bool taken_;
};

// What this daemon serves, derived from the spec it accepts (so the list cannot fall behind
// it): every value of the spec's enums that name a feature (pruning methods and scores,
// precisions, datasets, approximation range modes, gradient-sampling scales), the spec's
// optional blocks, the models, and the service's features.
std::vector<std::string> Capabilities() {
  std::vector<std::string> out;
  auto values = [&](const std::string& prefix, const google::protobuf::EnumDescriptor* e) {
    for (int i = 0; i < e->value_count(); ++i) {
      if (absl::EndsWith(e->value(i)->name(), "UNSPECIFIED")) continue;
      out.push_back(absl::StrCat(prefix, ":", e->value(i)->name()));
    }
  };
  values("pruning", topiary::v1::PruningSpec::Method_descriptor());
  values("pruning.score", topiary::v1::PruningSpec::Score_descriptor());
  values("precision", topiary::v1::TrainSpec::Precision_descriptor());
  values("dataset", topiary::v1::DataSpec::Dataset_descriptor());
  values("approximation.range", topiary::v1::ApproximationSpec::RangeMode_descriptor());
  values("gradient_sampling.scale", topiary::v1::GradientSamplingSpec::Scale_descriptor());
  const auto* spec = topiary::v1::ExperimentSpec::descriptor();
  for (int i = 0; i < spec->field_count(); ++i) {
    if (spec->field(i)->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
      out.push_back(absl::StrCat("spec:", spec->field(i)->name()));
    }
  }
  for (const std::string& m : ModelNames()) out.push_back("model:" + m);
  for (const char* c : {"manual_rounds", "fork", "checkpoints:hdf5-sealed", "data_parallel",
                        "watch:resumable", "list:pages", "import:onnx", "model:graph", "files",
                        "command:evaluate", "command:sensitivity", "command:export"}) {
    out.push_back(c);
  }
  return out;
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return Status::OK;
  return Status(static_cast<StatusCode>(s.code()), std::string(s.message()));
}

Status TopiaryService::Authorize(grpc::ServerContext* ctx) const {
  if (options_.token.empty() || ctx == nullptr) return Status::OK;
  return HasBearerToken(ctx->client_metadata(), options_.token) ? Status::OK : Unauthenticated();
}

Status TopiaryService::ResolvePath(const std::string& field, const std::string& path,
                                   std::string* absolute) const {
  const std::string root = RealOrSelf(registry_->data_dir());
  const std::string joined = Normalize(path.rfind('/', 0) == 0 ? path : root + "/" + path);
  // Lexically inside, and still inside once symbolic links are followed.
  if (joined.empty() || !IsInsideFolder(joined, root) || !IsInsideFolder(Canonical(joined), root)) {
    return Status(StatusCode::PERMISSION_DENIED,
                  absl::StrCat(field, ": '", path, "' is outside the daemon's data directory (",
                               root, "); copy the file into it and name it by its path there"));
  }
  *absolute = joined;
  return Status::OK;
}

Status TopiaryService::ResolveDataPath(const std::string& path, std::string* absolute) const {
  const std::string root = RealOrSelf(registry_->data_dir());
  const std::string joined = Normalize(path.rfind('/', 0) == 0 ? path : root + "/" + path);
  const std::string real = joined.empty() ? "" : Canonical(joined);
  bool allowed = !real.empty() && IsInsideFolder(real, root);
  for (const std::string& folder : options_.dataset_roots) {
    allowed = allowed || (!real.empty() && IsInsideFolder(real, RealOrSelf(folder)));
  }
  if (!allowed) {
    return Status(
        StatusCode::PERMISSION_DENIED,
        absl::StrCat("data.path: '", path, "' is outside the data directory (", root,
                     ") and the dataset folders (", absl::StrJoin(options_.dataset_roots, ", "),
                     "); a relative path is taken inside the data directory"));
  }
  *absolute = joined;
  return Status::OK;
}

std::string TopiaryService::MultiplierFolder() const {
  return registry_->data_dir() + "/multipliers";
}

Status TopiaryService::ResolveMultipliers(topiary::v1::ApproximationSpec* approx) const {
  for (int i = 0; i < approx->rules_size(); ++i) {
    auto* rule = approx->mutable_rules(i);
    if (rule->exclude()) continue;
    const std::string& m = rule->multiplier();
    const bool has_dir = m.find('/') != std::string::npos;
    std::string path;
    if (!has_dir && !absl::EndsWith(m, ".bin")) {
      // A family, or the stem of a table in the library.
      const std::string candidate = MultiplierFolder() + "/" + m + ".bin";
      if (!PathExists(candidate)) continue;
      path = candidate;
    } else if (!has_dir) {
      path = MultiplierFolder() + "/" + m;
    } else if (Status st =
                   ResolvePath(absl::StrCat("approximation.rules[", i, "].multiplier"), m, &path);
               !st.ok()) {
      return st;
    }
    rule->set_multiplier(path);
  }
  // Every table read and checked now, so a bad one is refused at submission, naming the rule.
  auto loaded = LoadRuleMultipliers(*approx);
  return loaded.ok() ? Status::OK : ToGrpc(loaded.status());
}

Status TopiaryService::CheckSpec(topiary::v1::ExperimentSpec* spec) const {
  if (auto st = ValidateSpec(*spec); !st.ok()) return ToGrpc(st);
  *spec = WithDefaults(*spec);
  // Refused now rather than queued forever: GPUs this daemon does not have, CPU threads
  // beyond this machine.
  if (auto st = scheduler_->Feasible(*spec); !st.ok()) return ToGrpc(st);
  if (spec->has_approximation()) {
    if (Status st = ResolveMultipliers(spec->mutable_approximation()); !st.ok()) return st;
  }
  if (!spec->init_from_checkpoint().empty()) {
    std::string abs;
    Status st = ResolvePath("init_from_checkpoint", spec->init_from_checkpoint(), &abs);
    if (!st.ok()) return st;
    spec->set_init_from_checkpoint(abs);
  }
  if (!spec->data().path().empty()) {
    std::string abs;
    if (Status st = ResolveDataPath(spec->data().path(), &abs); !st.ok()) return st;
    spec->mutable_data()->set_path(abs);
  }
  // The dataset's files are there now, not only when the run starts.
  if (auto st = CheckDatasetFiles(spec->data()); !st.ok()) {
    return Status(StatusCode::INVALID_ARGUMENT, std::string(st.message()));
  }
  return Status::OK;
}

Status TopiaryService::Admit(const topiary::v1::ExperimentSpec& spec, const std::string& parent,
                             topiary::v1::Experiment* out) {
  if (registry_->Count(topiary::v1::QUEUED) >= options_.max_queued) {
    return Status(StatusCode::RESOURCE_EXHAUSTED,
                  absl::StrCat("the queue is full (", options_.max_queued,
                               " experiments queued); try again later"));
  }
  auto created = registry_->Create(spec, parent);
  if (!created.ok()) return ToGrpc(created.status());
  scheduler_->Enqueue(created->id());
  *out = *created;
  return Status::OK;
}

Status TopiaryService::SubmitExperiment(grpc::ServerContext* ctx,
                                        const topiary::v1::SubmitExperimentRequest* req,
                                        topiary::v1::Experiment* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  topiary::v1::ExperimentSpec spec = req->spec();
  if (Status st = CheckSpec(&spec); !st.ok()) return st;
  return Admit(spec, "", out);
}

Status TopiaryService::GetExperiment(grpc::ServerContext* ctx,
                                     const topiary::v1::ExperimentRef* req,
                                     topiary::v1::Experiment* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  auto r = registry_->Get(req->id());
  if (!r.ok()) return ToGrpc(r.status());
  *out = *r;
  return Status::OK;
}

Status TopiaryService::ListExperiments(grpc::ServerContext* ctx,
                                       const topiary::v1::ListExperimentsRequest* req,
                                       topiary::v1::ListExperimentsResponse* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  if (req->page_size() < 0 || req->page_size() > kMaxPageSize) {
    return Status(StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("page_size: must be in [0, ", kMaxPageSize, "] (0: 100)"));
  }
  if (!req->page_token().empty() && !IsExperimentId(req->page_token())) {
    return Status(StatusCode::INVALID_ARGUMENT,
                  "page_token: not one a previous ListExperiments returned");
  }
  std::string next;
  // Pages stay far under any client's 4 MiB message limit, however large the specs.
  for (auto& e : registry_->ListPage(req->state(), req->page_token(),
                                     req->page_size() == 0 ? 100 : req->page_size(),
                                     size_t{1} << 20, &next)) {
    *out->add_experiments() = std::move(e);
  }
  out->set_next_page_token(next);
  return Status::OK;
}

Status TopiaryService::WatchExperiment(grpc::ServerContext* ctx,
                                       const topiary::v1::WatchExperimentRequest* req,
                                       grpc::ServerWriter<topiary::v1::Event>* writer) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  if (auto r = registry_->Get(req->id()); !r.ok()) return ToGrpc(r.status());
  // Each stream holds a server thread for as long as it lasts.
  CallSlot slot(&watchers_, options_.max_watchers);
  if (!slot.taken()) {
    return Status(StatusCode::RESOURCE_EXHAUSTED,
                  absl::StrCat(options_.max_watchers,
                               " watch streams are open; close one or try again later"));
  }
  uint32_t seq = req->from_seq();
  while (!ctx->IsCancelled()) {
    bool done = false;
    const auto events =
        registry_->EventsAfter(req->id(), seq, std::chrono::milliseconds(250), &done);
    for (const auto& e : events) {
      if (!writer->Write(e)) return Status(StatusCode::CANCELLED, "the watcher went away");
      seq = e.seq();
    }
    if (done && events.empty()) return Status::OK;
  }
  return Status(StatusCode::CANCELLED, "the watcher went away");
}

Status TopiaryService::PauseExperiment(grpc::ServerContext* ctx,
                                       const topiary::v1::ExperimentRef* req,
                                       topiary::v1::Experiment* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  // Still in the queue: paused there. Otherwise its run (under way, or just taken by a
  // worker) checkpoints at its next step boundary and ends PAUSED.
  if (scheduler_->Dequeue(req->id())) {
    auto r = registry_->Transition(req->id(), {topiary::v1::QUEUED}, topiary::v1::PAUSED,
                                   "paused while queued", "pause");
    if (!r.ok()) {
      scheduler_->Enqueue(req->id());  // still QUEUED on disk: keep it queued
      return ToGrpc(r.status());
    }
  } else if (auto st = registry_->RequestPause(req->id()); !st.ok()) {
    return ToGrpc(st);
  }
  auto r = registry_->Get(req->id());
  if (!r.ok()) return ToGrpc(r.status());
  *out = *r;
  return Status::OK;
}

Status TopiaryService::ResumeExperiment(grpc::ServerContext* ctx,
                                        const topiary::v1::ExperimentRef* req,
                                        topiary::v1::Experiment* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  bool requeue = false;
  auto r = registry_->Resume(req->id(), &requeue);
  if (!r.ok()) return ToGrpc(r.status());
  if (requeue) scheduler_->Enqueue(req->id());
  *out = *r;
  return Status::OK;
}

Status TopiaryService::CancelExperiment(grpc::ServerContext* ctx,
                                        const topiary::v1::ExperimentRef* req,
                                        topiary::v1::Experiment* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  // Still in the queue: cancelled there (back in the queue if that cannot be recorded).
  // Otherwise decided under the registry's lock, so a run that pauses meanwhile cannot
  // lose it.
  if (scheduler_->Dequeue(req->id())) {
    auto r = registry_->Transition(req->id(), {topiary::v1::QUEUED}, topiary::v1::CANCELLED,
                                   "cancelled", "cancel");
    if (!r.ok()) {
      scheduler_->Enqueue(req->id());
      return ToGrpc(r.status());
    }
    *out = *r;
    return Status::OK;
  }
  auto r = registry_->RequestCancel(req->id());
  if (!r.ok()) return ToGrpc(r.status());
  *out = *r;
  return Status::OK;
}

Status TopiaryService::AdvanceRound(grpc::ServerContext* ctx,
                                    const topiary::v1::AdvanceRoundRequest* req,
                                    topiary::v1::Experiment* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  if (req->has_target() && !(req->target() > 0 && req->target() < 1)) {
    return Status(StatusCode::INVALID_ARGUMENT, "target: must be in (0, 1)");
  }
  if (req->has_step_fraction() && !(req->step_fraction() > 0 && req->step_fraction() <= 1)) {
    return Status(StatusCode::INVALID_ARGUMENT, "step_fraction: must be in (0, 1]");
  }
  if (req->has_finetune_epochs() &&
      !(req->finetune_epochs() > 0 && req->finetune_epochs() <= kMaxEpochs)) {
    return Status(StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("finetune_epochs: must be in [1, ", kMaxEpochs, "]"));
  }
  if (req->finish() &&
      (req->has_target() || req->has_step_fraction() || req->has_finetune_epochs())) {
    return Status(StatusCode::INVALID_ARGUMENT,
                  "finish: ends the rounds; it takes no target, step_fraction or finetune_epochs");
  }
  if (auto st = registry_->Advance(*req); !st.ok()) return ToGrpc(st);
  *out = *registry_->Get(req->id());
  return Status::OK;
}

Status TopiaryService::ForkExperiment(grpc::ServerContext* ctx,
                                      const topiary::v1::ForkExperimentRequest* req,
                                      topiary::v1::Experiment* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  std::string path;
  if (Status st = ResolvePath("checkpoint", req->checkpoint(), &path); !st.ok()) return st;
  // The whole file is checked, as the fork's run will load it: a damaged checkpoint answers
  // its real code (DATA_LOSS), NOT_FOUND only when it is missing.
  auto file = OpenCheckpoint(path);
  if (!file.ok()) return ToGrpc(file.status());
  auto spec = ParseSpec(file->state.spec_text, req->checkpoint());
  if (!spec.ok()) {
    return Status(StatusCode::FAILED_PRECONDITION,
                  absl::StrCat("checkpoint: its spec does not parse: ", spec.status().message()));
  }
  // The parent's train.epochs were its dense phase, which the checkpoint has done: a fork
  // trains epochs first only when its --set asks for them (then it fine-tunes the checkpoint
  // before any round). Without pruning the inherited epochs stay (a fine-tune, say with a
  // multiplier).
  bool sets_epochs = false;
  for (const std::string& change : req->set()) {
    if (auto st = ApplySpecChange(change, &*spec); !st.ok()) return ToGrpc(st);
    sets_epochs = sets_epochs || absl::StartsWith(change, "train.epochs=") ||
                  absl::StartsWith(change, "train=");
  }
  if (spec->has_pruning() && !sets_epochs) spec->mutable_train()->set_epochs(0);
  spec->set_name(req->name().empty() ? spec->name() + "-fork" : req->name());
  spec->set_init_from_checkpoint(path);
  if (Status st = CheckSpec(&*spec); !st.ok()) return st;
  return Admit(*spec, req->checkpoint(), out);
}

Status TopiaryService::ListCheckpoints(grpc::ServerContext* ctx,
                                       const topiary::v1::ExperimentRef* req,
                                       topiary::v1::ListCheckpointsResponse* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  auto r = registry_->Get(req->id());
  if (!r.ok()) return ToGrpc(r.status());
  const std::string dir = registry_->Folder(req->id()) + "/checkpoints";
  std::vector<std::pair<double, std::string>> files;  // (mtime, name)
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() < 4 || name.substr(name.size() - 3) != ".h5") continue;
      struct stat st;
      if (::stat((dir + "/" + name).c_str(), &st) != 0) continue;
      files.push_back({st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9, name});
    }
    ::closedir(d);
  }
  std::sort(files.begin(), files.end());
  for (const auto& [mtime, name] : files) {
    const std::string abs = dir + "/" + name;
    auto state = ReadCheckpointState(abs);
    if (!state.ok()) continue;
    auto* c = out->add_checkpoints();
    c->set_path(r->folder() + "/checkpoints/" + name);
    c->set_round(state->position.round);
    c->set_epoch(state->position.epoch);
    c->set_created_at(state->created_at);
    struct stat st;
    if (::stat(abs.c_str(), &st) == 0) c->set_bytes(st.st_size);
    c->set_test_top1(state->metrics.test_top1());
  }
  return Status::OK;
}

Status TopiaryService::InspectCheckpoint(grpc::ServerContext* ctx,
                                         const topiary::v1::InspectCheckpointRequest* req,
                                         topiary::v1::CheckpointReport* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  std::string path;
  if (Status st = ResolvePath("path", req->path(), &path); !st.ok()) return st;
  auto report = topiary::InspectCheckpoint(path, req->layer());
  if (!report.ok()) return ToGrpc(report.status());
  *out = *report;
  out->set_path(req->path());
  return Status::OK;
}

// The file is read under the daemon's read policy and written only inside its data
// directory, never over an existing file (a checkpoint there may be a run's).
Status TopiaryService::ImportModel(grpc::ServerContext* ctx,
                                   const topiary::v1::ImportModelRequest* req,
                                   topiary::v1::ImportSummary* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  std::string onnx, dest;
  if (Status st = ResolvePath("onnx_path", req->onnx_path(), &onnx); !st.ok()) return st;
  if (req->out_path().empty() || !absl::EndsWith(req->out_path(), ".h5")) {
    return Status(StatusCode::INVALID_ARGUMENT, "out_path: a .h5 file in the data directory");
  }
  if (Status st = ResolvePath("out_path", req->out_path(), &dest); !st.ok()) return st;
  // Experiment folders belong to their runs (a pause checkpoint there is acknowledged data).
  const std::string experiments = RealOrSelf(registry_->data_dir()) + "/experiments";
  if (IsInsideFolder(dest, experiments) || IsInsideFolder(Canonical(dest), experiments)) {
    return Status(StatusCode::PERMISSION_DENIED,
                  "out_path: '" + req->out_path() +
                      "' is in experiments/, whose folders belong to the daemon's runs; "
                      "import elsewhere in the data directory");
  }
  if (PathExists(dest)) {
    return Status(StatusCode::ALREADY_EXISTS,
                  "out_path: '" + req->out_path() + "' exists; import into a new file");
  }
  // An import holds the whole model in memory for a while: a few at once.
  CallSlot slot(&imports_, kMaxImports);
  if (!slot.taken()) {
    return Status(StatusCode::RESOURCE_EXHAUSTED,
                  absl::StrCat(kMaxImports, " imports are under way; try again when one ends"));
  }
  if (absl::Status st = MakeDirs(dest.substr(0, dest.rfind('/'))); !st.ok()) return ToGrpc(st);
  OnnxImportOptions options;
  options.mean.assign(req->mean().begin(), req->mean().end());
  options.std.assign(req->std().begin(), req->std().end());
  if (req->max_value() != 0) options.max_value = req->max_value();
  options.arch = req->arch();
  options.height = req->height();
  options.width = req->width();
  options.channels = req->channels();
  options.create_only = true;  // a file made there meanwhile is never replaced
  if (!req->data().empty()) {
    // A recorded path is resolved now, inside the data directory or the dataset folders, as
    // a spec's data.path would be (the checkpoint then works from any working folder).
    const size_t colon = req->data().find(':');
    std::string data = req->data();
    if (colon != std::string::npos) {
      std::string abs;
      if (Status st = ResolveDataPath(data.substr(colon + 1), &abs); !st.ok()) return st;
      data = data.substr(0, colon + 1) + abs;
    }
    options.data = data;
  }
  auto summary = ImportOnnxFile(onnx, dest, options);
  if (!summary.ok()) return ToGrpc(summary.status());
  *out = *summary;
  out->set_checkpoint(req->out_path());
  return Status::OK;
}

Status TopiaryService::GetServerInfo(grpc::ServerContext* ctx,
                                     const topiary::v1::GetServerInfoRequest*,
                                     topiary::v1::ServerInfo* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  out->set_version(kTopiaryVersion);
  for (const std::string& d : options_.devices) out->add_devices(d);
  for (const std::string& c : Capabilities()) out->add_capabilities(c);
  out->set_max_running(scheduler_->slots());
  out->set_running(scheduler_->running());
  out->set_queued(registry_->Count(topiary::v1::QUEUED));
  out->set_data_dir(registry_->data_dir());
  const auto occupancy = scheduler_->Occupancy();
  for (size_t i = 0; i < occupancy.size(); ++i) {
    auto* g = out->add_gpus();
    g->set_ordinal(occupancy[i].first);
    if (i < options_.gpu_names.size()) g->set_name(options_.gpu_names[i]);
    g->set_experiment(occupancy[i].second);
    if (occupancy[i].second.empty()) continue;
    if (auto r = registry_->Get(occupancy[i].second); r.ok()) g->set_experiment_name(r->name());
  }
  return Status::OK;
}

Status TopiaryService::ListMultipliers(grpc::ServerContext* ctx,
                                       const topiary::v1::ListMultipliersRequest*,
                                       topiary::v1::ListMultipliersResponse* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  for (auto& info : ListMultiplierFolder(MultiplierFolder())) {
    // Paths relative to the data directory, like every other path the daemon reports.
    const std::string root = registry_->data_dir() + "/";
    if (info.source().rfind(root, 0) == 0) info.set_source(info.source().substr(root.size()));
    *out->add_multipliers() = std::move(info);
  }
  for (const std::string& f : MultiplierFamilies()) out->add_families(f);
  return Status::OK;
}

namespace {

Status TooManyTransfers() {
  return Status(StatusCode::RESOURCE_EXHAUSTED,
                absl::StrCat(kMaxTransfers,
                             " uploads and downloads are under way; try again when "
                             "one ends"));
}

}  // namespace

// Each file lands whole or not at all (file_transfer.h); the files before a failed one stay,
// and the error says how many.
Status TopiaryService::UploadFiles(grpc::ServerContext* ctx,
                                   grpc::ServerReader<topiary::v1::UploadChunk>* reader,
                                   topiary::v1::UploadSummary* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  CallSlot slot(&transfers_, kMaxTransfers);
  if (!slot.taken()) return TooManyTransfers();
  const std::string root = RealOrSelf(registry_->data_dir());
  std::unique_ptr<FileUpload> file;
  auto failed = [&](const absl::Status& st) {
    file.reset();  // removes the staged bytes
    std::string message(st.message());
    if (out->files_size() > 0) {
      absl::StrAppend(&message, " (the ", out->files_size(),
                      " file(s) before it in this upload were stored)");
    }
    return Status(static_cast<StatusCode>(st.code()), message);
  };
  auto land = [&]() -> absl::Status {
    if (file == nullptr) return absl::OkStatus();
    auto info = file->Commit();
    file.reset();
    if (!info.ok()) return info.status();
    out->set_bytes(out->bytes() + info->size());
    *out->add_files() = *std::move(info);
    return absl::OkStatus();
  };
  topiary::v1::UploadChunk chunk;
  while (reader->Read(&chunk)) {
    if (chunk.has_header()) {
      if (auto st = land(); !st.ok()) return failed(st);
      auto begun = FileUpload::Begin(root, chunk.header());
      if (!begun.ok()) return failed(begun.status());
      file = *std::move(begun);
    }
    if (chunk.data().empty()) continue;
    if (file == nullptr) {
      return failed(
          absl::InvalidArgumentError("data: bytes before any header; send a "
                                     "FileHeader first"));
    }
    if (auto st = file->Append(chunk.data()); !st.ok()) return failed(st);
  }
  if (ctx->IsCancelled()) {
    return failed(absl::CancelledError("the upload was cut off; nothing of the last file kept"));
  }
  if (auto st = land(); !st.ok()) return failed(st);
  if (out->files_size() == 0) {
    return Status(StatusCode::INVALID_ARGUMENT, "header: the upload named no file");
  }
  return Status::OK;
}

Status TopiaryService::DownloadFile(grpc::ServerContext* ctx,
                                    const topiary::v1::DownloadFileRequest* req,
                                    grpc::ServerWriter<topiary::v1::FileChunk>* writer) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  if (auto st = CheckTransferPath("path", req->path()); !st.ok()) return ToGrpc(st);
  std::string abs;
  if (Status st = ResolvePath("path", req->path(), &abs); !st.ok()) return st;
  CallSlot slot(&transfers_, kMaxTransfers);
  if (!slot.taken()) return TooManyTransfers();
  auto file = FileDownload::Open(abs, req->path());
  if (!file.ok()) return ToGrpc(file.status());
  const uint64_t size = (*file)->info().size();
  if (req->offset() < 0 || static_cast<uint64_t>(req->offset()) > size) {
    return Status(StatusCode::OUT_OF_RANGE, absl::StrCat("offset: ", req->offset(), " is beyond ",
                                                         req->path(), "'s ", size, " bytes"));
  }
  topiary::v1::FileChunk first;
  *first.mutable_info() = (*file)->info();
  if (!writer->Write(first)) return Status(StatusCode::CANCELLED, "the client went away");
  for (uint64_t off = req->offset(); off < size && !ctx->IsCancelled();) {
    auto data = (*file)->Read(off, kChunkBytes);
    if (!data.ok()) return ToGrpc(data.status());
    topiary::v1::FileChunk chunk;
    off += data->size();
    *chunk.mutable_data() = *std::move(data);
    if (!writer->Write(chunk)) return Status(StatusCode::CANCELLED, "the client went away");
  }
  return ctx->IsCancelled() ? Status(StatusCode::CANCELLED, "the client went away") : Status::OK;
}

Status TopiaryService::ListFiles(grpc::ServerContext* ctx, const topiary::v1::ListFilesRequest* req,
                                 topiary::v1::ListFilesResponse* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  auto files = ListDataFiles(RealOrSelf(registry_->data_dir()), req->path(), req->sha256());
  if (!files.ok()) return ToGrpc(files.status());
  for (auto& f : *files) *out->add_files() = std::move(f);
  return Status::OK;
}

// The device a command runs on: evaluate's --device, else the checkpoint's own; export
// needs none.
absl::StatusOr<std::optional<topiary::v1::DeviceSpec::Kind>> CommandDevice(
    const std::string& command, const std::string& device_flag, const std::string& checkpoint,
    bool has_gpus) {
  if (command == "export") return std::nullopt;
  if (device_flag == "cpu") return topiary::v1::DeviceSpec::CPU;
  if (device_flag == "cuda" || device_flag == "gpu") return topiary::v1::DeviceSpec::CUDA;
  if (!device_flag.empty()) {
    return absl::InvalidArgumentError("--device: 'cpu' or 'cuda', not '" + device_flag + "'");
  }
  auto state = ReadCheckpointState(checkpoint);
  if (!state.ok()) return state.status();
  auto spec = ParseSpec(state->spec_text, checkpoint);
  if (!spec.ok()) return spec.status();
  // AUTO: a GPU where the daemon schedules one, else the CPU (as a local run decides).
  if (spec->device().kind() == topiary::v1::DeviceSpec::AUTO) {
    return has_gpus ? topiary::v1::DeviceSpec::CUDA : topiary::v1::DeviceSpec::CPU;
  }
  return spec->device().kind();
}

Status TopiaryService::RunCommand(grpc::ServerContext* ctx,
                                  const topiary::v1::RunCommandRequest* req,
                                  grpc::ServerWriter<topiary::v1::CommandOutput>* writer) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  auto parsed = CheckCommandArgs(req->command(), {req->args().begin(), req->args().end()});
  if (!parsed.ok()) return ToGrpc(parsed.status());
  const std::string& onnx = parsed->onnx;
  const std::string& device_flag = parsed->device;
  const std::string root = RealOrSelf(registry_->data_dir());
  // The checkpoint is checked here so that the error names it (the child's read policy
  // would refuse it too).
  if (parsed->checkpoint.empty()) {
    return Status(StatusCode::INVALID_ARGUMENT, "args: name a checkpoint in the data directory");
  }
  std::string ckpt_abs;
  if (Status st = ResolvePath("checkpoint", parsed->checkpoint, &ckpt_abs); !st.ok()) return st;
  if (!onnx.empty()) {  // export writes one new file, where an upload could go
    if (auto st = CheckWritablePath("--onnx", onnx); !st.ok()) return ToGrpc(st);
    if (PathExists(root + "/" + onnx)) {
      return Status(StatusCode::ALREADY_EXISTS, "--onnx: '" + onnx + "' exists; not replaced");
    }
    std::string abs;
    if (Status st = ResolvePath("--onnx", onnx, &abs); !st.ok()) return st;
    if (auto st = MakeDirs(abs.substr(0, abs.rfind('/'))); !st.ok()) return ToGrpc(st);
  }
  auto kind =
      CommandDevice(req->command(), device_flag, ckpt_abs, !scheduler_->Occupancy().empty());
  if (!kind.ok()) return ToGrpc(kind.status());
  CallSlot slot(&commands_, kMaxCommands);
  if (!slot.taken()) {
    return Status(StatusCode::RESOURCE_EXHAUSTED,
                  absl::StrCat(kMaxCommands, " commands are under way; try again later"));
  }
  std::vector<std::string> args(req->args().begin(), req->args().end());
  auto note = [&](const std::string& text) {
    topiary::v1::CommandOutput o;
    o.set_err(text);
    return writer->Write(o);
  };
  // Evaluate and sensitivity wait for a device in the experiments' queue.
  const std::string holder = absl::StrCat(req->command(), "-", next_command_++);
  int gpu = -1;
  bool leased = false;
  if (kind->has_value()) {
    auto need = scheduler_->NeedFor(**kind);
    if (!need.ok()) return ToGrpc(need.status());
    int last_ahead = -1;
    auto granted = scheduler_->Lease(
        holder, *need, [&] { return ctx->IsCancelled(); },
        [&](int ahead) {
          if (ahead == last_ahead) return;
          last_ahead = ahead;
          note(absl::StrCat("topiaryd: waiting for ", need->cpu ? "a CPU slot" : "a GPU", " (",
                            ahead, " ahead in the queue)\n"));
        });
    if (!granted) return Status(StatusCode::CANCELLED, "the client went away while it waited");
    leased = true;
    if (!granted->empty()) gpu = granted->front();
    // The leased device, whatever the checkpoint names (its GPU is the only one visible).
    if (device_flag.empty()) {
      args.push_back(**kind == topiary::v1::DeviceSpec::CPU ? "--device=cpu" : "--device=cuda");
    }
  }
  CommandEnvironment env;
  env.topiary_binary = options_.topiary_binary;
  env.data_dir = root;
  env.read_roots = options_.dataset_roots;
  env.read_roots.push_back(root);
  env.max_file_bytes = options_.max_file_bytes;
  auto code = RunTopiary(
      env, req->command(), args, gpu,
      [&](bool is_stderr, const std::string& bytes) {
        topiary::v1::CommandOutput o;
        if (is_stderr) {
          o.set_err(bytes);
        } else {
          o.set_out(bytes);
        }
        writer->Write(o);
      },
      [&] { return ctx->IsCancelled(); });
  if (leased) scheduler_->EndLease(holder);
  if (!code.ok()) return ToGrpc(code.status());
  topiary::v1::CommandOutput last;
  last.set_exited(true);
  last.set_exit_code(*code);
  writer->Write(last);
  return Status::OK;
}

Status TopiaryService::ReportRunEvents(grpc::ServerContext* ctx,
                                       const topiary::v1::ReportRunEventsRequest* req,
                                       topiary::v1::ReportRunEventsResponse* out) {
  if (Status st = Authorize(ctx); !st.ok()) return st;
  const std::string& id = req->experiment_id();
  if (!IsExperimentId(id)) {
    return Status(grpc::StatusCode::INVALID_ARGUMENT, "experiment_id: not an experiment id");
  }
  if (req->events_size() > 10000) {
    return Status(grpc::StatusCode::INVALID_ARGUMENT, "events: at most 10000 per call");
  }
  auto record = registry_->Get(id);
  if (!record.ok()) return ToGrpc(record.status());
  // Only the job the daemon submitted for it may speak for it, and only while it runs.
  if (record->slurm_job_id().empty() || record->slurm_job_id() != req->slurm_job_id()) {
    return Status(grpc::StatusCode::PERMISSION_DENIED,
                  "slurm_job_id: '" + req->slurm_job_id() + "' is not the job running " + id);
  }
  if (IsTerminal(record->state())) {
    return Status(grpc::StatusCode::FAILED_PRECONDITION,
                  id + " has ended (" + topiary::v1::ExperimentState_Name(record->state()) + ")");
  }
  absl::MutexLock lock(&reports_mu_);
  auto& [job, acknowledged] = reported_[id];
  if (job != req->slurm_job_id()) job = req->slurm_job_id(), acknowledged = 0;  // a new run
  for (const Event& e : req->events()) {
    if (e.seq() <= acknowledged) continue;  // sent before: a retry
    registry_->AppendRunEvent(id, e);
    acknowledged = e.seq();
  }
  out->set_acknowledged_seq(acknowledged);
  return Status::OK;
}

}  // namespace topiary::server
