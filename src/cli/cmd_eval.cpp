// `k3cpp eval <model dir> [--data SPEC] [--heldout-every N] [--seq-len N] [--max-tokens N]
//              [--batch-tokens N] [--threads N] [--json out.json]
//              [--moving-qb [--mqb-lambda L] [--mqb-chunk C]]`
// Held-out loss, bits per byte (nats / ln 2 / the bytes the targets decode to, so comparable
// across vocabularies; the model directory's tiktoken vocabulary, else its byte tokenizer) and the routing statistics of every MoE layer of a trained
// model (train/routing_eval.h): MaxVio over the whole held-out set, experts that received no
// token, within-sequence MaxVio, dropped slots (counted; 0 without a capacity limit) and the
// overflow a capacity-limited MoE would have had per batch, each beside its random-routing
// noise floor. Defaults come from the checkpoint's run.json when there is one (the data, the
// held-out split, the last stage's seq_len and the batch), so `k3cpp eval DIR/checkpoint`
// evaluates a training run on exactly its held-out documents. --moving-qb adds the same
// figures for Moving QB's selection (train/moving_qb.h) recomputed from the model's scores.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "io/vocabulary.h"
#include "model/checkpoint.h"
#include "train/data.h"
#include "train/routing_eval.h"

namespace k3::cli {
namespace {

using json = nlohmann::json;

const char* kEvalUsage =
    "usage: k3cpp eval <model dir> [--data SPEC] [--heldout-every N] [--seq-len N] [--max-tokens N]\n"
    "                  [--batch-tokens N] [--threads N] [--json out.json]\n"
    "                  [--moving-qb [--mqb-lambda L] [--mqb-chunk C]]\n"
    "       k3cpp eval <model dir> --task vision --run RUN.json [--examples N] [--json out.json]  (images:\n"
    "                  the run file's tasks with blind baselines, docs/vision.md)\n"
    "       k3cpp eval <model dir> --task passkey|mqar|vartrack|loss-by-position ...  (long context;\n"
    "                  `k3cpp eval DIR --task passkey --help` lists its options)\n"
    "  --data           corpus: 'bible' or a path (default: the checkpoint's run.json, else bible)\n"
    "  --heldout-every  every N-th document is held out (default: run.json, else 40)\n"
    "  --seq-len        window length (default: the last stage's seq_len in run.json, else 256)\n"
    "  --max-tokens     evaluate only the first N held-out tokens (default 0: the whole held-out set)\n"
    "  --batch-tokens   batch of the per-batch overflow figure (default: run.json, else 4096)\n"
    "  --json           also write every figure (with per-expert loads) to this file\n"
    "  --moving-qb      also the figures of Moving QB's sequence-level selection (train/moving_qb.h),\n"
    "                   recomputed from each layer's scores: exact for the first MoE layer, later\n"
    "                   layers keep the inputs of the static routing; EMA weight L (0.3), chunk C (64)\n";

struct Defaults {
  std::string data = "bible";
  int64_t heldout_every = 40, seq_len = 256, batch_tokens = 4096;
  std::string source;  // the run.json the defaults came from ("" if none)
};

// The training run's settings, from <dir>/run.json (written by k3cpp train) when present.
Defaults run_defaults(const std::string& dir) {
  Defaults d;
  const std::string path = (std::filesystem::path(dir) / "run.json").string();
  std::ifstream f(path);
  if (!f) return d;
  json j;
  try {
    j = json::parse(f);
  } catch (const std::exception& e) {
    fail_input(path, "", std::string("is not valid JSON: ") + e.what());
  }
  auto str = [&](const char* key, std::string& v) {
    if (j.contains(key) && j[key].is_string()) v = j[key].get<std::string>();
  };
  auto num = [&](const char* key, int64_t& v) {
    if (j.contains(key) && j[key].is_number_integer()) v = j[key].get<int64_t>();
  };
  str("data", d.data);
  num("heldout_every", d.heldout_every);
  num("batch_tokens", d.batch_tokens);
  if (j.contains("stages") && j["stages"].is_array() && !j["stages"].empty() && j["stages"].back().contains("seq_len"))
    d.seq_len = j["stages"].back()["seq_len"].get<int64_t>();
  // A relative corpus path in run.json was relative to the run file; k3cpp train records the
  // path it resolved, so it is used as written.
  d.source = path;
  return d;
}

int64_t positive(const Args& a, const char* name, int64_t def, bool allow_zero = false) {
  const long long v = a.get_int(name, def);
  if (v < 0 || (!allow_zero && v == 0))
    fail(std::string("--") + name + ": expected a " + (allow_zero ? "non-negative" : "positive") + " integer, got " +
         std::to_string(v));
  return v;
}

json stats_json(const std::vector<LayerRoutingStats>& layers) {
  json a = json::array();
  for (const LayerRoutingStats& s : layers)
    a.push_back({{"layer", s.layer},
                 {"maxvio", s.maxvio},
                 {"zero_experts", s.zero_experts},
                 {"seq_maxvio_mean", s.seq_maxvio_mean},
                 {"seq_maxvio_max", s.seq_maxvio_max},
                 {"tokens", s.tokens},
                 {"slots", s.slots},
                 {"dropped", s.dropped},
                 {"overflow_cf1", s.overflow_cf1},
                 {"overflow_cf125", s.overflow_cf125},
                 {"loads", s.loads}});
  return a;
}

}  // namespace

int cmd_eval_long(const std::vector<std::string>& args);    // cmd_eval_long.cpp
int cmd_eval_vision(const std::vector<std::string>& args);  // cmd_eval_vision.cpp

int cmd_eval(const std::vector<std::string>& args) {
  // --task selects the long-context evaluation (cmd_eval_long.cpp).
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& x = args[i];
    if (x == "--task=vision" || (x == "--task" && i + 1 < args.size() && args[i + 1] == "vision"))
      return cmd_eval_vision(args);
    if (x == "--task" || x.rfind("--task=", 0) == 0) return cmd_eval_long(args);
  }
  Args a(args, {"data", "heldout-every", "seq-len", "max-tokens", "batch-tokens", "threads", "json", "mqb-lambda", "mqb-chunk"},
         {"help", "moving-qb"}, "eval");
  if (a.flag("help")) {
    std::fputs(kEvalUsage, stdout);
    return 0;
  }
  if (a.positional().size() != 1) fail("expected one <model dir>, got " + std::to_string(a.positional().size()));
  const std::string dir = a.positional_at(0, "model dir");
  set_num_threads(int(positive(a, "threads", 0, true)));
  const ModelDir md = open_model_dir(dir);
  const Defaults d = run_defaults(dir);
  const std::string data = a.get_or("data", d.data);
  const int64_t every = positive(a, "heldout-every", d.heldout_every);
  const int64_t T = positive(a, "seq-len", d.seq_len);
  const int64_t max_tokens = positive(a, "max-tokens", 0, true);
  const int64_t batch = positive(a, "batch-tokens", d.batch_tokens);
  MovingQBOptions mqb;
  mqb.lambda = a.get_double("mqb-lambda", mqb.lambda);
  mqb.chunk = positive(a, "mqb-chunk", mqb.chunk);
  if (!(mqb.lambda > 0 && mqb.lambda < 1)) fail("--mqb-lambda: expected a number in (0, 1), got " + std::to_string(mqb.lambda));
  const bool moving = a.flag("moving-qb");

  // The model's vocabulary (tiktoken.model, else tokenizer.json; none: the byte tokenizer).
  const Vocabulary tok = Vocabulary::dir_has_tiktoken(dir) || Vocabulary::dir_has_byte_tokenizer(dir)
                             ? Vocabulary::load_dir(dir)
                             : Vocabulary();
  if (md.config.vocab_size < tok.vocab_size())
    fail_input(md.config_path, "vocab_size",
               std::to_string(md.config.vocab_size) + " is below the " + tok.describe() + "'s " +
                   std::to_string(tok.vocab_size()) + " ids");
  std::fprintf(stderr, "eval: tokenizer: %s\n", tok.describe().c_str());
  const CorpusSplit split = split_and_tokenize(load_corpus(data), tok, every);
  LoadOptions lo;
  lo.dense_as_stored = true;  // bf16 dense weights read as stored
  const K3Model model = load_model(md, lo);
  announce_machine("eval");
  const HeldoutEval r = evaluate_heldout(model, split.heldout, T, max_tokens, batch, moving ? &mqb : nullptr,
                                         &tok.token_bytes());
  const int64_t k = md.config.num_experts_per_token, E = md.config.num_experts;

  std::printf("held-out: %s, every %lld-th document (%lld documents, %zu tokens)%s\n", data.c_str(), (long long)every,
              (long long)split.heldout_docs, split.heldout.size(), d.source.empty() ? "" : (", settings of " + d.source).c_str());
  std::printf("%lld windows of %lld tokens (%lld targets): loss %.4f nats, %.4f bits/byte\n", (long long)r.windows,
              (long long)T, (long long)r.targets, r.loss, r.bpb);
  if (!r.layers.empty()) {
    std::printf("routing (%lld experts, top-%lld; overflow per batch of %lld tokens at capacity factor 1.0 / 1.25):\n",
                (long long)E, (long long)k, (long long)r.batch_tokens);
    std::printf("%6s %8s %10s %13s %12s %8s %9s %10s\n", "layer", "MaxVio", "zero-load", "seq MaxVio", "seq max", "dropped",
                "over@1.0", "over@1.25");
    for (const LayerRoutingStats& s : r.layers)
      std::printf("%6lld %8.3f %10lld %13.3f %12.3f %8lld %8.2f%% %9.2f%%\n", (long long)s.layer, s.maxvio,
                  (long long)s.zero_experts, s.seq_maxvio_mean, s.seq_maxvio_max, (long long)s.dropped,
                  100 * s.overflow_cf1, 100 * s.overflow_cf125);
    std::printf("%6s %8.3f %10.1f %13.3f %12s %8s %8.2f%% %9.2f%%   (batch MaxVio %.3f)\n", "random", r.random.maxvio,
                r.random.zero_experts, r.random.seq_maxvio, "-", "-", 100 * r.random.overflow_cf1,
                100 * r.random.overflow_cf125, r.random.batch_maxvio);
  }
  if (!r.moving.empty()) {
    std::printf("Moving QB selection (lambda %.3g, chunk %lld), from the same scores:\n", mqb.lambda, (long long)mqb.chunk);
    for (const LayerRoutingStats& s : r.moving)
      std::printf("%6lld %8.3f %10lld %13.3f %12.3f %8lld %8.2f%% %9.2f%%\n", (long long)s.layer, s.maxvio,
                  (long long)s.zero_experts, s.seq_maxvio_mean, s.seq_maxvio_max, (long long)s.dropped,
                  100 * s.overflow_cf1, 100 * s.overflow_cf125);
  }
  if (const auto out = a.get("json")) {
    json j = {{"model", dir},
              {"data", data},
              {"heldout_every", every},
              {"seq_len", T},
              {"windows", r.windows},
              {"targets", r.targets},
              {"bytes", r.bytes},
              {"loss", r.loss},
              {"bpb", r.bpb},
              {"experts", E},
              {"top_k", k},
              {"batch_tokens", r.batch_tokens}};
    j["layers"] = stats_json(r.layers);
    if (moving) j["moving_qb"] = {{"lambda", mqb.lambda}, {"chunk", mqb.chunk}, {"layers", stats_json(r.moving)}};
    j["random"] = {{"maxvio", r.random.maxvio},
                   {"zero_experts", r.random.zero_experts},
                   {"seq_maxvio", r.random.seq_maxvio},
                   {"batch_maxvio", r.random.batch_maxvio},
                   {"overflow_cf1", r.random.overflow_cf1},
                   {"overflow_cf125", r.random.overflow_cf125}};
    write_text_file_atomic(*out, j.dump(1) + "\n");
    std::printf("wrote %s\n", out->c_str());
  }
  // Dropped slots mean the engine lost routed tokens: never expected, so a failure.
  for (const auto* set : {&r.layers, &r.moving})
    for (const LayerRoutingStats& s : *set)
      if (s.dropped != 0) {
        std::fprintf(stderr, "eval: layer %lld dropped %lld routed slots (expected 0: no capacity limit)\n",
                     (long long)s.layer, (long long)s.dropped);
        return 1;
      }
  return 0;
}

}  // namespace k3::cli
