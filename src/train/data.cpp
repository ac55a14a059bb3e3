#include "train/data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"

namespace k3 {

namespace fs = std::filesystem;

// `bible` prints chapters as "Genesis 1" header lines after a blank line, then verses
// indented by spaces and wrapped at COLUMNS; one document per chapter.
static Corpus load_bible() {
  FILE* p = popen("COLUMNS=80 bible 'Gen1:1-Rev22:21' 2>/dev/null", "r");
  if (!p) fail_system("cannot run the bible program (install Debian's bible-kjv)", "bible");
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0 || text.size() < 1000000)
    fail("corpus 'bible': the bible program failed or printed too little (install Debian's bible-kjv, or pass --data FILE)");
  Corpus c;
  c.source = "bible";
  std::istringstream in(text);
  std::string line, prev = "", doc;
  while (std::getline(in, line)) {
    const bool header = !line.empty() && line[0] != ' ' && prev.empty();
    if (header && !doc.empty()) {
      c.documents.push_back(doc);
      doc.clear();
    }
    if (!line.empty()) doc += line + "\n";
    prev = line;
  }
  if (!doc.empty()) c.documents.push_back(doc);
  return c;
}

Corpus load_corpus(const std::string& spec) {
  if (spec.empty() || spec == "bible") return load_bible();
  Corpus c;
  c.source = spec;
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    std::vector<std::string> files;
    for (auto& e : fs::directory_iterator(spec))
      if (e.is_regular_file()) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      std::string t = read_file_bytes(f, "corpus file");
      if (!t.empty()) c.documents.push_back(std::move(t));
    }
  } else if (fs::exists(spec, ec)) {
    std::string t = read_file_bytes(spec, "corpus file");
    size_t start = 0;
    while (start < t.size()) {  // form feeds separate documents when present
      size_t ff = t.find('\f', start);
      if (ff == std::string::npos) ff = t.size();
      if (ff > start) c.documents.push_back(t.substr(start, ff - start));
      start = ff + 1;
    }
  } else {
    fail_input(spec, "", "no such file or directory (corpus)");
  }
  if (c.documents.empty()) fail_input(spec, "", "corpus is empty");
  return c;
}

DocumentSplit split_documents(const Corpus& c, int64_t heldout_every, bool utf8_cut) {
  K3_ASSERT(heldout_every >= 2);
  DocumentSplit s;
  if (c.documents.size() == 1) {
    const std::string_view t = c.documents[0];
    size_t cut = t.size() - t.size() / size_t(heldout_every);
    if (utf8_cut)
      while (cut > 0 && cut < t.size() && (static_cast<unsigned char>(t[cut]) & 0xC0) == 0x80) --cut;
    s.train.push_back(t.substr(0, cut));
    s.heldout.push_back(t.substr(cut));
    return s;
  }
  for (size_t d = 0; d < c.documents.size(); ++d)
    (int64_t(d) % heldout_every == heldout_every / 2 ? s.heldout : s.train).push_back(c.documents[d]);
  return s;
}

CorpusSplit split_and_tokenize(const Corpus& c, const Vocabulary& vocab, int64_t heldout_every) {
  const DocumentSplit docs = split_documents(c, heldout_every, !vocab.is_bytes());
  CorpusSplit s;
  const int32_t bos = vocab.bos(), eos = vocab.eos();
  for (int pass = 0; pass < 2; ++pass) {
    const auto& in = pass == 0 ? docs.train : docs.heldout;
    auto& out = pass == 0 ? s.train : s.heldout;
    (pass == 0 ? s.train_docs : s.heldout_docs) = int64_t(in.size());
    for (const std::vector<int32_t>& ids : vocab.encode_batch(in)) {
      out.push_back(bos);
      out.insert(out.end(), ids.begin(), ids.end());
      out.push_back(eos);
    }
  }
  if (s.heldout.empty()) fail("corpus '" + c.source + "': too few documents for a held-out split");
  return s;
}

double unigram_bits_per_byte(const CorpusSplit& s, const Vocabulary& vocab) {
  // Byte histograms of each side: token counts, then each token's bytes.
  auto byte_counts = [&](const std::vector<int32_t>& stream) {
    std::vector<int64_t> ids(size_t(vocab.vocab_size()), 0);
    for (int32_t t : stream) ids[size_t(t)]++;
    std::vector<double> bytes(256, 0.0);
    for (size_t id = 0; id < ids.size(); ++id)
      if (ids[id] && vocab.token_bytes()[id] > 0)
        for (unsigned char b : vocab.decoder().token_bytes(int32_t(id))) bytes[b] += double(ids[id]);
    return bytes;
  };
  const std::vector<double> train = byte_counts(s.train), held = byte_counts(s.heldout);
  double total = 256, n = 0, bits = 0;
  for (double c : train) total += c;
  for (int b = 0; b < 256; ++b) {
    bits -= held[size_t(b)] * std::log2((train[size_t(b)] + 1.0) / total);  // add-one smoothing
    n += held[size_t(b)];
  }
  return n > 0 ? bits / n : 0.0;
}

int64_t target_bytes(const int32_t* ids, int64_t n, const std::vector<int32_t>& token_bytes) {
  int64_t b = 0;
  for (int64_t t = 1; t <= n; ++t) b += token_bytes[size_t(ids[t])];
  return b;
}

HeldoutTotals heldout_totals(const std::vector<double>& nats, const std::vector<int64_t>& bytes, int64_t T) {
  K3_ASSERT(nats.size() == bytes.size(), "heldout_totals: one byte count per window");
  HeldoutTotals h;
  double total = 0;
  for (size_t w = 0; w < nats.size(); ++w) total += nats[w], h.bytes += bytes[w];
  h.targets = int64_t(nats.size()) * T;
  h.loss = total / double(h.targets);
  h.bpb = h.bytes > 0 ? total / std::log(2.0) / double(h.bytes) : 0;
  return h;
}

SequenceStream::SequenceStream(const std::vector<int32_t>* tokens, int64_t seq_len, uint64_t seed)
    : tokens_(tokens), seq_len_(seq_len), seed_(seed) {
  build_perm();
}

void SequenceStream::build_perm() {
  const int64_t n = (int64_t(tokens_->size()) - 1) / seq_len_;
  if (n < 1)
    fail("data: the training stream (" + std::to_string(tokens_->size()) + " tokens) is shorter than one sequence of " +
         std::to_string(seq_len_ + 1) + " tokens");
  perm_.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) perm_[i] = i;
  // Fisher-Yates with a splitmix64 stream keyed by (seed, epoch, seq_len): portable.
  uint64_t st = seed_ * 0x9e3779b97f4a7c15ull + uint64_t(epoch_) * 0xbf58476d1ce4e5b9ull + uint64_t(seq_len_);
  auto next = [&]() {
    uint64_t z = (st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm_[i], perm_[next() % uint64_t(i + 1)]);
}

void SequenceStream::set_seq_len(int64_t seq_len) {
  if (seq_len == seq_len_) return;
  seq_len_ = seq_len;
  cursor_ = 0;
  build_perm();
}

void SequenceStream::set_position(int64_t epoch, int64_t cursor) {
  epoch_ = epoch;
  build_perm();
  if (cursor < 0 || cursor > int64_t(perm_.size())) fail("data: saved stream position is out of range for this corpus");
  cursor_ = cursor;
}

void SequenceStream::next(int32_t* out) {
  if (cursor_ >= int64_t(perm_.size())) {
    ++epoch_;
    cursor_ = 0;
    build_perm();
  }
  const int64_t start = perm_[cursor_++] * seq_len_;
  std::copy(tokens_->begin() + start, tokens_->begin() + start + seq_len_ + 1, out);
}

}  // namespace k3
