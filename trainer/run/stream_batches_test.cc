// The streaming pipeline (IMAGE_FOLDER pipeline STREAM) on the CPU device: evaluation batches
// equal the decoded-image cache's where no scaling is involved, training batches are
// reproducible and carry the epoch order's labels, prefetching survives out-of-order requests,
// and a file whose body turns out bad while streaming fails by name or is skipped and counted.
#include <gtest/gtest.h>

#include <cstdlib>

#include "pruning/pruner.h"
#include "tests/tools/image_files.h"
#include "trainer/data/device_batches.h"
#include "trainer/data/image_folder.h"
#include "trainer/run/runner_test_util.h"
#include "trainer/util/file_util.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

std::string Folder(const std::string& name) {
  const std::string d = testing::TestPath(name);
  EXPECT_EQ(std::system(("rm -rf '" + d + "'").c_str()), 0);
  for (int i = 0; i < 45; ++i) {
    const std::string split = i % 5 == 4 ? "val" : "train";
    const std::string dir = d + "/" + split + "/c" + std::to_string(i % 3);
    std::vector<uint8_t> px(12 * 12 * 3);
    for (size_t j = 0; j < px.size(); ++j) px[j] = static_cast<uint8_t>(i * 31 + j * 7);
    EXPECT_TRUE(MakeDirs(dir).ok());
    EXPECT_TRUE(
        WriteFileAtomic(dir + "/" + std::to_string(i) + ".png", testing::EncodePng(px, 12, 12, 3))
            .ok());
  }
  return d;
}

topiary::v1::DataSpec Spec(const std::string& root, bool stream) {
  topiary::v1::DataSpec d;
  d.set_dataset(topiary::v1::DataSpec::IMAGE_FOLDER);
  d.set_path(root);
  auto* f = d.mutable_image_folder();
  f->set_image_size(12);
  f->set_crop_size(12);
  f->set_channels(3);
  f->set_max_image_pixels(1 << 20);
  f->set_decode_threads(2);
  if (stream) {
    f->set_pipeline(topiary::v1::ImageFolderSpec::STREAM);
    f->set_prefetch_batches(2);
  }
  return d;
}

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> labels;
};

Batch Get(DeviceBatches& data, int epoch, int64_t first, int count, bool augment) {
  Batch b{std::vector<float>(static_cast<size_t>(count) * 12 * 12 * 3),
          std::vector<int32_t>(count)};
  const absl::Status st =
      data.Assemble(nullptr, epoch, first, count, augment, b.x.data(), b.labels.data());
  EXPECT_TRUE(st.ok()) << st;
  return b;
}

TEST(StreamBatches, EvaluationEqualsTheCacheAndTrainingIsReproducible) {
  const std::string root = Folder("stream_equal");
  auto cached = ReadImageFolder(Spec(root, false));
  auto streamed = ReadImageFolder(Spec(root, true));
  ASSERT_TRUE(cached.ok()) << cached.status();
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  auto cpu = MakeCpuDevice(1);
  const Normalization norm = ComputeNormalization(cached->train, 255, true);
  topiary::v1::Augment augment;
  augment.set_random_resized_crop(true);
  augment.set_horizontal_flip(true);
  Batcher cb(&cached->test, 255, norm, augment, 5), sb(&streamed->test, 255, norm, augment, 5);
  auto cd = DeviceBatches::Create(&cb, cpu.get());
  auto sd = DeviceBatches::Create(&sb, cpu.get());
  ASSERT_TRUE(cd.ok() && sd.ok());
  ASSERT_TRUE(cd->SetSequentialOrder().ok());
  ASSERT_TRUE(sd->SetSequentialOrder().ok());
  for (int first : {0, 4, 2}) {  // in order, then a request the prefetcher did not predict
    const Batch c = Get(*cd, 0, first, 4, false), s = Get(*sd, 0, first, 4, false);
    EXPECT_EQ(c.x, s.x) << "first " << first;
    EXPECT_EQ(c.labels, s.labels);
  }
  // Training batches: the epoch order's labels, the same bytes from a second pipeline.
  Batcher train(&streamed->train, 255, norm, augment, 5);
  auto t1 = DeviceBatches::Create(&train, cpu.get());
  auto t2 = DeviceBatches::Create(&train, cpu.get());
  ASSERT_TRUE(t1.ok() && t2.ok());
  const std::vector<int32_t> order = train.EpochOrder(3);
  ASSERT_TRUE(t1->SetOrder(order).ok());
  ASSERT_TRUE(t2->SetOrder(order).ok());
  for (int64_t first = 0; first + 8 <= 36; first += 8) {
    const Batch a = Get(*t1, 3, first, 8, true);
    ASSERT_TRUE(t2->Stage(3, first, 8, true, 8).ok());  // as the training loop does
    const Batch b = Get(*t2, 3, first, 8, true);
    EXPECT_EQ(a.x, b.x);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(a.labels[i], streamed->train.labels[order[first + i]]);
  }
  EXPECT_NE(t1->decoder().find("CPU threads"), std::string::npos) << t1->decoder();
}

TEST(StreamBatches, ABodyBadWhileStreamingFailsByNameOrIsSkipped) {
  const std::string root = Folder("stream_bad");
  const std::string png = testing::EncodePng(std::vector<uint8_t>(12 * 12 * 3, 9), 12, 12, 3);
  ASSERT_TRUE(WriteFileAtomic(root + "/val/c0/zz_cut.png", png.substr(0, png.size() - 30)).ok());
  for (bool skip : {false, true}) {
    auto spec = Spec(root, true);
    if (skip) spec.mutable_image_folder()->set_bad_images(topiary::v1::ImageFolderSpec::SKIP);
    auto ds = ReadImageFolder(spec);
    ASSERT_TRUE(ds.ok()) << ds.status();  // the header is whole
    auto cpu = MakeCpuDevice(1);
    Batcher b(&ds->test, 255, ComputeNormalization(ds->test, 255, false), {}, 1);
    auto data = DeviceBatches::Create(&b, cpu.get());
    ASSERT_TRUE(data.ok());
    ASSERT_TRUE(data->SetSequentialOrder().ok());
    const int n = static_cast<int>(ds->test.size());
    std::vector<float> x(static_cast<size_t>(n) * 12 * 12 * 3);
    std::vector<int32_t> labels(n);
    const absl::Status st = data->Assemble(nullptr, 0, 0, n, false, x.data(), labels.data());
    if (!skip) {
      ASSERT_FALSE(st.ok());
      EXPECT_NE(st.message().find("val/c0/zz_cut.png"), std::string::npos) << st;
    } else {
      EXPECT_TRUE(st.ok()) << st;
    }
  }
}

// A whole run: where no scaling is involved (stored size = image_size = crop_size, flips only),
// streaming feeds the training loop (staged per step, prefetched) the cache's batches, so
// both runs take the same steps to the same losses, through a pruning round too.
TEST(StreamBatches, ATrainingRunStreamedEqualsTheCachedRun) {
  const std::string root = Folder("stream_run");
  auto run = [&](bool stream) {
    topiary::v1::ExperimentSpec spec = testing::Parse(R"pb(
      name: "stream_run"
      seed: 5
      model { arch: "lenet5" }
      data {
        dataset: IMAGE_FOLDER
        batch_size: 4
        augment { horizontal_flip: true }
      }
      train {
        epochs: 2
        optimizer { lr: 0.05 momentum: 0.9 }
      }
      pruning { method: MAGNITUDE target: 0.3 step_fraction: 1 finetune_epochs: 1 max_rounds: 1 }
      device { kind: CPU threads: 1 }
    )pb");
    *spec.mutable_data() = [&] {
      topiary::v1::DataSpec d = spec.data();
      const topiary::v1::DataSpec folder = Spec(root, stream);
      d.set_path(folder.path());
      *d.mutable_image_folder() = folder.image_folder();
      return d;
    }();
    RunOptions opt;
    opt.out_dir = testing::TempDir(stream ? "run_stream" : "run_cache");
    opt.make_pruner = pruning::MakePruner;
    return testing::RunAndTrace(spec, opt);
  };
  const testing::Trace cached = run(false), streamed = run(true);
  ASSERT_EQ(cached.summary.state(), topiary::v1::SUCCEEDED) << cached.summary.error();
  ASSERT_EQ(streamed.summary.state(), topiary::v1::SUCCEEDED) << streamed.summary.error();
  ASSERT_EQ(cached.losses.size(), streamed.losses.size());
  EXPECT_EQ(cached.losses, streamed.losses);
  EXPECT_EQ(cached.summary.test_top1(), streamed.summary.test_top1());
  EXPECT_EQ(cached.started.image_decoder(), "");
  EXPECT_EQ(streamed.started.image_decoder(), "2 CPU threads");
}

}  // namespace
}  // namespace topiary
