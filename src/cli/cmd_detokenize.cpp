// `k3cpp detokenize --vocab FILE_OR_DIR (--ids 1,2,3 | --ids-file F) [--raw]`
// Decodes token ids to text on stdout (special ids as their names). Invalid UTF-8 in the
// decoded bytes is printed as U+FFFD unless --raw. A bad id is reported with its place:
// the field of --ids, or the line and field of --ids-file.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "io/tiktoken.h"

namespace k3::cli {
namespace {

const char* kDetokenizeUsage =
    "usage: k3cpp detokenize --vocab FILE_OR_DIR (--ids 1,2,3 | --ids-file F) [--raw]\n"
    "  --vocab     a tiktoken.model file, or a directory with tiktoken.model and tokenizer_config.json\n"
    "  --ids       comma-separated token ids\n"
    "  --ids-file  a file of ids separated by commas, spaces or newlines (what tokenize --ids-out writes)\n"
    "  --raw       print the decoded bytes as they are (no U+FFFD for invalid UTF-8)\n";

// Ids separated by commas / whitespace; a bad entry is named by its field (and line).
std::vector<int32_t> parse_ids(const std::string& text, const Tiktoken& tok, const std::string& source, bool lines) {
  std::vector<int32_t> ids;
  size_t line = 1, field = 0, i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      if (c == '\n') { ++line; field = 0; }
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] != ',' && text[j] != ' ' && text[j] != '\t' && text[j] != '\r' && text[j] != '\n') ++j;
    const std::string tokstr = text.substr(i, j - i);
    ++field;
    const std::string where = lines ? source + ": line " + std::to_string(line) + ": field " + std::to_string(field)
                                    : source + ": field " + std::to_string(field);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(tokstr.c_str(), &end, 10);
    if (*end || errno || tokstr.empty()) fail(where + ": '" + tokstr + "' is not a token id");
    if (v < 0 || v >= tok.vocab_size())
      fail(where + ": token id " + tokstr + " is outside the vocabulary (0.." + std::to_string(tok.vocab_size() - 1) + ")");
    ids.push_back(int32_t(v));
    i = j;
  }
  if (ids.empty()) fail(source + ": no token ids given");
  return ids;
}

}  // namespace

int cmd_detokenize(const std::vector<std::string>& args) {
  Args a(args, {"vocab", "ids", "ids-file"}, {"raw", "help"}, "detokenize");
  if (a.flag("help")) {
    std::fputs(kDetokenizeUsage, stdout);
    return 0;
  }
  if (!a.positional().empty()) fail("unexpected argument '" + a.positional()[0] + "' (see --help)");
  auto vocab = a.get("vocab");
  if (!vocab) fail("--vocab is required (a tiktoken.model file or its directory)");
  const auto ids_arg = a.get("ids"), ids_file = a.get("ids-file");
  if (bool(ids_arg) == bool(ids_file)) fail("give exactly one of --ids and --ids-file");
  const Tiktoken tok = Tiktoken::load(*vocab);
  std::vector<int32_t> ids;
  if (ids_arg) {
    ids = parse_ids(*ids_arg, tok, "--ids", false);
  } else {
    std::ifstream f(*ids_file, std::ios::binary);
    if (!f) fail_system("cannot open the ids file", *ids_file);
    std::stringstream ss;
    ss << f.rdbuf();
    ids = parse_ids(ss.str(), tok, *ids_file, true);
  }
  const std::string out = a.flag("raw") ? tok.decode_bytes(ids) : tok.decode(ids);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace k3::cli
