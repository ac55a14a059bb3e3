// The verifier of arithmetic answers: exact answer checking on the assistant's response
// channel (the text between <|open|>response<|sep|> and <|close|>response<|sep|>, as
// io/chat_parse.h parses it). The well-formed answer is one canonical decimal integer: an
// optional '-', then ASCII digits 0-9 without leading zeros ("0" itself allowed), with only
// ASCII whitespace around it. Anything else is malformed and gets the format penalty: extra
// words ("the answer is 12"), several numbers ("12 13", "12\n12"), other digit forms
// (fullwidth U+FF11, Arabic-Indic U+0661, superscripts), signs other than one leading '-',
// "+12", "12.0", "1,200", leading zeros, an empty response, or no response channel at all (a
// reply cut off before it closed).
#pragma once
#include <string>
#include <string_view>

namespace k3 {

enum class Verdict { correct, wrong, malformed };

// The canonical integer of `response`, or "" when it is not well formed (rules above).
std::string canonical_answer(std::string_view response);
// expected: a canonical integer (k3::Error otherwise: a task bug, not a model error).
Verdict verify_answer(std::string_view response, const std::string& expected);
const char* verdict_name(Verdict v);

// The reward of one reply (docs/model.md section 12): correct 1, wrong 0, malformed -format_penalty,
// and -1 when the reply did not finish within its effort's token budget (whatever it says).
struct RewardOptions {
  double format_penalty = 0.5;
  double over_budget = -1.0;
};
double reward_of(Verdict v, bool over_budget, const RewardOptions& o);

}  // namespace k3
