// The training run's vocabulary (train/run_config.h TokenizerConfig, train/trainer.h):
//  - by default a BPE vocabulary is learnt from the training documents only (a letter that
//    appears only in held-out documents is in no merged token), saved as OUT/tokenizer,
//    the corpus is tokenised with it (the held-out stream is each held-out document's
//    encoding between [BOS] and [EOS]) and the checkpoint carries a copy (a model directory);
//  - held-out bits per byte divides by the bytes the target tokens decode to, not by the
//    number of targets or of ids < 256;
//  - a resumed run uses the checkpoint's vocabulary (OUT/tokenizer may be gone) and equals
//    the run that never stopped, bit for bit; a corrupted copy is refused naming the file;
//  - bad input names the file and field: a model vocab_size too small for a trained
//    vocabulary or for the one asked for, a missing or corrupt tiktoken directory.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "model/checkpoint.h"
#include "train/data.h"
#include "train/model_grad.h"
#include "train/run_config.h"
#include "train/trainer.h"
#include "test_trainer_util.h"

namespace fs = std::filesystem;
using namespace k3;
using namespace k3::test;

namespace {

// The synthetic corpus with its held-out documents (20, 60, 100 of 120 at heldout_every 40)
// replaced by text full of 'z', a letter no training document has.
std::string corpus_with_z_heldout() {
  const std::string base = synthetic_corpus();
  std::vector<std::string> docs;
  size_t start = 0;
  while (start <= base.size()) {
    size_t ff = base.find('\f', start);
    if (ff == std::string::npos) ff = base.size();
    docs.push_back(base.substr(start, ff - start));
    start = ff + 1;
  }
  EXPECT_EQ(docs.size(), 120u);
  for (size_t d : {20, 60, 100}) {
    std::string t = "Chapter " + std::to_string(d + 1) + "\n";
    for (int v = 0; v < 12; ++v) t += "  " + std::to_string(v + 1) + " the zebra quizzed the lazy zealot of the land.\n";
    docs[d] = t;
  }
  std::string out;
  for (size_t d = 0; d < docs.size(); ++d) out += (d ? "\f" : "") + docs[d];
  return out;
}

nlohmann::json default_tokenizer_run() {
  nlohmann::json r = tiny_run();
  r.erase("tokenizer");
  return r;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

}  // namespace

TEST(TrainerVocab, DefaultLearnsFromTrainSplitSavesAndTokenizesWithIt) {
  TrainTempDir t;
  write_text(t.sub("corpus.txt"), corpus_with_z_heldout());
  const std::string run = write_run_files(t.path, default_tokenizer_run(), "run.json", 560);
  TrainOptions o;
  o.out_dir = t.sub("out");
  o.quiet = true;
  o.stop_at_step = 2;
  Trainer tr(load_run_config(run), o);
  const Vocabulary& v = tr.tokenizer();
  ASSERT_FALSE(v.is_bytes());
  EXPECT_EQ(v.vocab_size(), 560);  // the model config's vocab_size: 304 base tokens + 256 specials
  EXPECT_EQ(v.decoder().base_size(), 304);
  EXPECT_EQ(v.bos(), 304);
  EXPECT_EQ(v.eos(), 305);
  // Saved in the output directory, and what the run uses is what was saved.
  EXPECT_EQ(Vocabulary::load_tiktoken_dir(t.sub("out/tokenizer")).identity(), v.identity());
  // Learnt from the training documents only.
  for (int32_t id = 256; id < v.decoder().base_size(); ++id)
    EXPECT_FALSE(has(std::string(v.decoder().token_bytes(id)), "z")) << "token " << id << " holds held-out text";

  // The corpus is tokenised with it: the held-out stream is [BOS] doc [EOS] per held-out document.
  const Corpus c = load_corpus(t.sub("corpus.txt"));
  const CorpusSplit sp = split_and_tokenize(c, v, 40);
  std::vector<int32_t> want;
  for (size_t d : {20, 60, 100}) {
    want.push_back(v.bos());
    for (int32_t id : v.encode(c.documents[d])) want.push_back(id);
    want.push_back(v.eos());
  }
  EXPECT_EQ(sp.heldout, want);
  int64_t train_bytes = 0;
  for (size_t d = 0; d < c.documents.size(); ++d)
    if (d % 40 != 20) train_bytes += int64_t(c.documents[d].size());
  EXPECT_LT(double(sp.train.size()), 0.6 * double(train_bytes)) << "the merges should compress the training text";

  // Bits per byte over the bytes the targets decode to.
  const EvalResult e = tr.evaluate(32, 200);  // 7 windows of 32 targets
  ASSERT_EQ(e.targets, 7 * 32);
  auto s = make_train_scratch();
  double nats = 0;
  int64_t bytes = 0;
  for (int w = 0; w < 7; ++w) {
    nats += eval_loss_sum(tr.model(), sp.heldout.data() + w * 32, 32, *s);
    std::vector<int32_t> targets;
    for (int i = 1; i <= 32; ++i)
      if (!v.decoder().is_special(sp.heldout[size_t(w * 32 + i)])) targets.push_back(sp.heldout[size_t(w * 32 + i)]);
    bytes += int64_t(v.decode_bytes(targets).size());
  }
  EXPECT_EQ(e.bytes, bytes);
  EXPECT_GT(e.bytes, e.targets);
  EXPECT_NEAR(e.bpb, nats / std::log(2.0) / double(bytes), 1e-4 * e.bpb);

  // The checkpoint is a model directory with the vocabulary beside config.json and weights.
  tr.run();
  const std::string ck = t.sub("out/checkpoint");
  for (const char* f : {"tiktoken.model", "tokenizer_config.json"})
    EXPECT_EQ(read_text(ck + "/" + f), read_text(t.sub("out/tokenizer/") + f)) << f;
  EXPECT_FALSE(fs::exists(ck + "/tokenizer.json"));
  EXPECT_EQ(Vocabulary::load_dir(ck).identity(), v.identity());
  EXPECT_EQ(open_model_dir(ck).config.vocab_size, 560);
}

TEST(TrainerVocab, ResumeUsesTheSavedVocabularyExactly) {
  TrainTempDir t;
  nlohmann::json r = default_tokenizer_run();
  r["stages"] = nlohmann::json::parse(R"([
      {"name": "s1", "seq_len": 32, "tokens": 1024, "lr_peak": 0.01, "warmup_steps": 1},
      {"name": "s2", "seq_len": 64, "tokens": 512, "lr_peak": 0.01, "lr_end": 0.002, "decay_frac": 1.0}])");
  const std::string run = write_run_files(t.path, r, "run.json", 600);
  const TrainResult a = train_run(run, t.sub("a"), false);
  ASSERT_TRUE(a.complete);
  ASSERT_EQ(a.steps, 6);
  ASSERT_EQ(train_run(run, t.sub("b"), false, 3).steps, 3);
  fs::remove_all(t.sub("b/tokenizer"));  // the checkpoint's copy is the run's vocabulary
  const TrainResult b = train_run(run, t.sub("b"), true);
  ASSERT_TRUE(b.complete);
  EXPECT_TRUE(read_text(t.sub("a/checkpoint/model.safetensors")) == read_text(t.sub("b/checkpoint/model.safetensors")));
  EXPECT_EQ(read_text(t.sub("a/checkpoint/tiktoken.model")), read_text(t.sub("b/checkpoint/tiktoken.model")));
  const auto la = step_losses(t.sub("a/metrics.jsonl")), lb = step_losses(t.sub("b/metrics.jsonl"));
  ASSERT_EQ(la.size(), 6u);
  EXPECT_EQ(la, lb);
  for (size_t s = 0; s < 2; ++s) EXPECT_EQ(a.stages[s].eval_bpb, b.stages[s].eval_bpb);

  // A corrupted vocabulary in the checkpoint is refused, naming the file and line.
  ASSERT_EQ(train_run(run, t.sub("c"), false, 3).steps, 3);
  const std::string tm = t.sub("c/checkpoint/tiktoken.model");
  write_text(tm, read_text(tm) + "not-base64!! 600\n");
  const std::string e = error_of([&] { train_run(run, t.sub("c"), true); });
  EXPECT_TRUE(has(e, "tiktoken.model") && has(e, "line")) << e;
  // A run file that switches to the byte tokenizer does not resume a trained-vocabulary run.
  nlohmann::json rb = r;
  rb["tokenizer"] = "bytes";
  const std::string run_b = write_run_files(t.path, rb, "run-bytes.json", 600);
  const std::string eb = error_of([&] { train_run(run_b, t.sub("b"), true); });
  EXPECT_TRUE(has(eb, "tokenizer")) << eb;
}

TEST(TrainerVocab, BadVocabularyInputNamesFileAndField) {
  TrainTempDir t;
  TrainOptions o;
  o.quiet = true;
  // A model config too small for any trained vocabulary.
  std::string run = write_run_files(t.path, default_tokenizer_run(), "run.json", 260);
  o.out_dir = t.sub("o1");
  std::string e = error_of([&] { Trainer tr(load_run_config(run), o); });
  EXPECT_TRUE(has(e, t.sub("model.json") + ": vocab_size: 260") && has(e, "\"bytes\"")) << e;
  // A vocabulary asked for that the model cannot hold.
  nlohmann::json r = default_tokenizer_run();
  r["tokenizer"] = {{"kind", "train"}, {"vocab_size", 1024}};
  run = write_run_files(t.path, r, "run.json", 640);
  e = error_of([&] { Trainer tr(load_run_config(run), o); });
  EXPECT_TRUE(has(e, t.sub("model.json") + ": vocab_size: 640") && has(e, "tokenizer.vocab_size")) << e;
  // A tiktoken directory that is missing, or holds a corrupt file, or a vocabulary too big.
  r["tokenizer"] = {{"kind", "tiktoken"}, {"dir", "vocab"}};
  run = write_run_files(t.path, r, "run.json", 640);
  e = error_of([&] { Trainer tr(load_run_config(run), o); });
  EXPECT_TRUE(has(e, t.sub("vocab"))) << e;
  fs::create_directories(t.sub("vocab"));
  write_text(t.sub("vocab/tiktoken.model"), "YQ== 0\nYg== 5\n");
  e = error_of([&] { Trainer tr(load_run_config(run), o); });
  EXPECT_TRUE(has(e, t.sub("vocab/tiktoken.model")) && has(e, "line 2")) << e;
  // A valid directory (trained by a default run; the small corpus runs out of pairs at 585
  // ids) used by another run: too big for a 560-id model, then fitting a 640-id one.
  nlohmann::json d = default_tokenizer_run();
  const std::string run_d = write_run_files(t.path, d, "run-default.json", 640);
  o.out_dir = t.sub("trained");
  o.stop_at_step = 0;
  {
    Trainer tr(load_run_config(run_d), o);
    tr.run();
  }
  r["tokenizer"] = {{"kind", "tiktoken"}, {"dir", "trained/tokenizer"}};
  run = write_run_files(t.path, r, "run.json", 560);
  o.out_dir = t.sub("o2");
  e = error_of([&] { Trainer tr(load_run_config(run), o); });
  EXPECT_TRUE(has(e, t.sub("model.json") + ": vocab_size: 560") && has(e, "585 ids")) << e;
  run = write_run_files(t.path, r, "run.json", 640);
  Trainer ok(load_run_config(run), o);
  EXPECT_EQ(ok.tokenizer().identity(), Vocabulary::load_tiktoken_dir(t.sub("trained/tokenizer")).identity());
}
