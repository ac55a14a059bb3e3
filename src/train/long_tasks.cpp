// Long-context task generators (see long_tasks.h).
#include "train/long_tasks.h"

#include <algorithm>

#include "core/error.h"

namespace k3 {

namespace {

// The passkey papers' filler: the same sentences over and over, so nothing but the needle
// carries information.
const char* kFiller = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
  std::string digits(int n) {
    std::string d;
    for (int i = 0; i < n; ++i) d += char('0' + (i == 0 ? 1 + below(9) : below(10)));
    return d;
  }
  std::string word(int n) {
    std::string w;
    for (int i = 0; i < n; ++i) w += char('a' + below(26));
    return w;
  }
};

void append(std::vector<int32_t>& out, const std::vector<int32_t>& x) { out.insert(out.end(), x.begin(), x.end()); }

// `n` filler tokens: whole copies of the filler's ids, then a prefix of them.
std::vector<int32_t> filler(const std::vector<int32_t>& unit, int64_t n) {
  std::vector<int32_t> f;
  f.reserve(size_t(std::max<int64_t>(n, 0)));
  while (int64_t(f.size()) < n) f.push_back(unit[f.size() % unit.size()]);
  return f;
}

// Places `pieces` (each a fixed run of ids) at the given fractions of the filler between
// `head` and `tail`, so the sequence has `length` ids before the answers.
std::vector<int32_t> spread(const std::vector<int32_t>& unit, const std::vector<int32_t>& head,
                            const std::vector<std::vector<int32_t>>& pieces, const std::vector<double>& at,
                            const std::vector<int32_t>& tail, int64_t length, const char* task) {
  int64_t fixed = int64_t(head.size() + tail.size());
  for (const auto& p : pieces) fixed += int64_t(p.size());
  const int64_t free = length - fixed;
  if (free < 0)
    fail(std::string(task) + ": a length of " + std::to_string(length) + " tokens cannot hold its " +
         std::to_string(fixed) + " tokens of task text");
  std::vector<int32_t> out = head;
  int64_t used = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int64_t upto = std::clamp<int64_t>(int64_t(at[i] * double(free) + 0.5), used, free);
    append(out, filler(unit, upto - used));
    used = upto;
    append(out, pieces[i]);
  }
  append(out, filler(unit, free - used));
  append(out, tail);
  return out;
}

// n random fractions in [0, 1), sorted (spread() places pieces in order): where the shuffled
// pieces of a mixed sample go.
std::vector<double> random_fractions(Rng& rng, size_t n) {
  std::vector<double> at(n);
  for (double& a : at) a = double(rng.below(1 << 20)) / double(1 << 20);
  std::sort(at.begin(), at.end());
  return at;
}

// n distinct 3-letter keys with 4-digit values (MQAR and the mixed task).
void random_pairs(Rng& rng, int64_t n, std::vector<std::string>& keys, std::vector<std::string>& vals) {
  for (int64_t i = 0; i < n; ++i) {
    std::string k;
    do k = rng.word(3);
    while (std::find(keys.begin(), keys.end(), k) != keys.end());
    keys.push_back(k);
    vals.push_back(rng.digits(4));
  }
}

template <typename T>
void shuffle(Rng& rng, std::vector<T>& v) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[size_t(rng.below(int64_t(i)))]);
}

}  // namespace

LongTask parse_long_task(const std::string& name) {
  if (name == "passkey") return LongTask::passkey;
  if (name == "mqar") return LongTask::mqar;
  if (name == "vartrack") return LongTask::vartrack;
  if (name == "mixed") return LongTask::mixed;
  fail("--task: expected passkey, mqar, vartrack, mixed or loss-by-position, got '" + name + "'");
}

const char* long_task_name(LongTask t) {
  switch (t) {
    case LongTask::passkey: return "passkey";
    case LongTask::mqar: return "mqar";
    case LongTask::vartrack: return "vartrack";
    case LongTask::mixed: return "mixed";
  }
  return "?";
}

LongSample make_long_sample(const TextEncoder& enc, const LongTaskOptions& o) {
  K3_ASSERT(o.depth >= 0 && o.depth <= 1, "long task depth outside [0, 1]");
  Rng rng{o.seed * 0x2545F4914F6CDD1Dull + uint64_t(o.task) + 1};
  const std::vector<int32_t> unit = enc(kFiller);
  K3_ASSERT(!unit.empty(), "long task: the filler encodes to nothing");
  LongSample s;
  s.depth = o.depth;
  auto add_query = [&](const std::string& answer) {
    LongQuery q;
    q.at = int64_t(s.ids.size());
    q.answer_text = answer;
    q.answer = enc(answer);
    append(s.ids, q.answer);
    s.queries.push_back(std::move(q));
  };
  switch (o.task) {
    case LongTask::passkey: {
      const std::string key = rng.digits(5);
      const std::vector<int32_t> head =
          enc("There is important info hidden inside a lot of irrelevant text. Find it and memorize it.");
      const std::vector<int32_t> needle = enc(" The pass key is " + key + ". Remember it. " + key + " is the pass key.");
      const std::vector<int32_t> tail = enc(" What is the pass key? The pass key is");
      const int64_t len = o.length - int64_t(enc(" " + key).size());
      s.ids = spread(unit, head, {needle}, {o.depth}, tail, len, "passkey");
      add_query(" " + key);
      break;
    }
    case LongTask::mqar: {
      if (o.pairs < 1 || o.queries < 1 || o.queries > o.pairs) fail("mqar: needs 1 <= queries <= pairs");
      std::vector<std::string> keys, vals;
      random_pairs(rng, o.pairs, keys, vals);
      std::vector<std::vector<int32_t>> pieces;
      std::vector<double> at;
      for (int64_t i = 0; i < o.pairs; ++i) {
        pieces.push_back(enc(" " + keys[size_t(i)] + ": " + vals[size_t(i)] + "."));
        at.push_back(o.pairs == 1 ? 0.0 : double(i) / double(o.pairs - 1));
      }
      // Queries: a random subset, in random order, each "key:" then the value.
      std::vector<int64_t> ask(size_t(o.pairs));
      for (int64_t i = 0; i < o.pairs; ++i) ask[size_t(i)] = i;
      for (int64_t i = o.pairs - 1; i > 0; --i) std::swap(ask[size_t(i)], ask[size_t(rng.below(i + 1))]);
      ask.resize(size_t(o.queries));
      const std::vector<int32_t> head = enc("Remember the value of every key.");
      int64_t query_tokens = 0;
      for (int64_t i : ask)
        query_tokens += int64_t(enc(" " + keys[size_t(i)] + ":").size() + enc(" " + vals[size_t(i)] + ".").size());
      s.ids = spread(unit, head, pieces, at, enc(" Now recall."), o.length - query_tokens, "mqar");
      for (int64_t i : ask) {
        append(s.ids, enc(" " + keys[size_t(i)] + ":"));
        add_query(" " + vals[size_t(i)]);
        append(s.ids, enc("."));
      }
      break;
    }
    case LongTask::vartrack: {
      if (o.pairs < 1) fail("vartrack: needs at least one hop");
      std::vector<std::string> names;
      for (int64_t i = 0; i <= o.pairs; ++i) names.push_back(rng.word(1) + std::to_string(i) + rng.word(2));
      const std::string value = rng.digits(5);
      std::vector<std::vector<int32_t>> pieces;
      std::vector<double> at;
      // The chain starts at `depth` and ends at the window's end: every hop is needed.
      for (int64_t i = 0; i <= o.pairs; ++i) {
        const std::string rhs = i == 0 ? value : names[size_t(i - 1)];
        pieces.push_back(enc(" VAR " + names[size_t(i)] + " = " + rhs + "."));
        at.push_back(o.depth + (1.0 - o.depth) * double(i) / double(o.pairs + 1));
      }
      const std::vector<int32_t> tail = enc(" Q: what is the value of " + names.back() + "? A: the value is");
      const int64_t len = o.length - int64_t(enc(" " + value).size());
      s.ids = spread(unit, enc("Follow the variable assignments."), pieces, at, tail, len, "vartrack");
      add_query(" " + value);
      break;
    }
    case LongTask::mixed: {
      if (o.pairs < 1 || o.queries < 1 || o.queries > o.pairs || o.hops < 1)
        fail("mixed: needs 1 <= queries <= pairs and at least one hop");
      // The three sub-tasks' evidence, every piece at a random place of the window.
      const std::string key = rng.digits(5);
      std::vector<std::vector<int32_t>> pieces = {enc(" The pass key is " + key + ".")};
      std::vector<std::string> keys, vals;
      random_pairs(rng, o.pairs, keys, vals);
      for (int64_t i = 0; i < o.pairs; ++i) pieces.push_back(enc(" " + keys[size_t(i)] + ": " + vals[size_t(i)] + "."));
      std::vector<std::string> names;
      for (int64_t i = 0; i <= o.hops; ++i) names.push_back(rng.word(1) + std::to_string(i) + rng.word(2));
      const std::string value = rng.digits(5);
      for (int64_t i = 0; i <= o.hops; ++i)
        pieces.push_back(enc(" VAR " + names[size_t(i)] + " = " + (i == 0 ? value : names[size_t(i - 1)]) + "."));
      shuffle(rng, pieces);
      // The questions, in a random order: the pass key, `queries` of the pairs, the chain's end.
      struct Ask {
        std::string prompt, answer, after;
      };
      std::vector<Ask> asks = {{" The pass key is", " " + key, "."},
                               {" VAR " + names.back() + " is", " " + value, "."}};
      std::vector<int64_t> pick(size_t(o.pairs));
      for (int64_t i = 0; i < o.pairs; ++i) pick[size_t(i)] = i;
      shuffle(rng, pick);
      for (int64_t q = 0; q < o.queries; ++q)
        asks.push_back({" " + keys[size_t(pick[size_t(q)])] + ":", " " + vals[size_t(pick[size_t(q)])], "."});
      shuffle(rng, asks);
      int64_t ask_tokens = 0;
      for (const Ask& q : asks) ask_tokens += int64_t(enc(q.prompt).size() + enc(q.answer).size() + enc(q.after).size());
      s.ids = spread(unit, enc("Remember the pass key, every key's value and every variable."), pieces,
                     random_fractions(rng, pieces.size()), enc(" Now answer."), o.length - ask_tokens, "mixed");
      for (const Ask& q : asks) {
        append(s.ids, enc(q.prompt));
        add_query(q.answer);
        append(s.ids, enc(q.after));
      }
      break;
    }
  }
  return s;
}

}  // namespace k3
