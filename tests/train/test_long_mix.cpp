// Long-range tasks in training (train/long_mix.h, the `mixed` task of train/long_tasks.h):
//  - a mixed sample has its length, every answer's evidence sits before its query, and the
//    sub-tasks' pieces are shuffled over the window (not in a fixed order);
//  - the mix replaces about its fraction of sequences, deterministically in (seed, step,
//    index), writing exactly T + 1 ids and leaving the others untouched;
//  - the run file's stage "long_tasks" parses, names the field on bad input and round-trips;
//  - a run with long tasks in its second stage logs the replaced sequences there only, and
//    stopping and resuming it gives the straight run's losses bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "core/error.h"
#include "long_task_bytes.h"
#include "train/long_mix.h"
#include "train/run_config.h"
#include "train/trainer.h"
#include "test_trainer_util.h"

using namespace k3;
using namespace k3::test;

namespace {

using k3::test::dec;
using k3::test::enc;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LongMix, MixedSampleHoldsEveryAnswerBeforeItsQueryInShuffledOrder) {
  std::set<size_t> passkey_rank;  // where the pass key sits among the evidence pieces
  for (uint64_t seed = 0; seed < 12; ++seed) {
    LongTaskOptions o;
    o.task = LongTask::mixed;
    o.length = 900;
    o.pairs = 5;
    o.queries = 3;
    o.hops = 2;
    o.seed = seed;
    const LongSample s = make_long_sample(enc, o);
    EXPECT_EQ(int64_t(s.ids.size()), 900);
    ASSERT_EQ(s.queries.size(), 5u);  // the pass key, the chain's end, 3 pairs
    EXPECT_EQ(s.queries.back().at + int64_t(s.queries.back().answer.size()) + 1, 900);  // then "."
    const size_t ask0 = size_t(s.queries.front().at);
    const std::string evidence = dec(s.ids, 0, ask0);
    const size_t end_of_evidence = evidence.find(" Now answer.");
    ASSERT_NE(end_of_evidence, std::string::npos);
    int passkey = 0, chain = 0, pair = 0;
    for (const LongQuery& q : s.queries) {
      const std::string before = dec(s.ids, 0, size_t(q.at));
      const std::string value = q.answer_text.substr(1);
      if (before.size() >= 16 && before.compare(before.size() - 16, 16, " The pass key is") == 0) {
        ++passkey;
        const size_t at = evidence.find(" The pass key is " + value + ".");
        ASSERT_LT(at, end_of_evidence);
        // Rank of the pass key among the pieces: the pair and chain pieces before it (one ":" or "=" each).
        passkey_rank.insert(size_t(std::count(evidence.begin(), evidence.begin() + long(at), ':') +
                                   std::count(evidence.begin(), evidence.begin() + long(at), '=')));
      } else if (before.compare(before.size() - 3, 3, " is") == 0) {
        ++chain;  // " VAR name is": follow name back to the value
        const size_t var = before.rfind(" VAR ");
        std::string name = before.substr(var + 5, before.size() - var - 8);
        for (int hop = 0; hop < 3 && name != value; ++hop) {
          const size_t def = evidence.find(" VAR " + name + " = ");
          ASSERT_LT(def, end_of_evidence) << name;
          const size_t rhs = def + 5 + name.size() + 3;
          name = evidence.substr(rhs, evidence.find('.', rhs) - rhs);
        }
        EXPECT_EQ(name, value);
      } else {
        ++pair;
        const size_t sp = before.rfind(' ');
        const std::string key = before.substr(sp + 1, before.size() - sp - 2);
        EXPECT_LT(evidence.find(" " + key + ": " + value + "."), end_of_evidence) << key;
      }
    }
    EXPECT_EQ(passkey, 1);
    EXPECT_EQ(chain, 1);
    EXPECT_EQ(pair, 3);
  }
  EXPECT_GE(passkey_rank.size(), 3u) << "the pass key always sits at the same rank: the pieces are not shuffled";
}

TEST(LongMix, ReplacesItsFractionDeterministically) {
  LongTaskMix mix;
  mix.fraction = 0.3;
  mix.tasks = {LongTask::passkey, LongTask::mqar, LongTask::vartrack, LongTask::mixed};
  mix.pairs = 3, mix.queries = 2, mix.hops = 2;
  const int64_t T = 400;
  std::vector<int32_t> a(T + 1), b(T + 1);
  int replaced = 0;
  std::set<int32_t> firsts;
  for (int64_t i = 0; i < 1000; ++i) {
    std::fill(a.begin(), a.end(), -7);
    std::fill(b.begin(), b.end(), -7);
    const bool ra = mix_long_sample(mix, enc, 11, i / 10, i % 10, T, a.data());
    const bool rb = mix_long_sample(mix, enc, 11, i / 10, i % 10, T, b.data());
    ASSERT_EQ(ra, rb);
    EXPECT_EQ(a, b);
    if (ra) {
      ++replaced;
      for (int32_t id : a) ASSERT_TRUE(id >= 0 && id < 256) << "not every one of the T + 1 ids was written";
      firsts.insert(a[size_t(a.size() / 2)]);
    } else {
      EXPECT_EQ(a, std::vector<int32_t>(T + 1, -7)) << "an unreplaced sequence was written";
    }
  }
  EXPECT_NEAR(replaced / 1000.0, 0.3, 0.05);
  EXPECT_GT(firsts.size(), 3u);
  // Another seed picks other sequences.
  int same = 0;
  for (int64_t i = 0; i < 200; ++i)
    same += mix_long_sample(mix, enc, 11, 0, i, T, a.data()) == mix_long_sample(mix, enc, 12, 0, i, T, b.data());
  EXPECT_LT(same, 190);
  LongTaskMix off;
  EXPECT_FALSE(mix_long_sample(off, enc, 11, 0, 0, T, a.data()));
  EXPECT_NE(error_of([&] { check_long_task_mix(mix, enc, 100); }).find("cannot hold"), std::string::npos);
  EXPECT_NO_THROW(check_long_task_mix(mix, enc, T));
}

// answer_weight marks exactly the targets that predict a task's answer: for a passkey, the
// weighted targets' tokens are the key, at the end of the sequence, and the key is the one
// hidden in the evidence; an untouched sequence keeps weight 1 everywhere.
TEST(LongMix, AnswerWeightMarksTheAnswerTargets) {
  LongTaskMix mix;
  mix.fraction = 0.5;
  mix.tasks = {LongTask::passkey};
  mix.answer_weight = 8;
  const int64_t T = 300;
  std::vector<int32_t> ids(T + 1);
  std::vector<float> w(T);
  int replaced = 0, kept = 0;
  for (int64_t i = 0; i < 40; ++i) {
    std::fill(w.begin(), w.end(), -1.f);
    if (!mix_long_sample(mix, enc, 5, i, 0, T, ids.data(), w.data())) {
      ++kept;
      EXPECT_EQ(std::count(w.begin(), w.end(), 1.f), T);
      continue;
    }
    ++replaced;
    std::string key;
    int64_t first = -1, n8 = 0;
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_TRUE(w[size_t(t)] == 1.f || w[size_t(t)] == 8.f) << t;
      if (w[size_t(t)] != 8.f) continue;
      if (first < 0) first = t;
      ++n8;
      key += dec(ids, size_t(t + 1), size_t(t + 2));
    }
    ASSERT_GT(n8, 0);
    EXPECT_EQ(first + n8, T) << "the answer is one run of targets ending at the last";
    const std::string text = dec(ids, 0, size_t(T + 1));
    EXPECT_EQ(text.compare(text.size() - key.size(), key.size(), key), 0);
    const std::string digits = key.substr(key.find_first_not_of(' '));
    EXPECT_EQ(digits.find_first_not_of("0123456789."), std::string::npos) << key;
    EXPECT_LT(text.find("The pass key is " + digits.substr(0, digits.find('.'))), text.size() - key.size()) << key;
  }
  EXPECT_GT(replaced, 5);
  EXPECT_GT(kept, 5);
}

// `lengths`: a replaced sequence holds a sample of one of the lengths at its start (its answer
// weighted, ending at that length's last target) and keeps the caller's ids after it; every
// length is drawn; lengths {T} is the mix without the field, id for id; the check refuses a
// length too short for a task or longer than the stage.
TEST(LongMix, TaskLengthsPlaceAShorterSampleAtTheStartAndKeepTheTextAfterIt) {
  LongTaskMix mix;
  mix.fraction = 1;
  mix.tasks = {LongTask::passkey};
  mix.answer_weight = 5;
  const int64_t T = 400;
  mix.lengths = {250, 400};
  std::vector<int32_t> ids(T + 1);
  std::vector<float> w(T);
  std::map<int64_t, int> seen;
  for (int64_t i = 0; i < 40; ++i) {
    std::fill(ids.begin(), ids.end(), -7);
    ASSERT_TRUE(mix_long_sample(mix, enc, 3, i, 1, T, ids.data(), w.data()));
    const int64_t L = int64_t(std::find(ids.begin(), ids.end(), -7) - ids.begin()) - 1;
    ASSERT_TRUE(L == 250 || L == 400) << L;
    ++seen[L];
    for (int64_t p = L + 1; p <= T; ++p) ASSERT_EQ(ids[size_t(p)], -7) << "the text after the sample was overwritten";
    for (int64_t p = 0; p <= L; ++p) ASSERT_TRUE(ids[size_t(p)] >= 0 && ids[size_t(p)] < 256) << p;
    int64_t last = -1;
    for (int64_t t = 0; t < T; ++t)
      if (w[size_t(t)] == 5.f) last = t;
      else ASSERT_EQ(w[size_t(t)], 1.f) << t;
    EXPECT_EQ(last, L - 1) << "the last answer ends at the sample's last target";
  }
  EXPECT_GE(seen[250], 5);
  EXPECT_GE(seen[400], 5);
  LongTaskMix full = mix, none = mix;
  full.lengths = {T};
  none.lengths.clear();
  std::vector<int32_t> a(T + 1), b(T + 1);
  for (int64_t i = 0; i < 10; ++i) {
    mix_long_sample(full, enc, 3, i, 0, T, a.data());
    mix_long_sample(none, enc, 3, i, 0, T, b.data());
    ASSERT_EQ(a, b) << "lengths {seq_len} draws other samples than no lengths";
  }
  mix.lengths = {60, 400};
  const std::string short_one = error_of([&] { check_long_task_mix(mix, enc, T); });
  EXPECT_NE(short_one.find("lengths entry 60: "), std::string::npos) << short_one;
  EXPECT_NE(short_one.find("cannot hold"), std::string::npos) << short_one;
  mix.lengths = {401};
  EXPECT_NE(error_of([&] { check_long_task_mix(mix, enc, T); }).find("outside [1, seq_len 400]"), std::string::npos);
  mix.lengths = {250, 400};
  EXPECT_NO_THROW(check_long_task_mix(mix, enc, T));
}

// depth_power: the passkey's needle sits at depth u^p; p = 1 is the mix without the field id
// for id; p = 3 moves the needles toward the start (mean depth 1/4 against 1/2), the answers
// still found where the weights say.
TEST(LongMix, DepthPowerMovesTheNeedleTowardTheStart) {
  LongTaskMix mix;
  mix.fraction = 1;
  mix.tasks = {LongTask::passkey};
  const int64_t T = 400;
  std::vector<int32_t> a(T + 1), b(T + 1);
  auto mean_depth = [&](double power) {
    LongTaskMix m = mix;
    m.depth_power = power;
    double sum = 0;
    for (int64_t i = 0; i < 200; ++i) {
      EXPECT_TRUE(mix_long_sample(m, enc, 9, 2, i, T, a.data()));
      const std::string text = dec(a, 0, size_t(T + 1));
      const size_t at = text.find("The pass key is ");
      EXPECT_NE(at, std::string::npos);
      sum += double(at) / double(text.size());
    }
    return sum / 200;
  };
  // p = 3 draws other depths from the same hash: the samples differ, the keys stay the same.
  int differ = 0;
  for (int64_t i = 0; i < 50; ++i) {
    LongTaskMix early = mix;
    early.depth_power = 3;
    ASSERT_TRUE(mix_long_sample(mix, enc, 9, 2, i, T, a.data()));
    ASSERT_TRUE(mix_long_sample(early, enc, 9, 2, i, T, b.data()));
    differ += a != b;
    const std::string ta = dec(a, 0, size_t(T + 1)), tb = dec(b, 0, size_t(T + 1));
    EXPECT_EQ(ta.substr(ta.rfind(' ')), tb.substr(tb.rfind(' '))) << i;
  }
  EXPECT_GT(differ, 40);
  // The needle's place in the text is start + depth x span (the span: the text before the
  // question), so mean places are linear in the mean depths 1/4, 1/2 and 2/3 (p = 3, 1, 0.5).
  const double early = mean_depth(3), uniform = mean_depth(1), late = mean_depth(0.5);
  SCOPED_TRACE("mean needle place: p=3 " + std::to_string(early) + ", p=1 " + std::to_string(uniform) + ", p=0.5 " + std::to_string(late));
  EXPECT_LT(early, uniform - 0.05);
  EXPECT_GT(late, uniform + 0.03);
  EXPECT_NEAR((uniform - early) / (late - uniform), (0.5 - 0.25) / (2.0 / 3 - 0.5), 0.5);
}

TEST(LongMix, RunFileStageFieldParsesNamesErrorsAndRoundTrips) {
  auto run = tiny_run();
  run["stages"][1]["long_tasks"] = {{"fraction", 0.25}, {"tasks", {"passkey", "mixed"}}, {"pairs", 4}, {"queries", 2},
                                      {"answer_weight", 12.5}};
  const RunConfig r = parse_run_config(run.dump(), "/tmp/run.json");
  EXPECT_FALSE(r.stages[0].long_tasks.active());
  ASSERT_TRUE(r.stages[1].long_tasks.active());
  EXPECT_EQ(r.stages[1].long_tasks.fraction, 0.25);
  EXPECT_EQ(r.stages[1].long_tasks.tasks, (std::vector<LongTask>{LongTask::passkey, LongTask::mixed}));
  EXPECT_EQ(r.stages[1].long_tasks.pairs, 4);
  EXPECT_EQ(r.stages[1].long_tasks.answer_weight, 12.5);
  const RunConfig back = parse_run_config(run_config_to_json(r), "/tmp/run.json");
  EXPECT_EQ(run_config_to_json(back), run_config_to_json(r));
  EXPECT_EQ(back.stages[1].long_tasks.tasks, r.stages[1].long_tasks.tasks);
  // A run without long tasks serialises as it did before they existed.
  EXPECT_EQ(run_config_to_json(parse_run_config(tiny_run().dump(), "/tmp/run.json")).find("long_tasks"), std::string::npos);

  auto bad = [&](const nlohmann::json& lt) {
    auto j = tiny_run();
    j["stages"][1]["long_tasks"] = lt;
    return error_of([&] { parse_run_config(j.dump(), "/tmp/run.json"); });
  };
  EXPECT_NE(bad({{"fraction", 0}, {"tasks", {"passkey"}}}).find("stages[1].long_tasks.fraction"), std::string::npos);
  EXPECT_NE(bad({{"fraction", 0.5}, {"tasks", {"needle"}}}).find("stages[1].long_tasks.tasks[0]"), std::string::npos);
  EXPECT_NE(bad({{"fraction", 0.5}}).find("stages[1].long_tasks.tasks"), std::string::npos);
  EXPECT_NE(bad({{"fraction", 0.5}, {"tasks", {"mqar"}}, {"pairs", 2}, {"queries", 3}}).find("long_tasks.queries"),
            std::string::npos);
  EXPECT_NE(bad({{"fraction", 0.5}, {"tasks", {"mqar"}}, {"share", 1}}).find("long_tasks.share"), std::string::npos);
  EXPECT_NE(bad({{"fraction", 0.5}, {"tasks", {"passkey"}}, {"answer_weight", 0}}).find("long_tasks.answer_weight"),
            std::string::npos);
  EXPECT_NE(bad("half").find("stages[1].long_tasks"), std::string::npos);
  EXPECT_NE(bad({{"fraction", 0.5}, {"tasks", {"passkey"}}, {"depth_power", 0}}).find("long_tasks.depth_power"),
            std::string::npos);
  EXPECT_NE(bad({{"fraction", 0.5}, {"tasks", {"passkey"}}, {"depth_power", "early"}}).find("long_tasks.depth_power"),
            std::string::npos);
  auto withp = tiny_run();
  withp["stages"][1]["long_tasks"] = {{"fraction", 0.5}, {"tasks", {"passkey"}}, {"depth_power", 2.5}};
  const RunConfig rp = parse_run_config(withp.dump(), "/tmp/run.json");
  EXPECT_EQ(rp.stages[1].long_tasks.depth_power, 2.5);
  EXPECT_EQ(parse_run_config(run_config_to_json(rp), "/tmp/run.json").stages[1].long_tasks.depth_power, 2.5);
  // depth_power 1 is the default: written as a run file without the field.
  withp["stages"][1]["long_tasks"]["depth_power"] = 1;
  EXPECT_EQ(run_config_to_json(parse_run_config(withp.dump(), "/tmp/run.json")).find("depth_power"), std::string::npos);
  // lengths: a non-empty list of positive lengths within the stage's seq_len (64), round-tripped.
  const nlohmann::json pk = {"passkey"};
  EXPECT_NE(bad({{"fraction", 0.5}, {"tasks", pk}, {"lengths", nlohmann::json::array()}}).find("long_tasks.lengths"),
            std::string::npos);
  EXPECT_NE(bad({{"fraction", 0.5}, {"tasks", pk}, {"lengths", {32, 0}}}).find("long_tasks.lengths[1]"), std::string::npos);
  const std::string over = bad({{"fraction", 0.5}, {"tasks", pk}, {"lengths", {32, 65}}});
  EXPECT_NE(over.find("stages[1].long_tasks.lengths[1]"), std::string::npos) << over;
  EXPECT_NE(over.find("exceeds the stage's seq_len 64"), std::string::npos) << over;
  auto withl = tiny_run();
  withl["stages"][1]["long_tasks"] = {{"fraction", 0.5}, {"tasks", pk}, {"lengths", {32, 64}}};
  const RunConfig rl = parse_run_config(withl.dump(), "/tmp/run.json");
  EXPECT_EQ(rl.stages[1].long_tasks.lengths, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(parse_run_config(run_config_to_json(rl), "/tmp/run.json").stages[1].long_tasks.lengths,
            rl.stages[1].long_tasks.lengths);
}

namespace {

nlohmann::json run_with_long_tasks() {
  auto run = tiny_run();
  run["micro_batch_tokens"] = 256;
  run["stages"][1]["seq_len"] = 256;
  run["stages"][1]["long_tasks"] = {{"fraction", 0.5},
                                    {"tasks", {"passkey", "mqar", "vartrack", "mixed"}},
                                    {"pairs", 2},
                                    {"queries", 1},
                                    {"hops", 2}};
  return run;
}

}  // namespace

TEST(LongMix, TrainingStageUsesThemAndResumesExactly) {
  TrainTempDir t;
  const std::string run = write_run_files(t.path, run_with_long_tasks());
  ASSERT_TRUE(train_run(run, t.sub("a"), false).complete);
  // Stage 1 (steps 1-6) has no long tasks; stage 2 (steps 7-10, one sequence a step) has them.
  std::istringstream in(read_text(t.sub("a/metrics.jsonl")));
  std::string line;
  int64_t long_total = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] != "step") continue;
    if (j["stage"] == 0) {
      EXPECT_FALSE(j.contains("long_task_seqs")) << line;
    }
    if (j["stage"] == 1) {
      ASSERT_TRUE(j.contains("long_task_seqs")) << line;
      long_total += j["long_task_seqs"].get<int64_t>();
    }
  }
  EXPECT_GT(long_total, 0) << "no sequence of stage 2 was replaced (fraction 0.5 over 4 sequences)";
  ASSERT_FALSE(train_run(run, t.sub("b"), false, 8).complete);
  ASSERT_TRUE(train_run(run, t.sub("b"), true).complete);
  const auto la = step_losses(t.sub("a/metrics.jsonl")), lb = step_losses(t.sub("b/metrics.jsonl"));
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i].second, lb[i].second) << "step " << la[i].first;
  EXPECT_TRUE(read_text(t.sub("a/checkpoint/model.safetensors")) == read_text(t.sub("b/checkpoint/model.safetensors")));
}

TEST(LongMix, StageTooShortForItsTasksIsRefusedNamingTheField) {
  TrainTempDir t;
  auto j = run_with_long_tasks();
  j["stages"][0]["long_tasks"] = {{"fraction", 0.5}, {"tasks", {"passkey"}}};  // seq_len 32
  const std::string run = write_run_files(t.path, j);
  const std::string e = error_of([&] { train_run(run, t.sub("a"), false); });
  EXPECT_NE(e.find("stages[0].long_tasks"), std::string::npos) << e;
  EXPECT_NE(e.find("cannot hold"), std::string::npos) << e;
  // A task length too short for the task, in a stage long enough for it.
  auto k = run_with_long_tasks();
  k["stages"][1]["long_tasks"]["lengths"] = {24, 256};
  const std::string run2 = write_run_files(t.path, k);
  const std::string e2 = error_of([&] { train_run(run2, t.sub("b"), false); });
  EXPECT_NE(e2.find("stages[1].long_tasks"), std::string::npos) << e2;
  EXPECT_NE(e2.find("cannot hold"), std::string::npos) << e2;
}
