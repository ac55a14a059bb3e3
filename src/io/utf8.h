// UTF-8 helpers for the tokenizer: validation with replacement of invalid bytes (the
// "maximal subpart" practice of Unicode ch. 3 and WHATWG, which Python's errors='replace'
// and JavaScript's TextDecoder also follow, so k3cpp and the oracle see the same text),
// code-point iteration over valid text, and Python's str.isspace.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace k3::utf8 {

// Length of the longest prefix of `s` that is valid UTF-8.
size_t valid_prefix(std::string_view s);

// `s` with every ill-formed subsequence replaced by U+FFFD (EF BF BD); valid input is
// returned unchanged.
std::string sanitize(std::string_view s);

// Decodes the code point at s[i] of VALID UTF-8 and advances i past it.
inline char32_t next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) { ++i; return b0; }
  if (b0 < 0xE0) {
    char32_t c = (char32_t(b0 & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
    i += 2;
    return c;
  }
  if (b0 < 0xF0) {
    char32_t c = (char32_t(b0 & 0x0F) << 12) | (char32_t(static_cast<unsigned char>(s[i + 1]) & 0x3F) << 6) |
                 (static_cast<unsigned char>(s[i + 2]) & 0x3F);
    i += 3;
    return c;
  }
  char32_t c = (char32_t(b0 & 0x07) << 18) | (char32_t(static_cast<unsigned char>(s[i + 1]) & 0x3F) << 12) |
               (char32_t(static_cast<unsigned char>(s[i + 2]) & 0x3F) << 6) |
               (static_cast<unsigned char>(s[i + 3]) & 0x3F);
  i += 4;
  return c;
}

void append(std::string& out, char32_t cp);  // encodes one code point

// Python's str.isspace: Unicode White_Space plus U+001C..U+001F (bidi class B/S).
bool is_python_space(char32_t c);

// Bytes of an incomplete but so-far-valid sequence at the end of `s` (0..3): what a
// streaming decoder must hold back until more bytes arrive.
size_t incomplete_tail(std::string_view s);

}  // namespace k3::utf8
