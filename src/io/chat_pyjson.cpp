// Python-compatible JSON text (see chat_pyjson.h).
#include "io/chat_pyjson.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <vector>

namespace k3::chat {

namespace {

// float.__repr__: the shortest digits that round-trip, written fixed when the decimal point
// position decpt satisfies -4 < decpt <= 16, else as d.ddde+XX (CPython format_float_short).
std::string py_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::stoi(s.substr(e + 1));
  const int decpt = exp10 + 1;
  const int n = int(digits.size());
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out.assign("0.");
      out.append(size_t(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out = digits;
      out.append(size_t(decpt - n), '0');
      out += ".0";
    } else {
      out = digits.substr(0, size_t(decpt));
      out += '.';
      out += digits.substr(size_t(decpt));
    }
  } else {
    out = digits.substr(0, 1);
    if (n > 1) {
      out += '.';
      out += digits.substr(1);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  }
  return sign.empty() ? out : sign + out;
}

void dump(const Json& v, DumpStyle style, std::string& out) {
  const char* item_sep = style.compact ? "," : ", ";
  const char* key_sep = style.compact ? ":" : ": ";
  switch (v.type()) {
    case Json::value_t::null: out += "null"; return;
    case Json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case Json::value_t::number_integer: out += std::to_string(v.get<int64_t>()); return;
    case Json::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); return;
    case Json::value_t::number_float: out += py_float(v.get<double>()); return;
    case Json::value_t::string: out += py_quote(v.get_ref<const std::string&>()); return;
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += item_sep;
        first = false;
        dump(item, style, out);
      }
      out += ']';
      return;
    }
    case Json::value_t::object: {
      std::vector<const std::string*> keys;
      for (auto it = v.begin(); it != v.end(); ++it) keys.push_back(&it.key());
      if (style.sort_keys) {
        std::sort(keys.begin(), keys.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
      }
      out += '{';
      bool first = true;
      for (const std::string* k : keys) {
        if (!first) out += item_sep;
        first = false;
        out += py_quote(*k);
        out += key_sep;
        dump(v.at(*k), style, out);
      }
      out += '}';
      return;
    }
    default: out += "null"; return;  // binary / discarded never come out of the parser
  }
}

}  // namespace

std::string py_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  return out;
}

std::string py_quote(const std::string& s) {
  std::string out(1, '"');
  out += py_escape(s);
  out += '"';
  return out;
}

std::string py_dumps(const Json& value, DumpStyle style) {
  std::string out;
  dump(value, style, out);
  return out;
}

}  // namespace k3::chat
