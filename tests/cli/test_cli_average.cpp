// `k3cpp average`, run as the built binary: the average of two initialisations is a model
// directory with the inputs' vocabulary files that runs and computes logits unlike either
// input's; weights are normalised (1,3 and 0.5,1.5 write the same bytes); averaging a model
// with itself gives its logits exactly; bad
// arguments and differing vocabularies fail with one clear line and leave no directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/cli_run.h"
#include "common/random_model.h"
#include "io/atomic_file.h"
#include "io/config.h"

using namespace k3;
using k3::test::RunResult;
using k3::test::slurp;

namespace {

using k3::test::q;
using k3::test::k3cpp;
using k3::test::has;

// Two initialisations of configs/tiny.json (4 layers) with seeds 1 and 2 under t.
void init_pair(const k3::test::TempDir& t) {
  K3Config c = k3::test::four_layer_config();
  c.vocab_size = 260;
  write_text_file_atomic(t.sub("cfg.json"), config_to_hf_json(c));
  ASSERT_EQ(k3cpp("init " + q(t.sub("cfg.json")) + " " + q(t.sub("a")) + " --seed 1").rc, 0);
  ASSERT_EQ(k3cpp("init " + q(t.sub("cfg.json")) + " " + q(t.sub("b")) + " --seed 2").rc, 0);
}

}  // namespace

TEST(CliAverage, WritesARunnableDeterministicModelWithTheVocabulary) {
  k3::test::TempDir t("k3_cli_average");
  init_pair(t);
  const std::string a = t.sub("a"), b = t.sub("b");
  RunResult r = k3cpp("average " + q(a) + " " + q(b) + " --out " + q(t.sub("ab")) + " --weights 1,3");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "the average of 2 models (weights 0.25, 0.75")) << r.out;
  EXPECT_EQ(slurp(a + "/tokenizer.json"), slurp(t.sub("ab/tokenizer.json")));
  r = k3cpp("average " + q(a) + " " + q(b) + " --out " + q(t.sub("ab2")) + " --weights 0.5,1.5");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(t.sub("ab/model.safetensors")), slurp(t.sub("ab2/model.safetensors")));  // normalised alike

  const std::string ids = " --ids 1,7,42,100,3,9 --logits ";
  for (const char* m : {"a", "b", "ab"}) ASSERT_EQ(k3cpp("forward " + q(t.sub(m)) + ids + q(t.sub(std::string(m) + ".f32"))).rc, 0);
  EXPECT_NE(slurp(t.sub("ab.f32")), slurp(t.sub("a.f32")));
  EXPECT_NE(slurp(t.sub("ab.f32")), slurp(t.sub("b.f32")));

  r = k3cpp("average " + q(a) + " " + q(a) + " " + q(a) + " --out " + q(t.sub("aaa")));
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(k3cpp("forward " + q(t.sub("aaa")) + ids + q(t.sub("aaa.f32"))).rc, 0);
  EXPECT_EQ(slurp(t.sub("aaa.f32")), slurp(t.sub("a.f32")));
}

TEST(CliAverage, BadArgumentsFailClearlyAndWriteNothing) {
  k3::test::TempDir t("k3_cli_average_bad");
  init_pair(t);
  const std::string a = t.sub("a"), b = t.sub("b"), o = t.sub("o");
  auto fails_with = [&](const std::string& args, const std::string& part) {
    const RunResult r = k3cpp("average " + args);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_TRUE(has(r.err, part)) << args << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(o)) << args;
  };
  fails_with(q(a) + " --out " + q(o), "at least two model directories");
  fails_with(q(a) + " " + q(b), "--out");
  fails_with(q(a) + " " + q(b) + " --out " + q(o) + " --weights 1", "1 weight(s) for 2 models");
  fails_with(q(a) + " " + q(b) + " --out " + q(o) + " --weights 1,x", "entry 2 'x'");
  fails_with(q(a) + " " + q(t.sub("missing")) + " --out " + q(o), "missing");
  {
    const RunResult r = k3cpp("average " + q(a) + " " + q(b) + " --out " + q(a));
    EXPECT_NE(r.rc, 0);
    EXPECT_TRUE(has(r.err, "is one of the models being averaged")) << r.err;
  }
  // Another vocabulary: refused, naming both files.
  write_text_file_atomic(b + "/tokenizer.json", slurp(b + "/tokenizer.json") + " ");
  fails_with(q(a) + " " + q(b) + " --out " + q(o), b + "/tokenizer.json: differs from " + a + "/tokenizer.json");
  std::filesystem::remove(b + "/tokenizer.json");
  fails_with(q(a) + " " + q(b) + " --out " + q(o), "missing from " + b);

  // A non-empty output directory is kept unless --force.
  std::filesystem::create_directories(t.sub("full"));
  write_text_file_atomic(t.sub("full/keep.txt"), "x");
  const RunResult r = k3cpp("average " + q(a) + " " + q(a) + " --out " + q(t.sub("full")));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "--force")) << r.err;
  EXPECT_EQ(slurp(t.sub("full/keep.txt")), "x");
  ASSERT_EQ(k3cpp("average " + q(a) + " " + q(a) + " --out " + q(t.sub("full")) + " --force").rc, 0);
  EXPECT_FALSE(std::filesystem::exists(t.sub("full/keep.txt")));
  EXPECT_TRUE(std::filesystem::exists(t.sub("full/model.safetensors")));
}
