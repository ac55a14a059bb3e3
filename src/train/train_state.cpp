// Training-state file (see train_state.h).
#include "train/train_state.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/tensor.h"
#include "io/safetensors.h"

namespace k3 {

using nlohmann::json;

namespace {

constexpr const char* kFormat = "k3cpp-train-state";
constexpr int kVersion = 1;
constexpr const char* kMetaKey = "k3cpp.train_state";
constexpr const char* kOptTensor = "optimizer.state";

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

// One 64-bit lane per 8 bytes: h = rotl(h ^ (w * p1), 31) * p2, then a final avalanche.
uint64_t hash_bytes(const void* data, size_t n, uint64_t h) {
  const uint64_t p1 = 0x9e3779b97f4a7c15ull, p2 = 0xc2b2ae3d27d4eb4full;
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h ^= w * p1;
    h = ((h << 31) | (h >> 33)) * p2;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * p1;
  h ^= uint64_t(n);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

json stage_to_json(const StageSummary& s) {
  return {{"name", s.name},
          {"seq_len", s.seq_len},
          {"steps", s.steps},
          {"steps_done", s.steps_done},
          {"tokens", s.tokens},
          {"train_seconds", s.train_seconds},
          {"last_loss", s.last_loss},
          {"evaluated", s.evaluated},
          {"eval_loss", s.eval_loss},
          {"eval_bpb", s.eval_bpb},
          {"eval_maxvio", s.eval_maxvio}};
}

// Walks two JSON values and returns the path of the first difference ("" if equal).
std::string first_difference(const json& a, const json& b, const std::string& path, std::string* va, std::string* vb) {
  if (a.is_object() && b.is_object()) {
    for (auto& [k, v] : a.items()) {
      const std::string p = path.empty() ? k : path + "." + k;
      if (!b.contains(k)) {
        *va = v.dump(), *vb = "absent";
        return p;
      }
      std::string d = first_difference(v, b.at(k), p, va, vb);
      if (!d.empty()) return d;
    }
    for (auto& [k, v] : b.items())
      if (!a.contains(k)) {
        *va = "absent", *vb = v.dump();
        return path.empty() ? k : path + "." + k;
      }
    return "";
  }
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) {
      *va = std::to_string(a.size()) + " entries", *vb = std::to_string(b.size()) + " entries";
      return path;
    }
    for (size_t i = 0; i < a.size(); ++i) {
      std::string d = first_difference(a[i], b[i], path + "[" + std::to_string(i) + "]", va, vb);
      if (!d.empty()) return d;
    }
    return "";
  }
  if (a != b) {
    *va = a.dump(), *vb = b.dump();
    return path.empty() ? "(value)" : path;
  }
  return "";
}

}  // namespace

std::string content_hash(const void* data, size_t bytes) { return hex64(hash_bytes(data, bytes, 0x6b33637070ull)); }

std::string content_hash_i32(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  uint64_t h = hash_bytes(a.data(), a.size() * sizeof(int32_t), 0x6b33637070ull);
  h = hash_bytes(b.data(), b.size() * sizeof(int32_t), h);
  return hex64(h);
}

std::string run_fingerprint(const RunConfig& r) {
  // The run file's training-relevant fields: everything run_config_to_json writes except
  // paths, evaluation, checkpoint, logging, thread and sampling settings, which a resumed
  // run may change without changing what it trains.
  json j = json::parse(run_config_to_json(r));
  for (const char* k : {"model", "data", "eval_every", "eval_tokens", "checkpoint_every", "log_every", "threads",
                        "samples", "sample_tokens", "sample_temperature"})
    j.erase(k);
  // The byte tokenizer is left out (runs before the "tokenizer" field trained with it, so
  // their checkpoints keep resuming); a tiktoken directory's path is no training setting (its
  // content is: the tokenised corpus hash and the checkpoint's copy of the vocabulary).
  if (j.contains("tokenizer") && j["tokenizer"].is_string() && j["tokenizer"] == "bytes") j.erase("tokenizer");
  if (j.contains("tokenizer") && j["tokenizer"].is_object()) j["tokenizer"].erase("dir");
  return j.dump();
}

std::string compare_fingerprint(const TrainState& saved, const std::string& run_json, const std::string& model_json,
                                const std::string& corpus_hash) {
  std::string va, vb;
  auto parse = [](const std::string& s) {
    try {
      return json::parse(s);
    } catch (const json::exception&) {
      return json();
    }
  };
  std::string d = first_difference(parse(saved.run_json), parse(run_json), "", &va, &vb);
  if (!d.empty()) return "run field '" + d + "' is " + va + " in the checkpoint but " + vb + " in the run file";
  json ma = parse(saved.model_json), mb = parse(model_json);
  d = first_difference(ma, mb, "", &va, &vb);
  if (!d.empty()) return "model config field '" + d + "' is " + va + " in the checkpoint but " + vb + " in the run's model config";
  if (saved.corpus_hash != corpus_hash)
    return "the corpus differs (tokenised content hash " + saved.corpus_hash + " in the checkpoint, " + corpus_hash +
           " now): field 'data' or 'heldout_every' names other text";
  return "";
}

void save_train_state(const std::string& path, const TrainState& st, const std::vector<float>& opt_state) {
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = st.step;
  j["stage"] = st.stage;
  j["stage_step"] = st.stage_step;
  j["data_epoch"] = st.data_epoch;
  j["data_cursor"] = st.data_cursor;
  j["tokens_seen"] = st.tokens_seen;
  j["optimizer_steps"] = st.optimizer_steps;
  j["optimizer_elements"] = int64_t(opt_state.size());
  j["train_seconds"] = st.train_seconds;
  j["seed"] = std::to_string(st.seed);
  j["stages"] = json::array();
  for (auto& s : st.stages) j["stages"].push_back(stage_to_json(s));
  j["run"] = st.run_json;
  j["model"] = st.model_json;
  j["corpus_hash"] = st.corpus_hash;
  j["weights_hash"] = st.weights_hash;
  j["optimizer_hash"] = content_hash(opt_state.data(), opt_state.size() * sizeof(float));
  if (!st.vision_hash.empty()) {
    j["vision_cursor"] = st.vision_cursor;
    j["vision_hash"] = st.vision_hash;
  }
  SafetensorsWriter w;
  w.set_metadata(kMetaKey, j.dump());
  w.add(kOptTensor, Tensor::view_of(DType::F32, {int64_t(opt_state.size())}, const_cast<float*>(opt_state.data()), nullptr));
  w.write(path);
}

TrainState load_train_state(const std::string& path, std::vector<float>& opt_state, int64_t expect_elements) {
  auto f = SafetensorsFile::open(path);  // refuses structurally corrupt files, naming them
  auto it = f->metadata().find(kMetaKey);
  if (it == f->metadata().end()) fail_input(path, kMetaKey, "missing: not a k3cpp training state");
  json j;
  try {
    j = json::parse(it->second);
  } catch (const json::exception& e) {
    fail_input(path, kMetaKey, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) fail_input(path, kMetaKey, "expected a JSON object");
  auto need = [&](const char* key) -> const json& {
    if (!j.contains(key)) fail_input(path, std::string(kMetaKey) + "." + key, "missing");
    return j.at(key);
  };
  auto get_int = [&](const char* key) {
    const json& v = need(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      fail_input(path, std::string(kMetaKey) + "." + key, "expected a non-negative integer");
    return v.get<int64_t>();
  };
  auto get_str = [&](const char* key) {
    const json& v = need(key);
    if (!v.is_string()) fail_input(path, std::string(kMetaKey) + "." + key, "expected a string");
    return v.get<std::string>();
  };
  if (get_str("format") != kFormat) fail_input(path, std::string(kMetaKey) + ".format", "not '" + std::string(kFormat) + "'");
  if (get_int("version") != kVersion)
    fail_input(path, std::string(kMetaKey) + ".version", "version " + std::to_string(j["version"].get<int64_t>()) +
                                                             " is not supported (this build reads version 1)");
  TrainState st;
  st.step = get_int("step");
  st.stage = get_int("stage");
  st.stage_step = get_int("stage_step");
  st.data_epoch = get_int("data_epoch");
  st.data_cursor = get_int("data_cursor");
  st.tokens_seen = get_int("tokens_seen");
  st.optimizer_steps = get_int("optimizer_steps");
  const json& ts = need("train_seconds");
  if (!ts.is_number()) fail_input(path, std::string(kMetaKey) + ".train_seconds", "expected a number");
  st.train_seconds = ts.get<double>();
  try {
    st.seed = std::stoull(get_str("seed"));
  } catch (const std::exception&) {
    fail_input(path, std::string(kMetaKey) + ".seed", "not an unsigned integer");
  }
  st.run_json = get_str("run");
  st.model_json = get_str("model");
  st.corpus_hash = get_str("corpus_hash");
  st.weights_hash = get_str("weights_hash");
  st.optimizer_hash = get_str("optimizer_hash");
  if (j.contains("vision_hash")) {
    st.vision_cursor = get_int("vision_cursor");
    st.vision_hash = get_str("vision_hash");
  }
  const json& stages = need("stages");
  if (!stages.is_array()) fail_input(path, std::string(kMetaKey) + ".stages", "expected an array");
  try {
    for (auto& sj : stages) {
      StageSummary s;
      s.name = sj.at("name").get<std::string>();
      s.seq_len = sj.at("seq_len").get<int64_t>();
      s.steps = sj.at("steps").get<int64_t>();
      s.steps_done = sj.at("steps_done").get<int64_t>();
      s.tokens = sj.at("tokens").get<int64_t>();
      s.train_seconds = sj.at("train_seconds").get<double>();
      s.last_loss = sj.at("last_loss").get<double>();
      s.evaluated = sj.at("evaluated").get<bool>();
      s.eval_loss = sj.at("eval_loss").get<double>();
      s.eval_bpb = sj.at("eval_bpb").get<double>();
      s.eval_maxvio = sj.at("eval_maxvio").get<std::vector<double>>();
      st.stages.push_back(std::move(s));
    }
  } catch (const json::exception& e) {
    fail_input(path, std::string(kMetaKey) + ".stages", std::string("malformed stage summary (") + e.what() + ")");
  }
  if (st.stage > int64_t(st.stages.size()))
    fail_input(path, std::string(kMetaKey) + ".stage", "is beyond the number of stages");

  const TensorInfo* ti = f->find(kOptTensor);
  if (!ti) fail_input(path, kOptTensor, "missing");
  if (ti->dtype != DType::F32 || ti->shape.size() != 1)
    fail_input(path, kOptTensor, "expected a 1-D f32 tensor, found " + std::string(dtype_name(ti->dtype)) + " " + shape_str(ti->shape));
  if (ti->shape[0] != expect_elements || get_int("optimizer_elements") != expect_elements)
    fail_input(path, kOptTensor, "has " + std::to_string(ti->shape[0]) + " elements but the model's optimiser needs " +
                                     std::to_string(expect_elements));
  Tensor t = f->get(*ti);
  opt_state.assign(t.data<float>(), t.data<float>() + expect_elements);
  const std::string h = content_hash(opt_state.data(), opt_state.size() * sizeof(float));
  if (h != st.optimizer_hash)
    fail_input(path, kOptTensor, "content hash " + h + " does not match the recorded " + st.optimizer_hash + " (corrupted file)");
  return st;
}

}  // namespace k3
