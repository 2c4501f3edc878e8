#include "trainer/approx/multiplier.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "trainer/util/file_util.h"

namespace topiary {
namespace {

const char kDir[] = "data/multipliers/evoapprox8b/";

// A published figure and half a unit of its last digit (published figures are rounded).
struct Figure {
  double value = 0, tol = 0;
};

Figure ParseFigure(const std::string& text) {
  Figure f;
  EXPECT_TRUE(absl::SimpleAtod(text, &f.value)) << text;
  const size_t e = text.find_first_of("eE");
  const std::string mantissa = text.substr(0, e);
  int exponent = 0;
  if (e != std::string::npos) {
    EXPECT_TRUE(absl::SimpleAtoi(text.substr(e + 1), &exponent)) << text;
  }
  const size_t dot = mantissa.find('.');
  const int decimals = dot == std::string::npos ? 0 : static_cast<int>(mantissa.size() - dot - 1);
  f.tol = 0.5 * std::pow(10.0, exponent - decimals) * 1.0001;
  return f;
}

struct Published {
  std::string name;
  Figure mae_pct, mae, wce_pct, wce, ep_pct, mre_pct, mse;
  double power, area;
};

std::vector<Published> ReadPublished() {
  std::ifstream in(std::string(kDir) + "published_metrics.csv");
  std::string line;
  std::getline(in, line);  // header
  std::vector<Published> out;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() < 11) continue;
    Published p;
    p.name = f[0];
    p.mae_pct = ParseFigure(f[1]);
    p.mae = ParseFigure(f[2]);
    p.wce_pct = ParseFigure(f[3]);
    p.wce = ParseFigure(f[4]);
    // f[5] is WCRE%, which Topiary does not report.
    p.ep_pct = ParseFigure(f[6]);
    p.mre_pct = ParseFigure(f[7]);
    p.mse = ParseFigure(f[8]);
    EXPECT_TRUE(absl::SimpleAtod(f[9], &p.power));
    EXPECT_TRUE(absl::SimpleAtod(f[10], &p.area));
    out.push_back(p);
  }
  return out;
}

void ExpectNear(double ours, const Figure& published, const std::string& what) {
  EXPECT_NEAR(ours, published.value, published.tol) << what;
}

TEST(Multiplier, RecomputedMetricsEqualThePublishedOnes) {
  const auto published = ReadPublished();
  ASSERT_EQ(published.size(), 12u);
  for (const Published& p : published) {
    auto m = LoadMultiplier(std::string(kDir) + p.name + ".bin");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->name, p.name);
    ASSERT_TRUE(m->known.has_value()) << p.name;
    EXPECT_EQ(m->known->name, p.name);
    EXPECT_EQ(m->known->power_mw, p.power);
    EXPECT_EQ(m->known->area_um2, p.area);
    const MultiplierMetrics x = ComputeMetrics(m->table);
    ExpectNear(x.mae, p.mae, p.name + " MAE");
    ExpectNear(x.mae_pct, p.mae_pct, p.name + " MAE%");
    ExpectNear(x.wce, p.wce, p.name + " WCE");
    ExpectNear(x.wce_pct, p.wce_pct, p.name + " WCE%");
    ExpectNear(x.ep_pct, p.ep_pct, p.name + " EP%");
    ExpectNear(x.mre_pct, p.mre_pct, p.name + " MRE%");
    ExpectNear(x.mse, p.mse, p.name + " MSE");
  }
  // The figures for mul8u_L40.
  const MultiplierMetrics l40 =
      ComputeMetrics(LoadMultiplier(std::string(kDir) + "mul8u_L40.bin")->table);
  EXPECT_EQ(std::round(l40.mae), 1011);
  EXPECT_EQ(l40.wce, 9124);
  EXPECT_NEAR(l40.ep_pct, 74.91, 0.005);
  EXPECT_NEAR(l40.mre_pct, 7.46, 0.005);
}

TEST(Multiplier, GeneratedFamilies) {
  auto exact = LoadMultiplier("exact");
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->source, "generated");
  EXPECT_EQ(ComputeMetrics(exact->table).mae, 0.0);
  // mul8u_1JFF is the exact multiplier: the same contents, so the same hash.
  ASSERT_TRUE(exact->known.has_value());
  EXPECT_STREQ(exact->known->name, "mul8u_1JFF");

  const MultiplierMetrics t2 = ComputeMetrics(LoadMultiplier("trunc:2")->table);
  EXPECT_GT(t2.mae, 0.0);
  EXPECT_LE(t2.wce, 3 * 255 * 2 + 9);  // (a - da)(w - dw), da, dw <= 3
  const MultiplierMetrics t2a = ComputeMetrics(LoadMultiplier("trunc_a:2")->table);
  EXPECT_LT(t2a.mae, t2.mae);
  EXPECT_LE(t2a.wce, 3 * 255);

  auto mitchell = LoadMultiplier("mitchell");
  ASSERT_TRUE(mitchell.ok());
  for (int a = 0; a < 256; ++a) {
    for (int w = 0; w < 256; ++w) {
      ASSERT_LE(mitchell->table[(a << 8) | w], a * w) << a << " " << w;  // never overestimates
    }
  }
  EXPECT_EQ(mitchell->table[(64 << 8) | 32], 64 * 32);  // powers of two are exact
  // Mitchell's worst relative error is about 11.1%.
  EXPECT_LT(ComputeMetrics(mitchell->table).mre_pct, 11.2);

  const MultiplierMetrics d4 = ComputeMetrics(LoadMultiplier("drum:4")->table);
  const MultiplierMetrics d6 = ComputeMetrics(LoadMultiplier("drum:6")->table);
  EXPECT_GT(d4.mre_pct, d6.mre_pct);
  EXPECT_EQ(LoadMultiplier("drum:4")->table[(7 << 8) | 5], 35);  // short operands are exact

  const MultiplierMetrics b6 = ComputeMetrics(LoadMultiplier("bam:6")->table);
  const MultiplierMetrics b10 = ComputeMetrics(LoadMultiplier("bam:10")->table);
  EXPECT_LT(b6.mae, b10.mae);
  EXPECT_EQ(LoadMultiplier("bam:1")->table[(1 << 8) | 1], 0);  // a0 w0 is below column 1
}

TEST(Multiplier, BadNamesAndFilesAreNamed) {
  for (const char* bad : {"trunc:0", "trunc:8", "trunc", "trunc:x", "drum:9", "bam:15", "exact:3",
                          "mitchell:2", "wallace"}) {
    auto m = LoadMultiplier(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(m.status().message().find(bad), absl::string_view::npos) << m.status();
  }
  const std::string dir = ::testing::TempDir();
  for (size_t size : {size_t{0}, size_t{131071}, size_t{131073}, size_t{262144}}) {
    const std::string path = dir + "/wrong_" + std::to_string(size) + ".bin";
    std::ofstream(path) << std::string(size, '\x01');
    auto m = LoadMultiplier(path);
    ASSERT_FALSE(m.ok()) << size;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("131072"), absl::string_view::npos) << m.status();
    EXPECT_NE(m.status().message().find(path), absl::string_view::npos) << m.status();
  }
  auto missing = LoadMultiplier(dir + "/missing.bin");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  // Any valid 131,072-byte file works, and its hash is its contents'.
  const std::string held_out = dir + "/held_out.bin";
  std::ofstream(held_out) << std::string(131072, '\x02');
  auto h = LoadMultiplier(held_out);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->table[12345], 0x0202);
  EXPECT_FALSE(h->known.has_value());
  EXPECT_EQ(h->sha256.size(), 64u);
}

// A binary run by another Bazel binary or test has no runfiles tree of its own; the caller's
// RUNFILES_DIR names where the shipped tables are.
TEST(Multiplier, ShippedTablesAreFoundInTheCallersRunfiles) {
  const std::string root = ::testing::TempDir() + "/caller.runfiles";
  const std::string folder = root + "/topiary/data/multipliers/evoapprox8b";
  ASSERT_TRUE(MakeDirs(folder).ok());
  std::ofstream(folder + "/mul8u_only_here.bin") << std::string(131072, '\x03');
  const char* before = std::getenv("RUNFILES_DIR");
  const std::string saved = before ? before : "";
  ::setenv("RUNFILES_DIR", root.c_str(), 1);
  auto m = LoadMultiplier("mul8u_only_here");
  auto missing = LoadMultiplier("mul8u_nowhere");
  if (before) {
    ::setenv("RUNFILES_DIR", saved.c_str(), 1);
  } else {
    ::unsetenv("RUNFILES_DIR");
  }
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->table[777], 0x0303);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(folder), absl::string_view::npos) << missing.status();
}

TEST(Multiplier, WeightTuningNeverHurtsAndKeepsExactTables) {
  const auto exact = LoadMultiplier("exact")->table;
  EXPECT_EQ(WeightTuned(exact), exact);
  const auto l40 = LoadMultiplier(std::string(kDir) + "mul8u_L40.bin")->table;
  const auto tuned = WeightTuned(l40);
  EXPECT_LT(ComputeMetrics(tuned).mae, ComputeMetrics(l40).mae);
}

}  // namespace
}  // namespace topiary
