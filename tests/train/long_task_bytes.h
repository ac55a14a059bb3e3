// The byte tokenizer as the long-task tests' encoder: enc(text) and dec(ids[a, b)).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace k3::test {

inline const ByteTokenizer& byte_tokenizer() {
  static const ByteTokenizer t;
  return t;
}
inline std::vector<int32_t> enc(const std::string& s) { return byte_tokenizer().encode(s); }
inline std::string dec(const std::vector<int32_t>& ids, size_t a, size_t b) {
  return byte_tokenizer().decode(std::vector<int32_t>(ids.begin() + long(a), ids.begin() + long(b)));
}

}  // namespace k3::test
