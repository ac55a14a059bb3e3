#include "io/utf8.h"

namespace k3::utf8 {
namespace {

// Length of the well-formed sequence starting at s[i], or 0 with `bad` set to the length of
// its maximal ill-formed subpart (>= 1), per Unicode Table 3-7.
size_t sequence_at(std::string_view s, size_t i, size_t& bad) {
  const size_t n = s.size();
  const auto b0 = static_cast<unsigned char>(s[i]);
  bad = 1;
  if (b0 < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) len = 2;
  else if (b0 == 0xE0) { len = 3; lo = 0xA0; }
  else if (b0 == 0xED) { len = 3; hi = 0x9F; }
  else if (b0 >= 0xE1 && b0 <= 0xEF) len = 3;
  else if (b0 == 0xF0) { len = 4; lo = 0x90; }
  else if (b0 == 0xF4) { len = 4; hi = 0x8F; }
  else if (b0 >= 0xF1 && b0 <= 0xF3) len = 4;
  else return 0;  // C0, C1, F5..FF, or a stray continuation byte
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= n) { bad = k; return 0; }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) { bad = k; return 0; }
  }
  return len;
}

}  // namespace

size_t valid_prefix(std::string_view s) {
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    // ASCII fast path, eight bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    size_t len = sequence_at(s, i, bad);
    if (len == 0) return i;
    i += len;
  }
  return s.size();
}

std::string sanitize(std::string_view s) {
  size_t i = valid_prefix(s);
  if (i == s.size()) return std::string(s);
  std::string out(s.substr(0, i));
  out.reserve(s.size() + 16);
  while (i < s.size()) {
    size_t bad = 0, len = sequence_at(s, i, bad);
    if (len) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
  return out;
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xC0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(char(0xE0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  }
}

bool is_python_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  if (c < 0x85) return false;
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

size_t incomplete_tail(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t bad = 0;
    if (sequence_at(s, i, bad) != 0) return 0;  // complete sequence ends here
    // Ill-formed: incomplete only if every byte present was acceptable (bad == back).
    return bad == back && b >= 0xC2 && b <= 0xF4 ? back : 0;
  }
  return 0;
}

}  // namespace k3::utf8
