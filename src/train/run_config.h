// A training run file (JSON): model config, data, batch, context stages, optimiser, load
// balancer, evaluation, checkpointing and logging. Every field has a default except the
// model; unknown fields are refused (a typo must not silently fall back to a default).
// Paths inside are relative to the run file's directory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/long_mix.h"

namespace k3 {

// One progressive-context stage (K3: 8K, 64K, 256K, 1M; scaled to the machine): its
// sequence length, token budget and learning-rate segment (warmup from 0 to lr_peak over
// warmup_steps, constant, then linear decay to lr_end over the last decay_frac of its steps).
struct StageConfig {
  std::string name;
  int64_t seq_len = 256;
  int64_t tokens = 0;  // tokens to train in this stage (rounded up to whole steps)
  double lr_peak = 3e-3, lr_end = 3e-3;
  int64_t warmup_steps = 0;
  double decay_frac = 0.0;
  // {"fraction": f, "tasks": [...], "pairs": n, "queries": n, "hops": n} (train/long_mix.h):
  // generated long-range tasks replace a share f of the stage's sequences. Off by default.
  LongTaskMix long_tasks;
};

// The vocabulary the run trains with (the run file's "tokenizer"):
//   "train" or {"kind": "train", "vocab_size": N, "min_frequency": F} (default): a BPE
//     vocabulary (io/bpe_trainer.h, Kimi pattern, K3's special layout) learnt from the
//     training split only (never the held-out documents) when the run starts, saved as
//     OUT/tokenizer/{tiktoken.model, tokenizer_config.json} and in every checkpoint; a resumed
//     run uses the checkpoint's. vocab_size counts every id as the model config's does
//     (N - 256 base tokens + 256 special ids); 0 (default): the model config's vocab_size.
//   {"kind": "tiktoken", "dir": DIR}: an existing vocabulary directory in K3's format.
//   "bytes" or {"kind": "bytes"}: the byte tokenizer (io/tokenizer.h, 260 ids).
struct TokenizerConfig {
  std::string kind = "train";  // train | tiktoken | bytes
  std::string dir;             // tiktoken: resolved path
  int64_t vocab_size = 0;      // train: 0 = the model config's vocab_size
  int64_t min_frequency = 2;   // train: stop merging when the best pair is rarer
};

// Image-text data trained jointly with the text (docs/vision.md; the model config needs a
// vision_config and a media_placeholder_token_id): "vision": {"tasks": ["fashion", "scenes",
// "arithmetic"], "examples_per_micro_batch": N, "eval_examples": M, "fashion_dir": DIR,
// "unifont": FILE}. Each micro-batch adds N image-text examples (tasks in turn) to its text
// sequences; their answers are scored with the text targets in one mean loss. At the end of
// the run each task is evaluated on M test examples (fashion: the first M of the 10k test
// images; 0: all), with the image, with zeros in its place and with another example's image.
struct VisionRunConfig {
  bool enabled = false;
  std::vector<std::string> tasks;
  std::vector<int64_t> task_weights;  // per task, >= 1: its share of the training examples (default all 1)
  int64_t examples_per_micro_batch = 8;
  int64_t eval_examples = 1000;
  std::string fashion_dir = "/usr/share/datasets/fashion-mnist";
  std::string unifont = "/usr/share/unifont/unifont.hex";
};

struct RunConfig {
  std::string path;          // the run file
  std::string model_config;  // resolved path of the K3 config.json
  std::string data = "bible";
  int64_t heldout_every = 40;   // every n-th document is held out
  TokenizerConfig tokenizer;
  int64_t batch_tokens = 4096;  // tokens per optimizer step (all micro-batches)
  int64_t micro_batch_tokens = 2048;  // tokens per micro-batch (a multiple of every stage's seq_len)
  std::vector<StageConfig> stages;
  // Optimiser.
  std::string optimizer = "muon";  // muon (per-head, AdamW for the rest) | adamw
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, grad_clip = 1.0, muon_momentum = 0.95;
  // The router gate's learning rate relative to the stage's: the balancer's biases are
  // computed from one step's scores and applied to the next, so a router that moves fast
  // (small models at high learning rates) outruns them.
  double router_lr_scale = 1.0;
  // Load balancing: qb-hist | qb-exact | sign | aux | none.
  std::string balancer = "qb-hist";
  int64_t qb_bins = 1000;
  double sign_u = 1e-3;
  double aux_alpha = 1e-2;
  // Evaluation, checkpoints, logging.
  int64_t eval_every = 50;         // steps; 0: only at stage ends
  int64_t eval_tokens = 32768;     // held-out tokens per evaluation (0: the whole held-out set)
  int64_t checkpoint_every = 100;  // steps; a checkpoint is always written at the end
  int64_t log_every = 1;
  uint64_t seed = 1;
  int64_t init_seed = -1;          // model init seed (-1: same as seed)
  int64_t threads = 0;             // 0: environment / all cores
  // Samples generated from the trained model at the end (each prompt after <|bos|>).
  std::vector<std::string> samples = {"In the beginning", "And God said"};
  int64_t sample_tokens = 80;
  double sample_temperature = 0.8;  // 0: greedy
  VisionRunConfig vision;
};

// Parses and validates; k3::Error "<path>: <field>: <problem>".
RunConfig load_run_config(const std::string& path);
RunConfig parse_run_config(const std::string& json_text, const std::string& path);
std::string run_config_to_json(const RunConfig& r);

}  // namespace k3
