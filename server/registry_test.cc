// The registry against a data directory someone else could write into, and its pages.
#include "server/registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/util/file_util.h"
#include "util/test_dir.h"

namespace topiary::server {
namespace {

std::string DataDir(const std::string& name) { return testing::TestPath(name); }

topiary::v1::ExperimentSpec Spec(const std::string& name) {
  topiary::v1::ExperimentSpec spec;
  spec.set_name(name);
  return spec;
}

// A record that names another folder (its own id "../../x") would have the daemon write
// there; a record that does not parse used to leave its number free, so the next
// submission reused the folder with its old checkpoints.
TEST(Registry, RecoveryTrustsNoRecordAboutItsOwnFolder) {
  const std::string dir = DataDir("recovery");
  {
    Registry r(dir);
    ASSERT_TRUE(r.Load().ok());
    for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(r.Create(Spec(n), "").ok());
  }
  const std::string exp = dir + "/experiments/";
  // exp-0001 claims to be elsewhere; exp-0003's record is damaged; exp-0007 is an empty
  // folder (never acknowledged); exp-0009 a link someone planted.
  ASSERT_TRUE(WriteFileAtomic(exp + "exp-0001/experiment.json",
                              R"({"id": "../../escape", "folder": "../../escape",
                                  "state": "QUEUED"})")
                  .ok());
  ASSERT_TRUE(WriteFileAtomic(exp + "exp-0003/experiment.json", "{not json").ok());
  ASSERT_EQ(::mkdir((exp + "exp-0007").c_str(), 0755), 0);
  ASSERT_EQ(::symlink("/tmp", (exp + "exp-0010").c_str()), 0);
  Registry r(dir);
  auto queued = r.Load();
  ASSERT_TRUE(queued.ok());
  EXPECT_FALSE(r.Get("exp-0001").ok());
  EXPECT_FALSE(r.Get("../../escape").ok());
  EXPECT_TRUE(r.Get("exp-0002").ok());
  EXPECT_FALSE(r.Get("exp-0003").ok());
  EXPECT_EQ(*queued, std::vector<std::string>{"exp-0002"});
  // New experiments take numbers no folder has had, and pass over a planted name.
  auto next = r.Create(Spec("d"), "");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->id(), "exp-0011");
  struct stat st;
  EXPECT_NE(::stat((dir + "/../escape").c_str(), &st), 0);
}

TEST(Registry, ListsInPagesThatFitAMessage) {
  const std::string dir = DataDir("pages");
  Registry r(dir);
  ASSERT_TRUE(r.Load().ok());
  for (int i = 0; i < 25; ++i) {
    topiary::v1::ExperimentSpec spec = Spec("e" + std::to_string(i));
    spec.mutable_data()->set_path(std::string(3000, 'p'));  // ~3 KB per record
    ASSERT_TRUE(r.Create(spec, "").ok());
  }
  std::vector<std::string> ids;
  std::string after, next;
  int pages = 0;
  do {
    auto page = r.ListPage(topiary::v1::STATE_UNSPECIFIED, after, 10, 16 << 10, &next);
    ASSERT_FALSE(page.empty());
    EXPECT_LE(page.size(), 10u);
    size_t bytes = 0;
    for (const auto& e : page) {
      ids.push_back(e.id());
      bytes += e.ByteSizeLong();
    }
    EXPECT_LE(bytes, size_t{16} << 10);
    after = next;
    ++pages;
  } while (!next.empty());
  EXPECT_EQ(ids.size(), 25u);
  EXPECT_EQ(ids.front(), "exp-0001");
  EXPECT_EQ(ids.back(), "exp-0025");
  EXPECT_GE(pages, 5);  // the byte limit, not the count, cut most pages
  // A filter that matches nothing gives one empty last page.
  auto none = r.ListPage(topiary::v1::RUNNING, "", 10, 1 << 20, &next);
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(next.empty());
}

// Concurrent AdvanceRound calls for one round all answered OK, but only the last took effect:
// an acknowledged --finish (or next round) was silently dropped. Now exactly one is
// accepted per round; the others are FAILED_PRECONDITION, and the run takes the accepted one.
TEST(Registry, OneAdvanceRoundPerRound) {
  const std::string dir = DataDir("advance");
  Registry r(dir);
  ASSERT_TRUE(r.Load().ok());
  auto e = r.Create(Spec("manual"), "");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(r.SetState(e->id(), topiary::v1::RUNNING, "started").ok());
  std::unique_ptr<RunControl> control = r.ControlFor(e->id());
  ASSERT_NE(control, nullptr);
  for (int round = 1; round <= 20; ++round) {
    SCOPED_TRACE(round);
    topiary::v1::PruningSpec next;
    RunControl::Stop taken = RunControl::Stop::kCancel;
    std::thread run([&] { taken = control->WaitForRound(round, &next); });
    while (r.Get(e->id())->state() != topiary::v1::WAITING_FOR_ROUND) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // Eight clients at once: one finishes, the others ask for a next round with a target.
    std::atomic<int> accepted{0}, refused{0}, finish_accepted{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < 8; ++c) {
      clients.emplace_back([&, c] {
        topiary::v1::AdvanceRoundRequest req;
        req.set_id(e->id());
        if (c == 0) {
          req.set_finish(true);
        } else {
          req.set_target(0.5f);
        }
        const absl::Status st = r.Advance(req);
        if (st.ok()) {
          ++accepted;
          if (c == 0) ++finish_accepted;
        } else {
          EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
          ++refused;
        }
      });
    }
    for (auto& t : clients) t.join();
    run.join();
    EXPECT_EQ(accepted.load(), 1);
    EXPECT_EQ(refused.load(), 7);
    // What the run took is what was acknowledged.
    EXPECT_EQ(taken == RunControl::Stop::kFinish, finish_accepted.load() == 1);
    if (taken == RunControl::Stop::kNone) {
      EXPECT_FLOAT_EQ(next.target(), 0.5f);
    }
    ASSERT_TRUE(r.SetState(e->id(), topiary::v1::RUNNING, "next").ok());
  }
}

// A FIFO planted as an experiment's events.jsonl blocked the daemon's start-up before it
// ever listened; it is now refused like any non-regular file, and the record still loads.
TEST(Registry, APlantedFifoDoesNotBlockStartUp) {
  const std::string dir = DataDir("fifo");
  std::string id;
  {
    Registry r(dir);
    ASSERT_TRUE(r.Load().ok());
    auto e = r.Create(Spec("victim"), "");
    ASSERT_TRUE(e.ok());
    id = e->id();
  }
  const std::string events = dir + "/experiments/" + id + "/events.jsonl";
  std::remove(events.c_str());
  ASSERT_EQ(::mkfifo(events.c_str(), 0644), 0);
  std::atomic<bool> done{false};
  std::thread load([&] {
    Registry r(dir);
    auto queued = r.Load();
    EXPECT_TRUE(queued.ok());
    EXPECT_TRUE(r.Get(id).ok());
    done = true;
  });
  for (int i = 0; i < 100 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!done) {
    // Unblock the reader so that the test ends, then fail.
    const int fd = ::open(events.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  load.join();
  EXPECT_TRUE(done) << "Load blocked on a FIFO";
}

// A Cancel of a running experiment was only remembered in memory until the run stopped: a
// daemon that died before then (or could not write the final record: a full disk) ran it
// again. The request is now on disk before it is answered.
TEST(Registry, AnAcknowledgedCancelSurvivesARestart) {
  const std::string dir = DataDir("cancel");
  std::string id;
  {
    Registry r(dir);
    ASSERT_TRUE(r.Load().ok());
    auto e = r.Create(Spec("long"), "");
    ASSERT_TRUE(e.ok());
    id = e->id();
    ASSERT_TRUE(r.SetState(id, topiary::v1::RUNNING, "started").ok());
    auto cancelled = r.RequestCancel(id);
    ASSERT_TRUE(cancelled.ok()) << cancelled.status();
    EXPECT_TRUE(cancelled->cancel_requested());
    // The daemon dies here, before the run reaches its next step.
  }
  Registry r(dir);
  auto queued = r.Load();
  ASSERT_TRUE(queued.ok());
  EXPECT_TRUE(queued->empty()) << "queued again: " << (*queued)[0];
  EXPECT_EQ(r.Get(id)->state(), topiary::v1::CANCELLED);
}

}  // namespace
}  // namespace topiary::server
