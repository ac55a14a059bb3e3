// The vision part of a training run (run file "vision", train/run_config.h): the encoder's
// parameters, per-thread gradient buffers and scratch, the image-text examples of each
// micro-batch, the optimiser entries, the end-of-run evaluation with blind baselines, and the
// encoder tensors of the checkpoint. The Trainer (trainer_impl.h) owns one and calls it inside
// its step, so the encoder trains jointly with the text from step 0 with the same stages,
// learning-rate schedule, optimiser, gradient clipping and balancer.
// Example sequence: media_pad x (image tokens), then the question's tokens, then the answer's
// tokens and <|eos|>; only the answer and eos are scored.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "io/vocabulary.h"
#include "train/optimizer.h"
#include "train/run_config.h"
#include "train/vision_data.h"
#include "train/vision_step.h"

namespace k3 {

// Which training example the stream's n-th position holds: (task slot, index within that
// task). A cycle of sum(weights) positions gives task 0 its weights[0] positions first, then
// task 1, ...; so each task's indices run 0, 1, 2, ... without gaps or repeats, and equal
// weights put the tasks in turn.
std::pair<size_t, int64_t> vision_example_at(int64_t n, const std::vector<int64_t>& weights);

class VisionTrainPart {
 public:
  // k3::Error naming the model config when it has no vision_config or no usable
  // media_placeholder_token_id (it must be outside the vocabulary's byte ids and below
  // vocab_size).
  VisionTrainPart(const RunConfig& run, const K3Config& cfg, const Vocabulary& vocab, int threads, uint64_t init_seed);
  ~VisionTrainPart();

  std::vector<ParamRef> optimizer_params(bool muon);  // over the parameters and gradient buffer 0
  void zero_grads();
  void reduce_grads();              // buffers 1.. summed into 0, in thread order
  double grad_norm() const;         // L2 norm of gradient buffer 0 (before clipping)
  int64_t prepare(int64_t n);       // the next n training examples; returns their scored targets
  int64_t prepared() const { return int64_t(items_.size()); }
  SequenceResult run(const K3Model& model, int64_t i, int tid, double scale, float* text_grads, TrainScratch& s,
                     const LossOptions& opt, SequenceRouting* routing);
  // Greedy answers on eval_examples test examples per task: accuracy with the image, with
  // zeros (pixels 0.5: all-zero patches after normalisation) and with the next example's
  // image; scenes per question type; fashion's confusion matrix. Also written to `path`.
  nlohmann::json evaluate(const K3Model& model, const std::string& path);
  // Encoder forward + backward seconds summed over threads, and images, since the last call.
  std::pair<double, int64_t> take_encoder_time();
  void save(const std::string& dir) const;  // vision.safetensors (released names, f32)
  void load(const std::string& dir);        // a checkpoint's encoder (shapes checked)
  // Exact resume: the training example stream's position and the parameters' content hash.
  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t c) { cursor_ = c; }
  std::string params_hash() const;
  void set_eval_examples(int64_t n) { run_.vision.eval_examples = n; }
  int64_t parameter_count() const;

 private:
  struct Item {
    std::vector<int32_t> tokens;  // [T + 1]
    std::vector<uint8_t> mask;    // [T]
    VisionBatch<float> images;
  };
  Item make_item(const VisionExample& ex, const Image* replace, bool zeros) const;
  std::string greedy_answer(const K3Model& model, const Item& it, int tid);

  RunConfig run_;
  const Vocabulary& vocab_;
  VisionDims dims_;
  VisionLayout layout_;
  int32_t media_ = -1;
  std::vector<float> params_;
  std::vector<std::vector<float>> grads_;  // [P]
  std::vector<std::unique_ptr<VisionScratchT<float>>> scratch_;
  std::vector<VisionTask> tasks_;
  std::unique_ptr<VisionDataSource> data_;
  int64_t cursor_ = 0;
  std::vector<Item> items_;
};

}  // namespace k3
