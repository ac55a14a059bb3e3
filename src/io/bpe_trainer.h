// Byte-level BPE training in tiktoken's form: the 256 single bytes are ranks 0..255 (in
// byte order), then each merge, most frequent adjacent pair first, over the pre-tokenized
// pieces of the corpus (merges never cross a piece, so the result encodes with the same
// pattern). Pair counts live in a hash map and are updated incrementally: a merge revisits
// only the pieces that contain its pair (a pair -> pieces index) and changes only the pairs
// beside each occurrence, so long pieces cost nothing until one of their pairs is merged.
// Ties on frequency go to the pair with the smaller (left, right) ids: deterministic.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "io/bpe_ranks.h"
#include "io/pretokenizer.h"

namespace k3 {

struct BpeTrainProgress {
  int32_t merges_done = 0, merges_target = 0;
  int64_t best_count = 0;  // frequency of the pair just merged
  double seconds = 0;
};

struct BpeTrainOptions {
  int32_t base_vocab = 0;     // tokens in tiktoken.model, >= 256 (bytes + merges)
  PatternKind pattern = PatternKind::kimi;
  int64_t min_frequency = 2;  // stop when the best pair occurs less often
  std::function<void(const BpeTrainProgress&)> progress;  // called about once a second
};

struct BpeTrainResult {
  BpeRanks ranks;
  int64_t pieces = 0, unique_pieces = 0;
  int32_t merges = 0;
  bool exhausted = false;  // stopped before base_vocab: no pair left at min_frequency
  double pretokenize_seconds = 0, merge_seconds = 0;
};

BpeTrainResult train_bpe(std::string_view corpus, const BpeTrainOptions& options);
// Several documents, each pre-tokenized on its own (as Tiktoken encodes each document on its
// own: the long-input rule restarts, no piece spans two documents).
BpeTrainResult train_bpe(const std::vector<std::string_view>& documents, const BpeTrainOptions& options);

// Writes DIR/tiktoken.model and DIR/tokenizer_config.json (K3's special layout after the
// base vocabulary), each atomically; creates DIR.
void write_tokenizer_dir(const std::string& dir, const BpeRanks& ranks);

}  // namespace k3
