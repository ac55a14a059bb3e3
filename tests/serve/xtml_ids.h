// Test helper: model output written as XTML text -> token ids of a chat vocabulary. The
// spellings <|open|>, <|close|>, <|sep|>, <|end_of_msg|> become their control ids; all other
// text is encoded as ordinary text; text inside [[...]] is ordinary text even when it spells a
// marker (what ordinary ids that decode to a marker's spelling look like).
#pragma once
#include <string>
#include <vector>

#include "infer/chat_vocab.h"

namespace k3::test {

inline std::vector<int32_t> xtml_ids(const ChatVocab& v, const std::string& xtml) {
  std::vector<chat::Segment> segs;
  size_t at = 0;
  while (at < xtml.size()) {
    if (xtml.compare(at, 2, "[[") == 0) {
      const size_t e = xtml.find("]]", at);
      segs.push_back({xtml.substr(at + 2, e - at - 2), false});
      at = e + 2;
      continue;
    }
    size_t best = std::string::npos;
    std::string which;
    for (const char* m : {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "[["}) {
      const size_t p = xtml.find(m, at);
      if (p < best) best = p, which = m;
    }
    if (best == at) {
      segs.push_back({which, true});
      at += which.size();
      continue;
    }
    segs.push_back({xtml.substr(at, best == std::string::npos ? std::string::npos : best - at), false});
    at = best == std::string::npos ? xtml.size() : best;
  }
  return v.encode(segs);
}

}  // namespace k3::test
