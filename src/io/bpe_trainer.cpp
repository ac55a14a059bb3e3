#include "io/bpe_trainer.h"

#include <algorithm>
#include <chrono>
#include <queue>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/long_text.h"
#include "io/tiktoken_config.h"
#include "io/tiktoken_file.h"
#include "io/utf8.h"

namespace k3 {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

struct Word {
  std::vector<int32_t> sym;
  int64_t count = 0;
  int32_t visited = -1;  // last merge that rewrote it (the index may list a word twice)
};

struct HeapEntry {
  int64_t count;
  uint64_t key;
  bool operator<(const HeapEntry& o) const { return count != o.count ? count < o.count : key > o.key; }
};

}  // namespace

BpeTrainResult train_bpe(std::string_view raw, const BpeTrainOptions& opt) {
  return train_bpe(std::vector<std::string_view>{raw}, opt);
}

BpeTrainResult train_bpe(const std::vector<std::string_view>& documents, const BpeTrainOptions& opt) {
  if (opt.base_vocab < 256) fail("tokenizer train: the base vocabulary must hold at least the 256 byte tokens, got " +
                                 std::to_string(opt.base_vocab));
  BpeTrainResult res;
  const auto t0 = Clock::now();

  // 1. Count the distinct pieces (views into the sanitised documents, kept until the words
  // are built).
  std::vector<std::string> texts;
  texts.reserve(documents.size());
  for (std::string_view d : documents) texts.push_back(utf8::sanitize(d));
  std::unordered_map<std::string_view, int64_t> piece_count;
  Pretokenizer pretok(opt.pattern);
  auto count_part = [&](std::string_view part) {
    pretok.split(part, [&](size_t b, size_t e) {
      ++piece_count[part.substr(b, e - b)];
      ++res.pieces;
    });
  };
  for (const std::string& text : texts) {
    if (opt.pattern == PatternKind::kimi) {
      for (auto [b, e] : split_long_text(text)) count_part(std::string_view(text).substr(b, e - b));
    } else {
      count_part(text);
    }
  }
  res.unique_pieces = int64_t(piece_count.size());

  std::vector<Word> words;
  words.reserve(piece_count.size());
  for (const auto& [p, c] : piece_count) {
    if (p.size() < 2) continue;  // a single byte has no pair
    Word w;
    w.count = c;
    w.sym.reserve(p.size());
    for (unsigned char ch : p) w.sym.push_back(ch);
    words.push_back(std::move(w));
  }
  piece_count.clear();
  texts.clear();
  texts.shrink_to_fit();
  res.pretokenize_seconds = since(t0);

  // 2. Pair counts and the pair -> words index.
  const auto t1 = Clock::now();
  std::unordered_map<uint64_t, int64_t> counts;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;
  counts.reserve(words.size() * 2);
  for (uint32_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w].sym;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      uint64_t k = pair_key(s[i], s[i + 1]);
      counts[k] += words[w].count;
      auto& v = where[k];
      if (v.empty() || v.back() != w) v.push_back(w);
    }
  }
  std::priority_queue<HeapEntry> heap;
  for (const auto& [k, c] : counts) heap.push({c, k});

  BpeRanks& ranks = res.ranks;
  for (int b = 0; b < 256; ++b) {
    char c = char(b);
    ranks.add(std::string_view(&c, 1));
  }
  const int32_t target = opt.base_vocab - 256;
  auto last_report = Clock::now();
  std::vector<uint64_t> touched;
  std::vector<int32_t> fresh;
  int32_t step = 0;
  while (ranks.size() < opt.base_vocab) {
    // Pop the most frequent pair, skipping entries whose count has changed since.
    HeapEntry top{0, 0};
    bool found = false;
    while (!heap.empty()) {
      top = heap.top();
      heap.pop();
      auto it = counts.find(top.key);
      if (it != counts.end() && it->second == top.count) { found = true; break; }
    }
    if (!found || top.count < opt.min_frequency) {
      res.exhausted = true;
      break;
    }
    const int32_t a = int32_t(top.key >> 32), b = int32_t(top.key & 0xFFFFFFFFu);
    std::string merged = std::string(ranks.bytes(a)) + std::string(ranks.bytes(b));
    // Distinct pairs can spell the same bytes ("ab"+"c", "a"+"bc"); tiktoken's format needs
    // distinct bytes per rank, so the second spelling reuses the first's token.
    int32_t c = ranks.find(merged);
    if (c < 0) {
      ranks.add(merged);
      c = ranks.size() - 1;
      ++res.merges;
    }
    ++step;
    // Rewrite every word holding (a, b). Only the pairs next to each merged occurrence
    // change: (prev, a) -> (prev, c) and (b, next) -> (c, next), with `prev` taken from the
    // rewritten word so that back-to-back occurrences ("abab", "aaa") come out right.
    std::vector<uint32_t> list = std::move(where[top.key]);
    where.erase(top.key);
    touched.clear();
    auto bump = [&](int32_t x, int32_t y, int64_t d, uint32_t w) {
      const uint64_t k = pair_key(x, y);
      counts[k] += d;
      touched.push_back(k);
      if (d > 0) {
        auto& v = where[k];
        if (v.empty() || v.back() != w) v.push_back(w);
      }
    };
    for (uint32_t w : list) {
      Word& wd = words[w];
      if (wd.visited == step) continue;
      wd.visited = step;
      auto& s = wd.sym;
      const int64_t f = wd.count;
      fresh.clear();
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          bump(a, b, -f, w);
          if (!fresh.empty()) {
            bump(fresh.back(), a, -f, w);
            bump(fresh.back(), c, f, w);
          }
          if (i + 2 < s.size()) {
            bump(b, s[i + 2], -f, w);
            bump(c, s[i + 2], f, w);
          }
          fresh.push_back(c);
          i += 2;
        } else {
          fresh.push_back(s[i]);
          ++i;
        }
      }
      s.swap(fresh);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched) {
      auto it = counts.find(k);
      if (it == counts.end()) continue;
      if (it->second <= 0) {
        counts.erase(it);
      } else {
        heap.push({it->second, k});
      }
    }
    if (opt.progress && since(last_report) >= 1.0) {
      last_report = Clock::now();
      opt.progress({ranks.size() - 256, target, top.count, since(t0)});
    }
  }
  res.merge_seconds = since(t1);
  if (opt.progress) opt.progress({ranks.size() - 256, target, 0, since(t0)});
  return res;
}

void write_tokenizer_dir(const std::string& dir, const BpeRanks& ranks) {
  make_directories(dir);
  write_text_file_atomic(dir + "/tiktoken.model", format_tiktoken_model(ranks));
  write_text_file_atomic(dir + "/tokenizer_config.json", k3_tokenizer_config_json(ranks.size()));
}

}  // namespace k3
