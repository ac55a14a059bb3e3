// `k3cpp init`, `forward` and `generate`, run as the built binary (K3_CLI_PATH):
//  - init writes a checkpoint in the released layout that `k3cpp inspect` accepts, with plain
//    experts (configs/tiny.json) and MXFP4 experts (a test config whose expert widths are
//    multiples of 32; tiny.json's 48 is refused with the tensor named); the same seed gives
//    the same bytes; a non-empty directory is refused without --force;
//  - forward writes T * V float32 logits equal to the library's forward of the same checkpoint;
//  - generate --ids with greedy decoding prints the tokens the library's session produces;
//    --prompt encodes with the byte tokenizer (tokenizer.json) and prints text; stop tokens end
//    generation; with tiktoken.model in the directory, --prompt is encoded with it and the
//    output is streamed as whole UTF-8 characters (equal to the full decode of the ids), and a
//    vocabulary larger than the config or a corrupt tiktoken.model is refused, named;
//  - bad inputs (missing directory, missing config.json, ids outside the vocabulary,
//    unsupported tokenizer, bad options) fail with a non-zero exit and the culprit named.
#include <gtest/gtest.h>

#include "common/cli_run.h"
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "infer/session.h"
#include "io/atomic_file.h"
#include "io/bpe_trainer.h"
#include "io/utf8.h"
#include "io/vocabulary.h"
#include "model/checkpoint.h"

namespace fs = std::filesystem;
using namespace k3;

namespace {

using k3::test::RunResult;
using k3::test::slurp;
struct ModelTempDir : k3::test::TempDir {
  ModelTempDir() : k3::test::TempDir("k3_cli_model") {}
};
using k3::test::q;
using k3::test::k3cpp;

using k3::test::has;
std::string tiny_json() { return q(std::string(K3_SOURCE_DIR) + "/configs/tiny.json"); }

// A 4-layer config with expert width 64 (MXFP4-compatible) and vocabulary 260 (bytes + the
// four byte-tokenizer specials), written into `dir`.
std::string write_mx_config(const std::string& dir) {
  K3Config c = load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  c.num_hidden_layers = 4;
  c.full_attn_layers = {2, 4};
  c.kda_layers = {1, 3};
  c.moe_intermediate_size = 64;
  c.attn_res_block_size = 2;
  c.vocab_size = 260;
  const std::string path = dir + "/mx_config.json";
  write_text_file_atomic(path, config_to_hf_json(c));
  return path;
}

std::vector<float> library_logits(const std::string& dir, const std::vector<int32_t>& ids) {
  const K3Model m = load_model(dir);
  std::vector<float> logits(ids.size() * size_t(m.dims().V));
  DecodeState st = m.new_state();
  ForwardScratch s;
  m.forward(logits.data(), ids.data(), int64_t(ids.size()), st, s);
  return logits;
}

// Greedy tokens from the library's session, stopping at `stop` (not included).
std::vector<int32_t> library_greedy(const std::string& dir, const std::vector<int32_t>& prompt, int n, int32_t stop = -1) {
  const K3Model m = load_model(dir);
  Session s(m);
  const float* l = s.prefill(prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t next = int32_t(std::max_element(l, l + m.dims().V) - l);
    if (next == stop) break;
    out.push_back(next);
    if (int(out.size()) < n) l = s.step(next);
  }
  return out;
}

std::string join_ids(const std::vector<int32_t>& ids, const char* sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

void check_forward(const std::string& dir, const std::vector<int32_t>& ids, const std::string& tag) {
  const std::string out = dir + ".logits.f32";
  RunResult r = k3cpp("forward " + q(dir) + " --ids " + join_ids(ids, ",") + " --logits " + q(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string bytes = slurp(out);
  const std::vector<float> want = library_logits(dir, ids);
  ASSERT_EQ(bytes.size(), want.size() * sizeof(float)) << tag;
  std::vector<float> got(want.size());
  std::memcpy(got.data(), bytes.data(), bytes.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << tag << " at " << i;
}

}  // namespace

TEST(CliModel, InitPlainForwardGenerate) {
  ModelTempDir t;
  const std::string dir = t.sub("tiny");
  RunResult r = k3cpp("init " + tiny_json() + " " + q(dir) + " --seed 7");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "2230612 parameters")) << r.out;
  EXPECT_TRUE(fs::exists(dir + "/config.json") && fs::exists(dir + "/model.safetensors") &&
              fs::exists(dir + "/tokenizer.json"));
  r = k3cpp("inspect " + q(dir) + " --summary");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "OK: every tensor present")) << r.out;

  // The same seed gives the same bytes; another seed does not.
  ASSERT_EQ(k3cpp("init " + tiny_json() + " " + q(t.sub("again")) + " --seed 7").rc, 0);
  ASSERT_EQ(k3cpp("init " + tiny_json() + " " + q(t.sub("other")) + " --seed 8").rc, 0);
  EXPECT_EQ(slurp(dir + "/model.safetensors"), slurp(t.sub("again") + "/model.safetensors"));
  EXPECT_NE(slurp(dir + "/model.safetensors"), slurp(t.sub("other") + "/model.safetensors"));

  const std::vector<int32_t> ids = {1, 200, 3, 3, 255, 0, 17, 64, 9};
  check_forward(dir, ids, "tiny plain");

  // Greedy generate --ids prints the library's tokens.
  r = k3cpp("generate " + q(dir) + " --ids " + join_ids(ids, ",") + " --max-tokens 12 --ids-out");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, join_ids(library_greedy(dir, ids, 12), " ") + "\n");
  EXPECT_TRUE(has(r.err, "tok/s")) << r.err;
  // A stop token ends generation before it is printed.
  const std::vector<int32_t> greedy = library_greedy(dir, ids, 12);
  r = k3cpp("generate " + q(dir) + " --ids " + join_ids(ids, ",") + " --max-tokens 12 --ids-out --stop " +
            std::to_string(greedy[2]));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, join_ids(library_greedy(dir, ids, 12, greedy[2]), " ") + "\n");
  // Speculative decoding prints greedy's tokens: drafts from a lookup corpus of greedy's own
  // continuation are all accepted (a plain step, then two passes of 4 drafted tokens at K = 4).
  r = k3cpp("generate " + q(dir) + " --ids " + join_ids(ids, ",") + " --max-tokens 12 --ids-out --speculate 4 --lookup-ids " +
            join_ids(greedy, ","));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, join_ids(greedy, " ") + "\n");
  EXPECT_TRUE(has(r.err, "3 passes for 12 tokens") && has(r.err, "8 of 8 drafted tokens accepted")) << r.err;
  r = k3cpp("generate " + q(dir) + " --ids 1 --ids-out --speculate 2 --lookup-ids 2,256");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "--lookup-ids") && has(r.err, "256") && has(r.err, "vocabulary")) << r.err;
  // Sampling with a seed is reproducible.
  const std::string sample = "generate " + q(dir) + " --ids 5,6 --max-tokens 8 --ids-out --temperature 0.9 --top-k 20 --top-p 0.9 --seed 4";
  r = k3cpp(sample);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, k3cpp(sample).out);

  // A non-empty directory is refused without --force and replaced with it.
  r = k3cpp("init " + tiny_json() + " " + q(dir) + " --seed 8");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, dir) && has(r.err, "--force")) << r.err;
  ASSERT_EQ(k3cpp("init " + tiny_json() + " " + q(dir) + " --seed 8 --force").rc, 0);
  EXPECT_EQ(slurp(dir + "/model.safetensors"), slurp(t.sub("other") + "/model.safetensors"));
}

TEST(CliModel, InitMxfp4ForwardGenerateText) {
  ModelTempDir t;
  const std::string cfg = write_mx_config(t.path), dir = t.sub("mx");
  RunResult r = k3cpp("init " + q(cfg) + " " + q(dir) + " --seed 3 --experts mxfp4 --dtype bf16");
  ASSERT_EQ(r.rc, 0) << r.err;
  r = k3cpp("inspect " + q(dir));
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "experts.0.w2.weight_packed")) << r.out;
  EXPECT_TRUE(has(r.out, "bf16")) << r.out;
  EXPECT_EQ(load_model(dir).weights().expert_storage(), ExpertStorage::Mxfp4);
  check_forward(dir, {104, 101, 108, 108, 111, 257, 259}, "mxfp4");

  // --prompt: byte-encoded, output decoded; the default stop token is <|eos|> (257).
  const std::vector<int32_t> prompt = {104, 105};  // "hi"
  const std::vector<int32_t> want = library_greedy(dir, prompt, 10, 257);
  const Vocabulary tok = Vocabulary::load_dir(dir);
  ASSERT_TRUE(tok.is_bytes());
  r = k3cpp("generate " + q(dir) + " --prompt hi --max-tokens 10");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, tok.decoder().decode(want) + (want.empty() ? "" : "\n"));  // streamed: complete characters
  EXPECT_TRUE(has(r.err, "generate: tokenizer: byte tokenizer")) << r.err;
  r = k3cpp("generate " + q(dir) + " --prompt hi --max-tokens 10 --ids-out");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, join_ids(want, " ") + "\n");

  // tiny.json's expert width 48 cannot be MXFP4: refused with the tensor named.
  r = k3cpp("init " + tiny_json() + " " + q(t.sub("bad")) + " --experts mxfp4");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "w2.weight") && has(r.err, "multiple of 32")) << r.err;
  EXPECT_FALSE(fs::exists(t.sub("bad")));
}

// A model directory with tiktoken.model: --prompt is encoded with it (it wins over the
// tokenizer.json that init wrote), and the output goes through the streaming decoder: with a
// vocabulary of single bytes and an untrained model sampling at temperature 1, many tokens
// are lone UTF-8 lead or continuation bytes, yet stdout is valid UTF-8 and equals the full
// decode of the same ids.
TEST(CliModel, GeneratePromptUsesTheDirsTiktokenAndStreamsWholeCharacters) {
  ModelTempDir t;
  K3Config c = load_config(write_mx_config(t.path));  // 4 layers
  c.vocab_size = 512;
  const std::string cfg = t.sub("cfg.json"), dir = t.sub("m");
  write_text_file_atomic(cfg, config_to_hf_json(c));
  ASSERT_EQ(k3cpp("init " + q(cfg) + " " + q(dir) + " --seed 5").rc, 0);
  BpeRanks bytes;
  for (int b = 0; b < 256; ++b) {
    const char ch = char(b);
    bytes.add(std::string_view(&ch, 1));
  }
  write_tokenizer_dir(dir, bytes);
  const Vocabulary v = Vocabulary::load_dir(dir);
  ASSERT_FALSE(v.is_bytes());
  const std::string gen = "generate " + q(dir) + " --prompt 'h\xc3\xa9llo \xe4\xb8\xad' --max-tokens 40 --temperature 1 --seed 3";
  const RunResult ids = k3cpp(gen + " --ids-out"), text = k3cpp(gen);
  ASSERT_EQ(ids.rc, 0) << ids.err;
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_TRUE(has(text.err, "generate: tokenizer: tiktoken vocabulary")) << text.err;
  EXPECT_TRUE(has(text.err, "prefill 10 tokens")) << text.err;  // h é l l o ' ' 中: 10 byte tokens
  std::vector<int32_t> got;
  std::istringstream in(ids.out);
  for (int32_t id; in >> id;) got.push_back(id);
  ASSERT_FALSE(got.empty());
  int high = 0;
  for (int32_t id : got) high += id >= 0x80 && id < 0x100;
  EXPECT_GT(high, 0) << "no non-ASCII byte sampled: the test does not exercise the decoder";
  EXPECT_EQ(text.out, v.decoder().decode(got) + "\n");
  EXPECT_EQ(utf8::sanitize(text.out), text.out) << "partial UTF-8 printed";

  // Bad vocabularies name the file and field: one id more than the config holds, a corrupt line.
  bytes.add("ab");
  write_tokenizer_dir(dir, bytes);
  RunResult r = k3cpp("generate " + q(dir) + " --prompt hi");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, dir + "/config.json: vocab_size: 512") && has(r.err, "513")) << r.err;
  write_text_file_atomic(dir + "/tiktoken.model", "AA== 0\n@@@ 1\n");
  r = k3cpp("generate " + q(dir) + " --prompt hi");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, dir + "/tiktoken.model") && has(r.err, "line 2")) << r.err;
}

TEST(CliModel, BadInputsFailWithTheCulpritNamed) {
  ModelTempDir t;
  const std::string dir = t.sub("m");
  ASSERT_EQ(k3cpp("init " + tiny_json() + " " + q(dir) + " --seed 1").rc, 0);
  auto expect_fail = [](const std::string& args, const std::vector<std::string>& pieces) {
    RunResult r = k3cpp(args);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line expected: " << r.err;
    for (const std::string& p : pieces) EXPECT_TRUE(has(r.err, p)) << "'" << p << "' not in: " << r.err;
  };
  const std::string missing = t.sub("nowhere");
  expect_fail("forward " + q(missing) + " --ids 1 --logits " + q(t.sub("l")), {missing, "no such model directory"});
  expect_fail("generate " + q(missing) + " --ids 1", {missing});
  fs::create_directory(t.sub("empty"));
  expect_fail("forward " + q(t.sub("empty")) + " --ids 1 --logits " + q(t.sub("l")), {"config.json", "missing"});
  expect_fail("forward " + q(dir) + " --ids 1,300,2 --logits " + q(t.sub("l")),
              {"300", "position 1", "vocabulary [0, 256)", "config.json"});
  expect_fail("forward " + q(dir) + " --ids 1,x --logits " + q(t.sub("l")), {"--ids", "'x'"});
  expect_fail("forward " + q(dir) + " --ids 1", {"--logits"});
  expect_fail("generate " + q(dir) + " --ids 1 --prompt a", {"--ids", "--prompt"});
  expect_fail("generate " + q(dir) + " --ids 1 --top-p 0", {"top-p"});
  expect_fail("generate " + q(dir) + " --prompt hi --kda-path x", {"--kda-path"});
  expect_fail("generate " + q(dir) + " --ids 1 --lookup-ids 2,3", {"--lookup-ids", "--speculate"});
  expect_fail("init " + tiny_json() + " " + q(t.sub("o")) + " --experts fp8", {"--experts", "fp8"});
  expect_fail("init " + q(t.sub("none.json")) + " " + q(t.sub("o")), {"none.json"});
  EXPECT_FALSE(fs::exists(t.sub("l")));
  // An unsupported tokenizer is refused for text, with its type named; ids still work.
  write_text_file_atomic(dir + "/tokenizer.json", R"({"type": "tiktoken", "special_tokens": {}})");
  expect_fail("generate " + q(dir) + " --prompt hi", {"tokenizer.json", "tiktoken", "not supported"});
  RunResult r = k3cpp("generate " + q(dir) + " --ids 1,2 --max-tokens 3 --ids-out");
  EXPECT_EQ(r.rc, 0) << r.err;
  // A damaged checkpoint names the tensor.
  fs::remove(dir + "/tokenizer.json");
  K3Config c = load_config(dir + "/config.json");
  c.num_hidden_layers = 14;
  c.full_attn_layers.push_back(14);
  write_text_file_atomic(dir + "/config.json", config_to_hf_json(c));
  expect_fail("forward " + q(dir) + " --ids 1 --logits " + q(t.sub("l")), {"layers.13.", "missing"});
}
