#include "clients/text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
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

std::string TerminalText(absl::string_view s) { return Printable(s, /*keep_lines=*/true); }

void MakePrintable(google::protobuf::Message* message) {
  const google::protobuf::Reflection* r = message->GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(*message, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    using FD = google::protobuf::FieldDescriptor;
    if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(*message, f); ++i) {
          MakePrintable(r->MutableRepeatedMessage(message, f, i));
        }
      } else {
        MakePrintable(r->MutableMessage(message, f));
      }
    } else if (f->type() == FD::TYPE_STRING) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(*message, f); ++i) {
          r->SetRepeatedString(message, f, i, TerminalText(r->GetRepeatedString(*message, f, i)));
        }
      } else {
        r->SetString(message, f, TerminalText(r->GetString(*message, f)));
      }
    }
  }
}

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// The shortest text that reads back as the same value (of the field's own type: a float
// prints as 0.1, not as the double 0.10000000149011612).
template <typename F>
std::string Number(F v) {
  if (!std::isfinite(v))
    return JsonString(std::isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

void AppendValue(const Message& m, const FieldDescriptor* f, int index, std::string* out);

void AppendMessage(const Message& m, std::string* out) {
  const Reflection* r = m.GetReflection();
  const auto* d = m.GetDescriptor();
  out->push_back('{');
  bool first = true;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const bool set = f->is_repeated() || r->HasField(m, f);
    // Unset: messages, oneof members and proto3 `optional` fields are left out; other
    // primitives print their default, as protobuf's JSON does with always_print_primitive_fields.
    if (!set && (f->message_type() != nullptr || f->containing_oneof() != nullptr)) continue;
    const std::string& name = f->name();
    std::string value;
    if (f->is_repeated()) {
      value.push_back('[');
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        if (k > 0) value.push_back(',');
        AppendValue(m, f, k, &value);
      }
      value.push_back(']');
    } else {
      AppendValue(m, f, -1, &value);
    }
    absl::StrAppend(out, first ? "" : ",", JsonString(name), ":", value);
    first = false;
  }
  out->push_back('}');
}

// Field f of m (element `index` of a repeated field; -1: singular).
void AppendValue(const Message& m, const FieldDescriptor* f, int index, std::string* out) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrAppend(out, rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrAppend(out, rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrAppend(out, rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrAppend(out, rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return absl::StrAppend(out,
                             Number(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f)));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return absl::StrAppend(out,
                             Number(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f)));
    case FieldDescriptor::CPPTYPE_BOOL:
      return absl::StrAppend(
          out, (rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f)) ? "true" : "false");
    case FieldDescriptor::CPPTYPE_ENUM:
      return absl::StrAppend(out, JsonString(rep ? r->GetRepeatedEnum(m, f, index)->name()
                                                 : r->GetEnum(m, f)->name()));
    case FieldDescriptor::CPPTYPE_STRING:
      return absl::StrAppend(
          out, JsonString(rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f)));
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return AppendMessage(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f), out);
  }
}

}  // namespace

std::string ScriptJson(const Message& message) {
  std::string out;
  AppendMessage(message, &out);
  return out;
}

}  // namespace topiary
