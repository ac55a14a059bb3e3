// The calculator tool of the RL environment: evaluates an integer expression with + - *,
// unary minus and parentheses (ASCII digits and spaces only), in 64-bit integers with
// overflow detection. The result (or "error: ...") is the text of the tool message.
#pragma once
#include <optional>
#include <string>

namespace k3 {

struct CalcResult {
  bool ok = false;
  std::string text;  // the integer, or "error: <why>"
};
CalcResult calculate(const std::string& expression);

// The tool's OpenAI declaration (name "calculator", one string argument "expression").
std::string calculator_tool_json();

}  // namespace k3
