// The training run (`k3cpp train`): a K3 model trained from a run file (train/run_config.h)
// through its progressive-context stages (docs/model.md section 7: 8K, 64K, 256K, 1M, scaled
// to the machine), with held-out evaluation, metrics, checkpoints and exact resume.
//
// One optimizer step = batch_tokens / micro_batch_tokens micro-batches, each of
// micro_batch_tokens / seq_len sequences from the stage's SequenceStream (train/data.h).
// The sequences of a micro-batch run in parallel (OpenMP, static schedule; one TrainScratch
// and one gradient buffer per thread), their gradients are summed in thread order, and their
// routing is fed to the balancer in sequence order after the loop, so a run is deterministic
// for a given thread count and a resumed run is bitwise the run that never stopped.
// Loss = mean cross-entropy over the step's targets. Then: global-norm clipping, the stage's
// warmup-stable-decay learning rate, the optimiser (per-head Muon + AdamW, or AdamW), the
// balancer's bias update (applied from the next step), metrics.
//
// Optimiser assignment (optimizer_params): Muon for the 2-D matrices of the mixers, FFNs,
// shared experts, latent projections and every routed expert (each its own matrix), per
// head for KDA q/k/v_proj (H heads) and MLA q_b_proj / kv_b_proj (MLA heads); AdamW for the
// embedding, lm_head, the router gate (small, and its scores feed balancing: a plain adaptive
// step keeps the scale of the scores that the balancer's biases are measured against), the
// conv taps and every 1-D parameter. No weight decay on norms, AttnRes vectors, A_log,
// dt_bias or other 1-D parameters. The router bias (e_score_correction_bias) is no optimiser
// parameter: the balancer owns it.
//
// Vocabulary (run_config.h TokenizerConfig): by default a BPE vocabulary learnt from the
// training documents when a run starts (DIR/tokenizer), else a given tiktoken directory or
// the byte tokenizer. Held-out bits per byte = total nats / (ln 2 x the bytes the target
// tokens decode to, special ids counting 0), so runs with different vocabularies compare.
//
// Output directory: DIR/metrics.jsonl (train/metrics.h), DIR/tokenizer (a trained
// vocabulary) and DIR/checkpoint, one directory replaced atomically as a whole: the model in
// the released layout (f32), config.json, the vocabulary (tiktoken.model +
// tokenizer_config.json, or tokenizer.json for the byte tokenizer), run.json (the run file as
// parsed) and train_state.safetensors (train/train_state.h): a model directory that
// `k3cpp generate`, `eval` and (tiktoken) `chat` load. It is written every checkpoint_every steps, when --steps stops the
// run and at the end; the finished checkpoint is the trained model.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "io/vocabulary.h"
#include "model/k3_model.h"
#include "train/optimizer.h"
#include "train/run_config.h"
#include "train/train_state.h"

namespace k3 {

class DataParallel;            // train/parallel.h
class ExpertParallelTraining;  // train/parallel.h

struct TrainOptions {
  std::string out_dir;
  bool resume = false;          // continue DIR/checkpoint (refused if it does not match the run)
  int64_t stop_at_step = -1;    // --steps N: stop once N optimiser steps (global) are done
  int threads = 0;              // > 0: overrides the run file's `threads`
  bool quiet = false;           // no progress output
  std::FILE* log = stderr;      // progress and messages
  // Data parallel (src/dist): every rank runs a Trainer with the same run file and options;
  // rank r trains sequences [r n/N, (r + 1) n/N) of each micro-batch of n sequences (n must
  // be a multiple of N), the gradients are summed in rank order, the balancer's statistics
  // and the losses are those of the global batch, and rank 0 alone writes metrics and
  // checkpoints (the same files as a single process). nullptr: a single process.
  DataParallel* dp = nullptr;
  // With dp: ZeRO-1, each rank keeps the optimiser state of (and steps) only the parameters
  // it owns, whole matrices assigned to ranks in contiguous runs of about equal optimiser
  // cost; the updated parameters are then gathered. false: every rank steps everything.
  bool shard_optimizer = true;
  // With dp (not ep): start the gradient reduction during the step's last backward, each bucket
  // as soon as the backward has finished it (docs/distributed.md: where a rank adds its
  // sequences into one buffer, i.e. one thread per rank or one sequence per micro-batch);
  // the same bits either way. false (--dp-overlap off): after the backward.
  bool dp_overlap = true;
  // Expert parallel (with dp; docs/distributed.md): the ranks form groups of ep->size(), each
  // rank of a group owning, computing and stepping 1/ep->size() of every MoE layer's routed
  // experts; the sequences still split over all dp ranks. A rank holds the weights,
  // gradients and optimiser state of the trunk and of its own experts only (the others'
  // ranges of the weight and gradient buffers are never written, so they take no memory);
  // with shard_optimizer the trunk's optimiser state is split over all dp ranks (ZeRO-1);
  // sequences run one at a time on each rank (the kernels use the threads). nullptr: every
  // rank holds every expert.
  ExpertParallelTraining* ep = nullptr;
};

// Held-out evaluation: non-overlapping windows of seq_len + 1 tokens from the start of the
// held-out stream (the same windows every time for a given seq_len).
struct EvalResult {
  double loss = 0;          // mean cross-entropy per target (nats)
  double bpb = 0;           // bits per byte: total cross-entropy in bits / bytes the targets decode to
  int64_t targets = 0, bytes = 0;
  std::vector<double> maxvio;  // per MoE layer, over the whole evaluation
};

struct TrainResult {
  bool complete = false;     // every stage trained
  int64_t steps = 0, total_steps = 0;
  int64_t tokens_seen = 0;
  double train_seconds = 0;  // wall time of the training steps (all runs)
  double unigram_bpb = 0;    // baseline of the corpus (train frequencies, held-out bytes)
  std::vector<StageSummary> stages;
  std::string checkpoint_dir;
};

// What one optimiser step did (Trainer::step; the same figures go to metrics.jsonl).
struct StepStats {
  int64_t step = 0, stage = 0, seq_len = 0, tokens = 0;  // tokens: targets of the step
  double loss = 0, grad_norm = 0, lr = 0;
  double seconds = 0;          // the whole step
  double seconds_fwd_bwd = 0;  // forward + backward of every micro-batch (and balancer observation)
  double seconds_update = 0;   // clipping, optimiser, balancer update
  // Data parallel: the gradient reduction after the last backward (the exposed
  // communication; what an overlapped reduction has not finished during the backward)
  double seconds_grad_reduce = 0;
  std::vector<double> maxvio;  // per MoE layer, this step's routing (empty without a balancer)
};

class Trainer {
 public:
  // Loads the corpus and the model (fresh from init_weights, or the checkpoint with
  // --resume, refusing a missing, corrupt or mismatched one), sizes the buffers.
  Trainer(const RunConfig& run, const TrainOptions& opt);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  TrainResult run();  // trains to the end (or to --steps); writes the checkpoint
  // One iteration of run()'s loop (a step, and the stage end, evaluation or periodic
  // checkpoint that follows it); no final checkpoint. For benchmarks and embedding; a
  // k3::Error once the run is complete.
  StepStats step();

  const K3Model& model() const;
  // Bytes the threads' training records hold for the backward (model/activation_bytes.h),
  // after a step: the activation memory of one sequence per thread.
  int64_t activation_bytes() const;
  const Vocabulary& tokenizer() const;  // the run's vocabulary (RunConfig::tokenizer)
  const RunConfig& run_config() const;
  EvalResult evaluate(int64_t seq_len, int64_t max_tokens);  // held-out; max_tokens 0: all
  int64_t stage_steps(size_t stage) const;
  // The optimiser moments of every parameter in checkpoint order (collective with dp and a
  // sharded optimiser: gathered from the owners).
  std::vector<float> optimizer_state();
  // The last step's summed (and clipped) gradient, carved like the weights (collective with dp
  // and a sharded optimiser: each range gathered from its owner). For tests.
  std::vector<float> last_gradients();
  // Expert parallel: every rank's copy of every routed expert set to its owner's (collective;
  // evaluation and checkpoints do it themselves; nothing to do otherwise). For tests reading
  // model() between steps, or (root >= 0) on that rank only, e.g. to sample from the trained
  // model; release_foreign_experts() gives the others' experts back again.
  void sync_expert_weights(int root = -1);
  void release_foreign_experts();
  // Expert parallel: bytes of other ranks' routed experts resident in this rank's weight and
  // gradient buffers (mincore; whole pages inside their ranges); 0 otherwise. For tests.
  int64_t foreign_expert_resident_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The optimiser's parameter list over `w` and the gradient buffer `grads` (carved by
// w.layout()): see the assignment above; muon = false gives AdamW everywhere.
std::vector<ParamRef> optimizer_params(WeightStore& w, float* grads, bool muon);

// The end-of-run table: per stage seq_len, steps, tokens, tokens/s, held-out loss and bits
// per byte; the unigram baseline; held-out MaxVio per MoE layer after the last stage.
std::string format_summary(const TrainResult& r);

}  // namespace k3
