// Text the CLI prints that came from elsewhere (error messages, names, paths): as a JSON
// string literal for --json output, or made safe for one table cell.
#ifndef TOPIARY_CLIENTS_TEXT_H_
#define TOPIARY_CLIENTS_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace topiary {

// `s` as a quoted JSON string (RFC 8259): quotes, backslashes and control characters
// escaped, invalid UTF-8 replaced by U+FFFD, so any parser accepts it.
std::string JsonString(absl::string_view s);

// `s` on one line: control characters (newlines, tabs, escapes) shown as '?', so a name can
// never break a table or move the terminal's cursor.
std::string OneLine(absl::string_view s);

// `s` for a terminal, lines kept: every other control character (an escape sequence from a
// file name, a node name, an error quoting either) and bidirectional formatting shown as '?'.
// Every message the CLI prints that names something from outside goes through this.
std::string TerminalText(absl::string_view s);

// Every string field of `message`, at any depth, made TerminalText: for a reply or event
// about to be printed for people (not --json, whose JSON escaping already covers it).
void MakePrintable(google::protobuf::Message* message);

// `message` as JSON for scripts (every --json output of the CLI): proto field names, every
// primitive field (defaults too), enums by name; unlike protobuf's canonical JSON, 64-bit
// integers are numbers (exact below 2^53: counts, bytes, steps).
std::string ScriptJson(const google::protobuf::Message& message);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_TEXT_H_
