// JSON text exactly as Python's json.dumps(value, ensure_ascii=False, ...) writes it, which is
// what `encoding_k3.py` (vllm-project/vllm, vllm/tokenizers/encoding_k3.py) puts in the
// prompt: compact separators for tool and response schemas, Python's default ", " / ": "
// for typed argument values, floats in Python's repr (shortest round trip, "1.0", "1e-05",
// "1e+16"). nlohmann's own dump differs (e.g. 1e15), so the prompt must not depend on it.
#pragma once
#include <string>

#include "io/chat_types.h"

namespace k3::chat {

struct DumpStyle {
  bool compact = false;    // true: separators (",", ":"); false: (", ", ": ")
  bool sort_keys = false;  // recursively, by code point (= UTF-8 byte order)
};

std::string py_dumps(const Json& value, DumpStyle style);
// One JSON string literal: quotes, \" \\ \n \r \t \b \f, other C0 controls as \u00xx;
// everything else (non-ASCII included) kept as UTF-8.
std::string py_quote(const std::string& s);
// The string escape without the surrounding quotes, for streaming a string piece by piece.
std::string py_escape(const std::string& s);

}  // namespace k3::chat
