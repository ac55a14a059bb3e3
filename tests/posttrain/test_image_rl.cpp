// RL on image prompts (posttrain/image_task.h) with the tiny released-layout model and its
// random vision encoder (tests/data/k3-release-tiny: patch 4, 2 x 2 merge, so the rendered
// 16 x 40 "a+b" is 10 image tokens):
//  - a rollout of an image prompt equals the same prompt built and run by hand: the chat
//    conversation rendered, the image rendered by the vision data's renderer, expanded and
//    encoded by infer/image_prompt.h, prefilled through a Session with the splice and decoded
//    token by token with the rollout's documented draws (same tokens, logprobs to 1e-4);
//  - image positions carry no loss: their dlogits rows are exactly zero, the placeholder's
//    embedding row gets exactly zero gradient, and the encoder (frozen) gets none, while the
//    image does reach the loss (its rows' gradient is non-zero);
//  - an image RL run stopped mid-rollout and resumed ends bitwise where the straight run does;
//  - bad configs (an unknown task, problems the renderer cannot draw, no vision encoder).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/fixture.h"
#include "run_helpers.h"
#include "core/error.h"
#include "infer/image_prompt.h"
#include "infer/session.h"
#include "io/chat_render.h"
#include "model/checkpoint.h"
#include "posttrain/image_task.h"
#include "posttrain/policy_update.h"
#include "posttrain/rl.h"
#include "posttrain/sft.h"
#include "posttrain/token_grad.h"

namespace fs = std::filesystem;
using namespace k3;

namespace {

const std::string kDir = test::data_path("k3-release-tiny");
const std::string kFont = "/usr/share/unifont/unifont.hex";

struct Fx {
  ModelDir md = open_model_dir(kDir);
  K3Model model = [this] {
    LoadOptions lo;
    lo.dequantize_experts = true;
    return load_model(md, lo);
  }();
  ChatVocab vocab = load_chat_vocab(md);
  ImageTask task = load_image_task(md, kFont, "test");
};
const Fx& fx() {
  static const Fx f;
  return f;
}

std::string tmp_dir(const std::string& name) { return test::scratch_dir("k3_imgrl_" + name); }
std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  return test::write_text(dir, name, text);
}
using test::file_bytes;

ArithProblem problem(int64_t a, int64_t b) {
  ArithProblem p;
  p.a = a, p.b = b, p.op = '+', p.digits = 2;
  return p;
}

}  // namespace

TEST(ImageRl, RolloutEqualsThePromptRunByHand) {
  const Fx& f = fx();
  const int64_t V = f.model.dims().V;
  const ArithProblem p = problem(47, 85);
  RolloutOptions ro;
  ro.seed = 9;
  // Three trajectories decoded together: the image prompt among two others.
  std::vector<Trajectory> ts;
  ts.push_back(make_image_trajectory(f.task, problem(12, 34), chat::Effort::low, f.vocab, 1));
  ts.push_back(make_image_trajectory(f.task, p, chat::Effort::low, f.vocab, 2));
  ts.push_back(make_trajectory(prompt_conversation(problem(55, 66), chat::Effort::high, false), f.vocab, 3));
  // A second member of p's group: its prefill is the first member's, copied (rollout.cpp).
  ts.push_back(make_image_trajectory(f.task, p, chat::Effort::low, f.vocab, 4));
  for (auto& t : ts) t.budget = 12;
  std::vector<Trajectory*> ptr = {&ts[0], &ts[1], &ts[2], &ts[3]};
  const RolloutStats rs = advance(f.model, f.vocab, ptr, 4, 0, ro);
  EXPECT_EQ(rs.prefills, 3);
  for (const Trajectory* tp : {&ts[1], &ts[3]}) {
  const Trajectory& t = *tp;
  EXPECT_EQ(t.image_tokens, 10);  // 16 x 40 pixels, patch 4, 2 x 2 merge

  // By hand: the conversation, the renderer's image, the shared prompt expansion, a Session.
  chat::Conversation conv;
  chat::Message u;
  u.role = chat::Role::user;
  u.content = {"sum?"};
  u.images = {chat::ImagePart{0, "x.png", "f"}};
  conv.messages = {u};
  conv.options.effort = chat::Effort::low;
  conv.options.add_generation_prompt = true;
  const std::vector<int32_t> ids = f.vocab.encode(chat::render(conv));
  ASSERT_EQ(count_id(ids, f.task.vm.media_id), 1);
  const VisionExample ex = arithmetic_example(f.task.font, 47, 85);
  EXPECT_EQ(ex.answer, "132");
  const ImagePrompt ip = expand_image_prompt(f.task.vm, ids, {&ex.image}, "by hand");
  ASSERT_EQ(t.prompt_len, int64_t(ip.ids.size()));
  for (size_t i = 0; i < ip.ids.size(); ++i) ASSERT_EQ(t.ids[i], ip.ids[i]) << i;
  ASSERT_EQ(t.image_rows, ip.rows);
  Session s(f.model);
  const EmbedSpliceT<float> sp{f.task.vm.media_id, ip.rows.data(), ip.image_tokens, nullptr};
  const float* l = s.prefill(ip.ids.data(), int64_t(ip.ids.size()), &sp);
  std::vector<int32_t> seq = ip.ids;
  int64_t drawn = 0;
  for (size_t k = size_t(t.prompt_len); k < t.ids.size(); ++k) {
    // The rollout's draw for (seed, trajectory id, token index), rollout.cpp.
    const uint64_t r = mix64(mix64(ro.seed) ^ mix64(t.id * 0x100000001b3ull + uint64_t(seq.size())));
    double lp = 0;
    const int32_t tok = draw_token(l, V, double(r >> 11) * 0x1.0p-53, &lp);
    ASSERT_EQ(tok, t.ids[k]) << "token " << k;
    EXPECT_NEAR(lp, double(t.behav_logp[k]), 1e-4) << "token " << k;
    seq.push_back(tok), ++drawn;
    if (k + 1 < t.ids.size()) l = s.step(tok);
  }
  EXPECT_EQ(drawn, t.generated);
  EXPECT_GT(drawn, 0);
  }
  EXPECT_NE(ts[1].ids, ts[3].ids);  // the members drew their own replies
  const std::vector<int32_t> ids = f.vocab.encode(chat::render(image_conversation(prompt_conversation(p, chat::Effort::low, false), p)));
  const VisionExample ex = arithmetic_example(f.task.font, 47, 85);
  const ImagePrompt ip = expand_image_prompt(f.task.vm, ids, {&ex.image}, "by hand");
  const EmbedSpliceT<float> sp{f.task.vm.media_id, ip.rows.data(), ip.image_tokens, nullptr};
  // Zeros in the image's place change the reply's first distribution: the image is read.
  std::vector<float> zeros(ip.rows.size(), 0.f);
  Session z(f.model);
  const EmbedSpliceT<float> spz{f.task.vm.media_id, zeros.data(), ip.image_tokens, nullptr};
  const float* lz = z.prefill(ip.ids.data(), int64_t(ip.ids.size()), &spz);
  Session again(f.model);
  const float* l0 = again.prefill(ip.ids.data(), int64_t(ip.ids.size()), &sp);
  double diff = 0;
  for (int64_t v = 0; v < V; ++v) diff += std::fabs(double(lz[v]) - double(l0[v]));
  EXPECT_GT(diff, 1e-3);
}

TEST(ImageRl, ImagePositionsGetZeroGradient) {
  const Fx& f = fx();
  const int64_t V = f.model.dims().V, d = f.model.dims().d;
  Trajectory t = make_image_trajectory(f.task, problem(38, 27), chat::Effort::low, f.vocab, 5);
  t.budget = 8;
  RolloutOptions ro;
  std::vector<Trajectory*> ptr = {&t};
  advance(f.model, f.vocab, ptr, 1, 0, ro);
  const int64_t T = int64_t(t.ids.size()) - 1;
  // The RL loss's coefficients: loss tokens only (t.gen), as rl.cpp's mask; image positions
  // are prompt positions, never loss tokens.
  for (size_t i = 0; i < t.ids.size(); ++i) {
    if (t.ids[i] == t.media_id) {
      ASSERT_EQ(t.gen[i], 0) << i;
    }
  }
  auto objective = [&](const double* logp, int64_t n, double* c) {
    double l = 0;
    for (int64_t k = 0; k < n; ++k) c[k] = t.gen[size_t(k + 1)] ? -0.3 : 0.0, l -= t.gen[size_t(k + 1)] ? 0.3 * logp[k] : 0.0;
    return l;
  };
  TrainScratch s;
  std::vector<float> g(size_t(f.model.weights().size()), 0.f), drows(t.image_rows.size(), 0.f);
  EmbedSpliceT<float> sp;
  token_objective_backward_t<float>(f.model, t.ids.data(), T, objective, g.data(), s, nullptr, t.splice(sp, drows.data()));
  // dlogits rows at targets that are image tokens or predicted from them are exactly zero.
  for (int64_t k = 0; k < T; ++k) {
    double row = 0;
    for (int64_t v = 0; v < V; ++v) row += std::fabs(double(s.logits[size_t(k * V + v)]));
    if (t.gen[size_t(k + 1)]) EXPECT_GT(row, 0.0) << k;
    else EXPECT_EQ(row, 0.0) << k;
  }
  // The placeholder's embedding row: exactly zero (its positions take the encoder's rows).
  const ParamLayout& lay = f.model.weights().layout();
  bool found = false;
  for (size_t i = 0; i < lay.size(); ++i)
    if (lay.spec(i).component == Component::Embedding) {
      found = true;
      const float* row = g.data() + lay.offset(i) + int64_t(t.media_id) * d;
      for (int64_t k = 0; k < d; ++k) ASSERT_EQ(row[k], 0.f) << k;
    }
  ASSERT_TRUE(found);
  // (Without the splice the placeholders are ordinary embedding rows and that row does get a
  // gradient: the check above can fail.)
  {
    std::vector<float> g0(g.size(), 0.f);
    token_objective_backward_t<float>(f.model, t.ids.data(), T, objective, g0.data(), s);
    for (size_t i = 0; i < lay.size(); ++i)
      if (lay.spec(i).component == Component::Embedding) {
        double n = 0;
        for (int64_t k = 0; k < d; ++k) n += std::fabs(double(g0[size_t(lay.offset(i) + int64_t(t.media_id) * d + k)]));
        EXPECT_GT(n, 0.0);
      }
  }
  // The image reaches the loss: the rows' gradient is non-zero (and dropped: the encoder is
  // frozen, no parameter of it exists in g).
  double dn = 0;
  for (float x : drows) dn += double(x) * double(x);
  EXPECT_GT(dn, 0.0);
  EXPECT_EQ(int64_t(g.size()), f.model.weights().size());
  // Without the caller's drows the same parameter gradient comes out (the buffer is internal).
  std::vector<float> g2(g.size(), 0.f);
  token_objective_backward_t<float>(f.model, t.ids.data(), T, objective, g2.data(), s, nullptr, t.splice(sp));
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], g2[i]) << i;
}

// The RL resume test of test_runs.cpp on image prompts: lambda 0.5, stopped after step 1 with
// image trajectories mid-decode, resumed: bitwise the run that never stopped (the image rows
// recomputed from the problems, the encoder in the checkpoint).
TEST(ImageRl, ResumeOfAnImageRunIsExact) {
  const std::string d = tmp_dir("resume");
  const std::string rl = R"({"model": ")" + kDir + R"(", "task": "image_arithmetic",
    "arithmetic": {"problems": 50, "efforts": ["low", "high"]},
    "eval": {"problems": 2, "efforts": ["low"], "seed": 3}, "eval_every": 3, "eval_samples": 2,
    "steps": 3, "prompts_per_step": 3, "group_size": 4, "budgets": {"low": 30, "high": 40, "max": 40},
    "lambda": 0.5, "checkpoint_every": 1, "lr": 1e-3, "threads": 1, "kl_coef": 0.05, "format_penalty": 0.7, "seed": 4})";
  const RLConfig c = load_rl_config(write(d, "rl.json", rl));
  RLOptions o = test::run_whole_then_stop_after_step_1(c, d);
  // The checkpoint is a vision model directory (the frozen encoder, its vision_config).
  EXPECT_EQ(file_bytes(d + "/split/checkpoint/vision.safetensors"), file_bytes(d + "/whole/checkpoint/vision.safetensors"));
  EXPECT_NO_THROW(load_vision_model(d + "/split/checkpoint", open_model_dir(d + "/split/checkpoint").config, "ckpt"));
  EXPECT_EQ(run_rl(c, o).steps, 3);
  auto records = [](const std::string& path, const char* type) {
    std::vector<std::string> out;
    std::ifstream m(path);
    for (std::string line; std::getline(m, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j["type"] != type) continue;
      for (const char* k : {"seconds", "rollout_seconds", "update_seconds"}) j.erase(k);
      out.push_back(j.dump());
    }
    return out;
  };
  const auto whole = records(d + "/whole/metrics.jsonl", "step"), split = records(d + "/split/metrics.jsonl", "step");
  ASSERT_EQ(whole.size(), 3u);
  EXPECT_EQ(whole, split);
  EXPECT_EQ(records(d + "/whole/metrics.jsonl", "eval"), records(d + "/split/metrics.jsonl", "eval"));
  int64_t kept = 0, stale = 0;
  for (const std::string& w : whole) {
    const nlohmann::json j = nlohmann::json::parse(w);
    kept += j["kept"].get<int64_t>(), stale += j["stale_tokens"].get<int64_t>();
  }
  EXPECT_GT(kept, 0);   // the weights moved
  EXPECT_GT(stale, 0);  // restored image trajectories were continued and trained on
  EXPECT_EQ(file_bytes(d + "/whole/checkpoint/model.safetensors"), file_bytes(d + "/split/checkpoint/model.safetensors"));
  EXPECT_EQ(file_bytes(d + "/whole/checkpoint/optimizer.bin"), file_bytes(d + "/split/checkpoint/optimizer.bin"));
  EXPECT_EQ(file_bytes(d + "/whole/checkpoint/rollouts.json"), file_bytes(d + "/split/checkpoint/rollouts.json"));
  // The held-out split never meets the training split.
  for (int64_t i = 0; i < 200; ++i) {
    const ArithItem tr = image_arith_item(c.train, i, false), ev = image_arith_item(*c.eval, i, true);
    ASSERT_FALSE(image_pair_heldout(tr.problem.a, tr.problem.b));
    ASSERT_TRUE(image_pair_heldout(ev.problem.a, ev.problem.b));
    ASSERT_TRUE(tr.problem.a >= 10 && tr.problem.a <= 99 && tr.problem.b >= 10 && tr.problem.b <= 99);
  }
  fs::remove_all(d);
}

TEST(ImageRl, SftOnImagesMasksTheImageAndSavesTheEncoder) {
  const Fx& f = fx();
  const ChatSequence q = image_sft_sequence(f.task, problem(47, 85), chat::Effort::low, f.vocab, "test");
  ASSERT_EQ(q.image_tokens, 10);
  ASSERT_EQ(q.ids.size(), q.loss.size());
  int64_t media = 0;
  for (size_t i = 0; i < q.ids.size(); ++i) {
    if (q.ids[i] != q.media_id) continue;
    ++media;
    EXPECT_EQ(q.loss[i], 0) << i;
  }
  EXPECT_EQ(media, 10);
  // The trained tokens are the reply "132" and its end: the text task's.
  const ChatSequence text = tokenize_conversation(sft_conversation(problem(47, 85), chat::Effort::low, false), f.vocab, "t");
  EXPECT_EQ(q.trained(), text.trained());
  const std::string d = tmp_dir("sft");
  const SFTConfig c = load_sft_config(write(d, "sft.json", R"({"model": ")" + kDir + R"(", "task": "image_arithmetic",
    "arithmetic": {"problems": 6, "efforts": ["low"]}, "steps": 2, "batch": 2, "threads": 1})"));
  SFTOptions o;
  o.quiet = true;
  o.out_dir = d + "/out";
  EXPECT_TRUE(std::isfinite(run_sft(c, o).last_loss));
  EXPECT_NO_THROW(load_vision_model(d + "/out/checkpoint", open_model_dir(d + "/out/checkpoint").config, "ckpt"));
  fs::remove_all(d);
}

TEST(ImageRl, BadConfigsAreOneClearError) {
  const std::string d = tmp_dir("bad");
  auto err = [&](const std::string& text, bool rl) { return test::posttrain_config_error(d, text, rl); };
  auto has = [](const std::string& msg, const std::string& what) {
    return msg.find(what) != std::string::npos ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << msg;
  };
  EXPECT_TRUE(has(err(R"({"model": "x", "task": "images", "arithmetic": {}})", true), "c.json: task: 'images' is not a task"));
  EXPECT_TRUE(has(err(R"({"model": "x", "task": "images", "arithmetic": {}})", false), "c.json: task"));
  EXPECT_TRUE(has(err(R"({"model": "x", "task": "image_arithmetic", "arithmetic": {"digits": [3]}})", true),
                  "c.json: arithmetic.digits: must be [2]"));
  EXPECT_TRUE(has(err(R"({"model": "x", "task": "image_arithmetic", "arithmetic": {"ops": "*"}})", true), "arithmetic.ops"));
  EXPECT_TRUE(has(err(R"({"model": "x", "task": "image_arithmetic", "arithmetic": {"bands": ["2+", "3+"]}})", true),
                  "arithmetic.bands[1]"));
  EXPECT_TRUE(has(err(R"({"model": "x", "task": "image_arithmetic", "arithmetic": {}, "eval": {"tool_share": 0.5}})", true),
                  "eval.tool_share"));
  EXPECT_TRUE(has(err(R"({"model": "x", "arithmetic": {}, "unifont": "u.hex"})", true), "c.json: unifont"));
  EXPECT_TRUE(has(err(R"({"model": "x", "task": "image_arithmetic", "data": "d.jsonl"})", false), "c.json: arithmetic"));
  // The defaults become the renderer's problems.
  {
    const RLConfig c = load_rl_config(write(d, "ok.json", R"({"model": "x", "task": "image_arithmetic", "arithmetic": {}})"));
    EXPECT_EQ(c.train.digits, std::vector<int>{2});
    EXPECT_EQ(c.train.ops, "+");
    EXPECT_EQ(c.unifont, "/usr/share/unifont/unifont.hex");
  }
  // An image task on a model without a vision encoder: the config's task field and the
  // model's config.json named; the run refuses before anything is written.
  const std::string nov = d + "/novision";
  fs::create_directories(nov);
  for (const auto& e : fs::directory_iterator(kDir)) fs::copy(e.path(), nov / e.path().filename());
  {
    nlohmann::json cj = nlohmann::json::parse(file_bytes(kDir + "/config.json"));
    cj.erase("vision_config");
    write(nov, "config.json", cj.dump());
  }
  const RLConfig c = load_rl_config(write(d, "rl.json", R"({"model": ")" + nov + R"(", "task": "image_arithmetic",
    "arithmetic": {}, "steps": 1})"));
  RLOptions o;
  o.quiet = true;
  o.out_dir = d + "/out";
  try {
    run_rl(c, o);
    ADD_FAILURE() << "an image task ran on a model without a vision encoder";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "rl.json: task: image_arithmetic needs a model with a vision encoder"));
    EXPECT_TRUE(has(e.what(), "config.json has no vision_config"));
  }
  EXPECT_FALSE(fs::exists(d + "/out/checkpoint"));
  // A missing font names the file.
  EXPECT_THROW(load_image_task(open_model_dir(kDir), d + "/missing.hex", "rl.json"), Error);
  fs::remove_all(d);
}
