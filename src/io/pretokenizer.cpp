#define PCRE2_CODE_UNIT_WIDTH 8
#include "io/pretokenizer.h"

#include <pcre2.h>

#include "core/error.h"

namespace k3 {
namespace {

// Unicode White_Space, the meaning of \s in the Rust regex crate.
#define K3_WS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define K3_S "[" K3_WS "]"
#define K3_NOT_S "[^" K3_WS "]"
#define K3_CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] and [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] as
// negated complements (see the header).
#define K3_UPPER_NOT_HAN "[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{sc:Han}]"
#define K3_LOWER_NOT_HAN "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{sc:Han}]"

const char* kKimiReference =
    "[\\p{Han}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|"
    "\\s+";
const char* kKimiPcre2 =
    "\\p{sc:Han}+|"
    "[^\\r\\n\\p{L}\\p{N}]?" K3_UPPER_NOT_HAN "*" K3_LOWER_NOT_HAN "+" K3_CONTRACTIONS "?|"
    "[^\\r\\n\\p{L}\\p{N}]?" K3_UPPER_NOT_HAN "+" K3_LOWER_NOT_HAN "*" K3_CONTRACTIONS "?|"
    "\\p{N}{1,3}|"
    " ?[^" K3_WS "\\p{L}\\p{N}]+[\\r\\n]*|"
    K3_S "*[\\r\\n]+|"
    K3_S "+(?!" K3_NOT_S ")|"
    K3_S "+";

const char* kCl100kReference =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kCl100kPcre2 =
    K3_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" K3_WS "\\p{L}\\p{N}]+[\\r\\n]*|"
    K3_S "*[\\r\\n]+|" K3_S "+(?!" K3_NOT_S ")|" K3_S "+";

const char* kO200kReference =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kO200kPcre2 =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" K3_CONTRACTIONS "?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" K3_CONTRACTIONS "?|"
    "\\p{N}{1,3}| ?[^" K3_WS "\\p{L}\\p{N}]+[\\r\\n/]*|" K3_S "*[\\r\\n]+|" K3_S "+(?!" K3_NOT_S ")|" K3_S "+";

}  // namespace

PatternKind parse_pattern_kind(const std::string& name) {
  if (name == "kimi") return PatternKind::kimi;
  if (name == "cl100k") return PatternKind::cl100k;
  if (name == "o200k") return PatternKind::o200k;
  fail("unknown pattern '" + name + "' (expected kimi, cl100k or o200k)");
}

const char* pattern_kind_name(PatternKind kind) {
  switch (kind) {
    case PatternKind::kimi: return "kimi";
    case PatternKind::cl100k: return "cl100k";
    case PatternKind::o200k: return "o200k";
  }
  return "?";
}

std::string reference_pattern(PatternKind kind) {
  switch (kind) {
    case PatternKind::kimi: return kKimiReference;
    case PatternKind::cl100k: return kCl100kReference;
    case PatternKind::o200k: return kO200kReference;
  }
  return {};
}

std::string pcre2_pattern(PatternKind kind) {
  switch (kind) {
    case PatternKind::kimi: return kKimiPcre2;
    case PatternKind::cl100k: return kCl100kPcre2;
    case PatternKind::o200k: return kO200kPcre2;
  }
  return {};
}

struct Pretokenizer::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Pretokenizer::Pretokenizer(PatternKind kind) : Pretokenizer(pcre2_pattern(kind)) {}

Pretokenizer::Pretokenizer(const std::string& src) : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(src.data()), src.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("pre-tokenizer pattern: offset " + std::to_string(off) + ": " +
         reinterpret_cast<const char*>(msg));
  }
  // Without JIT (a PCRE2 built without it) matching is ~7x slower but identical.
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Pretokenizer::~Pretokenizer() = default;
Pretokenizer::Pretokenizer(Pretokenizer&&) noexcept = default;
Pretokenizer& Pretokenizer::operator=(Pretokenizer&&) noexcept = default;
bool Pretokenizer::jit() const { return impl_->jit; }

Pretokenizer::Cursor::Cursor(const Pretokenizer& p, std::string_view text)
    : impl_(p.impl_.get()), text_(text) {
  md_ = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  if (!md_) fail("pre-tokenizer: out of memory for match data");
}

Pretokenizer::Cursor::~Cursor() { pcre2_match_data_free(static_cast<pcre2_match_data*>(md_)); }

bool Pretokenizer::Cursor::next(size_t pos, size_t& begin, size_t& end) {
  if (pos >= text_.size()) return false;
  auto* md = static_cast<pcre2_match_data*>(md_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text_.data());
  // NO_UTF_CHECK: the text was validated once; PCRE2 would otherwise re-check it from
  // `pos` on every call (quadratic).
  int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text_.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr)
                      : pcre2_match(impl_->code, subject, text_.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    fail(std::string("pre-tokenizer: match failed at byte ") + std::to_string(pos) + ": " +
         reinterpret_cast<const char*>(msg));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  begin = ov[0];
  end = ov[1];
  if (end == begin) {
    // The shipped patterns never match empty; a custom one could, so step past a character
    // (as find_iter does) instead of looping forever.
    size_t e = begin + 1;
    while (e < text_.size() && (static_cast<unsigned char>(text_[e]) & 0xC0) == 0x80) ++e;
    end = e;
    return next(e, begin, end);
  }
  return true;
}

std::vector<std::string_view> Pretokenizer::split(std::string_view text) const {
  std::vector<std::string_view> out;
  split(text, [&](size_t b, size_t e) { out.push_back(text.substr(b, e - b)); });
  return out;
}

}  // namespace k3
