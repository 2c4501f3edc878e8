#include "server/registry.h"

#include <dirent.h>
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer/run/events.h"
#include "trainer/util/file_util.h"

namespace topiary::server {
namespace {

using topiary::v1::ExperimentState;
using topiary::v1::ExperimentState_Name;

// Appends one line to a file; fsyncs when `sync` (state changes, rounds, checkpoints).
void AppendLine(const std::string& path, const std::string& line, bool sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  const std::string text = line + "\n";
  (void)!::write(fd, text.data(), text.size());
  if (sync) ::fdatasync(fd);
  ::close(fd);
}

std::string Relative(const std::string& data_dir, const std::string& path) {
  const std::string prefix = data_dir + "/";
  return path.rfind(prefix, 0) == 0 ? path.substr(prefix.size()) : path;
}

}  // namespace

bool IsTerminal(ExperimentState s) {
  return s == topiary::v1::SUCCEEDED || s == topiary::v1::FAILED || s == topiary::v1::CANCELLED;
}

std::string Registry::Folder(const std::string& id) const {
  return absl::StrCat(data_dir_, "/experiments/", id);
}

Registry::Entry* Registry::Find(const std::string& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.get();
}

absl::Status Registry::Persist(const Experiment& record) const {
  return WriteFileAtomic(Folder(record.id()) + "/experiment.json", MessageToJson(record) + "\n");
}

absl::StatusOr<std::vector<std::string>> Registry::Load() {
  if (auto st = MakeDirs(data_dir_); !st.ok()) return st;
  const std::string root = data_dir_ + "/experiments";
  if (auto st = MakeDirs(root); !st.ok()) return st;
  std::vector<std::string> ids;
  if (DIR* dir = ::opendir(root.c_str())) {
    while (dirent* d = ::readdir(dir)) {
      const std::string name = d->d_name;
      if (name.rfind("exp-", 0) == 0) ids.push_back(name);
    }
    ::closedir(dir);
  }
  std::sort(ids.begin(), ids.end());
  std::vector<std::string> queue;
  absl::MutexLock lock(&mu_);
  for (const std::string& id : ids) {
    auto json = ReadFile(Folder(id) + "/experiment.json");
    if (!json.ok()) continue;  // created but never acknowledged: the record is written first
    auto entry = std::make_unique<Entry>();
    google::protobuf::util::JsonParseOptions lenient;
    lenient.ignore_unknown_fields = true;
    if (!google::protobuf::util::JsonStringToMessage(*json, &entry->record, lenient).ok()) {
      continue;
    }
    std::ifstream events(Folder(id) + "/events.jsonl");
    for (std::string line; std::getline(events, line);) {
      Event e;
      if (google::protobuf::util::JsonStringToMessage(line, &e, lenient).ok()) {
        entry->events.push_back(std::move(e));  // a line cut by a crash fails and is skipped
      }
    }
    next_number_ = std::max(next_number_, std::atoi(id.c_str() + 4) + 1);
    Entry* raw = entry.get();
    entries_[id] = std::move(entry);
    const ExperimentState state = raw->record.state();
    if (state == topiary::v1::RUNNING || state == topiary::v1::WAITING_FOR_ROUND) {
      Experiment& r = raw->record;
      r.set_crashes(r.crashes() + 1);
      if (r.crashes() >= max_restarts_) {
        (void)SetStateLocked(
            raw, topiary::v1::FAILED,
            absl::StrCat("the daemon stopped ", r.crashes(),
                         " times while this experiment ran, without a checkpoint in between; "
                         "it is not restarted again (a run that crashes the daemon?)",
                         r.last_checkpoint().empty() ? "" : "; last checkpoint ",
                         r.last_checkpoint()));
      } else {
        (void)SetStateLocked(
            raw, topiary::v1::QUEUED,
            r.last_checkpoint().empty()
                ? "the daemon restarted; the run starts again"
                : "the daemon restarted; the run resumes from " + r.last_checkpoint());
      }
    }
    if (raw->record.state() == topiary::v1::QUEUED) queue.push_back(id);
  }
  return queue;
}

absl::StatusOr<Experiment> Registry::Create(const topiary::v1::ExperimentSpec& spec,
                                            const std::string& parent) {
  absl::MutexLock lock(&mu_);
  const std::string id = absl::StrFormat("exp-%04d", next_number_++);
  auto entry = std::make_unique<Entry>();
  Experiment& r = entry->record;
  r.set_id(id);
  r.set_name(spec.name().empty() ? id : spec.name());
  r.set_state(topiary::v1::QUEUED);
  *r.mutable_spec() = spec;
  r.set_created_at(NowIso8601());
  r.set_updated_at(r.created_at());
  r.set_parent(parent);
  r.set_folder("experiments/" + id);
  if (auto st = MakeDirs(Folder(id)); !st.ok()) return st;
  if (auto st = Persist(r); !st.ok()) return st;
  Entry* raw = entry.get();
  entries_[id] = std::move(entry);
  Event e;
  e.mutable_state()->set_state("QUEUED");
  e.mutable_state()->set_reason("submitted");
  AppendLocked(raw, std::move(e));
  return raw->record;
}

absl::StatusOr<Experiment> Registry::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  const Entry* e = Find(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no experiment '", id, "'"));
  return e->record;
}

std::vector<Experiment> Registry::List(ExperimentState filter) const {
  absl::MutexLock lock(&mu_);
  std::vector<Experiment> out;
  for (const auto& [id, e] : entries_) {
    if (filter == topiary::v1::STATE_UNSPECIFIED || e->record.state() == filter) {
      out.push_back(e->record);
    }
  }
  return out;
}

int Registry::Count(ExperimentState state) const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [id, e] : entries_) n += e->record.state() == state;
  return n;
}

void Registry::AppendLocked(Entry* entry, Event event) {
  const uint32_t seq = entry->events.empty() ? 1 : entry->events.back().seq() + 1;
  event.set_seq(seq);
  if (event.time_s() == 0) event.set_time_s(static_cast<double>(std::time(nullptr)));
  entry->record.set_last_seq(seq);
  const bool sync = !event.has_progress() && !event.has_epoch() &&
                    !(event.has_planning() && !event.planning().done());
  AppendLine(Folder(entry->record.id()) + "/events.jsonl", MessageToJson(event), sync);
  entry->events.push_back(std::move(event));
  changed_.SignalAll();
}

absl::Status Registry::SetState(const std::string& id, ExperimentState state,
                                const std::string& reason) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no experiment '", id, "'"));
  return SetStateLocked(e, state, reason);
}

absl::StatusOr<Experiment> Registry::Transition(const std::string& id,
                                                std::initializer_list<ExperimentState> from,
                                                ExperimentState to, const std::string& reason,
                                                const std::string& verb) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no experiment '", id, "'"));
  if (std::find(from.begin(), from.end(), e->record.state()) == from.end()) {
    std::vector<std::string> names;
    for (ExperimentState s : from) names.push_back(ExperimentState_Name(s));
    return absl::FailedPreconditionError(
        absl::StrCat(id, " is ", ExperimentState_Name(e->record.state()), "; only ",
                     absl::StrJoin(names, " or "), " can ", verb));
  }
  if (auto st = SetStateLocked(e, to, reason); !st.ok()) return st;
  return e->record;
}

absl::Status Registry::RequestPause(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no experiment '", id, "'"));
  const ExperimentState s = e->record.state();
  if (s != topiary::v1::QUEUED && s != topiary::v1::RUNNING &&
      s != topiary::v1::WAITING_FOR_ROUND) {
    return absl::FailedPreconditionError(
        absl::StrCat(id, " is ", ExperimentState_Name(s),
                     "; only QUEUED, RUNNING or WAITING_FOR_ROUND can pause"));
  }
  e->stop = static_cast<int>(RunControl::Stop::kPause);
  e->resume_after_pause = false;
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<Experiment> Registry::Resume(const std::string& id, bool* requeue) {
  absl::MutexLock lock(&mu_);
  *requeue = false;
  Entry* e = Find(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no experiment '", id, "'"));
  const ExperimentState s = e->record.state();
  if (s == topiary::v1::PAUSED) {
    *requeue = true;
    if (auto st = SetStateLocked(e, topiary::v1::QUEUED, "resumed"); !st.ok()) return st;
    return e->record;
  }
  const bool pause_pending = e->stop.load() == static_cast<int>(RunControl::Stop::kPause);
  if (pause_pending && (s == topiary::v1::QUEUED || s == topiary::v1::RUNNING ||
                        s == topiary::v1::WAITING_FOR_ROUND)) {
    e->stop = 0;
    e->resume_after_pause = true;
    Event ev;
    ev.mutable_state()->set_state(ExperimentState_Name(s));
    ev.mutable_state()->set_reason("resumed: the pending pause is withdrawn");
    AppendLocked(e, std::move(ev));
    return e->record;
  }
  return absl::FailedPreconditionError(
      absl::StrCat(id, " is ", ExperimentState_Name(s), "; only PAUSED can resume"));
}

bool Registry::FinishRun(const std::string& id, const std::string& run_state,
                         const std::string& error, bool daemon_stopping) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return false;
  bool requeue = false;
  if (run_state == "SUCCEEDED") {
    (void)SetStateLocked(e, topiary::v1::SUCCEEDED, "finished");
  } else if (run_state == "PAUSED") {
    if (daemon_stopping) {
      (void)SetStateLocked(e, topiary::v1::QUEUED,
                           "the daemon stopped; it resumes when it restarts");
    } else if (e->resume_after_pause) {
      requeue = true;
      (void)SetStateLocked(e, topiary::v1::QUEUED, "resumed right after it paused");
    } else {
      (void)SetStateLocked(e, topiary::v1::PAUSED, "paused");
    }
  } else if (run_state == "CANCELLED") {
    (void)SetStateLocked(e, topiary::v1::CANCELLED, "cancelled");
  } else {
    (void)SetStateLocked(e, topiary::v1::FAILED, error);
  }
  e->resume_after_pause = false;
  return requeue;
}

absl::Status Registry::SetStateLocked(Entry* e, ExperimentState state, const std::string& reason) {
  e->record.set_state(state);
  e->record.set_updated_at(NowIso8601());
  if (state == topiary::v1::FAILED) e->record.set_error(reason);
  // A stop request is cleared when the experiment is queued again (resume, restart), not
  // when it starts running: a pause that raced with the start must still take effect.
  if (state == topiary::v1::QUEUED) e->stop = 0;
  Event ev;
  ev.mutable_state()->set_state(ExperimentState_Name(state));
  ev.mutable_state()->set_reason(reason);
  AppendLocked(e, std::move(ev));
  return Persist(e->record);
}

absl::Status Registry::Update(const std::string& id,
                              const std::function<void(Experiment*)>& change) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no experiment '", id, "'"));
  change(&e->record);
  e->record.set_updated_at(NowIso8601());
  return Persist(e->record);
}

void Registry::AppendRunEvent(const std::string& id, Event event) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return;
  Experiment& r = e->record;
  bool persist = false;
  if (event.has_started()) r.set_device(event.started().device());
  if (event.has_epoch() && event.epoch().evaluated()) r.set_test_top1(event.epoch().test_top1());
  if (event.has_round()) {
    r.set_round(event.round().round());
    r.set_test_top1(event.round().test_top1());
    r.set_sparsity(event.round().sparsity());
    persist = true;
  }
  if (event.has_checkpoint()) {
    r.set_crashes(0);  // progress since the last restart: not a crash loop
    r.set_last_checkpoint(Relative(data_dir_, event.checkpoint().path()));
    r.set_epoch(event.checkpoint().epoch());
    event.mutable_checkpoint()->set_path(r.last_checkpoint());
    persist = true;
  }
  if (event.has_summary()) {
    const auto& s = event.summary();
    if (s.state() == "SUCCEEDED") {
      r.set_test_top1(s.test_top1());
      r.set_sparsity(s.sparsity());
      r.set_epoch(s.epochs());
    }
    event.mutable_summary()->set_out_dir(r.folder());
    event.mutable_summary()->set_checkpoint(r.last_checkpoint());
    persist = true;
  }
  event.set_time_s(static_cast<double>(std::time(nullptr)));
  AppendLocked(e, std::move(event));
  if (persist) {
    r.set_updated_at(NowIso8601());
    (void)Persist(r);
  }
}

std::vector<Event> Registry::EventsAfter(const std::string& id, uint32_t from_seq,
                                         std::chrono::milliseconds wait, bool* done) const {
  absl::MutexLock lock(&mu_);
  std::vector<Event> out;
  *done = false;
  const Entry* e = Find(id);
  if (e == nullptr) {
    *done = true;
    return out;
  }
  auto collect = [&] {
    for (const Event& ev : e->events) {
      if (ev.seq() > from_seq) out.push_back(ev);
    }
  };
  collect();
  if (out.empty() && !IsTerminal(e->record.state())) {
    changed_.WaitWithTimeout(&mu_, absl::FromChrono(wait));
    collect();
  }
  *done = IsTerminal(e->record.state());
  return out;
}

void Registry::RequestStop(const std::string& id, RunControl::Stop stop) {
  absl::MutexLock lock(&mu_);
  if (Entry* e = Find(id)) {
    e->stop = static_cast<int>(stop);
    changed_.SignalAll();
  }
}

absl::Status Registry::Advance(const topiary::v1::AdvanceRoundRequest& request) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(request.id());
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no experiment '", request.id(), "'"));
  if (e->record.state() != topiary::v1::WAITING_FOR_ROUND) {
    return absl::FailedPreconditionError(absl::StrCat(request.id(), " is ",
                                                      ExperimentState_Name(e->record.state()),
                                                      "; AdvanceRound needs WAITING_FOR_ROUND"));
  }
  e->advance = true;
  e->changes = request;
  changed_.SignalAll();
  return absl::OkStatus();
}

// The RunControl of one experiment's run: reads the stop flag, and waits for AdvanceRound.
class Registry::Control : public RunControl {
 public:
  // Entries are never removed, so `entry` outlives the run.
  Control(Registry* registry, std::string id, Entry* entry)
      : registry_(registry), id_(std::move(id)), entry_(entry) {}

  // Polled every training step: an atomic read, no lock.
  Stop ShouldStop() override { return static_cast<Stop>(entry_->stop.load()); }

  Stop WaitForRound(int completed_round, topiary::v1::PruningSpec* next) override {
    (void)registry_->SetState(id_, topiary::v1::WAITING_FOR_ROUND,
                              absl::StrCat("round ", completed_round, " done"));
    {
      absl::MutexLock lock(&registry_->mu_);
      Entry* e = entry_;
      while (!e->advance && e->stop.load() == 0) registry_->changed_.Wait(&registry_->mu_);
      if (e->stop.load() != 0) return static_cast<Stop>(e->stop.load());
      const auto& c = e->changes;
      if (c.has_target()) next->set_target(c.target());
      if (c.has_step_fraction()) next->set_step_fraction(c.step_fraction());
      if (c.has_finetune_epochs()) next->set_finetune_epochs(c.finetune_epochs());
      e->advance = false;
      *e->record.mutable_spec()->mutable_pruning() = *next;
    }
    (void)registry_->SetState(id_, topiary::v1::RUNNING,
                              absl::StrCat("advanced after round ", completed_round));
    return Stop::kNone;
  }

 private:
  Registry* registry_;
  std::string id_;
  Entry* entry_;
};

std::unique_ptr<RunControl> Registry::ControlFor(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  return e ? std::make_unique<Control>(this, id, e) : nullptr;
}

}  // namespace topiary::server
