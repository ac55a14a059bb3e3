// The arithmetic task of the post-training demonstration: multi-digit addition and
// multiplication problems, their worked traces (carries written out) at each reasoning
// effort, and the chat conversations SFT trains on and RL prompts with.
//  - low: no reasoning, the answer only;
//  - high: the compact column trace (addition: one "a+b+c=s" per column; multiplication:
//    one partial product per digit of the second operand, then their sum);
//  - max: the same with every carry spelt out and a restatement of the result.
// With the tool, the assistant calls calculator(expression) and answers from its result.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/chat_types.h"

namespace k3 {

struct ArithProblem {
  int64_t a = 0, b = 0;
  char op = '+';   // '+' or '*'
  int digits = 1;  // digits of each operand
  std::string expression() const;  // "47*85"
  std::string answer() const;      // canonical integer
};

// Operands of exactly `digits` digits (1-digit operands include 0), drawn from `seed`.
ArithProblem make_problem(int digits, char op, uint64_t seed);

std::string user_text(const ArithProblem& p);  // "What is 47*85?"
std::string worked_trace(const ArithProblem& p, chat::Effort e);

// The user message (with the calculator declared when `tool`) at effort e; with
// add_generation_prompt (the RL prompt) or with the reference reply appended (SFT).
chat::Conversation prompt_conversation(const ArithProblem& p, chat::Effort e, bool tool);
chat::Conversation sft_conversation(const ArithProblem& p, chat::Effort e, bool tool);

// A plain-text pretraining document: the problem, the max-effort trace and the answer.
std::string pretrain_document(const ArithProblem& p);

}  // namespace k3

namespace k3 {

// A family of problems ("arithmetic" in sft.json / rl.json): problem i of the family is
// make_problem(digits[i % |digits|], ops[(i / |digits|) % |ops|], seed + i), in band
// b = i % n of n = |digits| * |ops|, at effort efforts[(i / n + b) % |efforts|] (so every
// band meets every effort), with the tool on a
// tool_share of problems (seeded); item indices cycle over the `problems` items. Held-out
// problems come from another seed.
// Curriculum: `bands` ("2+", "3*": operand digits x operator, the evaluation's bands) replaces
// the digits x ops product with exactly these bands, problem i in bands[i % |bands|] (RL on
// the band at the edge of competence, docs/model.md section 12); `problems_per_band` sets
// problems = that many times the number of bands, so each band has the same count.
struct ArithBand {
  int digits = 1;
  char op = '+';
};
struct ArithFamily {
  std::vector<int> digits = {1, 2, 3};
  std::string ops = "+*";
  std::vector<ArithBand> bands;  // non-empty: these bands instead of digits x ops
  std::vector<chat::Effort> efforts = {chat::Effort::low, chat::Effort::high, chat::Effort::max};
  double tool_share = 0.0;
  int64_t problems = 1000;
  uint64_t seed = 1;
};
struct ArithItem {
  ArithProblem problem;
  chat::Effort effort = chat::Effort::high;
  bool tool = false;
};
ArithItem arith_item(const ArithFamily& f, int64_t i);
int64_t arith_band_count(const ArithFamily& f);  // |bands|, else |digits| * |ops|

class ConfigReader;
// Reads an "arithmetic" object (fields as in ArithFamily; efforts by name).
ArithFamily parse_arith_family(const nlohmann::json& j, const std::string& file, const std::string& field);
chat::Effort parse_effort(const std::string& name, const std::string& file, const std::string& field);

}  // namespace k3

namespace k3 {
// Pretraining documents for the family's problems, `per_doc` problems each: every problem as
// its plain max-effort trace (pretrain_document), and per document the text segments of one
// chat conversation (its system notes, question, trace and answer, without the XTML control
// tokens), so the vocabulary and the model know the prompt's words before SFT.
std::vector<std::string> pretrain_corpus(const ArithFamily& f, int64_t per_doc);
}  // namespace k3
