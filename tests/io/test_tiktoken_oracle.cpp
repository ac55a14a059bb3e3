// k3cpp's tiktoken encoder against an independent oracle: the npm package tiktoken (the
// WebAssembly build of tiktoken's Rust core, pinned in tools/oracle/package.json and
// installed by scripts/setup.sh). tools/oracle/oracle.mjs builds a >= 10 MB corpus from
// Debian files plus generated text and writes the reference ids for cl100k_base and
// o200k_base with their own patterns and for the Kimi pattern over o200k ranks; every
// document must match token for token. Documents named "unicode15:*" hold characters newer
// than PCRE2 10.42's Unicode 14 tables (CJK extensions H and I, Kawi, Nag Mundari): the
// oracle's regex tables do not know them either, so they match too; tiktoken builds with
// newer tables would differ there (docs/tokenizer.md; test_tiktoken.cpp pins k3cpp's side).
// A missing node_modules fails the test (CI runs setup first); it is never skipped.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "io/pretokenizer.h"
#include "io/tiktoken.h"
#include "io/tiktoken_file.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

struct Doc {
  std::string name, bytes;
};

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint32_t u32_at(const std::string& b, size_t& o) {
  if (o + 4 > b.size()) throw std::runtime_error("truncated oracle file");
  uint32_t v;
  std::memcpy(&v, b.data() + o, 4);
  o += 4;
  return v;
}

std::vector<Doc> read_corpus(const std::string& path) {
  std::string b = read_all(path);
  size_t o = 0;
  std::vector<Doc> docs(u32_at(b, o));
  for (auto& d : docs) {
    uint32_t n = u32_at(b, o);
    d.name = b.substr(o, n);
    o += n;
    n = u32_at(b, o);
    d.bytes = b.substr(o, n);
    o += n;
  }
  return docs;
}

std::vector<std::vector<int32_t>> read_ids(const std::string& path, size_t docs) {
  std::string b = read_all(path);
  size_t o = 0;
  std::vector<std::vector<int32_t>> out(docs);
  for (auto& ids : out) {
    ids.resize(u32_at(b, o));
    for (auto& id : ids) id = int32_t(u32_at(b, o));
  }
  EXPECT_EQ(o, b.size()) << path;
  return out;
}

// Where two id lists first differ, with the decoded text around it.
std::string describe(const Tiktoken& tok, const std::vector<int32_t>& want, const std::vector<int32_t>& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  auto window = [&](const std::vector<int32_t>& v) {
    std::string s;
    for (size_t k = i; k < v.size() && k < i + 6; ++k) {
      std::string b(tok.token_bytes(v[k]));
      s += std::to_string(v[k]) + "'" + b + "' ";
    }
    return s;
  };
  return "first difference at token " + std::to_string(i) + " of " + std::to_string(want.size()) + "/" +
         std::to_string(got.size()) + ": oracle " + window(want) + "| k3cpp " + window(got);
}

}  // namespace

TEST(TiktokenOracle, MatchesNpmTiktokenTokenForToken) {
  const std::string oracle_dir = std::string(K3_SOURCE_DIR) + "/tools/oracle";
  ASSERT_TRUE(fs::exists(oracle_dir + "/node_modules/tiktoken/tiktoken_bg.wasm"))
      << "npm tiktoken is not installed in tools/oracle/node_modules: run scripts/setup.sh";
  test::TempDir tmp("k3_tok_oracle");
  const std::string cmd = "node " + test::shell_quote(oracle_dir + "/oracle.mjs") + " " + test::shell_quote(tmp.path) + " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string log;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) log.append(buf, n);
  const int rc = pclose(p);
  ASSERT_EQ(rc, 0) << "oracle.mjs failed: " << log;
  std::printf("%s", log.c_str());

  const auto report = nlohmann::json::parse(read_all(tmp.sub("oracle.json")));
  EXPECT_EQ(report["tiktoken_version"], "1.0.22");
  const std::vector<Doc> docs = read_corpus(tmp.sub("corpus.bin"));
  size_t total = 0;
  for (const auto& d : docs) total += d.bytes.size();
  EXPECT_GE(total, size_t(10'000'000)) << "the corpus must hold at least 10 MB";

  struct Mode {
    const char* mode;
    const char* ranks;
    PatternKind pattern;
  };
  const Mode modes[] = {{"cl100k", "cl100k_base", PatternKind::cl100k},
                        {"o200k", "o200k_base", PatternKind::o200k},
                        {"kimi_o200k", "o200k_base", PatternKind::kimi}};
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.mode);
    // The oracle's pattern is the reference string k3cpp rewrites for PCRE2.
    EXPECT_EQ(report["modes"][m.mode]["pattern"].get<std::string>(), reference_pattern(m.pattern));
    Tiktoken tok(read_tiktoken_model(tmp.sub(std::string(m.ranks) + ".tiktoken")), {}, m.pattern);
    const auto want = read_ids(tmp.sub(std::string("ids_") + m.mode + ".bin"), docs.size());
    std::vector<std::string_view> views;
    for (const auto& d : docs) views.emplace_back(d.bytes);
    const auto got = tok.encode_batch(views);
    size_t tokens = 0, pinned = 0, mismatched = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
      tokens += want[i].size();
      if (docs[i].name.rfind("unicode15:", 0) == 0) ++pinned;
      if (want[i] != got[i] && ++mismatched <= 10)
        ADD_FAILURE() << docs[i].name << ": " << describe(tok, want[i], got[i]);
    }
    EXPECT_EQ(mismatched, 0u);
    EXPECT_EQ(pinned, 2u);
    std::printf("%s: %zu documents, %zu oracle tokens, %zu mismatches (%zu Unicode 15+ documents among them)\n",
                m.mode, docs.size(), tokens, mismatched, pinned);
  }
}
