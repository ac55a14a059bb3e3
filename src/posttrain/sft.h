// Supervised fine-tuning (`k3cpp sft --config sft.json --out DIR`): a pretrained k3cpp model
// directory (with its tiktoken vocabulary) trained on XTML conversations, the loss on the
// assistant tokens only (posttrain/chat_tokens.h):
//   L = -(1 / N) sum over the batch's trained tokens of log p(token | prefix)
// N the trained tokens of the step's batch. Conversations come from a JSONL file (one
// OpenAI-style chat request per line, io/chat_json.h) or the arithmetic family
// (posttrain/arith_task.h). Step s draws its `batch` conversations by seeded hashing of
// (seed, s, j), so a resumed run draws exactly the conversations the uninterrupted one does.
// Output: DIR/metrics.jsonl, DIR/checkpoint (posttrain/policy_update.h), resumable exactly.
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "posttrain/arith_task.h"
#include "posttrain/image_task.h"
#include "posttrain/policy_update.h"

namespace k3 {

struct SFTConfig {
  std::string path;   // the config file
  std::string model;  // pretrained model directory (resolved)
  std::string data;   // JSONL path (resolved), or "" with `arith`
  std::optional<ArithFamily> arith;
  // "task": arithmetic, or image_arithmetic (the family's problems as rendered images in the
  // user turn, posttrain/image_task.h; a vision model, its encoder frozen; the "train" split).
  PosttrainTask task = PosttrainTask::arithmetic;
  std::string unifont = "/usr/share/unifont/unifont.hex";
  int64_t steps = 100, batch = 8, max_tokens = 1024;
  double lr = 1e-3, lr_end = 1e-4;
  int64_t warmup_steps = 5;
  UpdateOptions update;
  int64_t checkpoint_every = 50, log_every = 1;
  uint64_t seed = 1;
};
SFTConfig load_sft_config(const std::string& path);

struct SFTOptions {
  std::string out_dir;
  bool resume = false;
  int64_t stop_at_step = -1;
  bool quiet = false;
  std::FILE* log = stderr;
};

struct SFTResult {
  int64_t steps = 0;
  double last_loss = 0, seconds = 0;
  std::string checkpoint_dir;
};

SFTResult run_sft(const SFTConfig& c, const SFTOptions& o);

// Linear warmup then linear decay to lr_end over the remaining steps (step 0-based).
double posttrain_lr(int64_t step, int64_t total, double lr, double lr_end, int64_t warmup);

}  // namespace k3
