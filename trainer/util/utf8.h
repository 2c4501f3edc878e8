// UTF-8 checks for text that came from outside (spec fields, error messages printed as JSON).
#ifndef TOPIARY_TRAINER_UTIL_UTF8_H_
#define TOPIARY_TRAINER_UTIL_UTF8_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace topiary {

// Length (1 to 4) of the well-formed UTF-8 sequence starting at s[i], or 0 when there is none
// (a stray continuation byte, a truncated or overlong sequence, a surrogate, beyond U+10FFFF).
// REQUIRES: i < s.size().
size_t Utf8SequenceLength(absl::string_view s, size_t i);

bool IsValidUtf8(absl::string_view s);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_UTIL_UTF8_H_
