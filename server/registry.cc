#include "server/registry.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "trainer/util/file_util.h"
#include "trainer/util/json.h"
#include "trainer/util/utf8.h"

namespace topiary::server {
namespace {

using topiary::v1::ExperimentState;
using topiary::v1::ExperimentState_Name;

// Appends one line to the event log; fsyncs when `sync` (state changes, rounds,
// checkpoints). The log's own copy in memory stays whole; a failed write is said on stderr.
void AppendLine(const std::string& path, const std::string& line, bool sync) {
  absl::Status st = AppendToFile(path, line + "\n", sync);
  if (!st.ok()) std::fprintf(stderr, "topiaryd: %s\n", std::string(st.message()).c_str());
}

// An error for a record and a table cell: libraries' multi-line texts (HDF5's error stack)
// on one line, without controls.
std::string SingleLine(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool space = c == '\n' || c == '\r' || c == '\t';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out.push_back(space ? ' ' : c);
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return Printable(out);
}

std::string Relative(const std::string& data_dir, const std::string& path) {
  const std::string prefix = data_dir + "/";
  return path.rfind(prefix, 0) == 0 ? path.substr(prefix.size()) : path;
}

}  // namespace

bool IsExperimentId(const std::string& id) {
  if (id.size() < 8 || id.size() > 12 || id.rfind("exp-", 0) != 0) return false;
  return std::all_of(id.begin() + 4, id.end(), [](char c) { return c >= '0' && c <= '9'; });
}

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
  return WriteFileAtomic(Folder(record.id()) + "/experiment.json", ToJson(record) + "\n");
}

namespace {
// Room for a few hundred record rewrites (each makes a new file, then frees the old one).
constexpr size_t kReserveBytes = 1 << 20;
}  // namespace

std::string Registry::ReservePath() const { return data_dir_ + "/.reserve"; }

bool Registry::MakeReserve() {
  const std::string reserve = ReservePath();
  return PathExists(reserve) || WriteFileAtomic(reserve, std::string(kReserveBytes, '\0')).ok();
}

absl::Status Registry::PersistAcknowledged(const Experiment& record) {
  absl::Status st = Persist(record);
  const std::string reserve = ReservePath();
  if (absl::IsResourceExhausted(st) && PathExists(reserve) && ::unlink(reserve.c_str()) == 0) {
    std::fprintf(
        stderr, "topiaryd: the disk is full; its reserve (%s) was freed to record %s as %s\n",
        reserve.c_str(), record.id().c_str(), ExperimentState_Name(record.state()).c_str());
    st = Persist(record);
  }
  return st;
}

absl::StatusOr<std::vector<std::string>> Registry::Load() {
  if (auto st = MakeDirs(data_dir_); !st.ok()) return st;
  const std::string root = data_dir_ + "/experiments";
  if (auto st = MakeDirs(root); !st.ok()) return st;
  std::vector<std::string> ids;
  if (DIR* dir = ::opendir(root.c_str())) {
    while (dirent* d = ::readdir(dir)) {
      const std::string name = d->d_name;
      if (IsExperimentId(name)) ids.push_back(name);
    }
    ::closedir(dir);
  }
  std::sort(ids.begin(), ids.end());
  std::vector<std::string> queue;
  absl::MutexLock lock(&mu_);
  (void)MakeReserve();
  for (const std::string& id : ids) {
    // Every folder's number stays taken, whatever is (or is not) in it: a new experiment
    // never reuses a folder and its old checkpoints.
    next_number_ = std::max(next_number_, std::atoi(id.c_str() + 4) + 1);
    auto json = ReadFile(Folder(id) + "/experiment.json");
    if (!json.ok()) continue;  // created but never acknowledged: the record is written first
    auto entry = std::make_unique<Entry>();
    const std::string record = Folder(id) + "/experiment.json";
    if (auto st = FromJson(*json, &entry->record, record, JsonUnknown::kIgnore); !st.ok()) {
      std::fprintf(stderr, "topiaryd: %s; left out\n", std::string(st.message()).c_str());
      continue;
    }
    // The record names its own folder: it must be this one (a record whose id pointed
    // elsewhere would have the daemon write there).
    if (entry->record.id() != id || entry->record.folder() != "experiments/" + id) {
      std::fprintf(stderr, "topiaryd: %s/experiment.json names id '%s' and folder '%s'; left out\n",
                   Folder(id).c_str(), entry->record.id().c_str(), entry->record.folder().c_str());
      continue;
    }
    // Through the checked reader like every other file: a FIFO or device planted here is
    // refused without blocking, a link out is not followed.
    auto events = ReadFile(Folder(id) + "/events.jsonl");
    if (!events.ok() && !absl::IsNotFound(events.status())) {
      std::fprintf(stderr, "topiaryd: %s; its events are left out\n",
                   std::string(events.status().message()).c_str());
    }
    for (absl::string_view line : absl::StrSplit(events.ok() ? *events : "", '\n')) {
      Event e;
      if (!line.empty() && FromJson(line, &e, "events.jsonl", JsonUnknown::kIgnore).ok()) {
        entry->events.push_back(std::move(e));  // a line cut by a crash fails and is skipped
      }
    }
    Entry* raw = entry.get();
    entries_[id] = std::move(entry);
    const ExperimentState state = raw->record.state();
    if (raw->record.cancel_requested() && !IsTerminal(state)) {
      // Acknowledged before the daemon stopped: never run again.
      ForceStateLocked(raw, topiary::v1::CANCELLED,
                       "cancelled (the cancel was acknowledged before the daemon stopped)");
    } else if (state == topiary::v1::RUNNING || state == topiary::v1::WAITING_FOR_ROUND) {
      Experiment& r = raw->record;
      r.set_crashes(r.crashes() + 1);
      if (r.crashes() >= max_restarts_) {
        ForceStateLocked(
            raw, topiary::v1::FAILED,
            absl::StrCat("the daemon stopped ", r.crashes(),
                         " times while this experiment ran, without a checkpoint in between; "
                         "it is not restarted again (a run that crashes the daemon?)",
                         r.last_checkpoint().empty() ? "" : "; last checkpoint ",
                         r.last_checkpoint()));
      } else {
        ForceStateLocked(raw, topiary::v1::QUEUED,
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
  // Without its reserve the daemon could not record what it acknowledges about a new
  // experiment (a cancel, the end of its run): no new work until the disk has room.
  if (!MakeReserve()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the data directory's disk is full (", ReservePath(),
        ", the room kept for recording experiments, cannot be made); free space and submit "
        "again"));
  }
  // A folder of its own, made now: a name that exists (left over, or planted: a link) is
  // passed over rather than written into.
  std::string id;
  for (int tries = 0; id.empty(); ++tries) {
    const std::string candidate = absl::StrFormat("exp-%04d", next_number_++);
    if (::mkdir(Folder(candidate).c_str(), 0755) == 0) {
      id = candidate;
    } else if (errno != EEXIST || tries >= 1000) {
      return ErrnoStatus(errno, "cannot create the experiment's folder " + Folder(candidate));
    }
  }
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
  if (auto st = Persist(r); !st.ok()) {
    ::rmdir(Folder(id).c_str());
    return st;
  }
  Entry* raw = entry.get();
  entries_[id] = std::move(entry);
  Event e;
  e.mutable_state()->set_state(topiary::v1::QUEUED);
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

std::vector<Experiment> Registry::ListPage(ExperimentState filter, const std::string& after,
                                           size_t max_count, size_t max_bytes,
                                           std::string* next) const {
  absl::MutexLock lock(&mu_);
  std::vector<Experiment> out;
  size_t bytes = 0;
  next->clear();
  for (auto it = after.empty() ? entries_.begin() : entries_.upper_bound(after);
       it != entries_.end(); ++it) {
    const Experiment& r = it->second->record;
    if (filter != topiary::v1::STATE_UNSPECIFIED && r.state() != filter) continue;
    const size_t size = r.ByteSizeLong();
    if (!out.empty() && (out.size() >= max_count || bytes + size > max_bytes)) {
      *next = out.back().id();
      break;
    }
    out.push_back(r);
    bytes += size;
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
  AppendLine(Folder(entry->record.id()) + "/events.jsonl", ToJson(event), sync);
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

absl::StatusOr<Experiment> Registry::RequestCancel(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no experiment '", id, "'"));
  const ExperimentState s = e->record.state();
  if (IsTerminal(s)) {
    return absl::FailedPreconditionError(absl::StrCat(id, " is already ", ExperimentState_Name(s)));
  }
  if (s == topiary::v1::PAUSED) {  // no run: cancelled now
    if (auto st = SetStateLocked(e, topiary::v1::CANCELLED, "cancelled"); !st.ok()) return st;
    return e->record;
  }
  // A run under way (or taken by a worker): it stops at its next step boundary, and
  // FinishRun records CANCELLED even if it was pausing meanwhile. Recorded before it is
  // acknowledged, so that a daemon restarted before then does not run it again.
  Experiment next = e->record;
  next.set_cancel_requested(true);
  next.set_updated_at(NowIso8601());
  if (absl::Status st = PersistAcknowledged(next); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("cannot record the cancel of ", id, ": ",
                                                st.message(), "; nothing was changed"));
  }
  e->record = std::move(next);
  e->stop = static_cast<int>(RunControl::Stop::kCancel);
  e->resume_after_pause = false;
  changed_.SignalAll();
  return e->record;
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
    ev.mutable_state()->set_state(s);
    ev.mutable_state()->set_reason("resumed: the pending pause is withdrawn");
    AppendLocked(e, std::move(ev));
    return e->record;
  }
  return absl::FailedPreconditionError(
      absl::StrCat(id, " is ", ExperimentState_Name(s), "; only PAUSED can resume"));
}

bool Registry::FinishRun(const std::string& id, ExperimentState run_state, const std::string& error,
                         bool daemon_stopping) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return false;
  bool requeue = false;
  const bool cancel_pending = e->stop.load() == static_cast<int>(RunControl::Stop::kCancel);
  if (run_state == topiary::v1::SUCCEEDED) {
    ForceStateLocked(e, topiary::v1::SUCCEEDED, "finished");
  } else if (run_state == topiary::v1::PAUSED && cancel_pending) {
    // A Cancel that came while the run wrote its pause checkpoint: acknowledged, so kept.
    ForceStateLocked(e, topiary::v1::CANCELLED, "cancelled while it paused");
  } else if (run_state == topiary::v1::PAUSED) {
    if (daemon_stopping) {
      ForceStateLocked(e, topiary::v1::QUEUED, "the daemon stopped; it resumes when it restarts");
    } else if (e->resume_after_pause) {
      requeue = true;
      ForceStateLocked(e, topiary::v1::QUEUED, "resumed right after it paused");
    } else {
      ForceStateLocked(e, topiary::v1::PAUSED, "paused");
    }
  } else if (run_state == topiary::v1::CANCELLED) {
    ForceStateLocked(e, topiary::v1::CANCELLED, "cancelled");
  } else {
    ForceStateLocked(e, topiary::v1::FAILED, SingleLine(error));
  }
  e->resume_after_pause = false;
  (void)MakeReserve();  // where a full disk had it spent, and has room again
  return requeue;
}

absl::Status Registry::ChangeStateLocked(Entry* e, ExperimentState state, const std::string& reason,
                                         bool force) {
  Experiment next = e->record;
  next.set_state(state);
  next.set_updated_at(NowIso8601());
  if (state == topiary::v1::FAILED) next.set_error(reason);
  absl::Status saved = PersistAcknowledged(next);
  if (!saved.ok()) {
    saved = absl::Status(
        saved.code(), absl::StrCat("cannot record ", next.id(), " as ", ExperimentState_Name(state),
                                   ": ", saved.message()));
    if (!force) return saved;
    std::fprintf(stderr, "topiaryd: %s\n", std::string(saved.message()).c_str());
  }
  e->record = std::move(next);
  // A stop request is cleared when the experiment is queued again (resume, restart), not
  // when it starts running: a pause that raced with the start must still take effect.
  if (state == topiary::v1::QUEUED) e->stop = 0;
  Event ev;
  ev.mutable_state()->set_state(state);
  ev.mutable_state()->set_reason(
      saved.ok() ? reason
                 : absl::StrCat(reason, " (not saved: ", saved.message(),
                                "; a restarted daemon acts on the state it last saved)"));
  AppendLocked(e, std::move(ev));
  return saved;
}

absl::Status Registry::SetStateLocked(Entry* e, ExperimentState state, const std::string& reason) {
  return ChangeStateLocked(e, state, reason, /*force=*/false);
}

void Registry::ForceStateLocked(Entry* e, ExperimentState state, const std::string& reason) {
  (void)ChangeStateLocked(e, state, reason, /*force=*/true);  // said on stderr and in the event
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
  if (event.has_epoch() && event.epoch().evaluated()) {
    r.set_test_top1(event.epoch().test_top1());
    r.set_val_top1(event.epoch().val_top1());
  }
  if (event.has_round()) {
    r.set_round(event.round().round());
    r.set_test_top1(event.round().test_top1());
    r.set_val_top1(event.round().val_top1());
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
    if (s.state() == topiary::v1::SUCCEEDED) {
      r.set_test_top1(s.test_top1());
      r.set_val_top1(s.val_top1());
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
    if (absl::Status st = Persist(r); !st.ok()) {
      std::fprintf(stderr, "topiaryd: %s: cannot save the record: %s\n", id.c_str(),
                   std::string(st.message()).c_str());
    }
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
  // One answer per round: a second call before the run takes the first would replace it,
  // and an acknowledged --finish or next round would be lost.
  if (e->advance) {
    return absl::FailedPreconditionError(
        absl::StrCat(request.id(), ": an AdvanceRound for this round is already accepted (",
                     e->changes.finish() ? "finish" : "next round",
                     ") and the run is taking it; call again once it waits for the next round"));
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
    {
      absl::MutexLock lock(&registry_->mu_);
      Entry* e = entry_;
      registry_->ForceStateLocked(e, topiary::v1::WAITING_FOR_ROUND,
                                  absl::StrCat("round ", completed_round, " done"));
      while (!e->advance && e->stop.load() == 0) registry_->changed_.Wait(&registry_->mu_);
      if (e->stop.load() != 0) return static_cast<Stop>(e->stop.load());
      const auto& c = e->changes;
      e->advance = false;
      if (c.finish()) {
        registry_->ForceStateLocked(e, topiary::v1::RUNNING,
                                    absl::StrCat("rounds finished after round ", completed_round));
        return Stop::kFinish;
      }
      if (c.has_target()) next->set_target(c.target());
      if (c.has_step_fraction()) next->set_step_fraction(c.step_fraction());
      if (c.has_finetune_epochs()) next->set_finetune_epochs(c.finetune_epochs());
      *e->record.mutable_spec()->mutable_pruning() = *next;
      registry_->ForceStateLocked(e, topiary::v1::RUNNING,
                                  absl::StrCat("advanced after round ", completed_round));
    }
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
