// The training state saved beside a model checkpoint (train_state.safetensors in the same
// atomically swapped directory as the weights, config.json, tokenizer.json and run.json), so
// that `k3cpp train --resume` continues exactly where the run stopped:
//  - tensor "optimizer.state" F32 [2 * N]: the optimiser moments (train/optimizer.h), in
//    parameter order;
//  - __metadata__ "k3cpp.train_state": one JSON object with the counters (global step, stage
//    and step within it, data stream position (epoch, cursor), tokens seen, optimiser step
//    count, training seconds), the seed, the per-stage summaries, the run's fingerprint (the
//    canonical JSON of every run field that shapes the trajectory, the model config, a hash
//    of the tokenised corpus) and content hashes of the optimiser state and of the weights;
//    a run with images adds the image-text stream position and the encoder's hash (the
//    encoder's moments follow the text model's in "optimizer.state").
// The router biases that the balancer owns are model weights (e_score_correction_bias), so
// they travel in the weights. Balancer statistics are reset after every step, so nothing
// else is needed between steps.
// Loading validates everything and refuses, with one sentence naming the file and the field,
// a file of another format or version, a missing field, a state whose size does not match
// the model, and a hash that does not match (a corrupted file).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"
#include "train/run_config.h"

namespace k3 {

// What a finished (or running) stage reports in the summary.
struct StageSummary {
  std::string name;
  int64_t seq_len = 0;
  int64_t steps = 0;             // steps of the stage (planned)
  int64_t steps_done = 0;        // steps trained so far
  int64_t tokens = 0;            // tokens trained so far
  double train_seconds = 0;      // wall time of its steps (sum over resumed runs)
  double last_loss = 0;          // training loss of its last step
  bool evaluated = false;        // the stage-end held-out evaluation ran
  double eval_loss = 0;          // held-out mean cross-entropy (nats per token)
  double eval_bpb = 0;           // held-out bits per byte
  std::vector<double> eval_maxvio;  // held-out MaxVio per MoE layer
};

struct TrainState {
  int64_t step = 0;          // optimiser steps completed (global)
  int64_t stage = 0;         // current stage (== number of stages: run complete)
  int64_t stage_step = 0;    // steps completed within the current stage
  int64_t data_epoch = 0;    // the current stage's SequenceStream position
  int64_t data_cursor = 0;
  int64_t tokens_seen = 0;   // training tokens consumed (global)
  int64_t optimizer_steps = 0;
  double train_seconds = 0;  // wall time of training steps (all runs)
  uint64_t seed = 0;
  std::vector<StageSummary> stages;
  // Fingerprint (see run_fingerprint / compare_fingerprint).
  std::string run_json;      // canonical JSON of the trajectory-shaping run fields
  std::string model_json;    // the model architecture, config_to_hf_json form (trainer_setup.cpp model_record)
  std::string corpus_hash;   // hex of the tokenised train + held-out streams
  // Content hashes, checked on load.
  std::string weights_hash;  // hex of the f32 weight buffer
  std::string optimizer_hash;
  // A run with images (run file "vision"): the image-text example stream's position and the
  // content hash of the encoder's f32 parameters (vision.safetensors). Absent in text runs.
  int64_t vision_cursor = 0;
  std::string vision_hash;
};

// 64-bit content hash of a byte range (fixed, portable; not cryptographic), as 16 hex digits.
std::string content_hash(const void* data, size_t bytes);
std::string content_hash_i32(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// The canonical JSON of the run fields that shape the training trajectory (model config
// content rather than its path; everything but logging, evaluation cadence, checkpoint
// cadence, threads and samples).
std::string run_fingerprint(const RunConfig& r);

// Compares a saved fingerprint with the current one; "" when equal, else a sentence naming
// the first field that differs with both values (e.g. "run field 'stages[1].tokens' is 4096
// in the checkpoint but 8192 in the run file").
std::string compare_fingerprint(const TrainState& saved, const std::string& run_json, const std::string& model_json,
                                const std::string& corpus_hash);

// Writes `path` atomically. opt_state: the optimiser moments [2 * N].
void save_train_state(const std::string& path, const TrainState& st, const std::vector<float>& opt_state);
// Reads and validates `path`; opt_state receives the moments (its size is checked against
// expect_elements = 2 * N of the model about to be trained).
TrainState load_train_state(const std::string& path, std::vector<float>& opt_state, int64_t expect_elements);

}  // namespace k3
