// Hostile and damaged checkpoint files (tests/tools/hostile_files.h): each is refused with
// an error naming the file and the object, by the loader (run --resume,
// init_from_checkpoint, fork) and by the report (inspect), before anything is allocated for
// what the file merely declares, and a failed load leaves the model as it was. Every case
// here crashed, exhausted memory, escaped the data directory or was silently accepted before.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/tools/hostile_files.h"
#include "trainer/nn/graph.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/store/checkpoint.h"
#include "trainer/store/checkpoint_report.h"
#include "trainer/store/checkpoint_schema.h"
#include "trainer/util/file_util.h"
#include "trainer/util/json.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

std::string TempPath(const std::string& name) { return testing::TestPath(name); }

struct Net {
  std::unique_ptr<Device> device = MakeCpuDevice(1);
  std::unique_ptr<Model> model;
  Net() {
    model = *BuildModel("resnet20", 1.0f, {1, 28, 28, 1}, 10, device.get());
    model->Initialize(11);
  }
};

const std::string& GoodFile() {
  static const std::string* path = [] {
    auto* p = new std::string(TempPath("good.h5"));
    testing::WriteGoodCheckpoint(*p);
    return p;
  }();
  return *path;
}

TEST(HostileCheckpoint, TheGoodFileLoadsAndReports) {
  Net n;
  auto loaded = LoadCheckpoint(GoodFile(), n.model.get(), true);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto report = InspectCheckpoint(GoodFile(), "");
  ASSERT_TRUE(report.ok()) << report.status();
}

TEST(HostileCheckpoint, EveryHostileFileIsRefusedByLoaderAndReport) {
  const std::string dir = TempPath("hostile");
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string outside = TempPath("outside.h5");
  testing::WriteGoodCheckpoint(outside);
  const auto cases = testing::WriteHostileCheckpoints(GoodFile(), dir, outside);
  EXPECT_GE(cases.size(), 17u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir + "/" + c.name;
    Net target, reference;
    auto loaded = LoadCheckpoint(path, target.model.get(), true);
    ASSERT_FALSE(loaded.ok());
    EXPECT_NE(loaded.status().message().find(path), std::string::npos) << loaded.status();
    EXPECT_NE(loaded.status().message().find(c.needle), std::string::npos) << loaded.status();
    for (size_t i = 0; i < target.model->parameters().size(); ++i) {
      ASSERT_EQ(target.model->parameters()[i]->value.ToHost(),
                reference.model->parameters()[i]->value.ToHost());
    }
    auto report = InspectCheckpoint(path, "");
    ASSERT_FALSE(report.ok());
    EXPECT_NE(report.status().message().find(c.needle), std::string::npos) << report.status();
  }
}

TEST(HostileCheckpoint, NonRegularFilesAndLinksOutOfTheRootsAreRefused) {
  Net n;
  auto dev = LoadCheckpoint("/dev/zero", n.model.get(), true);
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().message().find("not a regular file"), std::string::npos) << dev.status();
  // With the daemon's policy, a link from inside the allowed folder to a file outside it.
  const std::string root = TempPath("root");
  ASSERT_TRUE(MakeDirs(root).ok());
  const std::string link = root + "/link.h5";
  std::remove(link.c_str());
  ASSERT_EQ(::symlink(GoodFile().c_str(), link.c_str()), 0);
  const ReadPolicy saved = GetReadPolicy();
  ReadPolicy policy;
  policy.roots = {root};
  SetReadPolicy(policy);
  auto outside = LoadCheckpoint(link, n.model.get(), true);
  SetReadPolicy(saved);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(outside.status().message().find("outside the folders"), std::string::npos)
      << outside.status();
}

// A checkpoint's network graph was built (values, gradients, momentum, on every rank) before
// anything checked that the file holds those weights: a 35 KB file cost 4 GB. Now the graph
// may need no more parameter values than the file stores, checked layer by layer before
// each is allocated; the file's own weights still build.
TEST(HostileCheckpoint, AGraphLargerThanItsFileIsRefusedBeforeAllocation) {
  auto file = OpenCheckpoint(GoodFile());
  ASSERT_TRUE(file.ok()) << file.status();
  const CheckpointState& good = file->state;
  EXPECT_GT(good.stored_parameter_values, 200000);  // resnet20's ~270 K values
  std::unique_ptr<Device> device = MakeCpuDevice(1);
  auto built = BuildCheckpointModel(good, GoodFile(), 1.0f, {1, 28, 28, 1}, 10, device.get());
  ASSERT_TRUE(built.ok()) << built.status();
  // The same file claiming a 65,536-channel 25x25 convolution (41 M weights, 164 MB each
  // for values, gradients and momentum).
  topiary::v1::NetworkGraph g;
  g.set_arch("wide");
  g.set_height(28);
  g.set_width(28);
  g.set_channels(1);
  g.set_classes(10);
  auto* conv = g.add_layers();
  conv->set_name("wide");
  conv->set_kind(topiary::v1::conv2d);
  conv->add_inputs("input");
  conv->set_out_channels(65536);
  conv->set_kernel_h(25);
  conv->set_kernel_w(25);
  conv->set_stride(1);
  auto* pool = g.add_layers();
  pool->set_name("pool");
  pool->set_kind(topiary::v1::global_avg_pool);
  pool->add_inputs("wide");
  auto* fc = g.add_layers();
  fc->set_name("fc");
  fc->set_kind(topiary::v1::linear);
  fc->add_inputs("pool");
  fc->set_out_channels(10);
  const std::string path = TempPath("wide_graph.h5");
  testing::WriteEdited(GoodFile(), path,
                       [&](H5Document* d) { d->groups["/"][kNetworkAttr] = ToJson(g); });
  auto hostile = OpenCheckpoint(path);
  ASSERT_TRUE(hostile.ok()) << hostile.status();  // a well-formed file: the graph is the lie
  auto model = BuildCheckpointModel(hostile->state, path, 1.0f, {1, 28, 28, 1}, 10, device.get());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("layer 'wide': the network needs 40960000"),
            std::string::npos)
      << model.status();
  EXPECT_NE(model.status().message().find("but its file holds"), std::string::npos);
}

// The JSON attributes are parsed once, when the file is opened: one that is not JSON of its
// message (or, for the input and the network, names a key this build does not know) is an
// error naming the file and the attribute, for every reader (runs, evaluate, export, inspect).
TEST(HostileCheckpoint, JsonAttributesThatDoNotParseNameTheAttribute) {
  const struct {
    const char* attr;
    std::string value;
  } cases[] = {
      {kMetricsAttr, "{\"test_top1\": \"high\"}"},
      {kInputAttr, "{\"height\": 28, \"resize\": \"bicubic\"}"},
      {kNetworkAttr, "{\"layers\": 7}"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string path = TempPath(absl::StrCat("json_attr_", i++, ".h5"));
    testing::WriteEdited(GoodFile(), path,
                         [&](H5Document* d) { d->groups["/"][c.attr] = c.value; });
    for (const auto& st : {OpenCheckpoint(path).status(), ReadCheckpointState(path).status(),
                           InspectCheckpoint(path, "").status()}) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_NE(st.message().find(absl::StrCat(path, ": /@", c.attr)), std::string::npos) << st;
    }
  }
  // A newer writer's metrics key is a record's, not a lie: ignored.
  const std::string newer = TempPath("json_attr_newer.h5");
  testing::WriteEdited(GoodFile(), newer, [&](H5Document* d) {
    d->groups["/"][kMetricsAttr] = std::string("{\"test_top1\": 0.5, \"from_the_future\": 1}");
  });
  auto file = OpenCheckpoint(newer);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->state.metrics.test_top1(), 0.5);
}

// An import aimed at an acknowledged checkpoint (a run's pause.h5) replaced it: the daemon
// checked "exists" when the call started and wrote seconds later. Created-only writes are
// decided by the filesystem as the file is linked into place.
TEST(HostileCheckpoint, CreateOnlyNeverReplacesAFile) {
  Net n;
  const std::string dir = TempPath("create_only");
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string acknowledged = dir + "/pause.h5";
  ASSERT_TRUE(WriteFileAtomic(acknowledged, "acknowledged pause checkpoint").ok());
  const absl::Status st = SaveCheckpoint(acknowledged, *n.model, {}, WriteMode::kCreate);
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
  EXPECT_EQ(*ReadFile(acknowledged), "acknowledged pause checkpoint");
  const std::string fresh = dir + "/imported.h5";
  ASSERT_TRUE(SaveCheckpoint(fresh, *n.model, {}, WriteMode::kCreate).ok());
  EXPECT_TRUE(ReadCheckpointFile(fresh).ok());
  // No temporary file is left behind either way.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 2);
}

}  // namespace
}  // namespace topiary
