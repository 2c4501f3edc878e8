#include "trainer/nn/plan_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

using kernels::ConvAlgos;

std::string TempDir() {
  std::string dir = absl::StrCat(testing::TestDir(), "/plan_cache_", getpid(), "_",
                                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
  mkdir(dir.c_str(), 0755);
  return dir;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

ConvAlgos Sample() {
  ConvAlgos a;
  a.pass[0].graph = true;
  a.pass[0].engine = 42;
  a.pass[0].ms = 0.125f;
  a.pass[1].algo = 1;
  a.pass[1].math = 2;
  a.pass[1].ms = -1;        // untimed
  a.pass[2].direct = true;  // the direct kernel
  a.pass[2].ms = 0.0625f;
  return a;
}

std::string SampleKey(int n = 128) {
  kernels::ConvShape s;
  s.n = n, s.h = 32, s.w = 32, s.c = 16, s.k = 32, s.r = 3, s.s = 3, s.stride_h = s.stride_w = 2;
  s.pad_h = s.pad_w = 1;
  return ConvPlanCache::Key("NVIDIA H100 80GB HBM3|sm_90|driver 13000|cudnn 91900", s,
                            kernels::Precision::kBf16, size_t{1} << 30, false);
}

void ExpectSame(const ConvAlgos& a, const ConvAlgos& b) {
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ(a.pass[p].graph, b.pass[p].graph) << p;
    EXPECT_EQ(a.pass[p].direct, b.pass[p].direct) << p;
    if (a.pass[p].graph) {
      EXPECT_EQ(a.pass[p].engine, b.pass[p].engine) << p;
    } else {
      EXPECT_EQ(a.pass[p].algo, b.pass[p].algo) << p;
      EXPECT_EQ(a.pass[p].math, b.pass[p].math) << p;
    }
    EXPECT_FLOAT_EQ(a.pass[p].ms, b.pass[p].ms) << p;
  }
}

TEST(PlanCacheTest, KeyNamesEverythingAMeasurementDependsOn) {
  const std::string key = SampleKey();
  for (const char* part :
       {"v3|", "H100", "sm_90", "driver 13000", "cudnn 91900", "128,32,32,16", "k32", "r3",
        "stride 2,2", "pad 1,1", "bf16", "ws 1073741824", "det 0"}) {
    EXPECT_NE(key.find(part), std::string::npos) << part << " in " << key;
  }
  EXPECT_NE(SampleKey(128), SampleKey(256));
  // A tab in a device name cannot break the line format.
  kernels::ConvShape s{1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(ConvPlanCache::Key("a\tb\nc", s, kernels::Precision::kFp32, 1, true).find('\t'),
            std::string::npos);
}

TEST(PlanCacheTest, LinesRoundTrip) {
  const std::string line = ConvPlanCache::FormatLine(SampleKey(), Sample());
  auto parsed = ConvPlanCache::ParseLine(line);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->first, SampleKey());
  ExpectSame(parsed->second, Sample());
}

TEST(PlanCacheTest, DamagedLinesAreRefusedNamingTheProblem) {
  const std::string key = SampleKey();
  const std::string good = "G 1 0.5";
  struct Case {
    std::string line, message;
  };
  const std::vector<Case> cases = {
      {key, "fields"},
      {absl::StrCat(key, "\t", good, "\t", good), "fields"},
      {absl::StrCat(key, "\t", good, "\t", good, "\t", good, "\t", good), "fields"},
      {absl::StrCat("v2|x\t", good, "\t", good, "\t", good), "v3|"},  // a v2 plan
      {absl::StrCat(key, "\tG -1 0.5\t", good, "\t", good), "engine"},
      {absl::StrCat(key, "\tG 99999999999 0.5\t", good, "\t", good), "engine"},
      {absl::StrCat(key, "\tG x 0.5\t", good, "\t", good), "engine"},
      {absl::StrCat(key, "\t", good, "\tL 65 0 1\t", good), "algorithm"},
      {absl::StrCat(key, "\t", good, "\tL 1 4 1\t", good), "math"},
      {absl::StrCat(key, "\t", good, "\tL 1 -1 1\t", good), "math"},
      {absl::StrCat(key, "\t", good, "\t", good, "\tL 1 3 nan"), "time"},
      {absl::StrCat(key, "\t", good, "\t", good, "\tL 1 3 inf"), "time"},
      {absl::StrCat(key, "\t", good, "\t", good, "\tL 1 3 -2"), "time"},
      {absl::StrCat(key, "\t", good, "\t", good, "\tG 1 1e9"), "time"},
      {absl::StrCat(key, "\t", good, "\t", good, "\tD nan"), "time"},
      {absl::StrCat(key, "\t", good, "\t", good, "\tX 1 1"), "is not"},
      {absl::StrCat(key, "\t", good, "\t", good, "\tG 1 1 extra"), "is not"},
      {absl::StrCat(key, "\t", good, "\t", good, "\tD 1 1"), "is not"},
      {absl::StrCat(key, "\t", good, "\t", good, "\t"), "is not"},
      {std::string(5000, 'v'), "bytes"},
  };
  for (const Case& c : cases) {
    auto parsed = ConvPlanCache::ParseLine(c.line);
    ASSERT_FALSE(parsed.ok()) << c.line;
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos)
        << parsed.status() << " for " << c.line.substr(0, 200);
  }
}

TEST(PlanCacheTest, StoredPlansAreAppendedAndReadByTheNextProcess) {
  const std::string path = TempDir() + "/sub/dir/conv_plans.tsv";  // folders are made
  {
    ConvPlanCache cache;
    cache.AddFile(path);
    EXPECT_TRUE(cache.notes().empty());
    EXPECT_FALSE(cache.Find(SampleKey()).has_value());
    cache.Store(SampleKey(), Sample());
    ConvAlgos second = Sample();
    second.pass[0].engine = 7;
    cache.Store(SampleKey(256), second);
    ASSERT_TRUE(cache.Find(SampleKey()).has_value());
    ExpectSame(*cache.Find(SampleKey()), Sample());
  }
  ConvPlanCache next;
  next.AddFile(path);
  EXPECT_TRUE(next.notes().empty());
  EXPECT_EQ(next.size(), 2u);
  ASSERT_TRUE(next.Find(SampleKey()).has_value());
  ExpectSame(*next.Find(SampleKey()), Sample());
  EXPECT_EQ(next.Find(SampleKey(256))->pass[0].engine, 7);
  // A later line replaces an earlier one (a plan measured again).
  ConvAlgos again = Sample();
  again.pass[2].ms = 1.0f;
  next.Store(SampleKey(), again);
  ConvPlanCache third;
  third.AddFile(path);
  EXPECT_FLOAT_EQ(third.Find(SampleKey())->pass[2].ms, 1.0f);
  EXPECT_EQ(third.size(), 2u);
}

TEST(PlanCacheTest, DamagedLinesAreSkippedAndTheRestIsUsed) {
  const std::string path = TempDir() + "/conv_plans.tsv";
  Write(path, absl::StrCat("garbage\n", std::string(3000, '\xff'), "\n",
                           ConvPlanCache::FormatLine(SampleKey(), Sample()), "\n",
                           "v3|x\tG 1 1\tG 1 1\n", std::string("\0\0\0", 3), "\n"));
  ConvPlanCache cache;
  cache.AddFile(path);
  EXPECT_EQ(cache.size(), 1u);
  ASSERT_TRUE(cache.Find(SampleKey()).has_value());
  const auto notes = cache.notes();
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes.back().find("4 damaged lines skipped"), std::string::npos) << notes.back();
  EXPECT_NE(notes.front().find("line 1"), std::string::npos) << notes.front();
  // The file stays in use: new plans are appended after the damage.
  cache.Store(SampleKey(512), Sample());
  ConvPlanCache next;
  next.AddFile(path);
  EXPECT_EQ(next.size(), 2u);
}

TEST(PlanCacheTest, LinksFoldersAndHugeFilesAreNeitherReadNorWritten) {
  const std::string dir = TempDir();
  const std::string target = dir + "/elsewhere.tsv";
  Write(target, ConvPlanCache::FormatLine(SampleKey(), Sample()) + "\n");
  const std::string link = dir + "/link.tsv";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  const std::string folder = dir + "/folder.tsv";
  ASSERT_EQ(mkdir(folder.c_str(), 0755), 0);
  const std::string huge = dir + "/huge.tsv";
  Write(huge, "");
  ASSERT_EQ(truncate(huge.c_str(), ConvPlanCache::kMaxFileBytes + 1), 0);

  ConvPlanCache cache;
  for (const std::string& p : {link, folder, huge}) cache.AddFile(p);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_TRUE(cache.files().empty());
  const auto notes = cache.notes();
  ASSERT_EQ(notes.size(), 3u);
  EXPECT_NE(notes[0].find("link"), std::string::npos) << notes[0];
  EXPECT_NE(notes[1].find("not a regular file"), std::string::npos) << notes[1];
  EXPECT_NE(notes[2].find("over the limit"), std::string::npos) << notes[2];
  cache.Store(SampleKey(), Sample());  // memory only
  EXPECT_TRUE(cache.Find(SampleKey()).has_value());
  EXPECT_EQ(Read(target), ConvPlanCache::FormatLine(SampleKey(), Sample()) + "\n");  // untouched
}

}  // namespace
}  // namespace topiary
