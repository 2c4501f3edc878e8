// Tables of pairs that map one enum to another or to its name (the spec's enums and the
// engine's, the engine's and the names in checkpoint files): one lookup either way for all.
#ifndef TOPIARY_TRAINER_UTIL_ENUM_PAIRS_H_
#define TOPIARY_TRAINER_UTIL_ENUM_PAIRS_H_

#include <cstddef>
#include <optional>
#include <utility>

namespace topiary {

// The second of the pair whose first equals `key` (nullopt: none does).
template <typename A, typename B, size_t N, typename K>
std::optional<B> SecondOf(const std::pair<A, B> (&table)[N], const K& key) {
  for (const auto& p : table) {
    if (p.first == key) return p.second;
  }
  return std::nullopt;
}

// The first of the pair whose second equals `key` (nullopt: none does).
template <typename A, typename B, size_t N, typename K>
std::optional<A> FirstOf(const std::pair<A, B> (&table)[N], const K& key) {
  for (const auto& p : table) {
    if (p.second == key) return p.first;
  }
  return std::nullopt;
}

}  // namespace topiary

#endif  // TOPIARY_TRAINER_UTIL_ENUM_PAIRS_H_
