#include "trainer/data/dataset.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "trainer/data/batcher.h"
#include "trainer/util/file_util.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

std::string TempDir() { return testing::TestDir(); }

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string IdxImages(uint32_t n, uint32_t rows, uint32_t cols, uint32_t magic = 0x803) {
  std::string s = Be32(magic) + Be32(n) + Be32(rows) + Be32(cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) s.push_back(static_cast<char>(i % 251));
  return s;
}

std::string IdxLabels(const std::string& labels) {
  return Be32(0x801) + Be32(labels.size()) + labels;
}

std::string Gzip(const std::string& data) {
  uLongf cap = compressBound(data.size()) + 64;
  std::string out(cap, '\0');
  z_stream zs{};
  deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = data.size();
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = cap;
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

absl::Status ReadPair(const std::string& images, const std::string& labels) {
  const std::string ip = TempDir() + "/img", lp = TempDir() + "/lab";
  Write(ip, images);
  Write(lp, labels);
  return ReadIdxPair(ip, lp, 10).status();
}

void ExpectError(const absl::Status& st, const std::string& needle) {
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find(needle), std::string::npos) << st.message();
}

TEST(Idx, ReadsRawAndGzip) {
  const std::string ip = TempDir() + "/ok_img.gz", lp = TempDir() + "/ok_lab";
  Write(ip, Gzip(IdxImages(3, 2, 4)));
  Write(lp, IdxLabels(std::string("\x01\x09\x00", 3)));
  auto set = ReadIdxPair(ip, lp, 10);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->size(), 3);
  EXPECT_EQ(set->h, 2);
  EXPECT_EQ(set->w, 4);
  EXPECT_EQ(set->labels, (std::vector<int32_t>{1, 9, 0}));
  EXPECT_EQ(set->pixels[9], 9);
}

TEST(Idx, RejectsWrongMagic) {
  ExpectError(ReadPair(IdxImages(2, 2, 2, 0x0801), IdxLabels("\1\2")), "wrong magic number");
}

TEST(Idx, RejectsTruncatedFile) {
  std::string img = IdxImages(4, 3, 3);
  ExpectError(ReadPair(img.substr(0, img.size() - 5), IdxLabels("\1\2\3\4")), "truncated");
}

TEST(Idx, RejectsTruncatedGzip) {
  std::string gz = Gzip(IdxImages(50, 8, 8));
  ExpectError(ReadPair(gz.substr(0, gz.size() / 2), IdxLabels(std::string(50, '\1'))),
              "truncated gzip");
}

TEST(Idx, RejectsLabelOutOfRange) {
  ExpectError(ReadPair(IdxImages(2, 2, 2), IdxLabels(std::string("\x01\x0c", 2))),
              "label 12 of record 1 out of range");
}

TEST(Idx, RejectsCountMismatch) {
  ExpectError(ReadPair(IdxImages(3, 2, 2), IdxLabels("\1\2")), "count mismatch");
}

TEST(Idx, MissingFolderHintsAtDebianPackage) {
  topiary::v1::DataSpec d;
  d.set_dataset(topiary::v1::DataSpec::FASHION_MNIST);
  d.set_path("/nonexistent/fashion");
  auto ds = LoadDataset(d, 1);
  ExpectError(ds.status(), "dataset-fashion-mnist");
  ExpectError(ds.status(), "/nonexistent/fashion");
}

TEST(Cifar, RejectsSizeNotMultipleOfRecord) {
  const std::string dir = TempDir() + "/cifar_bad";
  ::mkdir(dir.c_str(), 0755);
  for (int i = 1; i <= 5; ++i)
    Write(dir + "/data_batch_" + std::to_string(i) + ".bin", std::string(3073 * 2, '\1'));
  Write(dir + "/test_batch.bin", std::string(3073 + 7, '\1'));
  ExpectError(ReadCifarFolder(dir, false).status(), "not a multiple of the 3073-byte");
}

TEST(Cifar, ReadsPlanarRecordsAsHwc) {
  const std::string dir = TempDir() + "/cifar100";
  ::mkdir(dir.c_str(), 0755);
  std::string rec(3074, '\0');
  rec[0] = 3;          // coarse
  rec[1] = 77;         // fine
  rec[2 + 0] = 10;     // R of pixel 0
  rec[2 + 1024] = 20;  // G of pixel 0
  rec[2 + 2048] = 30;  // B of pixel 0
  Write(dir + "/train.bin", rec + rec);
  Write(dir + "/test.bin", rec);
  auto ds = ReadCifarFolder(dir, true);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->classes, 100);
  EXPECT_EQ(ds->train.size(), 2);
  EXPECT_EQ(ds->train.labels[0], 77);
  EXPECT_EQ(ds->train.pixels[0], 10);
  EXPECT_EQ(ds->train.pixels[1], 20);
  EXPECT_EQ(ds->train.pixels[2], 30);
}

TEST(Digits, ParsesCsvAndRejectsBadRows) {
  const std::string p = TempDir() + "/digits.csv";
  std::string csv;
  for (int r = 0; r < 10; ++r) {
    for (int i = 0; i < 64; ++i) csv += std::to_string((r + i) % 17) + ".0,";
    csv += std::to_string(r % 10) + ".0\n";
  }
  Write(p, csv);
  auto ds = ReadDigitsCsv(p);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->train.size(), 8);
  EXPECT_EQ(ds->test.size(), 2);
  EXPECT_EQ(ds->test.labels[0], 4);
  EXPECT_EQ(ds->max_value, 16.0f);
  Write(p, csv + "1,2,3\n");
  ExpectError(ReadDigitsCsv(p).status(), "line 11 has 3 values");
}

TEST(FashionMnist, RealDatasetLoads) {
  topiary::v1::DataSpec d;
  d.set_path(kFashionMnistDir);
  auto ds = LoadDataset(d, 1);
  ASSERT_TRUE(ds.ok()) << ds.status() << " (CI installs dataset-fashion-mnist)";
  EXPECT_EQ(ds->train.size(), 60000);
  EXPECT_EQ(ds->test.size(), 10000);
  EXPECT_EQ(ds->train.h, 28);
  std::vector<int> counts(10, 0);
  for (int32_t l : ds->test.labels) ++counts[l];
  for (int c : counts) EXPECT_EQ(c, 1000);  // Fashion-MNIST's test set is balanced
}

TEST(Synthetic, DeterministicPerSeed) {
  topiary::v1::SyntheticSpec s;
  s.set_height(8);
  s.set_width(8);
  s.set_channels(2);
  s.set_classes(4);
  s.set_train_size(20);
  s.set_test_size(5);
  s.set_noise(0.3f);
  const Dataset a = MakeSynthetic(s, 7), b = MakeSynthetic(s, 7), c = MakeSynthetic(s, 8);
  EXPECT_EQ(a.train.pixels, b.train.pixels);
  EXPECT_EQ(a.train.labels, b.train.labels);
  EXPECT_NE(a.train.pixels, c.train.pixels);
}

// The validation split: stratified, disjoint, whole, the same whatever else changes.
TEST(Validation, HoldsOutAStratifiedFixedShareOfTheTrainingImages) {
  topiary::v1::SyntheticSpec s;
  s.set_height(4);
  s.set_width(4);
  s.set_channels(1);
  s.set_classes(5);
  s.set_train_size(403);
  s.set_test_size(7);
  s.set_noise(0.5f);
  const Dataset whole = MakeSynthetic(s, 3);
  Dataset split = whole;
  ASSERT_TRUE(HoldOutValidation(0.1, &split).ok());
  const size_t bytes = whole.train.image_bytes();
  auto images = [&](const ImageSet& set) {
    std::multiset<std::string> out;
    for (int64_t i = 0; i < set.size(); ++i) {
      out.insert(std::string(set.pixels.begin() + i * bytes, set.pixels.begin() + (i + 1) * bytes) +
                 static_cast<char>(set.labels[i]));
    }
    return out;
  };
  std::multiset<std::string> both = images(split.train);
  const auto val = images(split.validation);
  both.insert(val.begin(), val.end());
  EXPECT_EQ(both, images(whole.train));  // every image in exactly one of the two sets
  std::vector<int> all(5), held(5);
  for (int32_t l : whole.train.labels) ++all[l];
  for (int32_t l : split.validation.labels) ++held[l];
  for (int c = 0; c < 5; ++c) EXPECT_EQ(held[c], std::llround(0.1 * all[c])) << "class " << c;
  EXPECT_EQ(split.test.labels, whole.test.labels);  // the test set is left alone
  // A fixed draw: another copy splits the same way.
  Dataset again = whole;
  ASSERT_TRUE(HoldOutValidation(0.1, &again).ok());
  EXPECT_EQ(again.validation.pixels, split.validation.pixels);
  EXPECT_EQ(again.train.labels, split.train.labels);
  // Nothing held out at 0; out-of-range fractions and emptied classes refused, naming the field.
  Dataset none = whole;
  ASSERT_TRUE(HoldOutValidation(0, &none).ok());
  EXPECT_EQ(none.validation.size(), 0);
  EXPECT_EQ(none.train.size(), whole.train.size());
  for (double bad : {0.6, -0.1, std::nan("")}) {
    Dataset d = whole;
    const absl::Status st = HoldOutValidation(bad, &d);
    EXPECT_NE(st.message().find("data.validation_fraction"), std::string::npos) << st;
  }
  Dataset tiny = whole;
  tiny.train.Truncate(2);
  tiny.train.labels = {0, 1};
  const absl::Status st = HoldOutValidation(0.5, &tiny);
  EXPECT_NE(st.message().find("would hold out all"), std::string::npos) << st;
}

TEST(Batcher, ShuffleIsAPermutationAndFlipMirrors) {
  ImageSet set;
  set.h = 2;
  set.w = 3;
  set.c = 1;
  set.pixels = {1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60};
  set.labels = {0, 1};
  Normalization id{{0.0f}, {1.0f}};
  topiary::v1::Augment aug;
  aug.set_horizontal_flip(true);
  Batcher b(&set, 1.0f, id, aug, 3);
  auto order = b.EpochOrder(0);
  std::vector<int32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(b.EpochOrder(5), b.EpochOrder(5));
  // Over many draws (one per epoch) both flipped and unflipped copies of image 0 appear,
  // each exact; the same epoch always draws the same.
  bool seen[2] = {false, false};
  std::vector<int32_t> fixed = {0};
  for (int epoch = 0; epoch < 20; ++epoch) {
    float x[6], again[6];
    int32_t label;
    b.Assemble(fixed, epoch, 0, 1, true, x, &label);
    b.Assemble(fixed, epoch, 0, 1, true, again, &label);
    EXPECT_TRUE(std::equal(x, x + 6, again));
    if (x[0] == 1 && x[2] == 3) seen[0] = true;
    if (x[0] == 3 && x[2] == 1 && x[3] == 6) seen[1] = true;
  }
  EXPECT_TRUE(seen[0] && seen[1]);
}

TEST(Batcher, CropPadsWithZeroBeforeNormalization) {
  ImageSet set;
  set.h = 4;
  set.w = 4;
  set.c = 1;
  set.pixels.assign(16, 200);
  set.labels = {0};
  Normalization norm{{0.5f}, {2.0f}};
  topiary::v1::Augment aug;
  aug.set_crop_padding(2);
  Batcher b(&set, 200.0f, norm, aug, 3);
  std::vector<int32_t> order = {0};
  bool saw_pad = false;
  for (int epoch = 0; epoch < 30; ++epoch) {
    float x[16];
    int32_t label;
    b.Assemble(order, epoch, 0, 1, true, x, &label);
    for (float v : x) {
      // Image pixels normalize to (1 - 0.5) * 2 = 1, zero padding to (0 - 0.5) * 2 = -1.
      EXPECT_TRUE(std::abs(v - 1.0f) < 1e-6f || v == -1.0f) << v;
      saw_pad |= v == -1.0f;
    }
  }
  EXPECT_TRUE(saw_pad);
}

// Batches smaller than the stored images: evaluation takes the exact centre; a random-resized
// crop samples a box of the image (every output pixel a stored pixel, the box's corners
// reached over many draws), deterministically per (epoch, image).
TEST(Batcher, CentreCropAndRandomResizedCrop) {
  ImageSet set;
  set.h = 8;
  set.w = 8;
  set.c = 1;
  set.out_h = set.out_w = 4;
  for (int i = 0; i < 64; ++i) set.pixels.push_back(static_cast<uint8_t>(i));
  set.labels = {0};
  Normalization id{{0.0f}, {1.0f}};
  topiary::v1::Augment aug;
  aug.set_random_resized_crop(true);
  Batcher b(&set, 1.0f, id, aug, 3);
  std::vector<int32_t> order = {0};
  float x[16], again[16];
  int32_t label;
  b.Assemble(order, 0, 0, 1, false, x, &label);  // evaluation: rows 2-5, columns 2-5
  for (int y = 0; y < 4; ++y)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(x[y * 4 + c], (y + 2) * 8 + (c + 2));
  bool varied = false, saw_corner = false;
  for (int epoch = 0; epoch < 200; ++epoch) {
    b.Assemble(order, epoch, 0, 1, true, x, &label);
    b.Assemble(order, epoch, 0, 1, true, again, &label);
    EXPECT_TRUE(std::equal(x, x + 16, again));
    for (int i = 0; i < 16; ++i) {
      EXPECT_TRUE(x[i] >= 0 && x[i] < 64 && x[i] == std::floor(x[i])) << x[i];
    }
    // Rows increase by whole image rows, columns by one: a box sampled in order.
    EXPECT_LE(x[0], x[3]);
    EXPECT_LE(x[0], x[12]);
    varied |= x[0] != 18;
    saw_corner |= x[0] == 0 || x[15] == 63;
  }
  EXPECT_TRUE(varied);
  EXPECT_TRUE(saw_corner);
}

// Hostile inputs: each one crashed, exhausted memory or read outside the allowed folders.
TEST(Hostile, IdxDimensionsThatWrapAreRefused) {
  // 2^22 * 2^21 * 2^21 wraps a 64-bit size to 0.
  std::string img = Be32(0x803) + Be32(1u << 22) + Be32(1u << 21) + Be32(1u << 21);
  ExpectError(ReadPair(img, IdxLabels("\1")), "outside [1,");
  std::string zero = Be32(0x803) + Be32(1) + Be32(0) + Be32(28);
  ExpectError(ReadPair(zero, IdxLabels("\1")), "dimension 1 is 0");
}

TEST(Hostile, AGzipBombStopsAtTheLimit) {
  const std::string ip = TempDir() + "/bomb.gz", lp = TempDir() + "/bomb_lab";
  // 64 MiB of zeros inflate from ~64 KiB; the limit is set to 8 MiB for the test.
  std::string payload = Be32(0x803) + Be32(65536) + Be32(32) + Be32(32);
  payload.resize(payload.size() + (size_t{64} << 20), '\0');
  Write(ip, Gzip(payload));
  Write(lp, IdxLabels(std::string(65536, '\1')));
  const ReadPolicy saved = GetReadPolicy();
  ReadPolicy small = saved;
  small.max_file_bytes = uint64_t{8} << 20;
  SetReadPolicy(small);
  auto st = ReadIdxPair(ip, lp, 10).status();
  SetReadPolicy(saved);
  ExpectError(st, "inflates to more than the limit of 8 MiB");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
}

TEST(Hostile, DevicesAndLinksOutOfTheAllowedFoldersAreRefused) {
  const std::string dir = TempDir() + "/allowed";
  mkdir(dir.c_str(), 0755);
  const std::string outside = TempDir() + "/secret";
  Write(outside, "root:x:0:0:root:/root:/bin/bash\n");
  const std::string link = dir + "/train-images-idx3-ubyte";
  std::remove(link.c_str());
  ASSERT_EQ(symlink(outside.c_str(), link.c_str()), 0);
  const std::string zero = dir + "/train-labels-idx1-ubyte";
  std::remove(zero.c_str());
  ASSERT_EQ(symlink("/dev/zero", zero.c_str()), 0);
  const ReadPolicy saved = GetReadPolicy();
  ReadPolicy policy;
  policy.roots = {dir};
  SetReadPolicy(policy);
  auto escaped = ReadIdxPair(link, zero, 10).status();
  auto device = ReadIdxPair(zero, zero, 10).status();
  SetReadPolicy(saved);
  ExpectError(escaped, "outside the folders this process may read");
  EXPECT_EQ(escaped.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(std::string(escaped.message()).find("0x726f6f74"), std::string::npos);
  ExpectError(device, "outside the folders");  // /dev/zero is outside too
  // Without roots (the CLI), a device is still never read.
  ExpectError(ReadIdxPair(zero, zero, 10).status(), "not a regular file");
}

TEST(Hostile, DigitsPixelsMustBeFinite) {
  const std::string p = TempDir() + "/nan_digits.csv";
  std::string rows;
  for (int r = 0; r < 5; ++r) {
    for (int i = 0; i < 64; ++i) rows += (r == 2 && i == 7) ? "nan," : "3,";
    rows += "1\n";
  }
  Write(p, rows);
  ExpectError(ReadDigitsCsv(p).status(), "line 3, column 8: 'nan' is not a pixel value");
}

}  // namespace
}  // namespace topiary
