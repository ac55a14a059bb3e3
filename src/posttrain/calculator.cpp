// Recursive-descent integer calculator (see calculator.h).
#include "posttrain/calculator.h"

#include <cstdint>
#include <stdexcept>

namespace k3 {

namespace {

struct CalcError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Parser {
  const std::string& s;
  size_t i = 0;
  int depth = 0;
  void skip() {
    while (i < s.size() && s[i] == ' ') ++i;
  }
  static int64_t add(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) throw CalcError("overflow");
    return r;
  }
  static int64_t mul(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) throw CalcError("overflow");
    return r;
  }
  int64_t expr() {  // term (('+'|'-') term)*
    int64_t v = term();
    for (skip(); i < s.size() && (s[i] == '+' || s[i] == '-'); skip()) {
      const char op = s[i++];
      const int64_t r = term();
      v = op == '+' ? add(v, r) : add(v, mul(r, -1));
    }
    return v;
  }
  int64_t term() {  // factor ('*' factor)*
    int64_t v = factor();
    for (skip(); i < s.size() && s[i] == '*'; skip()) {
      ++i;
      v = mul(v, factor());
    }
    return v;
  }
  int64_t factor() {
    skip();
    if (i >= s.size()) throw CalcError("unexpected end of expression");
    if (s[i] == '-') {
      ++i;
      return mul(factor(), -1);
    }
    if (s[i] == '(') {
      if (++depth > 64) throw CalcError("too deeply nested");
      ++i;
      const int64_t v = expr();
      skip();
      if (i >= s.size() || s[i] != ')') throw CalcError("missing ')'");
      ++i, --depth;
      return v;
    }
    if (s[i] < '0' || s[i] > '9') throw CalcError(std::string("unexpected character '") + s[i] + "'");
    int64_t v = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') v = add(mul(v, 10), s[i++] - '0');
    return v;
  }
};

}  // namespace

CalcResult calculate(const std::string& expression) {
  Parser p{expression};
  try {
    const int64_t v = p.expr();
    p.skip();
    if (p.i != expression.size()) throw CalcError(std::string("unexpected character '") + expression[p.i] + "'");
    return {true, std::to_string(v)};
  } catch (const CalcError& e) {
    return {false, std::string("error: ") + e.what()};
  }
}

std::string calculator_tool_json() {
  return R"({"type":"function","function":{"name":"calculator","description":"Evaluates an integer expression with + - * and parentheses.","parameters":{"type":"object","properties":{"expression":{"type":"string","description":"for example 47*85"}},"required":["expression"]}}})";
}

}  // namespace k3
