// Generated long-context tasks with exact answers (docs/model.md section 13): passkey retrieval
// (Mohtashami & Jaggi 2023: a number hidden in repeated filler at a given depth, asked for at
// the end), multi-query associative recall (MQAR, Arora et al. 2023: key-value pairs spread
// over the window, then queries), and variable tracking (RULER, Hsieh et al. 2024: a chain of
// assignments VAR B = A spread over the window, ask the value at the end of the chain). Built
// at the token level from an encoder, so a sample has exactly the requested length in the
// model's own vocabulary (byte or BPE). Deterministic in the seed. `mixed` is the K3 report's
// permuted and concatenated sub-tasks (docs/model.md section 13): a passkey, MQAR pairs and a
// variable chain whose pieces are shuffled over the whole window, all asked at the end, so no
// answer can be found without evidence from everywhere in the window.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace k3 {

using TextEncoder = std::function<std::vector<int32_t>(const std::string&)>;

enum class LongTask { passkey, mqar, vartrack, mixed };
LongTask parse_long_task(const std::string& name);  // k3::Error naming the value
const char* long_task_name(LongTask t);

// One query of a sample: the prompt runs to `at` (exclusive); the answer ids follow there in
// teacher forcing (answer[0] is predicted from position at - 1).
struct LongQuery {
  int64_t at = 0;
  std::vector<int32_t> answer;
  std::string answer_text;
};

struct LongSample {
  std::vector<int32_t> ids;        // the whole sequence, answers included
  std::vector<LongQuery> queries;  // in order of position
  double depth = 0;                // where the evidence sits, 0 (start) .. 1 (end)
};

struct LongTaskOptions {
  LongTask task = LongTask::passkey;
  int64_t length = 1024;  // tokens of the sample (within a few tokens: the answer's length)
  double depth = 0.5;     // passkey: where the needle sits; vartrack: where the chain starts
  int64_t pairs = 8;      // MQAR and mixed: key-value pairs; vartrack: chain hops
  int64_t queries = 4;    // MQAR and mixed: pairs asked at the end
  int64_t hops = 2;       // mixed: hops of its variable chain
  uint64_t seed = 0;
};

// k3::Error when the length cannot hold the task's fixed text.
LongSample make_long_sample(const TextEncoder& enc, const LongTaskOptions& opt);

}  // namespace k3
