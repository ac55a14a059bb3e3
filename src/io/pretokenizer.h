// The regex pre-tokenizer of tiktoken-style encodings, on PCRE2 (Debian's 10.42, JIT).
// Each pattern is the reference pattern rewritten for PCRE2 with the same matches:
//  - `\p{Han}` is `\p{sc:Han}`, the Script property, as in the Rust regex crate; PCRE2
//    10.40+ reads `\p{Han}` as Script_Extensions, which adds CJK punctuation (、。「」).
//  - `\s` / `\S` are spelled out as Unicode White_Space (what the Rust regex crate means);
//    PCRE2's \s with UCP also matches U+180E, which White_Space no longer contains.
//  - Kimi's class intersections `[X&&[^\p{Han}]]` (PCRE2 10.42 reads `&&` literally) become
//    one negated class of the complement, e.g. [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] =
//    [^\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}] (the general categories partition the code
//    points); the lookahead form (?:(?!\p{sc:Han})[...]) is equal (tests check every code point)
//    but costs a JIT backtrack frame per character of a word.
// PCRE2 10.42 carries Unicode 14 tables: characters added later (e.g. CJK extension H,
// U+31350..) are unassigned there, so not \p{L} / \p{Han}; see docs/tokenizer.md.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace k3 {

enum class PatternKind { kimi, cl100k, o200k };

PatternKind parse_pattern_kind(const std::string& name);  // k3::Error naming the choices
const char* pattern_kind_name(PatternKind kind);

// The reference pattern string (as given to tiktoken) and k3cpp's PCRE2 rewrite of it.
std::string reference_pattern(PatternKind kind);
std::string pcre2_pattern(PatternKind kind);

class Pretokenizer {
 public:
  explicit Pretokenizer(PatternKind kind);
  // Compiles an arbitrary PCRE2 pattern (UTF + UCP, JIT when available); k3::Error on
  // a syntax error, naming the offset.
  explicit Pretokenizer(const std::string& pcre2_source);
  ~Pretokenizer();
  Pretokenizer(Pretokenizer&&) noexcept;
  Pretokenizer& operator=(Pretokenizer&&) noexcept;

  // Calls piece(begin, end) (byte offsets into `text`) for every match, left to right,
  // as the reference's find_iter does. `text` must be valid UTF-8 (utf8::sanitize).
  // Thread-safe: the compiled pattern is shared, match state is per call.
  template <class F>
  void split(std::string_view text, F&& piece) const {
    size_t pos = 0;
    Cursor c(*this, text);
    size_t b, e;
    while (c.next(pos, b, e)) {
      piece(b, e);
      pos = e;
    }
  }
  std::vector<std::string_view> split(std::string_view text) const;
  bool jit() const;

 private:
  struct Impl;
  // One match at a time from `pos`; false at the end of the text.
  class Cursor {
   public:
    Cursor(const Pretokenizer& p, std::string_view text);
    ~Cursor();
    bool next(size_t pos, size_t& begin, size_t& end);

   private:
    const Impl* impl_;
    std::string_view text_;
    void* md_;
  };
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3
