// The long-input rule of K3's tokenizer (tokenization_kimi.py): the text is cut into chunks
// of 400,000 code points, and each chunk again wherever a run of whitespace or of
// non-whitespace (Python str.isspace) grows past 25,000 code points: the 25,001st
// character starts a new piece. Pieces are encoded independently, so this changes tokens.
#pragma once
#include <cstddef>
#include <string_view>
#include <vector>

namespace k3 {

struct LongTextLimits {
  size_t chunk_chars = 400000;
  size_t max_run_chars = 25000;
};

// Byte ranges [begin, end) of the pieces of VALID UTF-8 `text`, in order, covering it.
std::vector<std::pair<size_t, size_t>> split_long_text(std::string_view text, LongTextLimits limits = {});

}  // namespace k3
