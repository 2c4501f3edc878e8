// The daemon's experiments: each one's record (persisted as experiment.json), its event log
// (events.jsonl, replayed to watchers), and the controls its run polls. Everything lives
// under DATA_DIR/experiments/<id>/, written atomically (temporary file, fsync, rename), so a
// daemon killed at any moment restarts with every acknowledged experiment.
#ifndef TOPIARY_SERVER_REGISTRY_H_
#define TOPIARY_SERVER_REGISTRY_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/service.pb.h"
#include "trainer/runner.h"

namespace topiary::server {

using topiary::v1::Event;
using topiary::v1::Experiment;
using topiary::v1::ExperimentState;

bool IsTerminal(ExperimentState state);

class Registry {
 public:
  explicit Registry(std::string data_dir) : data_dir_(std::move(data_dir)) {}

  // Reads every experiment under data_dir/experiments. Experiments that were RUNNING or
  // WAITING_FOR_ROUND when the daemon stopped become QUEUED (they resume from their last
  // checkpoint); returns the ids to queue, oldest first (QUEUED ones included).
  absl::StatusOr<std::vector<std::string>> Load();

  // Creates and persists a QUEUED experiment (fsynced before this returns).
  absl::StatusOr<Experiment> Create(const topiary::v1::ExperimentSpec& spec,
                                    const std::string& parent);

  absl::StatusOr<Experiment> Get(const std::string& id) const;
  std::vector<Experiment> List(ExperimentState filter) const;
  int Count(ExperimentState state) const;

  // Sets the state (persisted) and logs a StateChanged event.
  absl::Status SetState(const std::string& id, ExperimentState state, const std::string& reason);
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
    std::atomic<int> stop{0};  // RunControl::Stop
    bool advance = false;
    topiary::v1::AdvanceRoundRequest changes;
  };
  class Control;

  Entry* Find(const std::string& id) const;  // REQUIRES: mu_ held
  absl::Status Persist(const Experiment& record) const;
  void AppendLocked(Entry* entry, Event event);  // REQUIRES: mu_ held

  std::string data_dir_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::map<std::string, std::unique_ptr<Entry>> entries_;
  int next_number_ = 1;
};

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_REGISTRY_H_
