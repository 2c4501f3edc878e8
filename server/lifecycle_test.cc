// The lifecycle edges that race with a run, in process: the real registry, scheduler and
// service (called directly, as gRPC would), with real CPU runs of a small lenet5.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "server/registry.h"
#include "server/scheduler.h"
#include "server/service.h"
#include "trainer/spec/spec.h"
#include "trainer/util/file_util.h"
#include "util/test_dir.h"

namespace topiary::server {
namespace {

using topiary::v1::Experiment;
using topiary::v1::ExperimentRef;
using topiary::v1::ExperimentState;

// lenet5 on 2,000 Fashion-MNIST images, for far more epochs than a test waits: it runs
// until the test stops it.
topiary::v1::ExperimentSpec LongSpec() {
  auto spec = ParseSpec(R"(
    name: "long" seed: 1
    model { arch: "lenet5" }
    data { dataset: FASHION_MNIST batch_size: 32 train_limit: 2000 test_limit: 200 }
    train { epochs: 1000 optimizer { lr: 0.01 momentum: 0.9 } }
    device { kind: CPU threads: 1 }
  )",
                        "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return WithDefaults(*spec);
}

class Daemon {
 public:
  explicit Daemon(const std::string& name, int slots = 2,
                  std::function<void(const std::string&)> after_run = nullptr) {
    dir_ = testing::TestPath(name);
    registry_ = std::make_unique<Registry>(dir_);
    EXPECT_TRUE(registry_->Load().ok());
    SchedulerOptions options;
    options.cpu_slots = slots;
    options.progress_interval_s = 0.01;
    options.after_run = std::move(after_run);
    scheduler_ = std::make_unique<Scheduler>(registry_.get(), options);
    scheduler_->Start();
    service_ =
        std::make_unique<TopiaryService>(registry_.get(), scheduler_.get(), ServiceOptions{});
  }
  ~Daemon() {
    for (const auto& e : registry_->List(topiary::v1::STATE_UNSPECIFIED)) {
      if (!IsTerminal(e.state())) Call(&TopiaryService::CancelExperiment, e.id());
    }
    scheduler_.reset();
  }

  std::string Submit() {
    auto created = registry_->Create(LongSpec(), "");
    EXPECT_TRUE(created.ok()) << created.status();
    scheduler_->Enqueue(created->id());
    return created->id();
  }
  grpc::Status Call(grpc::Status (TopiaryService::*method)(grpc::ServerContext*,
                                                           const ExperimentRef*, Experiment*),
                    const std::string& id, Experiment* out = nullptr) {
    ExperimentRef ref;
    ref.set_id(id);
    Experiment ignored;
    return (service_.get()->*method)(nullptr, &ref, out ? out : &ignored);
  }
  ExperimentState State(const std::string& id) { return registry_->Get(id)->state(); }
  // Waits until `id` is in `state` with at least `events` events logged.
  bool WaitFor(const std::string& id, ExperimentState state, uint32_t events = 0,
               double seconds = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      auto r = registry_->Get(id);
      if (r.ok() && r->state() == state && r->last_seq() >= events) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
  uint32_t Seq(const std::string& id) { return registry_->Get(id)->last_seq(); }
  const std::string& dir() const { return dir_; }
  Registry& registry() { return *registry_; }
  Scheduler& scheduler() { return *scheduler_; }

 private:
  std::string dir_;
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<TopiaryService> service_;
};

// A Resume that lands while the run writes its pause checkpoint queues the experiment again
// before the run's thread has ended. With two slots free, the dispatcher used to start it
// at once in a second slot and overwrite the running std::thread: the process aborted.
TEST(Lifecycle, ResumeDuringThePauseCheckpointNeverRunsAnExperimentTwice) {
  // Each run's thread lingers after its run, as a slow machine's might.
  Daemon d("resume_race", 2,
           [](const std::string&) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
  const std::string id = d.Submit();
  int requeued = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    ASSERT_TRUE(d.WaitFor(id, topiary::v1::RUNNING, d.Seq(id) + 3)) << attempt;
    const uint32_t before = d.Seq(id);
    ASSERT_TRUE(d.Call(&TopiaryService::PauseExperiment, id).ok());
    // The run has taken the pause once its pause.h5 is written; its thread ends soon after.
    bool written = false;
    for (int i = 0; i < 20000 && !written; ++i) {
      bool done = false;
      for (const auto& e :
           d.registry().EventsAfter(id, before, std::chrono::milliseconds(0), &done)) {
        written = written || e.has_checkpoint();
      }
      if (!written) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ASSERT_TRUE(written) << attempt;
    Experiment out;
    const grpc::Status st = d.Call(&TopiaryService::ResumeExperiment, id, &out);
    ASSERT_TRUE(st.ok()) << st.error_message();
    // Queued again (by the run's end, or by Resume of a PAUSED experiment) while the run's
    // thread may still be alive.
    requeued += out.state() == topiary::v1::QUEUED || out.state() == topiary::v1::RUNNING;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_LE(d.scheduler().running(), 1) << "one experiment holds two slots";
  }
  EXPECT_EQ(requeued, 8);
  ASSERT_TRUE(d.WaitFor(id, topiary::v1::RUNNING));
  EXPECT_EQ(d.scheduler().running(), 1);
}

// A Cancel that lands while the run writes its pause checkpoint was acknowledged and lost:
// the run ended PAUSED. It must end CANCELLED.
TEST(Lifecycle, CancelDuringThePauseCheckpointIsKept) {
  Daemon d("cancel_race");
  for (int attempt = 0; attempt < 6; ++attempt) {
    const std::string id = d.Submit();
    ASSERT_TRUE(d.WaitFor(id, topiary::v1::RUNNING, 4)) << attempt;
    ASSERT_TRUE(d.Call(&TopiaryService::PauseExperiment, id).ok());
    std::this_thread::sleep_for(std::chrono::microseconds(700 * attempt));
    const grpc::Status st = d.Call(&TopiaryService::CancelExperiment, id);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_TRUE(d.WaitFor(id, topiary::v1::CANCELLED, 0, 30))
        << attempt << ": ended " << topiary::v1::ExperimentState_Name(d.State(id));
  }
}

// A state change the disk cannot hold fails the call and changes nothing; the experiment
// is neither reported nor restarted in a state that was never written.
TEST(Lifecycle, AFailedWriteFailsTheTransitionAndChangesNothing) {
  std::string id, dir;
  {
    Daemon d("full_disk", /*slots=*/1);
    dir = d.dir();
    const std::string first = d.Submit();  // holds the only slot
    ASSERT_TRUE(d.WaitFor(first, topiary::v1::RUNNING));
    id = d.Submit();  // stays QUEUED
    // Where the record's temporary file goes, a folder: every write of the record fails
    // (as on a full disk; the tests run as root, so permissions would not stop them).
    const std::string blocker = d.registry().Folder(id) + "/experiment.json.tmp";
    ASSERT_EQ(::mkdir(blocker.c_str(), 0755), 0);
    Experiment out;
    grpc::Status st = d.Call(&TopiaryService::CancelExperiment, id, &out);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.error_message().find("cannot record " + id + " as CANCELLED"), std::string::npos)
        << st.error_message();
    EXPECT_EQ(d.State(id), topiary::v1::QUEUED);
    st = d.Call(&TopiaryService::PauseExperiment, id);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(d.State(id), topiary::v1::QUEUED);
    ASSERT_EQ(::rmdir(blocker.c_str()), 0);
    // Still in the queue: once the disk takes writes again, it can be cancelled.
    ASSERT_TRUE(d.Call(&TopiaryService::CancelExperiment, id).ok());
    EXPECT_EQ(d.State(id), topiary::v1::CANCELLED);
  }
  Registry again(dir);
  ASSERT_TRUE(again.Load().ok());
  EXPECT_EQ(again.Get(id)->state(), topiary::v1::CANCELLED);
}

}  // namespace
}  // namespace topiary::server
