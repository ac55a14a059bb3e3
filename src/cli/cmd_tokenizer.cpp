// `k3cpp tokenizer train --corpus FILE --vocab-size N --out DIR [--pattern kimi]
//                        [--min-frequency F]`
// Trains a byte-level BPE vocabulary (io/bpe_trainer.h) and writes DIR/tiktoken.model and
// DIR/tokenizer_config.json with K3's special layout, each atomically. N counts every id
// as a model config's vocab_size does: N - 256 base tokens, then the 256 special ids.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "io/bpe_trainer.h"
#include "io/tiktoken_config.h"

namespace k3::cli {
namespace {

const char* kTokenizerUsage =
    "usage: k3cpp tokenizer train --corpus FILE --vocab-size N --out DIR [--pattern kimi|cl100k|o200k]\n"
    "                             [--min-frequency F]\n"
    "  --corpus         training text (bytes; invalid UTF-8 becomes U+FFFD)\n"
    "  --vocab-size     all ids, as a model config's vocab_size: N - 256 base tokens (the 256\n"
    "                   byte tokens, then merges), then 256 special ids laid out as K3's\n"
    "  --out            output directory: tiktoken.model and tokenizer_config.json\n"
    "  --pattern        pre-tokenizer the merges are learnt under (default kimi)\n"
    "  --min-frequency  stop early when the best pair occurs fewer times (default 2)\n";

}  // namespace

int cmd_tokenizer(const std::vector<std::string>& args) {
  Args a(args, {"corpus", "vocab-size", "out", "pattern", "min-frequency"}, {"help"}, "tokenizer");
  if (a.flag("help") || a.positional().empty()) {
    std::fputs(kTokenizerUsage, a.flag("help") ? stdout : stderr);
    return a.flag("help") ? 0 : 2;
  }
  if (a.positional()[0] != "train" || a.positional().size() != 1)
    fail("unknown tokenizer action '" + a.positional()[0] + "' (expected: tokenizer train ...)");
  const auto corpus = a.get("corpus"), out = a.get("out");
  if (!corpus) fail("--corpus is required");
  if (!out) fail("--out is required");
  if (!a.get("vocab-size")) fail("--vocab-size is required");
  const long long n = a.get_int("vocab-size", 0);
  if (n < 256 + kReservedSpecialIds || n > (1ll << 30))
    fail("--vocab-size: " + std::to_string(n) + " is out of range (at least " +
         std::to_string(256 + kReservedSpecialIds) + ": 256 byte tokens and 256 special ids)");
  BpeTrainOptions opt;
  opt.base_vocab = int32_t(n - kReservedSpecialIds);
  opt.pattern = parse_pattern_kind(a.get_or("pattern", "kimi"));
  opt.min_frequency = a.get_int("min-frequency", 2);
  if (opt.min_frequency < 1) fail("--min-frequency must be at least 1");
  opt.progress = [](const BpeTrainProgress& p) {
    std::fprintf(stderr, "\rtokenizer train: %d/%d merges (%.1f%%), %.1f s", p.merges_done, p.merges_target,
                 p.merges_target ? 100.0 * p.merges_done / p.merges_target : 100.0, p.seconds);
    std::fflush(stderr);
  };
  std::ifstream f(*corpus, std::ios::binary);
  if (!f) fail_system("cannot open the corpus", *corpus);
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail_system("cannot read the corpus", *corpus);
  const std::string text = ss.str();
  if (text.empty()) fail_input(*corpus, "", "the corpus is empty");
  std::fprintf(stderr, "tokenizer train: %zu bytes, pattern %s, target %d base tokens\n", text.size(),
               pattern_kind_name(opt.pattern), opt.base_vocab);
  BpeTrainResult r = train_bpe(text, opt);
  std::fprintf(stderr, "\n");
  write_tokenizer_dir(*out, r.ranks);
  std::printf("tokenizer train: %lld pieces (%lld distinct), %d merges, %d base tokens + %d special ids -> %s\n",
              (long long)r.pieces, (long long)r.unique_pieces, r.merges, r.ranks.size(), kReservedSpecialIds, out->c_str());
  std::printf("  pre-tokenize %.2f s, merges %.2f s\n", r.pretokenize_seconds, r.merge_seconds);
  if (r.exhausted)
    std::printf("  note: stopped at %d base tokens: no pair occurs %lld times or more\n", r.ranks.size(),
                (long long)opt.min_frequency);
  return 0;
}

}  // namespace k3::cli
