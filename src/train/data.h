// Training data: a corpus of documents (the King James Bible from Debian's bible-kjv by
// default, or any text file or directory), split into train and held-out documents, turned
// into tokens of the run's vocabulary (io/vocabulary.h: a trained tiktoken vocabulary or the
// byte tokenizer) with BOS/EOS around each document, and packed into fixed-length sequences.
// The stream is deterministic given the seed, and its position is a pair of integers
// (epoch, cursor), saved in training checkpoints so a resumed run continues on exactly the
// same sequences.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <string_view>

#include "io/vocabulary.h"

namespace k3 {

struct Corpus {
  std::string source;                  // "bible" or the path
  std::vector<std::string> documents;  // in source order
};

// "bible" (default corpus; needs the `bible` program of Debian's bible-kjv: one document
// per chapter) or a path: a file (documents separated by blank-line-separated form feeds or
// one document when none) or a directory (every regular file, sorted by name, one document
// each). k3::Error names the path on failure.
Corpus load_corpus(const std::string& spec);

// The documents of each side of the split (views into `c`). Every `heldout_every`-th
// document (offset by half the period) is held out; a corpus of one document holds out its
// last 1/heldout_every of bytes (with utf8_cut, moved back to a character boundary so that
// neither side starts or ends inside a UTF-8 character).
struct DocumentSplit {
  std::vector<std::string_view> train, heldout;
};
DocumentSplit split_documents(const Corpus& c, int64_t heldout_every, bool utf8_cut);

struct CorpusSplit {
  std::vector<int32_t> train, heldout;  // token streams: bos doc eos bos doc eos ...
  int64_t train_docs = 0, heldout_docs = 0;
};
// split_documents (utf8_cut for a tiktoken vocabulary; the byte tokenizer keeps the byte
// cut it always had), then each document encoded on its own between BOS and EOS.
CorpusSplit split_and_tokenize(const Corpus& c, const Vocabulary& vocab, int64_t heldout_every);

// Unigram entropy of the held-out bytes under the train set's byte frequencies (add-one
// smoothing over the 256 byte values), in bits per byte: the baseline a learning model must
// beat. Both streams are counted as the bytes their tokens decode to (special ids: none), so
// the figure is the corpus's, the same whatever the vocabulary.
double unigram_bits_per_byte(const CorpusSplit& s, const Vocabulary& vocab);

// Bytes that the targets ids[1..n] decode to (special ids count 0): the denominator of
// held-out bits per byte, comparable across vocabularies.
int64_t target_bytes(const int32_t* ids, int64_t n, const std::vector<int32_t>& token_bytes);

// The held-out figures of n windows of T targets from each window's nats and target bytes,
// summed in window order (the order one process sums them, whatever split the windows had).
struct HeldoutTotals {
  int64_t targets = 0, bytes = 0;
  double loss = 0;  // mean cross-entropy per target (nats)
  double bpb = 0;   // total cross-entropy in bits / bytes the targets decode to (0: no bytes)
};
HeldoutTotals heldout_totals(const std::vector<double>& nats, const std::vector<int64_t>& bytes, int64_t T);

// Packs a token stream into sequences of seq_len + 1 tokens (input and shifted target), in a
// seeded shuffled order of start offsets per epoch. Sequence s of an epoch starts at
// perm[s] * seq_len (the last window that fits is included).
class SequenceStream {
 public:
  SequenceStream(const std::vector<int32_t>* tokens, int64_t seq_len, uint64_t seed);
  void set_seq_len(int64_t seq_len);  // stage change: the cursor restarts at the next epoch boundary
  // Writes seq_len + 1 tokens.
  void next(int32_t* out);
  int64_t epoch() const { return epoch_; }
  int64_t cursor() const { return cursor_; }
  void set_position(int64_t epoch, int64_t cursor);
  int64_t seq_len() const { return seq_len_; }
  int64_t sequences_per_epoch() const { return int64_t(perm_.size()); }

 private:
  void build_perm();
  const std::vector<int32_t>* tokens_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t epoch_ = 0, cursor_ = 0;
  std::vector<int64_t> perm_;
};

}  // namespace k3
