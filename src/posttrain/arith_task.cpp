// Arithmetic problems, traces and conversations (see arith_task.h).
#include "posttrain/arith_task.h"

#include <algorithm>

#include "core/error.h"
#include "posttrain/calculator.h"
#include "posttrain/policy_update.h"

namespace k3 {

namespace {

std::vector<int> digits_lsb(int64_t x) {
  std::vector<int> d;
  do {
    d.push_back(int(x % 10));
    x /= 10;
  } while (x > 0);
  return d;
}

std::string add_trace(int64_t a, int64_t b, bool verbose) {
  const std::vector<int> da = digits_lsb(a), db = digits_lsb(b);
  const size_t n = std::max(da.size(), db.size());
  std::string t;
  int carry = 0;
  for (size_t i = 0; i < n; ++i) {
    const int x = i < da.size() ? da[i] : 0, y = i < db.size() ? db[i] : 0, s = x + y + carry;
    if (verbose)
      t += std::to_string(x) + "+" + std::to_string(y) + "+" + std::to_string(carry) + "=" + std::to_string(s) +
           " write " + std::to_string(s % 10) + " carry " + std::to_string(s / 10) + "\n";
    else
      t += std::to_string(x) + "+" + std::to_string(y) + (carry ? "+1" : "") + "=" + std::to_string(s) + "\n";
    carry = s / 10;
  }
  if (carry && verbose) t += "write " + std::to_string(carry) + "\n";
  return t;
}

std::string mul_trace(int64_t a, int64_t b, bool verbose) {
  const std::vector<int> db = digits_lsb(b), da = digits_lsb(a);
  std::string t;
  std::vector<int64_t> parts;
  int64_t shift = 1;
  for (size_t i = 0; i < db.size(); ++i, shift *= 10) {
    const int64_t part = a * db[i] * shift;
    parts.push_back(part);
    if (verbose) {
      int carry = 0;
      for (size_t j = 0; j < da.size(); ++j) {
        const int s = da[j] * db[i] + carry;
        t += std::to_string(da[j]) + "*" + std::to_string(db[i]) + "+" + std::to_string(carry) + "=" +
             std::to_string(s) + " write " + std::to_string(s % 10) + " carry " + std::to_string(s / 10) + "\n";
        carry = s / 10;
      }
    }
    t += std::to_string(a) + "*" + std::to_string(db[i] * shift) + "=" + std::to_string(part) + "\n";
  }
  if (parts.size() > 1) {
    int64_t acc = parts[0];
    for (size_t i = 1; i < parts.size(); ++i) {
      t += std::to_string(acc) + "+" + std::to_string(parts[i]) + "=" + std::to_string(acc + parts[i]) + "\n";
      acc += parts[i];
    }
  }
  return t;
}

chat::Conversation base(const ArithProblem& p, chat::Effort e, bool tool) {
  chat::Conversation c;
  chat::Message u;
  u.role = chat::Role::user;
  u.content = {user_text(p)};
  c.messages.push_back(u);
  if (tool) c.tools = chat::Json::array({chat::Json::parse(calculator_tool_json())});
  c.options.thinking = true;
  c.options.effort = e;
  return c;
}

}  // namespace

std::string ArithProblem::expression() const { return std::to_string(a) + op + std::to_string(b); }

std::string ArithProblem::answer() const { return std::to_string(op == '+' ? a + b : a * b); }

ArithProblem make_problem(int digits, char op, uint64_t seed) {
  if (digits < 1 || digits > 9) fail("arithmetic task: digits must be in 1..9, got " + std::to_string(digits));
  if (op != '+' && op != '*') fail(std::string("arithmetic task: operator '") + op + "' is not + or *");
  int64_t lo = 1, hi = 10;
  for (int i = 1; i < digits; ++i) lo *= 10, hi *= 10;
  if (digits == 1) lo = 0;
  ArithProblem p;
  p.op = op, p.digits = digits;
  const uint64_t r1 = mix64(seed * 2 + 1), r2 = mix64(seed * 2 + 2);
  p.a = lo + int64_t(r1 % uint64_t(hi - lo));
  p.b = lo + int64_t(r2 % uint64_t(hi - lo));
  return p;
}

std::string user_text(const ArithProblem& p) { return "What is " + p.expression() + "?"; }

std::string worked_trace(const ArithProblem& p, chat::Effort e) {
  if (e == chat::Effort::low) return "";
  const bool verbose = e == chat::Effort::max;
  std::string t = p.op == '+' ? add_trace(p.a, p.b, verbose) : mul_trace(p.a, p.b, verbose);
  if (verbose) t += "so " + p.expression() + "=" + p.answer() + "\n";
  return t;
}

chat::Conversation prompt_conversation(const ArithProblem& p, chat::Effort e, bool tool) {
  chat::Conversation c = base(p, e, tool);
  c.options.add_generation_prompt = true;
  return c;
}

chat::Conversation sft_conversation(const ArithProblem& p, chat::Effort e, bool tool) {
  chat::Conversation c = base(p, e, tool);
  c.options.add_generation_prompt = false;
  chat::Message a;
  a.role = chat::Role::assistant;
  if (tool) {
    a.reasoning = "";
    chat::ToolCall call;
    call.id = "call_1";
    call.name = "calculator";
    call.arguments = chat::Json::object({{"expression", p.expression()}});
    a.tool_calls.push_back(call);
    c.messages.push_back(a);
    chat::Message r;
    r.role = chat::Role::tool;
    r.tool_call_id = "call_1";
    r.tool_name = "calculator";
    r.content = {calculate(p.expression()).text};
    c.messages.push_back(r);
    chat::Message a2;
    a2.role = chat::Role::assistant;
    a2.reasoning = "";
    a2.content = {p.answer()};
    c.messages.push_back(a2);
  } else {
    a.reasoning = worked_trace(p, e);
    a.content = {p.answer()};
    c.messages.push_back(a);
  }
  return c;
}

std::string pretrain_document(const ArithProblem& p) {
  return p.expression() + "\n" + worked_trace(p, chat::Effort::max) + p.expression() + "=" + p.answer() + "\n";
}

}  // namespace k3

#include "posttrain/config_reader.h"

namespace k3 {

int64_t arith_band_count(const ArithFamily& f) {
  return f.bands.empty() ? int64_t(f.digits.size() * f.ops.size()) : int64_t(f.bands.size());
}

ArithItem arith_item(const ArithFamily& f, int64_t i) {
  ArithItem it;
  i %= f.problems;  // a family of `problems` distinct items, cycled
  // Band b = i % n in round q = i / n gets effort (q + b) % |efforts|: every band meets every
  // effort whatever n is. (The formula was (q + i) % |efforts| before the curriculum; the two
  // agree whenever n is a multiple of |efforts|, as in every demo config, n = 6 for 3 efforts.)
  const int64_t ne = int64_t(f.efforts.size()), n = arith_band_count(f), q = i / n, b = i % n;
  if (!f.bands.empty()) {
    const ArithBand& band = f.bands[size_t(b)];
    it.problem = make_problem(band.digits, band.op, mix64(f.seed) + uint64_t(i));
  } else {
    const int64_t nd = int64_t(f.digits.size()), no = int64_t(f.ops.size());
    it.problem = make_problem(f.digits[size_t(i % nd)], f.ops[size_t((i / nd) % no)], mix64(f.seed) + uint64_t(i));
  }
  it.effort = f.efforts[size_t((q + b) % ne)];
  it.tool = double(mix64(f.seed * 7919 + uint64_t(i)) % 1000000) < f.tool_share * 1e6;
  return it;
}

chat::Effort parse_effort(const std::string& name, const std::string& file, const std::string& field) {
  if (name == "low") return chat::Effort::low;
  if (name == "high") return chat::Effort::high;
  if (name == "max") return chat::Effort::max;
  fail_input(file, field, "'" + name + "' is not one of low, high, max");
}

ArithFamily parse_arith_family(const nlohmann::json& j, const std::string& file, const std::string& field) {
  ArithFamily f;
  ConfigReader rd(j, file, field);
  rd.get("digits", f.digits);
  rd.get("ops", f.ops);
  std::vector<std::string> efforts;
  if (rd.get("efforts", efforts)) {
    f.efforts.clear();
    for (const auto& e : efforts) f.efforts.push_back(parse_effort(e, file, rd.field("efforts")));
  }
  rd.get("tool_share", f.tool_share);
  rd.get("problems", f.problems);
  int64_t per_band = 0;
  const bool has_per_band = rd.get("problems_per_band", per_band);
  std::vector<std::string> bands;
  const bool has_bands = rd.get("bands", bands);
  rd.get("seed", f.seed);
  rd.finish();
  if (has_bands) {
    if (j.contains("digits") || j.contains("ops")) rd.bad("bands", "give either bands or digits/ops, not both");
    if (bands.empty()) rd.bad("bands", "must list at least one band such as \"2+\"");
    for (size_t k = 0; k < bands.size(); ++k) {
      const std::string& b = bands[k];
      const std::string at = rd.field("bands") + "[" + std::to_string(k) + "]";
      if (b.size() != 2 || b[0] < '1' || b[0] > '9' || (b[1] != '+' && b[1] != '*'))
        fail_input(file, at, "'" + b + "' is not a band <digits><op> (digits 1..9, op + or *), e.g. \"2+\"");
      f.bands.push_back({b[0] - '0', b[1]});
    }
  }
  if (has_per_band) {
    if (j.contains("problems")) rd.bad("problems_per_band", "give either problems or problems_per_band, not both");
    if (per_band < 1) rd.bad("problems_per_band", "must be at least 1");
  }
  if (f.digits.empty()) rd.bad("digits", "must list at least one digit count");
  for (int d : f.digits)
    if (d < 1 || d > 9) rd.bad("digits", "each entry must be in 1..9");
  if (f.ops.empty()) rd.bad("ops", "must name at least one operator");
  for (char c : f.ops)
    if (c != '+' && c != '*') rd.bad("ops", "only '+' and '*' are supported");
  if (f.efforts.empty()) rd.bad("efforts", "must list at least one effort");
  if (f.tool_share < 0 || f.tool_share > 1) rd.bad("tool_share", "must be in [0, 1]");
  if (f.problems < 1) rd.bad("problems", "must be at least 1");
  if (has_per_band) f.problems = per_band * arith_band_count(f);
  return f;
}

}  // namespace k3

#include "io/chat_render.h"

namespace k3 {

std::vector<std::string> pretrain_corpus(const ArithFamily& f, int64_t per_doc) {
  std::vector<std::string> docs;
  std::string doc;
  for (int64_t i = 0; i < f.problems; ++i) {
    const ArithItem it = arith_item(f, i);
    doc += pretrain_document(it.problem);
    if ((i + 1) % per_doc == 0 || i + 1 == f.problems) {
      for (const chat::Segment& s : chat::render(sft_conversation(it.problem, it.effort, it.tool)))
        if (!s.is_control) doc += s.text;
      docs.push_back(doc + "\n");
      doc.clear();
    }
  }
  return docs;
}

}  // namespace k3
