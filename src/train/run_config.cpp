#include "train/run_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace k3 {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Reader {
  const json& j;
  std::string path, prefix;
  std::set<std::string> known;

  template <typename V>
  void get(const char* key, V& out) {
    known.insert(key);
    if (!j.contains(key)) return;
    const json& v = j.at(key);
    const std::string field = prefix + key;
    try {
      if constexpr (std::is_same_v<V, std::string>) {
        if (!v.is_string()) fail_input(path, field, "expected a string");
      } else if constexpr (std::is_same_v<V, double>) {
        if (!v.is_number()) fail_input(path, field, "expected a number");
      } else if constexpr (std::is_integral_v<V>) {
        if (!v.is_number_integer()) fail_input(path, field, "expected an integer");
      }
      out = v.get<V>();
    } catch (const json::exception& e) {
      fail_input(path, field, std::string("wrong type (") + e.what() + ")");
    }
  }
  void check_unknown() {
    for (auto& [k, v] : j.items())
      if (!known.count(k)) fail_input(path, prefix + k, "unknown field");
  }
};

void positive(const std::string& path, const std::string& field, double v) {
  if (!(v > 0)) fail_input(path, field, "must be positive");
}

LongTaskMix parse_long_task_mix(const json& j, const std::string& path, const std::string& field) {
  if (!j.is_object()) fail_input(path, field, "expected an object {fraction, tasks, pairs, queries, hops, answer_weight, lengths, depth_power}");
  LongTaskMix m;
  Reader rd{j, path, field + ".", {}};
  rd.get("fraction", m.fraction);
  rd.get("pairs", m.pairs);
  rd.get("queries", m.queries);
  rd.get("hops", m.hops);
  rd.get("answer_weight", m.answer_weight);
  rd.get("depth_power", m.depth_power);
  rd.known.insert("tasks");
  rd.known.insert("lengths");
  rd.check_unknown();
  if (!(m.fraction > 0 && m.fraction <= 1)) fail_input(path, field + ".fraction", "must be in (0, 1]");
  if (!j.contains("tasks") || !j["tasks"].is_array() || j["tasks"].empty())
    fail_input(path, field + ".tasks", "missing or empty (a list of passkey, mqar, vartrack, mixed)");
  for (size_t i = 0; i < j["tasks"].size(); ++i) {
    const json& t = j["tasks"][i];
    const std::string f = field + ".tasks[" + std::to_string(i) + "]";
    if (!t.is_string()) fail_input(path, f, "expected a task name");
    const std::string name = t.get<std::string>();
    if (name != "passkey" && name != "mqar" && name != "vartrack" && name != "mixed")
      fail_input(path, f, "expected passkey, mqar, vartrack or mixed, got '" + name + "'");
    m.tasks.push_back(parse_long_task(name));
  }
  if (j.contains("lengths")) {  // within the stage's seq_len: checked by the caller, which knows it
    const json& ls = j["lengths"];
    if (!ls.is_array() || ls.empty())
      fail_input(path, field + ".lengths", "expected a non-empty list of task lengths in tokens (e.g. [64, 128, 256])");
    for (size_t i = 0; i < ls.size(); ++i) {
      if (!ls[i].is_number_integer() || ls[i].get<int64_t>() < 1)
        fail_input(path, field + ".lengths[" + std::to_string(i) + "]", "expected a positive whole number of tokens");
      m.lengths.push_back(ls[i].get<int64_t>());
    }
  }
  if (m.pairs < 1) fail_input(path, field + ".pairs", "must be at least 1");
  if (m.queries < 1 || m.queries > m.pairs) fail_input(path, field + ".queries", "must be in [1, pairs]");
  if (m.hops < 1) fail_input(path, field + ".hops", "must be at least 1");
  if (!(m.answer_weight > 0 && m.answer_weight <= 1000))
    fail_input(path, field + ".answer_weight", "must be in (0, 1000]");
  if (!(m.depth_power >= 0.1 && m.depth_power <= 10))
    fail_input(path, field + ".depth_power", "must be in [0.1, 10] (1: depths uniform; above 1: more near the start)");
  return m;
}

json long_task_mix_json(const LongTaskMix& m) {
  json tasks = json::array();
  for (LongTask t : m.tasks) tasks.push_back(long_task_name(t));
  json out = {{"fraction", m.fraction}, {"tasks", tasks}, {"pairs", m.pairs}, {"queries", m.queries}, {"hops", m.hops},
              {"answer_weight", m.answer_weight}};
  if (!m.lengths.empty()) out["lengths"] = m.lengths;  // absent: a run file from before the field reads the same
  if (m.depth_power != 1) out["depth_power"] = m.depth_power;  // likewise
  return out;
}

}  // namespace

RunConfig parse_run_config(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail_input(path, "", std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) fail_input(path, "", "expected a JSON object");
  RunConfig r;
  r.path = path;
  Reader rd{j, path, "", {}};
  rd.get("model", r.model_config);
  rd.get("data", r.data);
  rd.get("heldout_every", r.heldout_every);
  rd.get("batch_tokens", r.batch_tokens);
  rd.get("micro_batch_tokens", r.micro_batch_tokens);
  rd.get("optimizer", r.optimizer);
  rd.get("weight_decay", r.weight_decay);
  rd.get("beta1", r.beta1);
  rd.get("beta2", r.beta2);
  rd.get("grad_clip", r.grad_clip);
  rd.get("muon_momentum", r.muon_momentum);
  rd.get("router_lr_scale", r.router_lr_scale);
  rd.get("balancer", r.balancer);
  rd.get("qb_bins", r.qb_bins);
  rd.get("sign_u", r.sign_u);
  rd.get("aux_alpha", r.aux_alpha);
  rd.get("eval_every", r.eval_every);
  rd.get("eval_tokens", r.eval_tokens);
  rd.get("checkpoint_every", r.checkpoint_every);
  rd.get("log_every", r.log_every);
  rd.get("seed", r.seed);
  rd.get("init_seed", r.init_seed);
  rd.get("threads", r.threads);
  rd.get("sample_tokens", r.sample_tokens);
  rd.get("sample_temperature", r.sample_temperature);
  rd.known.insert("samples");
  if (j.contains("samples")) {
    if (!j["samples"].is_array()) fail_input(path, "samples", "expected an array of strings");
    r.samples.clear();
    for (auto& s : j["samples"]) {
      if (!s.is_string()) fail_input(path, "samples", "expected an array of strings");
      r.samples.push_back(s.get<std::string>());
    }
  }
  rd.known.insert("tokenizer");
  if (j.contains("tokenizer")) {
    const json& tj = j["tokenizer"];
    TokenizerConfig& t = r.tokenizer;
    if (tj.is_string()) {
      t.kind = tj.get<std::string>();
      if (t.kind == "tiktoken") fail_input(path, "tokenizer", "\"tiktoken\" needs a directory: {\"kind\": \"tiktoken\", \"dir\": DIR}");
    } else if (tj.is_object()) {
      Reader tr{tj, path, "tokenizer.", {}};
      tr.get("kind", t.kind);
      tr.get("dir", t.dir);
      tr.get("vocab_size", t.vocab_size);
      tr.get("min_frequency", t.min_frequency);
      tr.known.insert("comment");
      tr.check_unknown();
      if (t.kind == "tiktoken" && t.dir.empty()) fail_input(path, "tokenizer.dir", "missing (the vocabulary directory)");
      if (t.kind != "tiktoken" && !t.dir.empty()) fail_input(path, "tokenizer.dir", "only for \"kind\": \"tiktoken\"");
      if (t.kind != "train" && (tj.contains("vocab_size") || tj.contains("min_frequency")))
        fail_input(path, tj.contains("vocab_size") ? "tokenizer.vocab_size" : "tokenizer.min_frequency",
                   "only for \"kind\": \"train\"");
    } else {
      fail_input(path, "tokenizer", "expected \"train\", \"bytes\" or an object {\"kind\": ...}");
    }
    if (t.kind != "train" && t.kind != "tiktoken" && t.kind != "bytes")
      fail_input(path, tj.is_string() ? "tokenizer" : "tokenizer.kind",
                 "must be 'train', 'tiktoken' or 'bytes', got '" + t.kind + "'");
    if (t.vocab_size != 0 && (t.vocab_size < 512 || t.vocab_size > (int64_t(1) << 30)))
      fail_input(path, "tokenizer.vocab_size",
                 std::to_string(t.vocab_size) + " is out of range (at least 512: 256 byte tokens and K3's 256 special ids; 0: the model config's vocab_size)");
    if (t.min_frequency < 1) fail_input(path, "tokenizer.min_frequency", "must be at least 1");
  }
  rd.known.insert("vision");
  if (j.contains("vision")) {
    const json& vj = j["vision"];
    if (!vj.is_object()) fail_input(path, "vision", "expected an object {\"tasks\": [...], ...}");
    VisionRunConfig& v = r.vision;
    v.enabled = true;
    Reader vr{vj, path, "vision.", {}};
    vr.get("examples_per_micro_batch", v.examples_per_micro_batch);
    vr.get("eval_examples", v.eval_examples);
    vr.get("fashion_dir", v.fashion_dir);
    vr.get("unifont", v.unifont);
    vr.known.insert("tasks");
    vr.known.insert("task_weights");
    vr.known.insert("comment");
    vr.check_unknown();
    if (!vj.contains("tasks") || !vj["tasks"].is_array() || vj["tasks"].empty())
      fail_input(path, "vision.tasks", "missing or empty (a list of \"fashion\", \"scenes\", \"arithmetic\")");
    for (const json& t : vj["tasks"]) {
      if (!t.is_string()) fail_input(path, "vision.tasks", "expected an array of task names");
      const std::string n = t.get<std::string>();
      if (n != "fashion" && n != "scenes" && n != "arithmetic")
        fail_input(path, "vision.tasks", "unknown task \"" + n + "\" (expected fashion, scenes or arithmetic)");
      v.tasks.push_back(n);
    }
    if (vj.contains("task_weights")) {
      const json& w = vj["task_weights"];
      if (!w.is_array() || w.size() != v.tasks.size())
        fail_input(path, "vision.task_weights", "expected an array with one positive integer per task (" +
                                                    std::to_string(v.tasks.size()) + ")");
      for (const json& x : w) {
        if (!x.is_number_integer() || x.get<int64_t>() < 1 || x.get<int64_t>() > 1000)
          fail_input(path, "vision.task_weights", "expected integers from 1 to 1000, got " + x.dump());
        v.task_weights.push_back(x.get<int64_t>());
      }
    } else {
      v.task_weights.assign(v.tasks.size(), 1);
    }
    if (v.examples_per_micro_batch < 1) fail_input(path, "vision.examples_per_micro_batch", "must be at least 1");
    if (v.eval_examples < 0) fail_input(path, "vision.eval_examples", "must be 0 (all) or positive");
  }
  rd.known.insert("stages");
  rd.known.insert("comment");
  rd.check_unknown();

  const fs::path base = fs::path(path).parent_path();
  if (r.model_config.empty()) fail_input(path, "model", "missing (path of the model's config.json)");
  if (fs::path(r.model_config).is_relative()) r.model_config = (base / r.model_config).lexically_normal().string();
  if (r.data != "bible" && fs::path(r.data).is_relative()) r.data = (base / r.data).lexically_normal().string();
  for (std::string* p : {&r.vision.fashion_dir, &r.vision.unifont})
    if (r.vision.enabled && fs::path(*p).is_relative()) *p = (base / *p).lexically_normal().string();
  if (!r.tokenizer.dir.empty() && fs::path(r.tokenizer.dir).is_relative())
    r.tokenizer.dir = (base / r.tokenizer.dir).lexically_normal().string();

  if (!j.contains("stages") || !j["stages"].is_array() || j["stages"].empty())
    fail_input(path, "stages", "missing or empty (a list of {seq_len, tokens, lr_peak, ...})");
  for (size_t i = 0; i < j["stages"].size(); ++i) {
    const json& sj = j["stages"][i];
    const std::string pre = "stages[" + std::to_string(i) + "].";
    if (!sj.is_object()) fail_input(path, pre.substr(0, pre.size() - 1), "expected an object");
    StageConfig s;
    s.name = "stage" + std::to_string(i + 1);
    Reader sr{sj, path, pre, {}};
    sr.get("name", s.name);
    sr.get("seq_len", s.seq_len);
    sr.get("tokens", s.tokens);
    sr.get("lr_peak", s.lr_peak);
    sr.get("lr_end", s.lr_end);
    sr.get("warmup_steps", s.warmup_steps);
    sr.get("decay_frac", s.decay_frac);
    sr.known.insert("long_tasks");
    sr.check_unknown();
    if (sj.contains("long_tasks")) s.long_tasks = parse_long_task_mix(sj["long_tasks"], path, pre + "long_tasks");
    if (s.seq_len < 2) fail_input(path, pre + "seq_len", "must be at least 2");
    for (size_t k = 0; k < s.long_tasks.lengths.size(); ++k)
      if (s.long_tasks.lengths[k] > s.seq_len)
        fail_input(path, pre + "long_tasks.lengths[" + std::to_string(k) + "]",
                   std::to_string(s.long_tasks.lengths[k]) + " exceeds the stage's seq_len " + std::to_string(s.seq_len));
    if (s.tokens <= 0) fail_input(path, pre + "tokens", "must be positive");
    positive(path, pre + "lr_peak", s.lr_peak);
    if (s.lr_end < 0) fail_input(path, pre + "lr_end", "must be >= 0");
    if (s.warmup_steps < 0) fail_input(path, pre + "warmup_steps", "must be >= 0");
    if (s.decay_frac < 0 || s.decay_frac > 1) fail_input(path, pre + "decay_frac", "must be in [0, 1]");
    if (s.seq_len > r.micro_batch_tokens || (r.micro_batch_tokens > 0 && r.micro_batch_tokens % s.seq_len != 0))
      fail_input(path, pre + "seq_len",
                 "must divide micro_batch_tokens (" + std::to_string(r.micro_batch_tokens) + ") into whole sequences");
    r.stages.push_back(s);
  }
  if (r.heldout_every < 2) fail_input(path, "heldout_every", "must be at least 2");
  if (r.micro_batch_tokens <= 0) fail_input(path, "micro_batch_tokens", "must be positive");
  if (r.batch_tokens <= 0 || r.batch_tokens % r.micro_batch_tokens != 0)
    fail_input(path, "batch_tokens", "must be a positive multiple of micro_batch_tokens");
  if (r.optimizer != "muon" && r.optimizer != "adamw") fail_input(path, "optimizer", "must be 'muon' or 'adamw', got '" + r.optimizer + "'");
  static const std::set<std::string> balancers = {"qb-hist", "qb-exact", "sign", "aux", "none"};
  if (!balancers.count(r.balancer))
    fail_input(path, "balancer", "must be one of qb-hist, qb-exact, sign, aux, none; got '" + r.balancer + "'");
  if (r.qb_bins < 2) fail_input(path, "qb_bins", "must be at least 2");
  positive(path, "sign_u", r.sign_u);
  if (r.aux_alpha < 0) fail_input(path, "aux_alpha", "must be >= 0");
  if (r.beta1 < 0 || r.beta1 >= 1) fail_input(path, "beta1", "must be in [0, 1)");
  if (r.beta2 < 0 || r.beta2 >= 1) fail_input(path, "beta2", "must be in [0, 1)");
  if (!(r.router_lr_scale >= 0)) fail_input(path, "router_lr_scale", "must be >= 0");
  if (r.weight_decay < 0) fail_input(path, "weight_decay", "must be >= 0");
  if (r.grad_clip < 0) fail_input(path, "grad_clip", "must be >= 0 (0: no clipping)");
  if (r.eval_every < 0) fail_input(path, "eval_every", "must be >= 0");
  if (r.eval_tokens < 0) fail_input(path, "eval_tokens", "must be >= 0");
  if (r.checkpoint_every < 0) fail_input(path, "checkpoint_every", "must be >= 0");
  if (r.log_every < 1) fail_input(path, "log_every", "must be >= 1");
  if (r.threads < 0) fail_input(path, "threads", "must be >= 0");
  if (r.sample_tokens < 0) fail_input(path, "sample_tokens", "must be >= 0");
  if (!(r.sample_temperature >= 0)) fail_input(path, "sample_temperature", "must be >= 0 (0: greedy)");
  return r;
}

RunConfig load_run_config(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail_system("cannot open run file", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_run_config(ss.str(), path);
}

std::string run_config_to_json(const RunConfig& r) {
  json j;
  j["model"] = r.model_config;
  j["data"] = r.data;
  j["heldout_every"] = r.heldout_every;
  if (r.tokenizer.kind == "bytes") {
    j["tokenizer"] = "bytes";
  } else if (r.tokenizer.kind == "tiktoken") {
    j["tokenizer"] = {{"kind", "tiktoken"}, {"dir", r.tokenizer.dir}};
  } else {
    j["tokenizer"] = {{"kind", "train"}, {"vocab_size", r.tokenizer.vocab_size}, {"min_frequency", r.tokenizer.min_frequency}};
  }
  j["batch_tokens"] = r.batch_tokens;
  j["micro_batch_tokens"] = r.micro_batch_tokens;
  j["optimizer"] = r.optimizer;
  j["weight_decay"] = r.weight_decay;
  j["beta1"] = r.beta1;
  j["beta2"] = r.beta2;
  j["grad_clip"] = r.grad_clip;
  j["muon_momentum"] = r.muon_momentum;
  j["router_lr_scale"] = r.router_lr_scale;
  j["balancer"] = r.balancer;
  j["qb_bins"] = r.qb_bins;
  j["sign_u"] = r.sign_u;
  j["aux_alpha"] = r.aux_alpha;
  j["eval_every"] = r.eval_every;
  j["eval_tokens"] = r.eval_tokens;
  j["checkpoint_every"] = r.checkpoint_every;
  j["log_every"] = r.log_every;
  j["seed"] = r.seed;
  j["init_seed"] = r.init_seed;
  j["threads"] = r.threads;
  j["samples"] = r.samples;
  j["sample_tokens"] = r.sample_tokens;
  j["sample_temperature"] = r.sample_temperature;
  j["stages"] = json::array();
  for (auto& s : r.stages) {
    json sj = {{"name", s.name},       {"seq_len", s.seq_len}, {"tokens", s.tokens},
               {"lr_peak", s.lr_peak}, {"lr_end", s.lr_end},   {"warmup_steps", s.warmup_steps},
               {"decay_frac", s.decay_frac}};
    // Only when set, so the fingerprint of a run without long tasks is what it always was.
    if (s.long_tasks.active()) sj["long_tasks"] = long_task_mix_json(s.long_tasks);
    j["stages"].push_back(sj);
  }
  if (r.vision.enabled)
    j["vision"] = {{"tasks", r.vision.tasks}, {"examples_per_micro_batch", r.vision.examples_per_micro_batch},
                   {"eval_examples", r.vision.eval_examples}, {"fashion_dir", r.vision.fashion_dir},
                   {"unifont", r.vision.unifont}};
  // Written only when they are not all 1, so a run without them keeps its fingerprint.
  if (r.vision.enabled &&
      std::any_of(r.vision.task_weights.begin(), r.vision.task_weights.end(), [](int64_t w) { return w != 1; }))
    j["vision"]["task_weights"] = r.vision.task_weights;
  return j.dump(2) + "\n";
}

}  // namespace k3
