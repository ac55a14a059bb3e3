#include "io/bpe_ranks.h"

#include <cstring>
#include <queue>

#include "core/error.h"

namespace k3 {

uint64_t BpeRanks::hash(std::string_view s) {
  // 64-bit multiply-mix over 8-byte words: token bytes are short, so this is a few cycles.
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  }
  h ^= h >> 32;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 29;
  return h;
}

void BpeRanks::grow() {
  size_t cap = slots_.empty() ? 1024 : slots_.size() * 2;
  slots_.assign(cap, -1);
  mask_ = cap - 1;
  for (int32_t r = 0; r < size(); ++r) {
    uint64_t j = hash(bytes(r)) & mask_;
    while (slots_[j] >= 0) j = (j + 1) & mask_;
    slots_[j] = r;
  }
}

int32_t BpeRanks::find(std::string_view s) const {
  if (slots_.empty()) return -1;
  uint64_t j = hash(s) & mask_;
  for (;;) {
    int32_t r = slots_[j];
    if (r < 0) return -1;
    const uint64_t b = offsets_[r], len = offsets_[r + 1] - b;
    if (len == s.size() && std::memcmp(arena_.data() + b, s.data(), len) == 0) return r;
    j = (j + 1) & mask_;
  }
}

bool BpeRanks::add(std::string_view s) {
  if (find(s) >= 0) return false;
  arena_.append(s);
  offsets_.push_back(arena_.size());
  // Load factor at most 1/2 keeps probe chains short.
  if (uint64_t(size()) * 2 > slots_.size()) {
    grow();
  } else {
    uint64_t j = hash(s) & mask_;
    while (slots_[j] >= 0) j = (j + 1) & mask_;
    slots_[j] = size() - 1;
  }
  return true;
}

bool BpeRanks::has_all_bytes() const {
  for (int b = 0; b < 256; ++b) {
    char c = char(b);
    if (find(std::string_view(&c, 1)) < 0) return false;
  }
  return true;
}

// The reference's loop with each adjacent pair's rank cached: parts are [starts[i],
// starts[i+1]); after merging at i only the ranks at i-1 and i change. O(n*m), best for the
// short pieces that make up nearly all text.
void BpeRanks::merge_small(std::string_view piece, std::vector<size_t>& starts) const {
  const size_t n = piece.size();
  starts.resize(n + 1);
  for (size_t i = 0; i <= n; ++i) starts[i] = i;
  constexpr int32_t kNone = INT32_MAX;
  std::vector<int32_t> rank(n);  // rank[i]: rank of parts i and i+1 joined
  auto pair_rank = [&](size_t i) -> int32_t {
    if (i + 2 >= starts.size()) return kNone;
    int32_t r = find(piece.substr(starts[i], starts[i + 2] - starts[i]));
    return r < 0 ? kNone : r;
  };
  for (size_t i = 0; i + 1 < n; ++i) rank[i] = pair_rank(i);
  size_t parts = n;
  while (parts > 1) {
    int32_t best = kNone;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts; ++i)
      if (rank[i] < best) { best = rank[i]; at = i; }
    if (best == kNone) break;
    starts.erase(starts.begin() + at + 1);
    rank.erase(rank.begin() + at + 1);
    --parts;
    rank[at] = pair_rank(at);
    if (at > 0) rank[at - 1] = pair_rank(at - 1);
  }
}

// The same merge order with a min-heap keyed by (rank, start) over a linked list of parts:
// O(n log n) for long pieces (long words, digit-free symbol runs, whitespace), where the
// reference is quadratic. Entries made stale by a neighbour's merge are skipped on pop.
void BpeRanks::merge_large(std::string_view piece, std::vector<size_t>& starts) const {
  const size_t n = piece.size();
  std::vector<uint32_t> next(n), prev(n);  // by part start; next == n is the end
  std::vector<char> alive(n, 1);
  for (size_t i = 0; i < n; ++i) { next[i] = uint32_t(i + 1); prev[i] = uint32_t(i == 0 ? 0 : i - 1); }
  struct Entry {
    int32_t rank;
    uint32_t start, mid, end;  // left part [start, mid), right part [mid, end)
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](uint32_t s) {
    uint32_t m = next[s];
    if (m >= n) return;
    uint32_t e = next[m];
    int32_t r = find(piece.substr(s, e - s));
    if (r >= 0) heap.push({r, s, m, e});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Entry t = heap.top();
    heap.pop();
    // Stale if either part changed since the entry was made.
    if (!alive[t.start] || next[t.start] != t.mid || !alive[t.mid] || next[t.mid] != t.end) continue;
    alive[t.mid] = 0;
    next[t.start] = t.end;
    if (t.end < n) prev[t.end] = t.start;
    push(t.start);
    if (t.start > 0) push(prev[t.start]);
  }
  starts.clear();
  for (size_t i = 0; i < n; i = next[i]) starts.push_back(i);
  starts.push_back(n);
}

std::vector<size_t> BpeRanks::merge_boundaries(std::string_view piece) const {
  std::vector<size_t> starts;
  if (piece.size() <= 128) merge_small(piece, starts);
  else merge_large(piece, starts);
  return starts;
}

void BpeRanks::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (int32_t r = find(piece); r >= 0) {
    out.push_back(r);
    return;
  }
  thread_local std::vector<size_t> starts;
  if (piece.size() <= 128) merge_small(piece, starts);
  else merge_large(piece, starts);
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    int32_t r = find(piece.substr(starts[i], starts[i + 1] - starts[i]));
    if (r < 0) fail("tokenizer: the vocabulary has no token for byte " +
                    std::to_string(static_cast<unsigned char>(piece[starts[i]])) + " (it must contain all 256 single bytes)");
    out.push_back(r);
  }
}

}  // namespace k3
