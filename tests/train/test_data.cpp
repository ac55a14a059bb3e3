#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "train/data.h"

using namespace k3;
namespace fs = std::filesystem;

TEST(Data, BibleCorpusSplitsByChapter) {
  Corpus c = load_corpus("bible");
  EXPECT_EQ(c.documents.size(), 1189u);  // chapters of the KJV
  EXPECT_EQ(c.documents.front().rfind("Genesis 1\n", 0), 0u);
  ByteTokenizer tok;
  CorpusSplit s = split_and_tokenize(c, tok, 40);
  EXPECT_EQ(s.train_docs + s.heldout_docs, 1189);
  EXPECT_GT(s.heldout.size(), 50000u);
  const double uni = unigram_bits_per_byte(s, tok.vocab_size());
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
