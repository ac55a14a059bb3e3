// A byte-level incremental JSON recognizer: a pushdown automaton over a compiled grammar
// (infer/json_schema.h builds one from a JSON schema, or the plain-JSON grammars). Plain JSON is
// RFC 8259 exactly (what nlohmann::json::accept accepts), with two caps so that a random model
// cannot run forever on structure: at most `max_ws_run` consecutive whitespace bytes outside
// strings, and at most `max_depth` frames (containers, plus the scalar innermost); numbers have
// at most 20 integer digits, 20 fraction digits and 2 exponent digits (so every number is a
// finite double: nlohmann rejects 1e400, and a random model cannot write digits forever). Strings are
// validated byte by byte: no control bytes below 0x20, escapes including \uXXXX with surrogate
// pairs (a lone surrogate is rejected), and UTF-8 as RFC 3629 (no overlongs, no surrogates, no
// code point above U+10FFFF).
//
// The automaton never enters a state from which the value cannot be completed (a dead end):
// every value it starts fits within max_depth (each node's minimum depth is precomputed), keys
// and commas are accepted only where a key or element can follow. So "some byte can follow or
// the value is complete" always holds, which lets the token mask never be empty.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace k3 {

inline constexpr int kJsonMaxDepth = 64;  // frames a JsonMachine can hold
inline constexpr uint32_t kJsonMaxIntDigits = 20, kJsonMaxFracDigits = 20, kJsonMaxExpDigits = 2;

struct JsonLimits {
  int max_depth = 32;        // frames: nesting of containers, plus one for a scalar or key inside
  int max_ws_run = 10;       // consecutive whitespace bytes outside strings (enough for "\n" + 8)
  bool trailing_ws = false;  // whitespace after the top-level value (RFC 8259 allows it)
};

enum class JsonKind : uint8_t { Object, Array, String, Number, Literal, Union };

struct JsonProperty {
  std::string name;
  int32_t node = -1;
  bool required = false;
};

// One node of the compiled grammar; which fields apply depends on `kind`.
struct JsonNode {
  JsonKind kind = JsonKind::Union;
  // Object. Declared properties: only these keys, in this order (required ones mandatory).
  // Without properties: free keys with values `values`, or (values = -1) only "{}".
  std::vector<JsonProperty> props;
  std::vector<int32_t> next_required;  // [props + 1]: first required index >= i, else props.size()
  int32_t key_node = -1;               // Literal node of the quoted property names (tag: index)
  int32_t values = -1;
  // Array.
  int32_t items = -1;
  int64_t min_items = 0, max_items = INT64_MAX;
  // Number.
  bool integer = false;  // no fraction, no exponent
  // Literal: alternatives as canonical JSON text in a byte trie (tag: alternative index).
  int32_t lit_root = -1;
  int32_t key_of = -1;  // this literal is the key set of that Object node
  // Union: the first byte of a value selects the branch (branches start with distinct bytes).
  std::vector<int32_t> branches;
  std::vector<int32_t> first;  // [256] branch node per first byte, -1: none
  int32_t min_depth = 0;       // frames needed to complete a value of this node
};

struct JsonLitNode {
  std::vector<std::pair<uint8_t, int32_t>> next;  // byte -> child
  int32_t tag = -1;                               // an alternative ends here
  std::vector<int32_t> below;                     // tags in this subtree (ascending)
};

struct JsonGrammar {
  std::vector<JsonNode> nodes;
  std::vector<JsonLitNode> lits;
  int32_t root = -1;
  int32_t string_node = -1;  // free object keys
  JsonLimits limits;

  int32_t lit_child(int32_t t, uint8_t c) const {
    for (const auto& [b, n] : lits[size_t(t)].next)
      if (b == c) return n;
    return -1;
  }
};

// One automaton state. Copies are cheap: only the frames in use are copied.
class JsonMachine {
 public:
  JsonMachine() = default;
  explicit JsonMachine(const JsonGrammar& g) : g_(&g) {}
  JsonMachine(const JsonMachine& o) { *this = o; }
  JsonMachine& operator=(const JsonMachine& o) {
    g_ = o.g_;
    size_ = o.size_;
    ws_ = o.ws_;
    done_ = o.done_;
    std::memcpy(f_, o.f_, sizeof(Frame) * size_);
    return *this;
  }

  // Consumes one byte; false if it cannot follow (the state is then unspecified: step a copy).
  bool step(uint8_t c);
  bool feed(std::string_view bytes) {
    for (char c : bytes)
      if (!step(uint8_t(c))) return false;
    return true;
  }
  // The bytes so far are a whole value (digits of a top-level number may still extend it).
  bool complete() const;
  // The top frame is a string between characters: any valid UTF-8 text without '"', '\' and
  // control bytes keeps it so (JsonVocab's fast path).
  bool in_plain_string() const;
  int depth() const { return size_; }

 private:
  struct Frame {
    int32_t node;
    uint8_t phase;   // container phase or scalar lexer state
    uint8_t sub;     // string: digits read / UTF-8 continuation bytes left
    uint8_t lo, hi;  // string: range of the next UTF-8 continuation byte
    uint32_t count;  // object: property index; array: items; literal: trie node; \u: surrogate flags
  };
  bool start_value(int32_t node, uint8_t c);
  bool push(int32_t node, uint8_t phase, uint32_t count);
  void pop_done(int32_t tag);  // pops the top frame and tells its parent
  bool container_byte(uint8_t c);
  bool object_byte(Frame& f, const JsonNode& n, uint8_t c);
  bool array_byte(Frame& f, const JsonNode& n, uint8_t c);
  bool string_byte(Frame& f, uint8_t c);
  bool number_byte(Frame& f, const JsonNode& n, uint8_t c);
  bool literal_byte(Frame& f, const JsonNode& n, uint8_t c);
  bool key_allowed(const Frame& obj, int obj_index, int32_t j) const;
  bool key_trie_allowed(int32_t t) const;
  bool can_start(int32_t node) const;  // a value of `node` fits above the current frames

  const JsonGrammar* g_ = nullptr;
  uint8_t size_ = 0;   // frames in use
  uint8_t ws_ = 0;     // consecutive whitespace bytes
  bool done_ = false;  // the top-level value is closed
  Frame f_[kJsonMaxDepth];
};

}  // namespace k3
