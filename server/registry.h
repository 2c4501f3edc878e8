// The daemon's experiments: each one's record (persisted as experiment.json), its event log
// (events.jsonl, replayed to watchers), and the controls its run polls. Everything lives
// under DATA_DIR/experiments/<id>/, written atomically (temporary file, fsync, rename), so a
// daemon killed at any moment restarts with every acknowledged experiment.
#ifndef TOPIARY_SERVER_REGISTRY_H_
#define TOPIARY_SERVER_REGISTRY_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "topiary/v1/service.pb.h"
#include "trainer/run/runner.h"

namespace topiary::server {

using topiary::v1::Event;
using topiary::v1::Experiment;
using topiary::v1::ExperimentState;

bool IsTerminal(ExperimentState state);
// "exp-" and 4 to 8 digits: the only folder names under experiments/ the daemon reads.
bool IsExperimentId(const std::string& id);

class Registry {
 public:
  // An experiment that was running when the daemon died `max_restarts` times without
  // writing a checkpoint in between is FAILED on the next start instead of restarted.
  explicit Registry(std::string data_dir, int max_restarts = 3)
      : data_dir_(std::move(data_dir)), max_restarts_(max_restarts) {}

  // Reads every experiment under data_dir/experiments. Experiments that were RUNNING or
  // WAITING_FOR_ROUND when the daemon stopped become QUEUED (they resume from their last
  // checkpoint), or FAILED when they keep taking the daemon down; returns the ids to queue,
  // oldest first (QUEUED ones included).
  absl::StatusOr<std::vector<std::string>> Load();

  // Creates and persists a QUEUED experiment (fsynced before this returns).
  absl::StatusOr<Experiment> Create(const topiary::v1::ExperimentSpec& spec,
                                    const std::string& parent);

  absl::StatusOr<Experiment> Get(const std::string& id) const;
  std::vector<Experiment> List(ExperimentState filter) const;
  // One page of List: the experiments after id `after` ("" : from the first), at most
  // `max_count` of them and about `max_bytes` of records (at least one). `*next` is the
  // last id returned when more follow, else empty.
  std::vector<Experiment> ListPage(ExperimentState filter, const std::string& after,
                                   size_t max_count, size_t max_bytes, std::string* next) const;
  int Count(ExperimentState state) const;

  // Sets the state (persisted) and logs a StateChanged event.
  absl::Status SetState(const std::string& id, ExperimentState state, const std::string& reason);
  // Sets the state only when the current one is among `from`, atomically; otherwise
  // FAILED_PRECONDITION naming the state and `verb`.
  absl::StatusOr<Experiment> Transition(const std::string& id,
                                        std::initializer_list<ExperimentState> from,
                                        ExperimentState to, const std::string& reason,
                                        const std::string& verb);

  // The state machine's edges that race with a run, each decided under one lock:
  // A pause of a run under way (RUNNING, WAITING_FOR_ROUND, or QUEUED but already taken by
  // a worker): the run checkpoints at its next step boundary and ends PAUSED.
  absl::Status RequestPause(const std::string& id);
  // Resume: PAUSED becomes QUEUED (`*requeue` set: the caller queues it). A pause still
  // pending is withdrawn instead, and should the run have stopped for it meanwhile,
  // FinishRun queues it again: a Resume that follows a Pause is never lost.
  absl::StatusOr<Experiment> Resume(const std::string& id, bool* requeue);
  // Cancel of an experiment that is not in the scheduler's queue: PAUSED becomes CANCELLED
  // (persisted before this returns); a run under way is asked to stop and ends CANCELLED,
  // also when it was writing a pause checkpoint. FAILED_PRECONDITION when terminal.
  absl::StatusOr<Experiment> RequestCancel(const std::string& id);
  // The end of a run: its final state from the run's summary state ("SUCCEEDED", "PAUSED",
  // "CANCELLED", else FAILED with `error`). `daemon_stopping` turns a pause into QUEUED.
  // True when the experiment must be queued again.
  bool FinishRun(const std::string& id, ExperimentState run_state, const std::string& error,
                 bool daemon_stopping);
  // Applies `change` to the record under the lock and persists it.
  absl::Status Update(const std::string& id, const std::function<void(Experiment*)>& change);

  // Appends a run event: numbers it, keeps it, writes it to events.jsonl, wakes watchers,
  // and folds what it says (epoch, round, metrics, checkpoint) into the record.
  void AppendRunEvent(const std::string& id, Event event);

  // Events with seq > from_seq, waiting up to `wait` for one when there are none. `done` is
  // set when the experiment is terminal and every event has been returned.
  std::vector<Event> EventsAfter(const std::string& id, uint32_t from_seq,
                                 std::chrono::milliseconds wait, bool* done) const;

  // Requests a pause or cancel of a running experiment (polled by its run).
  void RequestStop(const std::string& id, RunControl::Stop stop);
  // Lets an experiment waiting for a round continue with `request`'s changes.
  absl::Status Advance(const topiary::v1::AdvanceRoundRequest& request);
  // The RunControl a worker passes to the run of experiment `id` (null if unknown).
  std::unique_ptr<RunControl> ControlFor(const std::string& id);

  const std::string& data_dir() const { return data_dir_; }
  std::string Folder(const std::string& id) const;  // absolute

 private:
  struct Entry {
    Experiment record;
    std::vector<Event> events;
    std::atomic<int> stop{0};         // RunControl::Stop
    bool resume_after_pause = false;  // a Resume came while a pause was pending
    bool advance = false;
    topiary::v1::AdvanceRoundRequest changes;
  };
  class Control;

  Entry* Find(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Persist(const Experiment& record) const;
  // Persist for what was acknowledged (state changes, a cancel request): on a full disk the
  // reserve file is given up to make room, once, so that the record still says it.
  absl::Status PersistAcknowledged(const Experiment& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // (Re)makes the reserve, data_dir/.reserve (kReserveBytes), where there is room for it;
  // false when it is not there.
  bool MakeReserve() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string ReservePath() const;
  // Persists the new state, then applies it (record, stop flag, state event). A failed write
  // is returned; it changes nothing unless `force`, when the state is applied all the same
  // and the failure said on stderr and in the event.
  absl::Status ChangeStateLocked(Entry* e, ExperimentState state, const std::string& reason,
                                 bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ChangeStateLocked without force: a failed write changes nothing and is returned.
  absl::Status SetStateLocked(Entry* e, ExperimentState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A change that has happened whatever the disk says (a run's end, a round done, the
  // state found at start): applied even when it cannot be persisted, and then said on
  // stderr and in the state event.
  void ForceStateLocked(Entry* e, ExperimentState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AppendLocked(Entry* entry, Event event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string data_dir_;
  int max_restarts_;
  // Guards every Entry's fields too (their `stop` is also read without it: it is atomic).
  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;  // an event was appended, or a stop, advance or state change
  std::map<std::string, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  int next_number_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_REGISTRY_H_
