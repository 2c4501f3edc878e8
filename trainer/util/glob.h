// Layer-name patterns of the spec: '*' matches any run of characters (dots included), '?'
// one character; everything else matches itself.
#ifndef TOPIARY_TRAINER_UTIL_GLOB_H_
#define TOPIARY_TRAINER_UTIL_GLOB_H_

#include <string_view>

namespace topiary {

inline bool GlobMatch(std::string_view pattern, std::string_view name) {
  size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace topiary

#endif  // TOPIARY_TRAINER_UTIL_GLOB_H_
