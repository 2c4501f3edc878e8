// Convolution plans kept across processes: what cuDNN algorithm or engine each pass of a
// convolution measured fastest, keyed by everything the measurement depends on (GPU model,
// driver and cuDNN versions, shape, precision, workspace limit, determinism; the layout is
// always NHWC activations and KRSC filters). A second start of the same model makes its plans
// from here in seconds instead of timing every candidate again (docs/architecture.md, "Plans").
//
// The cache is a text file of one entry per line, appended to as plans are measured; later
// lines replace earlier ones. A file is read with the same suspicion as any input: a link,
// a non-regular or oversized file is not read, a line that does not parse exactly is skipped
// (and counted), and the kernels re-check every value before using it: a damaged cache costs a
// search, never a wrong or failing plan.
#ifndef TOPIARY_TRAINER_NN_PLAN_CACHE_H_
#define TOPIARY_TRAINER_NN_PLAN_CACHE_H_

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/conv/conv.h"

namespace topiary {

class ConvPlanCache {
 public:
  // Files larger than this are not read (about 40,000 entries).
  static constexpr size_t kMaxFileBytes = size_t{8} << 20;

  // The process's cache. Its first file is TOPIARY_PLAN_CACHE when set (a path; "off" keeps
  // plans in memory only), else $XDG_CACHE_HOME/topiary/conv_plans.tsv, else
  // $HOME/.cache/topiary/conv_plans.tsv; topiaryd adds one in its data directory.
  static ConvPlanCache& Global();

  ConvPlanCache() = default;
  // Reads `path` (if it exists) into memory and appends later entries to it. An unreadable
  // file is remembered in notes(); the cache goes on without it.
  void AddFile(const std::string& path);

  std::optional<kernels::ConvAlgos> Find(const std::string& key) const;
  // Keeps `algos` for `key` in memory and appends them to every file.
  void Store(const std::string& key, const kernels::ConvAlgos& algos);

  // The key of a plan: device identity (kernels::ConvDeviceIdentity), shape, precision,
  // workspace limit and determinism.
  static std::string Key(const std::string& device, const kernels::ConvShape& shape,
                         kernels::Precision precision, size_t workspace_limit, bool deterministic);
  // One line of a cache file (without the newline), and back. ParseLine refuses anything
  // that FormatLine would not have written, naming what is wrong.
  static std::string FormatLine(const std::string& key, const kernels::ConvAlgos& algos);
  static absl::StatusOr<std::pair<std::string, kernels::ConvAlgos>> ParseLine(
      const std::string& line);

  std::vector<std::string> files() const;
  // What went wrong with the files ("<path>: line 12: ...", "<path>: not a regular file"),
  // first few only; the count of skipped lines is in the last one.
  std::vector<std::string> notes() const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, kernels::ConvAlgos> entries_;
  std::vector<std::string> files_;
  std::vector<std::string> notes_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_PLAN_CACHE_H_
