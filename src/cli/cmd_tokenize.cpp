// `k3cpp tokenize --vocab FILE_OR_DIR [--pattern kimi|cl100k|o200k] (--text T | --file F)
//                 [--allow-special] [--ids-out FILE]`
// Encodes text with a tiktoken vocabulary (io/tiktoken.h) and prints the ids, comma-
// separated (the form `detokenize --ids` and `generate --ids` take). By default the text is
// user text: `<|open|>` and the like stay ordinary text; --allow-special encodes it as a
// control segment, where special names become their ids.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/tiktoken.h"

namespace k3::cli {
namespace {

const char* kTokenizeUsage =
    "usage: k3cpp tokenize --vocab FILE_OR_DIR [--pattern kimi|cl100k|o200k] (--text T | --file F)\n"
    "                      [--allow-special] [--ids-out FILE]\n"
    "  --vocab          a tiktoken.model file, or a directory with tiktoken.model and\n"
    "                   tokenizer_config.json (special tokens)\n"
    "  --pattern        pre-tokenizer: kimi (K3, default), cl100k or o200k\n"
    "  --text, --file   the text to encode (a file is read as bytes; invalid UTF-8 becomes U+FFFD)\n"
    "  --allow-special  special token names in the text become their ids (a control segment)\n"
    "  --ids-out        write the ids to FILE instead of stdout\n";

}  // namespace

int cmd_tokenize(const std::vector<std::string>& args) {
  Args a(args, {"vocab", "pattern", "text", "file", "ids-out"}, {"allow-special", "help"}, "tokenize");
  if (a.flag("help")) {
    std::fputs(kTokenizeUsage, stdout);
    return 0;
  }
  if (!a.positional().empty()) fail("unexpected argument '" + a.positional()[0] + "' (see --help)");
  auto vocab = a.get("vocab");
  if (!vocab) fail("--vocab is required (a tiktoken.model file or its directory)");
  const auto text = a.get("text"), file = a.get("file");
  if (bool(text) == bool(file)) fail("give exactly one of --text and --file");
  const PatternKind pattern = parse_pattern_kind(a.get_or("pattern", "kimi"));
  const Tiktoken tok = Tiktoken::load(*vocab, pattern);
  const std::vector<int32_t> ids = tok.encode(text ? *text : read_file_bytes(*file, "the text file"), a.flag("allow-special"));
  std::string out;
  out.reserve(ids.size() * 7);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += '\n';
  if (auto path = a.get("ids-out")) {
    write_text_file_atomic(*path, out);
    std::fprintf(stderr, "tokenize: %zu tokens -> %s\n", ids.size(), path->c_str());
  } else {
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return 0;
}

}  // namespace k3::cli
