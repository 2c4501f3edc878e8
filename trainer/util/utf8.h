// UTF-8 checks for text that came from outside (spec fields, error messages printed as JSON).
#ifndef TOPIARY_TRAINER_UTIL_UTF8_H_
#define TOPIARY_TRAINER_UTIL_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace topiary {

// Length (1 to 4) of the well-formed UTF-8 sequence starting at s[i], or 0 when there is none
// (a stray continuation byte, a truncated or overlong sequence, a surrogate, beyond U+10FFFF).
// REQUIRES: i < s.size().
size_t Utf8SequenceLength(absl::string_view s, size_t i);

bool IsValidUtf8(absl::string_view s);

// True for characters that change how a terminal or an editor shows the text around them
// rather than show themselves: C0 and C1 controls, DEL, and the bidirectional formatting
// characters (U+061C, U+200E/F, U+202A..E, U+2066..9), which can make a name print as
// another.
bool IsControlOrBidi(uint32_t code_point);

// Valid UTF-8 without controls or bidirectional formatting (names and paths must be).
bool IsPlainText(absl::string_view s);

// `s` fit to print on one line: every control, bidirectional formatting character and
// invalid byte becomes '?'. With `keep_lines`, newlines and tabs stay (a message of several
// lines), and only the rest becomes '?': no escape sequence ever reaches a terminal.
std::string Printable(absl::string_view s, bool keep_lines = false);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_UTIL_UTF8_H_
