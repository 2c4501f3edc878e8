#include "clients/text.h"

#include "absl/strings/str_format.h"
#include "trainer/util/utf8.h"

namespace topiary {

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out.append(s.data() + i, n);
    }
    i += n;
  }
  return out + "\"";
}

std::string OneLine(absl::string_view s) { return Printable(s); }

}  // namespace topiary
