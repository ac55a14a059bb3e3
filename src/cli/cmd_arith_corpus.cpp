// `k3cpp arith-corpus --out FILE [--problems N] [--digits 1,2,3] [--ops +*] [--seed S] [--per-doc K]`
// Writes the pretraining corpus of the post-training demonstration (posttrain/arith_task.h):
// arithmetic problems with worked traces (carries written out), documents separated by form
// feeds, the format `k3cpp train` reads as "data".
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "posttrain/arith_task.h"

namespace k3::cli {

int cmd_arith_corpus(const std::vector<std::string>& args) {
  Args a(args, {"out", "problems", "digits", "ops", "seed", "per-doc"}, {"help"}, "arith-corpus");
  if (a.flag("help")) {
    std::fputs("usage: k3cpp arith-corpus --out FILE [--problems N] [--digits 1,2,3] [--ops +*] [--seed S] [--per-doc K]\n",
               stdout);
    return 0;
  }
  const auto out = a.get("out");
  if (!out) fail("--out is required (see k3cpp arith-corpus --help)");
  ArithFamily f;
  f.problems = a.get_int("problems", 10000);
  f.seed = uint64_t(a.get_int("seed", 7));
  f.ops = a.get_or("ops", "+*");
  f.tool_share = 0.25;
  f.digits.clear();
  std::stringstream ds(a.get_or("digits", "1,2,3"));
  for (std::string x; std::getline(ds, x, ',');) {
    try {
      f.digits.push_back(std::stoi(x));
    } catch (const std::exception&) {
      fail("--digits: '" + x + "' is not a number");
    }
  }
  const long long per_doc = a.get_int("per-doc", 8);
  if (f.problems < 1 || per_doc < 1) fail("--problems and --per-doc must be positive");
  for (int d : f.digits)
    if (d < 1 || d > 9) fail("--digits: each must be in 1..9");
  for (char c : f.ops)
    if (c != '+' && c != '*') fail("--ops: only + and * are supported");
  const std::vector<std::string> docs = pretrain_corpus(f, per_doc);
  std::string text;
  for (size_t i = 0; i < docs.size(); ++i) text += (i ? "\f" : "") + docs[i];
  write_text_file_atomic(*out, text);
  std::printf("arith-corpus: %zu documents, %zu bytes -> %s\n", docs.size(), text.size(), out->c_str());
  return 0;
}

}  // namespace k3::cli
