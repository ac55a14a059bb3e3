#include "infer/json_grammar.h"

#include <algorithm>

namespace k3 {

namespace {

// Container phases.
enum : uint8_t { kOpen, kKey, kColon, kBeforeValue, kValue, kAfterValue, kAfterComma };
// String lexer states.
enum : uint8_t { kPlain, kEscape, kHex, kUtf8, kLowBackslash, kLowU, kLowHex };
// Number lexer states.
enum : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool JsonMachine::can_start(int32_t node) const {
  return size_ + g_->nodes[size_t(node)].min_depth <= g_->limits.max_depth;
}

bool JsonMachine::push(int32_t node, uint8_t phase, uint32_t count) {
  if (size_ >= g_->limits.max_depth) return false;
  f_[size_++] = Frame{node, phase, 0, 0, 0, count};
  return true;
}

// Resolves unions by the first byte, then opens the value with that byte.
bool JsonMachine::start_value(int32_t node, uint8_t c) {
  while (g_->nodes[size_t(node)].kind == JsonKind::Union) {
    node = g_->nodes[size_t(node)].first[c];
    if (node < 0) return false;
  }
  if (!can_start(node)) return false;
  const JsonNode& n = g_->nodes[size_t(node)];
  switch (n.kind) {
    case JsonKind::Object: return c == '{' && push(node, kOpen, 0);
    case JsonKind::Array: return c == '[' && push(node, kOpen, 0);
    case JsonKind::String: return c == '"' && push(node, kPlain, 0);
    case JsonKind::Number:
      if (c == '-') return push(node, kMinus, 0);
      if (c == '0') return push(node, kZero, 1);
      if (is_digit(c)) return push(node, kInt, 1);
      return false;
    case JsonKind::Literal: {
      if (!push(node, 0, uint32_t(n.lit_root))) return false;
      if (literal_byte(f_[size_ - 1], n, c)) return true;
      --size_;
      return false;
    }
    case JsonKind::Union: break;
  }
  return false;
}

void JsonMachine::pop_done(int32_t tag) {
  --size_;
  if (size_ == 0) {
    done_ = true;
    return;
  }
  Frame& p = f_[size_ - 1];
  const JsonNode& n = g_->nodes[size_t(p.node)];
  if (p.phase == kKey) {
    if (!n.props.empty()) p.count = uint32_t(tag);  // the chosen property
    p.phase = kColon;
  } else {  // kValue
    if (n.kind == JsonKind::Array || !n.props.empty()) ++p.count;
    p.phase = kAfterValue;
  }
}

bool JsonMachine::step(uint8_t c) {
  if (size_ > 0) {
    Frame& f = f_[size_ - 1];
    const JsonNode& n = g_->nodes[size_t(f.node)];
    switch (n.kind) {
      case JsonKind::String: return string_byte(f, c);
      case JsonKind::Number: return number_byte(f, n, c);
      case JsonKind::Literal: return literal_byte(f, n, c);
      default: break;
    }
  }
  return container_byte(c);
}

// A byte for the top container (or the root when no frame is open): whitespace, then structure.
bool JsonMachine::container_byte(uint8_t c) {
  if (is_ws(c)) {
    if (ws_ >= g_->limits.max_ws_run) return false;
    if (size_ == 0 && done_ && !g_->limits.trailing_ws) return false;
    ++ws_;
    return true;
  }
  ws_ = 0;
  if (size_ == 0) return !done_ && start_value(g_->root, c);
  Frame& f = f_[size_ - 1];
  const JsonNode& n = g_->nodes[size_t(f.node)];
  return n.kind == JsonKind::Object ? object_byte(f, n, c) : array_byte(f, n, c);
}

// Declared property j may be the next key: not before the current position, no required
// property skipped, and its value fits in depth (a required one always does: the object's own
// minimum depth counted it).
bool JsonMachine::key_allowed(const Frame& obj, int obj_index, int32_t j) const {
  const JsonNode& n = g_->nodes[size_t(obj.node)];
  const int32_t i = int32_t(obj.count);
  if (j < i || j > n.next_required[size_t(i)]) return false;
  const JsonProperty& p = n.props[size_t(j)];
  return p.required || obj_index + 1 + g_->nodes[size_t(p.node)].min_depth <= g_->limits.max_depth;
}

// Some allowed key lies below key-trie node t.
bool JsonMachine::key_trie_allowed(int32_t t) const {
  const int obj_index = size_ - 2;
  const Frame& obj = f_[obj_index];
  for (int32_t j : g_->lits[size_t(t)].below)
    if (key_allowed(obj, obj_index, j)) return true;
  return false;
}

bool JsonMachine::object_byte(Frame& f, const JsonNode& n, uint8_t c) {
  const bool declared = !n.props.empty();
  const int32_t np = int32_t(n.props.size());
  // A key can start here: some allowed declared key, or free keys whose values fit.
  auto key_possible = [&]() {
    if (declared) {
      for (int32_t j = int32_t(f.count); j < np; ++j)
        if (key_allowed(f, size_ - 1, j)) return true;
      return false;
    }
    return n.values >= 0 && can_start(n.values);
  };
  auto can_close = [&]() { return !declared || n.next_required[f.count] == np; };
  switch (f.phase) {
    case kOpen:
    case kAfterComma:
      if (c == '}' && f.phase == kOpen && can_close()) {
        pop_done(-1);
        return true;
      }
      if (c != '"' || !key_possible()) return false;
      f.phase = kKey;
      return start_value(declared ? n.key_node : g_->string_node, c);
    case kColon:
      if (c != ':') return false;
      f.phase = kBeforeValue;
      return true;
    case kBeforeValue: {
      const int32_t v = declared ? n.props[f.count].node : n.values;
      f.phase = kValue;
      return start_value(v, c);
    }
    case kAfterValue:
      if (c == '}' && can_close()) {
        pop_done(-1);
        return true;
      }
      if (c != ',' || !key_possible()) return false;
      f.phase = kAfterComma;
      return true;
    default: return false;
  }
}

bool JsonMachine::array_byte(Frame& f, const JsonNode& n, uint8_t c) {
  switch (f.phase) {
    case kOpen:
      if (c == ']') {
        if (n.min_items > 0) return false;
        pop_done(-1);
        return true;
      }
      if (n.max_items == 0) return false;
      f.phase = kValue;
      return start_value(n.items, c);
    case kAfterComma: f.phase = kValue; return start_value(n.items, c);
    case kAfterValue:
      if (c == ']') {
        if (int64_t(f.count) < n.min_items) return false;
        pop_done(-1);
        return true;
      }
      if (c != ',' || int64_t(f.count) >= n.max_items || !can_start(n.items)) return false;
      f.phase = kAfterComma;
      return true;
    default: return false;
  }
}

bool JsonMachine::string_byte(Frame& f, uint8_t c) {
  switch (f.phase) {
    case kPlain:
      if (c == '"') {
        pop_done(-1);
        return true;
      }
      if (c == '\\') {
        f.phase = kEscape;
        return true;
      }
      if (c < 0x20) return false;
      if (c < 0x80) return true;
      // UTF-8 lead byte: continuation count and the range of the first continuation byte
      // (E0/F0 exclude overlongs, ED excludes surrogates, F4 caps at U+10FFFF).
      f.lo = 0x80, f.hi = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) f.sub = 1;
      else if (c >= 0xE0 && c <= 0xEF) {
        f.sub = 2;
        if (c == 0xE0) f.lo = 0xA0;
        if (c == 0xED) f.hi = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        f.sub = 3;
        if (c == 0xF0) f.lo = 0x90;
        if (c == 0xF4) f.hi = 0x8F;
      } else return false;
      f.phase = kUtf8;
      return true;
    case kUtf8:
      if (c < f.lo || c > f.hi) return false;
      f.lo = 0x80, f.hi = 0xBF;
      if (--f.sub == 0) f.phase = kPlain;
      return true;
    case kEscape:
      if (c == 'u') {
        f.phase = kHex, f.sub = 0, f.count = 0;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        f.phase = kPlain;
        return true;
      }
      return false;
    case kHex: {
      // count: 1 after a first digit D, 2 once D[89AB] makes a high surrogate; D[C-F] (a low
      // surrogate with no high one before it) is rejected at its second digit.
      const int v = hex_value(c);
      if (v < 0) return false;
      if (f.sub == 0) f.count = v == 0xD ? 1 : 0;
      else if (f.sub == 1 && f.count == 1) {
        if (v >= 0xC) return false;
        f.count = v >= 0x8 ? 2 : 0;
      }
      if (++f.sub == 4) f.phase = f.count == 2 ? kLowBackslash : kPlain;
      return true;
    }
    case kLowBackslash:
      if (c != '\\') return false;
      f.phase = kLowU;
      return true;
    case kLowU:
      if (c != 'u') return false;
      f.phase = kLowHex, f.sub = 0;
      return true;
    case kLowHex: {  // \uDC00..\uDFFF
      const int v = hex_value(c);
      if (v < 0 || (f.sub == 0 && v != 0xD) || (f.sub == 1 && v < 0xC)) return false;
      if (++f.sub == 4) f.phase = kPlain;
      return true;
    }
    default: return false;
  }
}

bool JsonMachine::number_byte(Frame& f, const JsonNode& n, uint8_t c) {
  const bool d = is_digit(c);
  // count: digits of the current part, capped (so the value stays a finite double).
  auto to = [&](uint8_t s, uint32_t digits) {
    f.phase = s, f.count = digits;
    return true;
  };
  auto more = [&](uint32_t cap) {
    if (f.count >= cap) return false;
    ++f.count;
    return true;
  };
  // A byte that cannot continue a complete number ends it and goes to the parent.
  auto end = [&]() {
    pop_done(-1);
    return container_byte(c);
  };
  const bool frac_exp = !n.integer;
  switch (f.phase) {
    case kMinus: return c == '0' ? to(kZero, 1) : d ? to(kInt, 1) : false;
    case kZero:
    case kInt:
      if (d && f.phase == kInt) return more(kJsonMaxIntDigits);
      if (frac_exp && c == '.') return to(kDot, 0);
      if (frac_exp && (c == 'e' || c == 'E')) return to(kExp, 0);
      return d ? false : end();
    case kDot: return d ? to(kFrac, 1) : false;
    case kFrac:
      if (d) return more(kJsonMaxFracDigits);
      if (c == 'e' || c == 'E') return to(kExp, 0);
      return end();
    case kExp: return (c == '+' || c == '-') ? to(kExpSign, 0) : d ? to(kExpDigits, 1) : false;
    case kExpSign: return d ? to(kExpDigits, 1) : false;
    case kExpDigits: return d ? more(kJsonMaxExpDigits) : end();
    default: return false;
  }
}

// Literal alternatives are matched in a byte trie; one that ends where no longer alternative
// continues closes at once, otherwise (numbers such as 1 and 10) at the first byte that
// cannot continue, which then goes to the parent.
bool JsonMachine::literal_byte(Frame& f, const JsonNode& n, uint8_t c) {
  const int32_t t = int32_t(f.count);
  const int32_t next = g_->lit_child(t, c);
  if (next >= 0 && (n.key_of < 0 || key_trie_allowed(next))) {
    f.count = uint32_t(next);
    const JsonLitNode& ln = g_->lits[size_t(next)];
    if (ln.tag >= 0 && ln.next.empty()) pop_done(ln.tag);
    return true;
  }
  const int32_t tag = g_->lits[size_t(t)].tag;
  if (tag < 0) return false;
  pop_done(tag);
  return container_byte(c);
}

bool JsonMachine::complete() const {
  if (done_) return true;
  if (size_ != 1) return false;
  const Frame& f = f_[0];
  const JsonNode& n = g_->nodes[size_t(f.node)];
  if (n.kind == JsonKind::Number) return f.phase == kZero || f.phase == kInt || f.phase == kFrac || f.phase == kExpDigits;
  if (n.kind == JsonKind::Literal) return g_->lits[f.count].tag >= 0;
  return false;
}

bool JsonMachine::in_plain_string() const {
  return size_ > 0 && f_[size_ - 1].phase == kPlain && g_->nodes[size_t(f_[size_ - 1].node)].kind == JsonKind::String;
}

}  // namespace k3
