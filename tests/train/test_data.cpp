#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/bpe_trainer.h"
#include "io/tiktoken_config.h"
#include "io/tiktoken_file.h"
#include "train/data.h"

using namespace k3;
namespace fs = std::filesystem;

TEST(Data, BibleCorpusSplitsByChapter) {
  Corpus c = load_corpus("bible");
  EXPECT_EQ(c.documents.size(), 1189u);  // chapters of the KJV
  EXPECT_EQ(c.documents.front().rfind("Genesis 1\n", 0), 0u);
  Vocabulary tok;
  CorpusSplit s = split_and_tokenize(c, tok, 40);
  EXPECT_EQ(s.train_docs + s.heldout_docs, 1189);
  EXPECT_GT(s.heldout.size(), 50000u);
  const double uni = unigram_bits_per_byte(s, tok);
  EXPECT_GT(uni, 4.0);
  EXPECT_LT(uni, 5.0);
}

TEST(Data, StreamIsDeterministicAndResumable) {
  std::vector<int32_t> toks(10000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(i % 251);
  SequenceStream a(&toks, 64, 7), b(&toks, 64, 7);
  std::vector<int32_t> x(65), y(65);
  for (int i = 0; i < 500; ++i) {  // crosses epochs (156 sequences each)
    a.next(x.data());
    if (i == 200) b.set_position(a.epoch(), a.cursor());
    if (i > 200) {
      b.next(y.data());
      ASSERT_EQ(x, y) << i;
    }
  }
  // Target is the input shifted by one.
  a.next(x.data());
  EXPECT_EQ((x[0] + 1) % 251, x[1] % 251);
}

TEST(Data, FileCorpusAndErrors) {
  fs::path p = fs::temp_directory_path() / ("k3data-" + std::to_string(::getpid()) + ".txt");
  std::ofstream(p) << std::string(5000, 'a') << "\f" << std::string(3000, 'b');
  Corpus c = load_corpus(p.string());
  EXPECT_EQ(c.documents.size(), 2u);
  fs::remove(p);
  EXPECT_THROW(load_corpus("/nonexistent/corpus.txt"), Error);
  std::vector<int32_t> tiny(10, 1);
  EXPECT_THROW(SequenceStream(&tiny, 64, 1), Error);
}

namespace {

// 40 documents of verse-like text with some non-ASCII (é, 中) so that tokens and bytes differ.
Corpus small_corpus() {
  Corpus c;
  c.source = "test";
  static const char* words[] = {"and", "the", "lord", "said", "unto", "café", "中文", "behold", "people", "land"};
  uint64_t st = 99;
  for (int d = 0; d < 40; ++d) {
    std::string t = "Chapter " + std::to_string(d + 1) + "\n";
    for (int w = 0; w < 80; ++w) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      t += std::string(w ? " " : "") + words[(st >> 33) % 10];
    }
    c.documents.push_back(t + ".\n");
  }
  return c;
}

Vocabulary trained_vocabulary(const Corpus& c, int32_t base) {
  std::vector<std::string_view> docs(c.documents.begin(), c.documents.end());
  BpeTrainOptions o;
  o.base_vocab = base;
  const BpeTrainResult r = train_bpe(docs, o);
  return Vocabulary::from_tiktoken(format_tiktoken_model(r.ranks), k3_tokenizer_config_json(r.ranks.size()), "test");
}

}  // namespace

// Held-out bits per byte divides by target_bytes: with the byte tokenizer the old count of
// targets below 256 (specials none), with a tiktoken vocabulary the bytes the targets decode to.
TEST(Data, BitsPerByteDenominatorIsTheDecodedBytes) {
  const Corpus c = small_corpus();
  const Vocabulary bytes;
  const CorpusSplit sb = split_and_tokenize(c, bytes, 8);
  int64_t below_256 = 0;
  for (size_t i = 1; i < sb.heldout.size(); ++i) below_256 += sb.heldout[i] < 256;
  EXPECT_EQ(target_bytes(sb.heldout.data(), int64_t(sb.heldout.size()) - 1, bytes.token_bytes()), below_256);

  const Vocabulary tik = trained_vocabulary(c, 400);
  ASSERT_FALSE(tik.is_bytes());
  const CorpusSplit st = split_and_tokenize(c, tik, 8);
  std::vector<int32_t> text_ids;
  int64_t small_ids = 0;
  for (size_t i = 1; i < st.heldout.size(); ++i) {
    if (!tik.decoder().is_special(st.heldout[i])) text_ids.push_back(st.heldout[i]);
    small_ids += st.heldout[i] < 256;
  }
  const int64_t n = target_bytes(st.heldout.data(), int64_t(st.heldout.size()) - 1, tik.token_bytes());
  EXPECT_EQ(n, int64_t(tik.decode_bytes(text_ids).size()));
  EXPECT_EQ(n, below_256);  // the same held-out text, whatever the vocabulary
  EXPECT_NE(n, small_ids);
  EXPECT_LT(st.heldout.size() * 2, sb.heldout.size());  // merged tokens cover several bytes
  EXPECT_EQ(tik.token_bytes()[size_t(tik.bos())], 0);
}

// The unigram baseline counts bytes, so it is the corpus's, not the vocabulary's.
TEST(Data, UnigramBaselineIsTheSameForEveryVocabulary) {
  const Corpus c = small_corpus();
  const Vocabulary bytes, tik = trained_vocabulary(c, 400);
  const double ub = unigram_bits_per_byte(split_and_tokenize(c, bytes, 8), bytes);
  const double ut = unigram_bits_per_byte(split_and_tokenize(c, tik, 8), tik);
  EXPECT_NEAR(ub, ut, 1e-12);
  // Directly from the documents' bytes.
  std::vector<double> train(256, 0.0), held(256, 0.0);
  for (size_t d = 0; d < c.documents.size(); ++d)
    for (unsigned char b : c.documents[d]) (d % 8 == 4 ? held : train)[b] += 1;
  double total = 256, bits = 0, n = 0;
  for (double x : train) total += x;
  for (int b = 0; b < 256; ++b) bits -= held[size_t(b)] * std::log2((train[size_t(b)] + 1) / total), n += held[size_t(b)];
  EXPECT_NEAR(ub, bits / n, 1e-12);
  EXPECT_GT(ub, 3.0);
}

// One document: the held-out tail; for a tiktoken vocabulary the cut moves back to a
// character boundary, the byte tokenizer keeps its byte cut.
TEST(Data, OneDocumentCutsOnACharacterBoundaryForTiktoken) {
  Corpus c;
  c.source = "one";
  // 1009 bytes: 'a', 'b', 'c', 1000 x, then é é é with lead bytes at 1003, 1005, 1007.
  c.documents.push_back("abc" + std::string(1000, 'x') + "\xc3\xa9\xc3\xa9\xc3\xa9");
  // heldout_every 252: the cut at 1009 - 4 = 1005, a lead byte: both cut there.
  EXPECT_EQ(split_documents(c, 252, false).train[0].size(), 1005u);
  EXPECT_EQ(split_documents(c, 252, true).train[0].size(), 1005u);
  // heldout_every 200: the cut at 1009 - 5 = 1004, inside the first é.
  const DocumentSplit raw = split_documents(c, 200, false), cut = split_documents(c, 200, true);
  EXPECT_EQ(raw.train[0].size(), 1004u);
  EXPECT_EQ(cut.train[0].size(), 1003u);
  EXPECT_EQ(std::string(cut.train[0]) + std::string(cut.heldout[0]), c.documents[0]);
  EXPECT_EQ(static_cast<unsigned char>(cut.heldout[0][0]), 0xc3);
  // And the tokenised split: the held-out stream decodes to the tail, no U+FFFD.
  const Vocabulary tik = trained_vocabulary(c, 300);
  const CorpusSplit sp = split_and_tokenize(c, tik, 200);
  std::vector<int32_t> body(sp.heldout.begin() + 1, sp.heldout.end() - 1);
  EXPECT_EQ(tik.decode_bytes(body), std::string(cut.heldout[0]));
}
