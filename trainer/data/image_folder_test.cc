// IMAGE_FOLDER datasets: PNG pixels read back exactly, JPEG closely, classes in sorted folder
// order, resizing, and every kind of bad file refused by name (FAIL) or skipped and counted
// (SKIP).
#include "trainer/data/image_folder.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>

#include "absl/strings/str_format.h"
#include "kernels/test_util.h"
#include "tests/tools/image_files.h"
#include "trainer/spec/catalog.h"
#include "trainer/util/file_util.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

using testing::EncodeJpeg;
using testing::EncodePng;

std::string Dir(const std::string& name) {
  const std::string d = testing::TestPath(name);
  EXPECT_EQ(std::system(("rm -rf '" + d + "'").c_str()), 0);
  EXPECT_TRUE(MakeDirs(d).ok());
  return d;
}

void Write(const std::string& path, const std::string& bytes) {
  EXPECT_TRUE(MakeDirs(path.substr(0, path.rfind('/'))).ok());
  EXPECT_TRUE(WriteFileAtomic(path, bytes).ok());
}

// A w x h grey image whose pixel (y, x) is (seed + 3y + 5x) mod 256.
std::vector<uint8_t> Pattern(int w, int h, int seed) {
  std::vector<uint8_t> p(static_cast<size_t>(w) * h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) p[y * w + x] = static_cast<uint8_t>(seed + 3 * y + 5 * x);
  return p;
}

topiary::v1::DataSpec Spec(const std::string& root, int size, bool skip) {
  topiary::v1::DataSpec d;
  d.set_dataset(topiary::v1::DataSpec::IMAGE_FOLDER);
  d.set_path(root);
  auto* f = d.mutable_image_folder();
  f->set_image_size(size);
  f->set_channels(1);
  f->set_max_image_pixels(1 << 20);
  f->set_decode_threads(3);
  f->set_bad_images(skip ? topiary::v1::ImageFolderSpec::SKIP : topiary::v1::ImageFolderSpec::FAIL);
  return d;
}

TEST(ImageFolder, ReadsClassesInOrderPngExactlyJpegClosely) {
  const std::string root = Dir("folder_good");
  Write(root + "/train/bird/0.png", EncodePng(Pattern(8, 8, 1), 8, 8, 1));
  Write(root + "/train/bird/1.PNG", EncodePng(Pattern(8, 8, 2), 8, 8, 1));
  Write(root + "/train/ant/0.jpg", EncodeJpeg(Pattern(8, 8, 3), 8, 8, 1, 100));
  Write(root + "/train/ant/notes.txt", "not an image, and not named like one: ignored");
  Write(root + "/val/bird/0.png", EncodePng(Pattern(8, 8, 4), 8, 8, 1));
  auto ds = ReadImageFolder(Spec(root, 8, false));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->classes, 2);
  ASSERT_EQ(ds->train.size(), 3);
  EXPECT_EQ(ds->train.labels, (std::vector<int32_t>{0, 1, 1}));  // ant, bird, bird
  EXPECT_EQ(ds->test.labels, (std::vector<int32_t>{1}));
  const std::vector<uint8_t> p1 = Pattern(8, 8, 1);
  EXPECT_TRUE(std::equal(p1.begin(), p1.end(), ds->train.pixels.begin() + 64));
  const std::vector<uint8_t> p3 = Pattern(8, 8, 3);
  int worst = 0;
  for (int i = 0; i < 64; ++i) worst = std::max(worst, std::abs(ds->train.pixels[i] - p3[i]));
  EXPECT_LE(worst, 24);  // JPEG at quality 100 on a sharp pattern
  // crop_size: batches hold the centre (or random-resized) crop of the stored images.
  auto spec = Spec(root, 8, false);
  spec.mutable_image_folder()->set_crop_size(6);
  auto cropped = ReadImageFolder(spec);
  ASSERT_TRUE(cropped.ok()) << cropped.status();
  EXPECT_EQ(cropped->train.h, 8);
  EXPECT_EQ(cropped->train.batch_h(), 6);
  EXPECT_EQ(cropped->test.batch_w(), 6);
}

TEST(ImageFolder, FitsShorterSideThenCentreCrops) {
  DecodedImage img{6, 4, 1, std::vector<uint8_t>(24, 0)};
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 6; ++x) img.pixels[y * 6 + x] = x == 0 || x == 5 ? 0 : 200;
  // 6x4 -> 2x2 crop of the 3x2 halved image: every output covers two source columns of 200
  // (the centre) or a 0 and a 200 column; the centre crop drops the outer half-columns.
  const auto out = FitImage(img, 2);
  ASSERT_EQ(out.size(), 4u);
  for (uint8_t v : out) EXPECT_GE(v, 130);
  const auto same = FitImage(img, 4);  // shorter side already 4: crop only
  EXPECT_EQ(same[0], 200);
  EXPECT_EQ(same[3], 200);
  DecodedImage flat{2, 2, 1, {100, 100, 100, 100}};
  for (uint8_t v : FitImage(flat, 5)) EXPECT_EQ(v, 100);  // bilinear growth of a constant
}

// A PNG whose header claims w x h (a real 1x1 PNG with its IHDR patched, CRC fixed).
std::string HugePng(uint32_t w, uint32_t h) {
  std::string png = EncodePng({7}, 1, 1, 1);
  auto put = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) png[at + i] = static_cast<char>(v >> (24 - 8 * i));
  };
  put(16, w);
  put(20, h);
  put(29, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 17)));
  return png;
}

TEST(ImageFolder, BadFilesFailByNameOrAreSkippedAndCounted) {
  const std::string root = Dir("folder_bad");
  const std::string good = EncodePng(Pattern(8, 8, 1), 8, 8, 1);
  const std::string jpeg = EncodeJpeg(Pattern(8, 8, 1), 8, 8, 1, 90);
  Write(root + "/train/a/good.png", good);
  Write(root + "/val/a/good.png", good);
  const std::string outside = Dir("folder_outside") + "/outside.png";
  Write(outside, good);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"corrupt.jpg", "\xFF\xD8\xFF" + std::string(100, 'x')},
      {"truncated.jpg", jpeg.substr(0, jpeg.size() / 2)},
      {"truncated.png", good.substr(0, good.size() / 2)},
      {"text.png", "hello, not an image"},
      {"huge.png", HugePng(100000, 100000)},
  };
  for (const auto& [name, bytes] : bad) {
    SCOPED_TRACE(name);
    Write(root + "/train/a/" + name, bytes);
    auto ds = ReadImageFolder(Spec(root, 8, false));
    ASSERT_FALSE(ds.ok());
    EXPECT_NE(ds.status().message().find("train/a/" + name), std::string::npos) << ds.status();
    ASSERT_EQ(unlink((root + "/train/a/" + name).c_str()), 0);
  }
  ASSERT_EQ(symlink(outside.c_str(), (root + "/train/a/link.png").c_str()), 0);
  auto linked = ReadImageFolder(Spec(root, 8, false));
  ASSERT_FALSE(linked.ok());
  EXPECT_NE(linked.status().message().find("a link leading out of data.path"), std::string::npos)
      << linked.status();
  for (const auto& [name, bytes] : bad) Write(root + "/train/a/" + name, bytes);
  auto skipped = ReadImageFolder(Spec(root, 8, true));
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->train.size(), 1);
  EXPECT_EQ(skipped->skipped, static_cast<int64_t>(bad.size()) + 1);
  EXPECT_EQ(skipped->skipped_examples.size(), bad.size() + 1);
}

// Pipeline STREAM checks headers only at load: files whose headers are bad (or links out)
// fail or are skipped then; a body that is cut short passes and is met while streaming
// (trainer/run/stream_batches_test).
TEST(ImageFolder, StreamChecksHeadersAndKeepsNames) {
  const std::string root = Dir("folder_stream");
  const std::string good = EncodePng(Pattern(8, 8, 1), 8, 8, 1);
  const std::string jpeg = EncodeJpeg(Pattern(40, 30, 1), 40, 30, 1, 90);
  Write(root + "/train/a/good.png", good);
  Write(root + "/train/a/cut.jpg", jpeg.substr(0, jpeg.size() - 40));
  Write(root + "/train/a/corrupt.jpg", "\xFF\xD8\xFF" + std::string(100, 'x'));
  Write(root + "/train/a/text.png", "hello, not an image");
  Write(root + "/train/a/huge.png", HugePng(100000, 100000));
  Write(root + "/val/a/good.png", good);
  const std::string outside = Dir("folder_stream_outside") + "/outside.png";
  Write(outside, good);
  ASSERT_EQ(symlink(outside.c_str(), (root + "/train/a/link.png").c_str()), 0);
  auto spec = Spec(root, 8, false);
  spec.mutable_image_folder()->set_pipeline(topiary::v1::ImageFolderSpec::STREAM);
  auto failed = ReadImageFolder(spec);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("train/a/corrupt.jpg"), std::string::npos)
      << failed.status();
  spec.mutable_image_folder()->set_bad_images(topiary::v1::ImageFolderSpec::SKIP);
  auto ds = ReadImageFolder(spec);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->skipped, 4);  // corrupt, text, huge, link
  ASSERT_TRUE(ds->train.streamed());
  EXPECT_TRUE(ds->train.pixels.empty());
  EXPECT_EQ(ds->train.files->rel,
            (std::vector<std::string>{"train/a/cut.jpg", "train/a/good.png"}));
  EXPECT_EQ(ds->train.size(), 2);
  // The statistics sample: the good PNG at image_size (the cut JPEG may or may not decode).
  EXPECT_GE(ds->train.files->sample.size(), 8u * 8u);
  auto size = ReadImageSize(jpeg.substr(0, jpeg.size() - 40), "x.jpg", 1 << 20);
  ASSERT_TRUE(size.ok()) << size.status();  // the header alone is enough
  EXPECT_EQ(*size, std::make_pair(40, 30));
  EXPECT_FALSE(ReadImageSize(HugePng(5000, 5000), "h.png", 1 << 20).ok());
  EXPECT_FALSE(ReadImageSize(HugePng(0, 5), "z.png", 1 << 20).ok());
  // Found by image_fuzz: sides whose product overflows 64 bits.
  EXPECT_FALSE(ReadImageSize(HugePng(3890735079u, 3890735079u), "o.png", 1 << 20).ok());
  EXPECT_FALSE(ReadImageSize(good.substr(0, 20), "short.png", 1 << 20).ok());
}

TEST(ImageFolder, EmptyClassFoldersAndMissingSplitsAreErrorsNamingThem) {
  const std::string root = Dir("folder_empty");
  Write(root + "/train/a/x.png", EncodePng(Pattern(4, 4, 1), 4, 4, 1));
  EXPECT_TRUE(MakeDirs(root + "/train/b").ok());
  auto no_val = ReadImageFolder(Spec(root, 4, false));
  ASSERT_FALSE(no_val.ok());
  EXPECT_NE(no_val.status().message().find("no val/ or test/"), std::string::npos);
  Write(root + "/test/a/x.png", EncodePng(Pattern(4, 4, 1), 4, 4, 1));
  auto empty = ReadImageFolder(Spec(root, 4, false));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("train/b has no .jpg"), std::string::npos)
      << empty.status();
  Write(root + "/train/b/y.png", EncodePng(Pattern(4, 4, 1), 4, 4, 1));
  Write(root + "/test/zebra/y.png", EncodePng(Pattern(4, 4, 1), 4, 4, 1));
  auto stray = ReadImageFolder(Spec(root, 4, false));
  ASSERT_FALSE(stray.ok());
  EXPECT_NE(stray.status().message().find("test/zebra is a class train/ does not have"),
            std::string::npos)
      << stray.status();
}

// One bound for classes: a folder with more than a network may have is refused at load (it
// used to train, then its checkpoints were refused by every reader).
TEST(ImageFolder, MoreClassesThanANetworkMayHaveAreRefusedAtLoad) {
  const std::string root = Dir("folder_classes");
  ASSERT_TRUE(MakeDirs(root + "/train").ok());
  for (int i = 0; i <= kMaxClasses; ++i) {
    ASSERT_EQ(::mkdir(absl::StrFormat("%s/train/c%05d", root, i).c_str(), 0755), 0);
  }
  Write(root + "/val/c00000/x.png", EncodePng(Pattern(4, 4, 1), 4, 4, 1));
  auto ds = ReadImageFolder(Spec(root, 4, false));
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("65537 class folders"), std::string::npos) << ds.status();
}

// A 1,000,000 x 1 image (3 KB as PNG, within max_image_pixels) cost 1.4 GB per decode thread
// in the resize, cached or streamed (the statistics sample): the resize's memory now
// follows its output.
TEST(ImageFolder, AnImageOfExtremeAspectCostsWhatItsOutputCosts) {
  const std::string root = Dir("folder_aspect");
  const int long_side = 1000000;
  const std::string wide = EncodePng(std::vector<uint8_t>(long_side, 200), long_side, 1, 1);
  const std::string tall = EncodePng(std::vector<uint8_t>(long_side, 100), 1, long_side, 1);
  ASSERT_LT(wide.size(), 8000u);
  Write(root + "/train/a/wide.png", wide);
  Write(root + "/train/a/tall.png", tall);
  Write(root + "/val/a/wide.png", wide);
  long baseline = 0, kb = 0;
  ASSERT_EQ(kernels::testing::RunInChild([] { return 0; }, &baseline), 0);
  for (auto pipeline :
       {topiary::v1::ImageFolderSpec::CACHE, topiary::v1::ImageFolderSpec::STREAM}) {
    SCOPED_TRACE(topiary::v1::ImageFolderSpec::Pipeline_Name(pipeline));
    const int rc = kernels::testing::RunInChild(
        [&] {
          auto spec = Spec(root, 224, false);
          spec.mutable_image_folder()->set_max_image_pixels(long_side);
          spec.mutable_image_folder()->set_decode_threads(1);
          spec.mutable_image_folder()->set_pipeline(pipeline);
          auto ds = ReadImageFolder(spec);
          if (!ds.ok()) return 2;
          if (pipeline == topiary::v1::ImageFolderSpec::STREAM) return 0;
          // Every pixel of the wide image is 200: so is every pixel of its 224 x 224 crop.
          const auto& px = ds->train.pixels;
          return px.size() == 2u * 224 * 224 && px[224 * 224 + 5] == 200 && px[5] == 100 ? 0 : 3;
        },
        &kb);
    EXPECT_EQ(rc, 0);
    EXPECT_LT(kb - baseline, 100 << 10) << "peak " << kb << " KiB, baseline " << baseline;
  }
}

}  // namespace
}  // namespace topiary
