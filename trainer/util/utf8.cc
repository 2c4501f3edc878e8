#include "trainer/util/utf8.h"

#include <cstdint>

namespace topiary {

size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const unsigned char c = s[i];
  if (c < 0x80) return 1;
  size_t n;
  uint32_t min;
  if ((c & 0xe0) == 0xc0) {
    n = 2;
    min = 0x80;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3;
    min = 0x800;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  uint32_t cp = c & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) {
    const unsigned char d = s[i + k];
    if ((d & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

namespace {

// The code point of the well-formed sequence of `n` bytes at s[i].
uint32_t Decode(absl::string_view s, size_t i, size_t n) {
  if (n == 1) return static_cast<unsigned char>(s[i]);
  uint32_t cp = static_cast<unsigned char>(s[i]) & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return cp;
}

}  // namespace

bool IsControlOrBidi(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x061c || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

bool IsPlainText(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0 || IsControlOrBidi(Decode(s, i, n))) return false;
    i += n;
  }
  return true;
}

std::string Printable(absl::string_view s, bool keep_lines) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    const bool line = keep_lines && (s[i] == '\n' || s[i] == '\t');
    if (n == 0 || (!line && IsControlOrBidi(Decode(s, i, n)))) {
      out.push_back('?');
      i += n == 0 ? 1 : n;
      continue;
    }
    out.append(s.data() + i, n);
    i += n;
  }
  return out;
}

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace topiary
