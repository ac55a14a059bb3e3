// The training run's parts (train/trainer.h, train/trainer_internal.h, train/train_state.h,
// train/metrics.h):
//  - optimizer_params: Muon per head for KDA q/k/v and MLA q_b/kv_b, per matrix for the
//    other matrices and each routed expert; AdamW for embedding, lm_head, router, conv taps
//    and 1-D parameters, no decay on the 1-D ones; the router bias is no parameter;
//  - ShardedOptimizer (parallel) equals one Optimizer (the plain reference) bit for bit,
//    including its state layout;
//  - the training state round-trips, and fingerprints name the first differing field;
//  - the held-out evaluation equals model_grad's eval_loss_sum over the same windows;
//  - every balancer trains (finite losses, MaxVio logged; QB and sign move the router bias,
//    none and aux leave it at zero), the logged learning rate follows the stage segments,
//    the loss falls, and the metrics file holds the documented records.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "train/data.h"
#include "train/metrics.h"
#include "train/model_grad.h"
#include "train/run_config.h"
#include "train/train_state.h"
#include "train/trainer.h"
#include "train/trainer_internal.h"
#include "common/fixture.h"
#include "test_trainer_util.h"

using namespace k3;
using namespace k3::test;

namespace {

K3Config tiny_config() { return parse_config(tiny_model_json(), "tiny"); }

const ParamRef* find_ref(const std::vector<ParamRef>& refs, const std::string& suffix) {
  for (auto& r : refs)
    if (r.name.size() >= suffix.size() && r.name.compare(r.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return &r;
  return nullptr;
}

std::vector<nlohmann::json> records(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_text(path));
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TrainResult train_quiet(const std::string& run_path, const std::string& out) {
  TrainOptions o;
  o.out_dir = out;
  o.quiet = true;
  Trainer t(load_run_config(run_path), o);
  return t.run();
}

}  // namespace

TEST(TrainerParams, MuonPerHeadAndAdamWAssignment) {
  InitOptions io;
  WeightStore w = init_weights(tiny_config(), io);
  std::vector<float> g(size_t(w.size()), 0.0f);
  const auto refs = optimizer_params(w, g.data(), true);
  const std::string L0 = "layers.0.self_attn.", L3 = "layers.3.self_attn.", M1 = "layers.1.block_sparse_moe.";
  struct Want {
    std::string suffix;
    OptKind kind;
    int64_t heads;
    bool decay;
  };
  const std::vector<Want> wants = {
      {"embed_tokens.weight", OptKind::AdamW, 1, true},
      {"lm_head.weight", OptKind::AdamW, 1, true},
      {L0 + "q_proj.weight", OptKind::Muon, 2, true},
      {L0 + "k_proj.weight", OptKind::Muon, 2, true},
      {L0 + "v_proj.weight", OptKind::Muon, 2, true},
      {L0 + "g_proj.weight", OptKind::Muon, 1, true},
      {L0 + "o_proj.weight", OptKind::Muon, 1, true},
      {L0 + "f_a_proj.weight", OptKind::Muon, 1, true},
      {L0 + "q_conv1d.weight", OptKind::AdamW, 1, true},
      {L0 + "A_log", OptKind::AdamW, 1, false},
      {L0 + "dt_bias", OptKind::AdamW, 1, false},
      {L0 + "o_norm.weight", OptKind::AdamW, 1, false},
      {L3 + "q_a_proj.weight", OptKind::Muon, 1, true},
      {L3 + "q_b_proj.weight", OptKind::Muon, 2, true},
      {L3 + "kv_b_proj.weight", OptKind::Muon, 2, true},
      {L3 + "kv_a_proj_with_mqa.weight", OptKind::Muon, 1, true},
      {L3 + "q_a_layernorm.weight", OptKind::AdamW, 1, false},
      {"layers.0.mlp.gate_proj.weight", OptKind::Muon, 1, true},
      {M1 + "gate.weight", OptKind::AdamW, 1, true},
      {M1 + "routed_expert_down_proj.weight", OptKind::Muon, 1, true},
      {M1 + "routed_expert_norm.weight", OptKind::AdamW, 1, false},
      {M1 + "shared_experts.down_proj.weight", OptKind::Muon, 1, true},
      {M1 + "experts.5.w2.weight", OptKind::Muon, 1, true},
      {"layers.2.self_attention_res_proj.weight", OptKind::AdamW, 1, false},
      {"layers.2.input_layernorm.weight", OptKind::AdamW, 1, false},
      {"model.norm.weight", OptKind::AdamW, 1, false},
  };
  for (const Want& x : wants) {
    const ParamRef* r = find_ref(refs, x.suffix);
    ASSERT_NE(r, nullptr) << x.suffix;
    EXPECT_EQ(r->kind, x.kind) << x.suffix;
    EXPECT_EQ(r->heads, x.heads) << x.suffix;
    EXPECT_EQ(r->decay, x.decay) << x.suffix;
    EXPECT_EQ(r->rows * r->cols, shape_numel(w.layout().spec(w.layout().index(r->name)).shape)) << x.suffix;
    EXPECT_EQ(r->g - g.data(), r->w - w.data()) << x.suffix;  // same offset in both buffers
  }
  EXPECT_EQ(find_ref(refs, "e_score_correction_bias"), nullptr);
  EXPECT_EQ(refs.size(), w.layout().size() - 3);  // three MoE layers' biases left out
  for (const ParamRef& r : optimizer_params(w, g.data(), false)) EXPECT_EQ(r.kind, OptKind::AdamW) << r.name;
}

TEST(TrainerParams, ShardedOptimizerEqualsOneOptimizer) {
  InitOptions io;
  io.seed = 3;
  WeightStore wa = init_weights(tiny_config(), io), wb = init_weights(tiny_config(), io);
  std::vector<float> ga(size_t(wa.size())), gb;
  uint64_t s = 99;
  for (float& x : ga) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = float(int32_t(s >> 40) % 1000) * 1e-4f;
  }
  gb = ga;
  OptimizerOptions oo;
  Optimizer one(optimizer_params(wa, ga.data(), true), oo);
  ShardedOptimizer many(optimizer_params(wb, gb.data(), true), oo, 7);
  EXPECT_GT(many.shards(), 1u);
  for (int step = 0; step < 3; ++step) {
    one.step(0.01);
    many.step(0.01);
  }
  EXPECT_EQ(0, std::memcmp(wa.data(), wb.data(), sizeof(float) * size_t(wa.size())));
  std::vector<float> st;
  many.get_state(st);
  EXPECT_TRUE(st == one.state());
  EXPECT_EQ(many.steps(), 3);
  // set_state restores the same layout.
  ShardedOptimizer again(optimizer_params(wb, gb.data(), true), oo, 3);
  again.set_state(st);
  std::vector<float> st2;
  again.get_state(st2);
  EXPECT_TRUE(st2 == st);
}

TEST(TrainerParams, ShardedOptimizerLrScalePerParameter) {
  // Router gates at lr scale 0 stay put; every other parameter steps exactly as in one
  // Optimizer over all parameters (updates are per parameter).
  InitOptions io;
  io.seed = 4;
  WeightStore wa = init_weights(tiny_config(), io), wb = init_weights(tiny_config(), io);
  std::vector<float> ga(size_t(wa.size()), 0.01f), gb = ga;
  OptimizerOptions oo;
  Optimizer one(optimizer_params(wa, ga.data(), true), oo);
  auto refs = optimizer_params(wb, gb.data(), true);
  std::vector<double> scale;
  for (auto& r : refs) scale.push_back(r.name.find("block_sparse_moe.gate.weight") != std::string::npos ? 0.0 : 1.0);
  ShardedOptimizer many(refs, oo, 2, scale);
  EXPECT_GE(many.shards(), 7u);  // cut at each of the 3 routers, both sides
  one.step(0.02);
  many.step(0.02);
  const ParamLayout& lay = wa.layout();
  const WeightStore w0 = init_weights(tiny_config(), io);
  for (size_t i = 0; i < lay.size(); ++i) {
    const std::string& n = lay.spec(i).name;
    const int64_t cnt = lay.spec(i).numel();
    const bool router = n.find("block_sparse_moe.gate.weight") != std::string::npos;
    if (router) {
      EXPECT_EQ(0, std::memcmp(wb.param(i), w0.param(i), sizeof(float) * size_t(cnt))) << n;
    } else {
      EXPECT_EQ(0, std::memcmp(wa.param(i), wb.param(i), sizeof(float) * size_t(cnt))) << n;
    }
  }
}

TEST(TrainState, RoundTripAndFingerprint) {
  TrainTempDir t;
  TrainState st;
  st.step = 12, st.stage = 1, st.stage_step = 2, st.data_epoch = 3, st.data_cursor = 44, st.tokens_seen = 999;
  st.optimizer_steps = 12, st.train_seconds = 1.5, st.seed = 18446744073709551615ull;
  st.run_json = R"({"a":1,"stages":[{"tokens":5}]})";
  st.model_json = R"({"text_config":{"hidden_size":32}})";
  st.corpus_hash = "abc";
  st.weights_hash = "def";
  StageSummary ss;
  ss.name = "s1", ss.seq_len = 32, ss.steps = 6, ss.evaluated = true, ss.eval_bpb = 2.5, ss.eval_maxvio = {0.5, 1.0};
  st.stages = {ss};
  const std::vector<float> moments = {1, 2, 3, 4, 5, 6};
  save_train_state(t.sub("ts.safetensors"), st, moments);
  std::vector<float> back;
  const TrainState r = load_train_state(t.sub("ts.safetensors"), back, 6);
  EXPECT_TRUE(back == moments);
  EXPECT_EQ(r.step, 12);
  EXPECT_EQ(r.stage_step, 2);
  EXPECT_EQ(r.data_cursor, 44);
  EXPECT_EQ(r.seed, st.seed);
  ASSERT_EQ(r.stages.size(), 1u);
  EXPECT_EQ(r.stages[0].eval_maxvio, ss.eval_maxvio);
  EXPECT_EQ(compare_fingerprint(r, st.run_json, st.model_json, "abc"), "");
  EXPECT_NE(compare_fingerprint(r, R"({"a":1,"stages":[{"tokens":6}]})", st.model_json, "abc").find("'stages[0].tokens' is 5"),
            std::string::npos);
  EXPECT_NE(compare_fingerprint(r, st.run_json, R"({"text_config":{"hidden_size":64}})", "abc")
                .find("model config field 'text_config.hidden_size'"),
            std::string::npos);
  EXPECT_NE(compare_fingerprint(r, st.run_json, st.model_json, "xyz").find("corpus"), std::string::npos);
  try {
    load_train_state(t.sub("ts.safetensors"), back, 8);
    ADD_FAILURE() << "size mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.state"), std::string::npos) << e.what();
  }
}

TEST(TrainerEval, MatchesEvalLossSumAndCountsBytes) {
  TrainTempDir t;
  const std::string run = write_run_files(t.path, tiny_run());
  TrainOptions o;
  o.out_dir = t.sub("out");
  o.quiet = true;
  Trainer tr(load_run_config(run), o);
  const EvalResult r = tr.evaluate(32, 200);  // 7 windows of 32 targets
  EXPECT_EQ(r.targets, 7 * 32);
  EXPECT_EQ(r.maxvio.size(), 3u);
  // The same windows through model_grad's loss.
  Vocabulary tok;
  const Corpus c = load_corpus(t.sub("corpus.txt"));
  const CorpusSplit sp = split_and_tokenize(c, tok, 40);
  auto s = make_train_scratch();
  double sum = 0;
  int64_t bytes = 0;
  for (int w = 0; w < 7; ++w) {
    sum += eval_loss_sum(tr.model(), sp.heldout.data() + w * 32, 32, *s);
    for (int i = 1; i <= 32; ++i) bytes += sp.heldout[size_t(w * 32 + i)] < 256;
  }
  EXPECT_EQ(r.bytes, bytes);
  EXPECT_NEAR(r.loss, sum / (7 * 32), 1e-4 * std::abs(r.loss));
  EXPECT_NEAR(r.bpb, sum / std::log(2.0) / double(bytes), 1e-4 * r.bpb);
  // An untrained model is near uniform over the 260-token vocabulary.
  EXPECT_NEAR(r.loss, std::log(260.0), 0.3);
}

TEST(TrainerRun, EveryBalancerTrainsAndLogs) {
  for (const char* bal : {"qb-exact", "sign", "aux", "none"}) {
    SCOPED_TRACE(bal);
    TrainTempDir t;
    nlohmann::json r = tiny_run();
    r["balancer"] = bal;
    r["stages"] = nlohmann::json::parse(R"([{"seq_len": 32, "tokens": 1024, "lr_peak": 0.01}])");
    r["eval_every"] = 0;
    const TrainResult res = train_quiet(write_run_files(t.path, r), t.sub("out"));
    ASSERT_TRUE(res.complete);
    const auto rec = records(t.sub("out/metrics.jsonl"));
    int steps = 0;
    for (auto& j : rec) {
      if (j["type"] != "step") continue;
      ++steps;
      EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
      EXPECT_EQ(j["maxvio"].size(), 3u);
      EXPECT_EQ(j.contains("aux_loss"), std::string(bal) == "aux");
    }
    EXPECT_EQ(steps, 4);
    const K3Model m = load_model(t.sub("out/checkpoint"));
    const float* b = m.weights().param("language_model.model.layers.2.block_sparse_moe.gate.e_score_correction_bias");
    bool moved = false;
    for (int j = 0; j < 8; ++j) moved |= b[j] != 0.0f;
    const bool biased = std::string(bal) == "qb-exact" || std::string(bal) == "sign";
    EXPECT_EQ(moved, biased);
  }
}

TEST(TrainerRun, LearnsFollowsScheduleAndWritesRecords) {
  TrainTempDir t;
  const std::string run = write_run_files(t.path, tiny_run());
  const TrainResult res = train_quiet(run, t.sub("out"));
  ASSERT_TRUE(res.complete);
  const RunConfig rc = load_run_config(run);
  const auto rec = records(t.sub("out/metrics.jsonl"));
  std::vector<double> loss;
  int evals = 0, stages = 0, ckpts = 0, loads = 0;
  for (auto& j : rec) {
    const std::string type = j["type"];
    if (type == "step") {
      const int64_t step = j["step"], stage = j["stage"];
      const int64_t in_stage = stage == 0 ? step - 1 : step - 7;
      const int64_t n = stage == 0 ? 6 : 4;
      const StageConfig& sc = rc.stages[size_t(stage)];
      EXPECT_DOUBLE_EQ(j["lr"].get<double>(), wsd_lr(in_stage, n, sc.lr_peak, sc.lr_end, sc.warmup_steps,
                                                      std::llround(sc.decay_frac * double(n))));
      EXPECT_EQ(j["seq_len"].get<int64_t>(), sc.seq_len);
      loss.push_back(j["loss"]);
      if (j.contains("loads")) {
        ++loads;
        ASSERT_EQ(j["loads"].size(), 3u);
        int64_t total = 0;
        for (auto& v : j["loads"][0]) total += v.get<int64_t>();
        EXPECT_EQ(total, 256 * 2);  // every token of the step routed to top-2
      }
    } else if (type == "eval") {
      ++evals;
      EXPECT_GT(j["bpb"].get<double>(), 0);
    } else if (type == "stage") {
      ++stages;
    } else if (type == "checkpoint") {
      ++ckpts;
    }
  }
  ASSERT_EQ(loss.size(), 10u);
  EXPECT_LT(loss.back(), loss.front() - 1.0);  // from ~ln 260 = 5.56 down
  EXPECT_EQ(evals, 4);   // steps 3 and 9 periodic, stage ends 6 and 10
  EXPECT_EQ(stages, 2);  // both stage beginnings
  EXPECT_EQ(ckpts, 3);   // steps 4, 8 and the end
  EXPECT_GE(loads, 3);
  ASSERT_EQ(res.stages.size(), 2u);
  EXPECT_TRUE(res.stages[0].evaluated && res.stages[1].evaluated);
  const std::string table = format_summary(res);
  EXPECT_NE(table.find("unigram baseline"), std::string::npos);
  EXPECT_NE(table.find("MaxVio"), std::string::npos);

  // Longer (40 steps): held-out bits per byte well below the corpus's unigram baseline.
  nlohmann::json r = tiny_run();
  r["stages"][0]["tokens"] = 8192;
  r["stages"][1]["tokens"] = 2048;
  r["eval_every"] = 0;
  r["checkpoint_every"] = 0;
  const TrainResult longer = train_quiet(write_run_files(t.path, r, "longer.json"), t.sub("longer"));
  ASSERT_TRUE(longer.complete);
  EXPECT_EQ(longer.steps, 40);
  EXPECT_LT(longer.stages[1].eval_bpb, longer.unigram_bpb - 1.0)
      << longer.stages[1].eval_bpb << " vs unigram " << longer.unigram_bpb;
}

// Trainer::step is one iteration of run()'s loop: stepping a run to its end gives run()'s
// losses bitwise, with stats that match the metrics; a step past the end is refused.
TEST(TrainerRun, StepByStepEqualsRun) {
  TrainTempDir t;
  nlohmann::json r = tiny_run();
  r["checkpoint_every"] = 0;
  const std::string run = write_run_files(t.path, r);
  const TrainResult whole = train_quiet(run, t.sub("whole"));
  const auto want = step_losses(t.sub("whole/metrics.jsonl"));
  TrainOptions o;
  o.out_dir = t.sub("stepped");
  o.quiet = true;
  Trainer tr(load_run_config(run), o);
  std::vector<StepStats> got;
  for (int64_t i = 0; i < whole.steps; ++i) got.push_back(tr.step());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].step, want[i].first);
    EXPECT_EQ(got[i].loss, want[i].second) << "step " << got[i].step;
    EXPECT_EQ(got[i].tokens, 256);  // batch_tokens
    EXPECT_EQ(got[i].seq_len, got[i].stage == 0 ? 32 : 64);
    EXPECT_EQ(got[i].maxvio.size(), 3u);  // one per MoE layer
    EXPECT_GT(got[i].seconds, 0.0);
    EXPECT_LE(got[i].seconds_fwd_bwd + got[i].seconds_update, got[i].seconds * 1.001);
  }
  EXPECT_THROW(tr.step(), Error);
}

TEST(TrainerRun, ParallelSequencesMatchSerialReference) {
  // threads 1 runs the sequences of a micro-batch one after another (the plain reference);
  // threads 2 runs them in parallel with per-thread gradient buffers summed in thread order.
  // Same losses up to float summation order, same weights to rounding.
  std::vector<std::vector<std::pair<int64_t, double>>> losses;
  std::vector<std::vector<float>> weights;
  for (int threads : {1, 2}) {
    TrainTempDir t;
    nlohmann::json r = tiny_run();
    r["threads"] = threads;
    r["stages"] = nlohmann::json::parse(R"([{"seq_len": 32, "tokens": 768, "lr_peak": 0.003}])");
    r["eval_every"] = 0;
    train_quiet(write_run_files(t.path, r), t.sub("out"));
    losses.push_back(step_losses(t.sub("out/metrics.jsonl")));
    const K3Model m = load_model(t.sub("out/checkpoint"));
    weights.emplace_back(m.weights().data(), m.weights().data() + m.weights().size());
  }
  ASSERT_EQ(losses[0].size(), 3u);
  ASSERT_EQ(losses[1].size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(losses[0][i].second, losses[1][i].second, 1e-4 * losses[0][i].second) << i;
  EXPECT_LT(rel_rms(weights[1].data(), weights[0].data(), int64_t(weights[0].size())), 1e-3);
}

TEST(TrainerMetrics, ResumeCutsLaterRecords) {
  TrainTempDir t;
  const std::string p = t.sub("m.jsonl");
  {
    MetricsLog m;
    m.open(p);
    for (int s = 1; s <= 5; ++s) m.write({{"type", "step"}, {"step", s}});
  }
  write_text(p, read_text(p) + "{\"type\": \"st");  // torn last line
  MetricsLog m;
  m.open(p, 3);
  m.write({{"type", "resume"}, {"step", 3}});
  const auto rec = records(p);
  ASSERT_EQ(rec.size(), 4u);
  EXPECT_EQ(rec[2]["step"], 3);
  EXPECT_EQ(rec[3]["type"], "resume");
  EXPECT_EQ(format_duration(3725), "1h02m");
  EXPECT_EQ(format_duration(65), "1m05s");
}
