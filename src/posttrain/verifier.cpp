// The arithmetic verifier (see verifier.h).
#include "posttrain/verifier.h"

#include "core/error.h"

namespace k3 {

namespace {
bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
}  // namespace

std::string canonical_answer(std::string_view r) {
  size_t a = 0, b = r.size();
  while (a < b && ascii_space(r[a])) ++a;
  while (b > a && ascii_space(r[b - 1])) --b;
  std::string_view s = r.substr(a, b - a);
  size_t i = 0;
  if (i < s.size() && s[i] == '-') ++i;
  if (i == s.size()) return "";  // empty or a lone '-'
  // Byte-wise: any non-ASCII byte (other digit forms) fails the digit test.
  for (size_t j = i; j < s.size(); ++j)
    if (s[j] < '0' || s[j] > '9') return "";
  if (s[i] == '0' && s.size() - i > 1) return "";  // leading zero
  if (i == 1 && s == "-0") return "";              // negative zero is not canonical
  return std::string(s);
}

Verdict verify_answer(std::string_view response, const std::string& expected) {
  if (expected.empty() || canonical_answer(expected) != expected) fail("verifier: the expected answer '" + expected + "' is not a canonical integer");
  const std::string got = canonical_answer(response);
  if (got.empty()) return Verdict::malformed;
  return got == expected ? Verdict::correct : Verdict::wrong;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::correct: return "correct";
    case Verdict::wrong: return "wrong";
    default: return "malformed";
  }
}

double reward_of(Verdict v, bool over_budget, const RewardOptions& o) {
  if (over_budget) return o.over_budget;
  if (v == Verdict::correct) return 1.0;
  if (v == Verdict::wrong) return 0.0;
  return -o.format_penalty;
}

}  // namespace k3
