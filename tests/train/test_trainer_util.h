// Shared fixtures of the trainer tests: a temporary directory holding a synthetic corpus (no
// dependency on the `bible` program), a 4-layer K3-shaped model config (3 KDA + 1 MLA, Block
// AttnRes, 8 experts top-2, latent d/2, vocabulary 260 for the byte tokenizer or larger for a
// trained one) and run files.
#pragma once
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "train/run_config.h"
#include "train/trainer.h"

namespace k3::test {

struct TrainTempDir {
  std::string path;
  TrainTempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "k3_trainer_XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TrainTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string sub(const std::string& n) const { return path + "/" + n; }
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// ~120 documents of pseudo-random sentences over a small word list, separated by form feeds.
inline std::string synthetic_corpus() {
  static const char* words[] = {"the", "lord", "said", "unto", "him", "and", "they", "went", "into", "land",
                                "of",  "his",  "people", "behold", "king", "city", "house", "day", "came", "there"};
  uint64_t s = 12345;
  auto next = [&]() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(s >> 33);
  };
  std::string out;
  for (int d = 0; d < 120; ++d) {
    if (d) out += '\f';
    out += "Chapter " + std::to_string(d + 1) + "\n";
    for (int v = 0; v < 12; ++v) {
      out += "  " + std::to_string(v + 1) + " ";
      const int n = 6 + int(next() % 8);
      for (int w = 0; w < n; ++w) out += std::string(w ? " " : "") + words[next() % 20];
      out += ".\n";
    }
  }
  return out;
}

// vocab: the config's vocab_size (260: the byte tokenizer's ids; a trained vocabulary needs
// at least 512).
inline std::string tiny_model_json(int64_t vocab = 260) {
  return R"({"model_type": "kimi_k3", "text_config": {
    "hidden_size": 32, "num_hidden_layers": 4, "vocab_size": )" + std::to_string(vocab) + R"(, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": false,
    "linear_attn_config": {"num_heads": 2, "head_dim": 16, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
                           "full_attn_layers": [4], "kda_layers": [1, 2, 3]},
    "num_attention_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "mla_use_output_gate": true,
    "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1, "routed_expert_hidden_size": 16,
    "moe_intermediate_size": 16, "routed_scaling_factor": 1.0, "moe_renormalize": true, "latent_moe_use_norm": true,
    "first_k_dense_replace": 1, "intermediate_size": 64, "attn_res_block_size": 2,
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0, "max_position_embeddings": 4096}})";
}

// Two stages (seq_len 32: 6 steps, 64: 4 steps) of 256-token steps (2 micro-batches), QB,
// the byte tokenizer (erase "tokenizer" for the default, a vocabulary trained by the run).
inline nlohmann::json tiny_run() {
  return nlohmann::json::parse(R"({
    "model": "model.json", "data": "corpus.txt", "tokenizer": "bytes", "heldout_every": 40,
    "batch_tokens": 256, "micro_batch_tokens": 128,
    "stages": [
      {"name": "s1", "seq_len": 32, "tokens": 1536, "lr_peak": 0.01, "lr_end": 0.01, "warmup_steps": 2},
      {"name": "s2", "seq_len": 64, "tokens": 1024, "lr_peak": 0.01, "lr_end": 0.002, "decay_frac": 0.5}],
    "optimizer": "muon", "balancer": "qb-hist", "qb_bins": 200,
    "eval_every": 3, "eval_tokens": 512, "checkpoint_every": 4, "log_every": 1,
    "seed": 7, "threads": 2, "samples": [], "sample_tokens": 0})");
}

// Writes corpus.txt (unless present), model.json (vocab_size `vocab`) and run.json (from
// `run`) into dir; returns the run path.
inline std::string write_run_files(const std::string& dir, const nlohmann::json& run, const std::string& name = "run.json",
                                   int64_t vocab = 260) {
  if (!std::filesystem::exists(dir + "/corpus.txt")) write_text(dir + "/corpus.txt", synthetic_corpus());
  write_text(dir + "/model.json", tiny_model_json(vocab));
  write_text(dir + "/" + name, run.dump(2));
  return dir + "/" + name;
}

// The "step" records of a metrics.jsonl: (step, loss) in file order.
inline std::vector<std::pair<int64_t, double>> step_losses(const std::string& metrics_path) {
  std::vector<std::pair<int64_t, double>> out;
  std::istringstream in(read_text(metrics_path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
  }
  return out;
}

// Runs the run file quietly into `out` (resume: continue its checkpoint; stop > 0: stop after
// that many optimiser steps).
inline TrainResult train_run(const std::string& run_path, const std::string& out, bool resume, int64_t stop = -1) {
  TrainOptions o;
  o.out_dir = out;
  o.resume = resume;
  o.stop_at_step = stop;
  o.quiet = true;
  Trainer t(load_run_config(run_path), o);
  return t.run();
}

}  // namespace k3::test
