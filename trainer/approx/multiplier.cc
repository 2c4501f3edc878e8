#include "trainer/approx/multiplier.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "trainer/util/file_util.h"
#include "trainer/util/sha256.h"

namespace topiary {
namespace {

// The EvoApprox8b circuits shipped in data/multipliers/evoapprox8b, by content; power and
// area as published (PDK45).
constexpr KnownCircuit kKnown[] = {
    {"77694a3e3d33c655edf47f6bef0486ddded948843d93ea74bf2e4d16a5d1b361", "mul8u_12N4", 0.142,
     390.5},
    {"1319b35c1b93b04d94f21b097fd6c8da946fd38ac190c91281a9a9c84deecbb3", "mul8u_1446", 0.388,
     683.3},
    {"18d2a44f33c1da03ee01afdb413bf537788c9c06ff060cfed776cdc5546f1edb", "mul8u_17KS", 0.104,
     239.3},
    {"fcd6459a0c584fa87a4810eb71ccc99e70bbb64e7134a34fb7d798d84790b4c1", "mul8u_185Q", 0.206,
     427.5},
    {"0c6fd3441f139fb52cb64129eeb8b9cf866d6d095563d74639bd7459d183a8c1", "mul8u_1JFF", 0.391,
     709.6},
    {"a631aa6e8dcec9e80be826753eb5e637f050140fb346b8811cd8c5f9a6c0ef10", "mul8u_2P7", 0.386, 676.3},
    {"217ae1efb805a92fc38f6f341017382b5bf3048e99d824c5c59ceb0e7e084f43", "mul8u_96D", 0.309, 604.9},
    {"9c3539e69dfe6fa3498770cb1088ad4beb10f83a92920fb9bed350d9b278aa6a", "mul8u_CK5", 0.345, 604.5},
    {"cffd93a6478acee350d60f68adef06e223940ed275c10ec0664e03c5132534f0", "mul8u_EXZ", 0.380, 663.6},
    {"d170a9c7db9a809e0098f2c17426cbb6f4117486c4bf3ee76f39c09f7644252f", "mul8u_JQQ", 0.371, 661.2},
    {"edae36ca1a753dc5ad3909de56380f1f09bbb3d62134b0ce03d0e11e31c4c844", "mul8u_KEM", 0.370, 637.8},
    {"b07abb17f4940d34383a386f6e260ec81be362af2b8d1051d9ac40e000d49890", "mul8u_L40", 0.189, 437.4},
};

std::vector<uint16_t> Generate(const std::function<int(int, int)>& product) {
  std::vector<uint16_t> t(65536);
  for (int a = 0; a < 256; ++a) {
    for (int w = 0; w < 256; ++w) {
      const int p = product(a, w);
      t[(a << 8) | w] = static_cast<uint16_t>(p < 0 ? 0 : (p > 65535 ? 65535 : p));
    }
  }
  return t;
}

int LeadingOne(int x) { return 31 - __builtin_clz(static_cast<unsigned>(x)); }

int Mitchell(int a, int w) {
  if (a == 0 || w == 0) return 0;
  const int ka = LeadingOne(a), kw = LeadingOne(w);
  const double xa = a / std::ldexp(1.0, ka) - 1.0, xw = w / std::ldexp(1.0, kw) - 1.0;
  const double p =
      xa + xw < 1.0 ? std::ldexp(1.0 + xa + xw, ka + kw) : std::ldexp(xa + xw, ka + kw + 1);
  return static_cast<int>(std::floor(p));
}

int DrumOperand(int x, int k) {
  if (x == 0) return 0;
  const int shift = LeadingOne(x) - k + 1;
  if (shift <= 0) return x;
  return ((x >> shift) | 1) << shift;
}

int BrokenArray(int a, int w, int v) {
  int p = 0;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      if (i + j >= v && ((a >> i) & 1) && ((w >> j) & 1)) p += 1 << (i + j);
    }
  }
  return p;
}

absl::StatusOr<std::vector<uint16_t>> GenerateFamily(const std::string& name) {
  const size_t colon = name.find(':');
  const std::string family = name.substr(0, colon);
  int param = 0;
  const bool has_param = colon != std::string::npos;
  if (has_param && !absl::SimpleAtoi(name.substr(colon + 1), &param)) {
    return absl::InvalidArgumentError(
        absl::StrCat("multiplier ", name, ": the parameter after ':' must be an integer"));
  }
  auto needs = [&](int lo, int hi) -> absl::Status {
    if (!has_param || param < lo || param > hi) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "multiplier %s: %s needs a parameter in %d..%d (%s:N)", name, family, lo, hi, family));
    }
    return absl::OkStatus();
  };
  auto none = [&]() -> absl::Status {
    if (has_param) {
      return absl::InvalidArgumentError(
          absl::StrCat("multiplier ", name, ": ", family, " takes no parameter"));
    }
    return absl::OkStatus();
  };
  if (family == "exact") {
    if (auto st = none(); !st.ok()) return st;
    return Generate([](int a, int w) { return a * w; });
  }
  if (family == "trunc" || family == "trunc_a" || family == "trunc_w") {
    if (auto st = needs(1, 7); !st.ok()) return st;
    const int keep = ~((1 << param) - 1);
    const bool ta = family != "trunc_w", tw = family != "trunc_a";
    return Generate([=](int a, int w) { return (ta ? a & keep : a) * (tw ? w & keep : w); });
  }
  if (family == "bam") {
    if (auto st = needs(1, 14); !st.ok()) return st;
    return Generate([=](int a, int w) { return BrokenArray(a, w, param); });
  }
  if (family == "mitchell") {
    if (auto st = none(); !st.ok()) return st;
    return Generate(Mitchell);
  }
  if (family == "drum") {
    if (auto st = needs(3, 7); !st.ok()) return st;
    return Generate([=](int a, int w) { return DrumOperand(a, param) * DrumOperand(w, param); });
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "multiplier ", name,
      ": unknown; give a table file (.bin) or one of exact, trunc:T, trunc_a:T, trunc_w:T, "
      "bam:V, mitchell, drum:K"));
}

std::string TableBytes(const std::vector<uint16_t>& t) {
  std::string bytes(kMultiplierFileBytes, '\0');
  for (size_t i = 0; i < t.size(); ++i) {
    bytes[2 * i] = static_cast<char>(t[i] & 0xff);
    bytes[2 * i + 1] = static_cast<char>(t[i] >> 8);
  }
  return bytes;
}

absl::Status WrongSize(const std::string& path, const std::string& got) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "multiplier file %s: must be exactly 131072 bytes (65,536 little-endian uint16), got %s "
      "bytes",
      path, got));
}

// The content hash, and the published circuit with that content if there is one.
void Identify(const std::string& bytes, Multiplier* m) {
  m->sha256 = Sha256Hex(bytes.data(), bytes.size());
  for (const KnownCircuit& k : kKnown) {
    if (m->sha256 == k.sha256) m->known = k;
  }
}

}  // namespace

std::vector<std::string> MultiplierFamilies() {
  return {"exact", "trunc:T", "trunc_a:T", "trunc_w:T", "bam:V", "mitchell", "drum:K"};
}

absl::StatusOr<Multiplier> MultiplierFromBytes(const std::string& bytes, const std::string& path) {
  if (bytes.size() != kMultiplierFileBytes) return WrongSize(path, absl::StrCat(bytes.size()));
  Multiplier m;
  m.source = path;
  m.name = std::filesystem::path(path).stem().string();
  m.table.resize(65536);
  for (size_t i = 0; i < m.table.size(); ++i) {
    m.table[i] = static_cast<uint16_t>(static_cast<unsigned char>(bytes[2 * i]) |
                                       static_cast<unsigned char>(bytes[2 * i + 1]) << 8);
  }
  Identify(bytes, &m);
  return m;
}

std::vector<std::string> ShippedMultiplierFolders() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("TOPIARY_MULTIPLIERS")) {
    for (absl::string_view d : absl::StrSplit(env, ':', absl::SkipEmpty())) {
      candidates.emplace_back(d);
    }
  }
  const std::string in_runfiles = "/topiary/data/multipliers/evoapprox8b";
  // A binary started by another Bazel binary or test (the CLI under the Python suite) has
  // no runfiles tree of its own until Bazel builds it as a target of its own, which a test
  // does not wait for; its caller's runfiles, named by Bazel's variables, hold the tables.
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* dir = std::getenv(var)) candidates.push_back(dir + in_runfiles);
  }
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    const std::string self(exe, static_cast<size_t>(n));
    candidates.push_back(self + ".runfiles" + in_runfiles);
    const std::string dir = self.substr(0, self.rfind('/'));
    candidates.push_back(dir + "/../share/topiary/multipliers");
  }
  candidates.push_back("/usr/share/topiary/multipliers");
  candidates.push_back("data/multipliers/evoapprox8b");
  std::vector<std::string> out;
  for (const std::string& c : candidates) {
    if (IsDirectory(c)) out.push_back(c);
  }
  return out;
}

absl::StatusOr<Multiplier> LoadMultiplier(const std::string& name) {
  if (absl::EndsWith(name, ".bin")) {
    // One byte more than a table: a larger file is refused for its size, not read whole.
    auto raw = ReadFile(name, kMultiplierFileBytes + 1);
    if (raw.ok()) return MultiplierFromBytes(*raw, name);
    if (raw.status().code() == absl::StatusCode::kResourceExhausted) {
      return WrongSize(name, "more");
    }
    return absl::Status(raw.status().code(),
                        absl::StrCat("multiplier file ", name, ": ", raw.status().message()));
  }
  auto table = GenerateFamily(name);
  if (table.ok()) {
    Multiplier m;
    m.name = name;
    m.source = "generated";
    m.table = std::move(*table);
    Identify(TableBytes(m.table), &m);
    return m;
  }
  // A bare stem that is no family: a shipped table of that name, where one is found.
  if (name.find('/') != std::string::npos) return table.status();
  const std::vector<std::string> folders = ShippedMultiplierFolders();
  for (const std::string& folder : folders) {
    const std::string path = folder + "/" + name + ".bin";
    if (PathExists(path)) return LoadMultiplier(path);
  }
  return absl::Status(
      table.status().code(),
      absl::StrCat(table.status().message(), "; no shipped table ", name, ".bin either (",
                   folders.empty() ? "no folder of shipped tables found: set TOPIARY_MULTIPLIERS"
                                   : absl::StrCat("looked in ", absl::StrJoin(folders, ", ")),
                   ")"));
}

MultiplierMetrics ComputeMetrics(const std::vector<uint16_t>& t) {
  MultiplierMetrics m;
  double abs_sum = 0, sq_sum = 0, rel_sum = 0;
  int errors = 0, wce = 0;
  for (int a = 0; a < 256; ++a) {
    for (int w = 0; w < 256; ++w) {
      const int exact = a * w;
      const int err = std::abs(static_cast<int>(t[(a << 8) | w]) - exact);
      abs_sum += err;
      sq_sum += static_cast<double>(err) * err;
      if (err != 0) ++errors;
      if (err > wce) wce = err;
      if (exact != 0) rel_sum += static_cast<double>(err) / exact;
    }
  }
  constexpr double kPairs = 65536.0;
  m.mae = abs_sum / kPairs;
  m.mae_pct = 100.0 * m.mae / kPairs;
  m.wce = wce;
  m.wce_pct = 100.0 * wce / kPairs;
  m.ep_pct = 100.0 * errors / kPairs;
  m.mre_pct = 100.0 * rel_sum / (255.0 * 255.0);
  m.mse = sq_sum / kPairs;
  return m;
}

std::vector<uint16_t> WeightTuned(const std::vector<uint16_t>& t) {
  std::vector<int> best(256);
  for (int w = 0; w < 256; ++w) {
    int64_t best_cost = -1;
    for (int c = 0; c < 256; ++c) {
      int64_t cost = 0;
      for (int a = 0; a < 256; ++a) cost += std::abs(a * w - static_cast<int>(t[(a << 8) | c]));
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        best[w] = c;
      }
    }
  }
  std::vector<uint16_t> tuned(t.size());
  for (int a = 0; a < 256; ++a) {
    for (int w = 0; w < 256; ++w) tuned[(a << 8) | w] = t[(a << 8) | best[w]];
  }
  return tuned;
}

}  // namespace topiary
