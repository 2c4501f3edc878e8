#include "trainer/nn/plan_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

// The candidates a plan times are part of what a measurement depends on: v2 plans also time
// the direct kernels' bf16 forms in bf16 plans, which a v1 plan never measured; v3 plans the
// TF32 backward filter in TF32 plans.
constexpr char kVersion[] = "v3";
constexpr size_t kMaxLineBytes = 1024;
constexpr size_t kMaxNotes = 8;

// "G <engine> <ms>", "L <algo> <math> <ms>" or "D <ms>" (the direct kernel).
std::string FormatPass(const kernels::ConvPassAlgo& a) {
  return a.direct  ? absl::StrFormat("D %.5f", a.ms)
         : a.graph ? absl::StrFormat("G %d %.5f", a.engine, a.ms)
                   : absl::StrFormat("L %d %d %.5f", a.algo, a.math, a.ms);
}

absl::StatusOr<float> ParseMs(absl::string_view s) {
  float ms;
  if (!absl::SimpleAtof(s, &ms) || !std::isfinite(ms) || (ms < 0 && ms != -1) || ms > 1e7) {
    return absl::InvalidArgumentError(absl::StrCat("time '", s, "' is not -1 or 0..1e7 ms"));
  }
  return ms;
}

absl::StatusOr<kernels::ConvPassAlgo> ParsePass(absl::string_view field) {
  const std::vector<absl::string_view> w = absl::StrSplit(field, ' ');
  kernels::ConvPassAlgo a;
  int64_t v0 = 0, v1 = 0;
  if (w.size() == 2 && w[0] == "D") {
    a.direct = true;
    TOPIARY_ASSIGN_OR_RETURN(auto ms, ParseMs(w[1]));
    a.ms = ms;
    return a;
  }
  if (w.size() == 3 && w[0] == "G") {
    if (!absl::SimpleAtoi(w[1], &v0) || v0 < 0 || v0 > 1000000) {
      return absl::InvalidArgumentError(absl::StrCat("engine '", w[1], "' is not 0..1000000"));
    }
    a.graph = true;
    a.engine = v0;
    TOPIARY_ASSIGN_OR_RETURN(auto ms, ParseMs(w[2]));
    a.ms = ms;
    return a;
  }
  if (w.size() == 4 && w[0] == "L") {
    if (!absl::SimpleAtoi(w[1], &v0) || v0 < 0 || v0 > 64) {
      return absl::InvalidArgumentError(absl::StrCat("algorithm '", w[1], "' is not 0..64"));
    }
    if (!absl::SimpleAtoi(w[2], &v1) || v1 < 0 || v1 > 3) {
      return absl::InvalidArgumentError(absl::StrCat("math type '", w[2], "' is not 0..3"));
    }
    a.algo = static_cast<int>(v0);
    a.math = static_cast<int>(v1);
    TOPIARY_ASSIGN_OR_RETURN(auto ms, ParseMs(w[3]));
    a.ms = ms;
    return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pass '", field, "' is not 'G engine ms', 'L algo math ms' or 'D ms'"));
}

// The file's contents, when it is a regular file (not a link) of at most kMaxFileBytes; an
// empty string when it does not exist. Not file_util's ReadFile: topiaryd's read policy admits
// only its data and dataset folders, and the user's cache folder is neither; this reader
// follows no link at all instead.
absl::StatusOr<std::string> ReadCacheFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return std::string();
    return absl::FailedPreconditionError(
        absl::StrCat(errno == ELOOP ? "a link (not followed)" : std::strerror(errno)));
  }
  struct stat st {};
  std::string data;
  absl::Status status;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = absl::FailedPreconditionError("not a regular file");
  } else if (static_cast<uint64_t>(st.st_size) > ConvPlanCache::kMaxFileBytes) {
    status = absl::ResourceExhaustedError(
        absl::StrCat(HumanBytes(st.st_size), ", over the limit of ",
                     HumanBytes(ConvPlanCache::kMaxFileBytes), "; delete it to start a new one"));
  } else {
    data.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < data.size()) {
      const ssize_t n = read(fd, data.data() + got, data.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    data.resize(got);
  }
  close(fd);
  if (!status.ok()) return status;
  return data;
}

// Appends one line with a single write (O_APPEND: concurrent writers do not interleave lines),
// creating the folder; the file stays under kMaxFileBytes.
absl::Status AppendLine(const std::string& path, const std::string& line) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (auto st = MakeDirs(path.substr(0, slash)); !st.ok()) return st;
  }
  return AppendToFile(path, line + "\n", /*sync=*/false, ConvPlanCache::kMaxFileBytes);
}

}  // namespace

ConvPlanCache& ConvPlanCache::Global() {
  static ConvPlanCache* cache = [] {
    auto* c = new ConvPlanCache();
    const char* env = std::getenv("TOPIARY_PLAN_CACHE");
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    std::string path;
    if (env != nullptr && *env != '\0') {
      path = std::string(env) == "off" ? "" : env;
    } else if (xdg != nullptr && *xdg == '/') {
      path = absl::StrCat(xdg, "/topiary/conv_plans.tsv");
    } else if (home != nullptr && *home == '/') {
      path = absl::StrCat(home, "/.cache/topiary/conv_plans.tsv");
    }
    if (!path.empty()) c->AddFile(path);
    return c;
  }();
  return *cache;
}

void ConvPlanCache::AddFile(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& f : files_) {
    if (f == path) return;
  }
  auto note = [&](const std::string& what) {
    if (notes_.size() < kMaxNotes) notes_.push_back(absl::StrCat(path, ": ", what));
  };
  auto text = ReadCacheFile(path);
  if (!text.ok()) {
    note(std::string(text.status().message()));
    return;  // neither read nor written
  }
  files_.push_back(path);
  int line_no = 0, skipped = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    ++line_no;
    auto entry = ParseLine(std::string(line));
    if (!entry.ok()) {
      if (skipped++ < 3) note(absl::StrCat("line ", line_no, ": ", entry.status().message()));
      continue;
    }
    entries_[entry->first] = entry->second;
  }
  if (skipped > 0) note(absl::StrCat(skipped, " damaged lines skipped"));
}

std::optional<kernels::ConvAlgos> ConvPlanCache::Find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void ConvPlanCache::Store(const std::string& key, const kernels::ConvAlgos& algos) {
  const std::string line = FormatLine(key, algos);
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = algos;
  for (const std::string& f : files_) {
    if (auto st = AppendLine(f, line); !st.ok() && notes_.size() < kMaxNotes) {
      notes_.push_back(absl::StrCat(f, ": not written: ", st.message()));
    }
  }
}

std::string ConvPlanCache::Key(const std::string& device, const kernels::ConvShape& s,
                               kernels::Precision precision, size_t workspace_limit,
                               bool deterministic) {
  // Tabs and newlines would break the line format; a GPU name never has them.
  std::string dev = device;
  for (char& c : dev) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return absl::StrFormat(
      "%s|%s|nhwc-krsc %d,%d,%d,%d k%d r%d s%d stride %d,%d pad %d,%d|%s|ws %d|det %d", kVersion,
      dev, s.n, s.h, s.w, s.c, s.k, s.r, s.s, s.stride_h, s.stride_w, s.pad_h, s.pad_w,
      kernels::PrecisionName(precision), workspace_limit, deterministic ? 1 : 0);
}

std::string ConvPlanCache::FormatLine(const std::string& key, const kernels::ConvAlgos& algos) {
  return absl::StrCat(key, "\t", FormatPass(algos.pass[0]), "\t", FormatPass(algos.pass[1]), "\t",
                      FormatPass(algos.pass[2]));
}

absl::StatusOr<std::pair<std::string, kernels::ConvAlgos>> ConvPlanCache::ParseLine(
    const std::string& line) {
  if (line.size() > kMaxLineBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(line.size(), " bytes, over the limit of ", kMaxLineBytes));
  }
  const std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
  if (fields.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(fields.size(), " tab-separated fields, not 4 (key and three passes)"));
  }
  if (!absl::StartsWith(fields[0], absl::StrCat(kVersion, "|"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("the key does not start with '", kVersion, "|'"));
  }
  kernels::ConvAlgos algos;
  for (int p = 0; p < 3; ++p) {
    TOPIARY_ASSIGN_OR_RETURN(auto a, ParsePass(fields[p + 1]));
    algos.pass[p] = a;
  }
  return std::make_pair(std::string(fields[0]), algos);
}

std::vector<std::string> ConvPlanCache::files() const {
  std::lock_guard<std::mutex> lock(mu_);
  return files_;
}

std::vector<std::string> ConvPlanCache::notes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return notes_;
}

size_t ConvPlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace topiary
