// Multipliers for approximate convolutions: 8x8-bit tables of 65,536 uint16 products,
// T[(a << 8) | w] ~ a * w (a: activation code, w: weight code), loaded from files in the
// EvoApprox / TFApprox format or generated from a formula, identified by the SHA-256 of
// their contents (files move and get renamed; the contents say what circuit it is).
#ifndef TOPIARY_TRAINER_APPROX_MULTIPLIER_H_
#define TOPIARY_TRAINER_APPROX_MULTIPLIER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace topiary {

// Exactly this many bytes: 65,536 little-endian uint16, row-major, the activation as row.
inline constexpr uint64_t kMultiplierFileBytes = 131072;

// A published circuit recognized by its table's hash, with its synthesized cost (45 nm).
struct KnownCircuit {
  const char* sha256;
  const char* name;
  double power_mw, area_um2;
};

struct Multiplier {
  std::string name;    // the family as written ("trunc:4") or the file's stem ("mul8u_L40")
  std::string source;  // "generated", or the path of the file it was read from
  std::string sha256;  // of the table's 131,072 little-endian bytes
  std::vector<uint16_t> table;
  std::optional<KnownCircuit> known;  // a published circuit with these exact contents
};

// Error measures over all 2^16 operand pairs, as the EvoApprox library defines them: mean and
// worst absolute error (also as % of 2^16), error probability, mean relative error over the
// pairs whose exact product is not 0, mean squared error.
struct MultiplierMetrics {
  double mae = 0, mae_pct = 0, wce = 0, wce_pct = 0, ep_pct = 0, mre_pct = 0, mse = 0;
};

// NAME is a table file (ending in .bin, read under the read policy; exactly 131,072 bytes) or
// a generated family:
//   exact          a * w
//   trunc:T        both operands with their T low bits dropped (T in 1..7)
//   trunc_a:T      the activation only;  trunc_w:T  the weight only
//   bam:V          broken array: partial-product bits a_i w_j with i + j < V omitted (1..14)
//   mitchell       Mitchell's logarithmic multiplier (log2 by leading one, linear mantissa)
//   drum:K         DRUM: each operand cut to the K bits below its leading one, the lowest
//                  kept bit set to 1 (unbiased truncation; K in 3..7)
// or the stem of a table shipped with Topiary (e.g. mul8u_L40: ShippedMultiplierFolders).
// Errors are INVALID_ARGUMENT naming what is wrong (unknown family, bad parameter, wrong
// size) or the read policy's (NOT_FOUND, PERMISSION_DENIED, ...).
absl::StatusOr<Multiplier> LoadMultiplier(const std::string& name);

// Where the EvoApprox tables shipped with Topiary (data/multipliers/evoapprox8b) are found,
// the first existing of: $TOPIARY_MULTIPLIERS (folders separated by ':'), the Bazel
// runfiles of $RUNFILES_DIR or $TEST_SRCDIR, the running binary's own runfiles,
// <binary>/../share/topiary/multipliers,
// /usr/share/topiary/multipliers, ./data/multipliers/evoapprox8b (a source checkout).
std::vector<std::string> ShippedMultiplierFolders();

// A table file's contents, read from `path` (named in errors; its stem becomes the name).
absl::StatusOr<Multiplier> MultiplierFromBytes(const std::string& bytes, const std::string& path);

// The generated families, for help texts.
std::vector<std::string> MultiplierFamilies();

MultiplierMetrics ComputeMetrics(const std::vector<uint16_t>& table);

// ALWANN's weight tuning (Mrazek et al., ICCAD 2019): each weight code w is replaced by the
// code w' that minimizes sum_a |a * w - T[a, w']|, i.e. T'[a, w] = T[a, w'(w)]. The network's
// weights are unchanged; the multiplier sees the better-suited operand.
std::vector<uint16_t> WeightTuned(const std::vector<uint16_t>& table);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_APPROX_MULTIPLIER_H_
