// The training run's state (Trainer::Impl) and one optimiser step's working figures
// (TrainStep), shared by the trainer's files. One file per purpose:
//   trainer.cpp             the public Trainer: the run loop, a step and what follows it, stages
//   trainer_setup.cpp       setup: options, corpus and vocabulary, model or checkpoint, buffers,
//                           optimiser shards (data / expert parallel, ZeRO-1), balancer
//   trainer_step.cpp        train_step: the step as a sequence of named stages
//   trainer_batch.cpp       stage 1-2: the step's plan, zeroed gradients, a micro-batch's sequences
//   trainer_forward.cpp     stage 3: forward + backward of a micro-batch (text, then images)
//   trainer_reduce.cpp      stage 4-5: gradients summed over threads and ranks; the losses
//   trainer_update.cpp      stage 6: clipping, learning rate, optimiser step, ZeRO-1 gather
//   trainer_balance.cpp     routing observed per micro-batch, reduced over ranks, the bias update
//   trainer_log.cpp         stage 7: the step's counters, metrics record and progress line;
//                           evaluation and stage records
//   trainer_eval.cpp        held-out evaluation
//   trainer_checkpoint.cpp  the checkpoint and the gathered optimiser state
//   trainer_experts.cpp     expert parallelism: gathers and releases of other ranks' experts
//   trainer_parts.cpp       optimiser parameter assignment, sharded optimiser, summary table
// Internal: nothing outside src/train includes this.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/k3_model.h"
#include "train/balancer.h"
#include "train/data.h"
#include "train/expert_sharding.h"
#include "train/metrics.h"
#include "train/model_grad.h"
#include "train/parallel.h"
#include "train/trainer.h"
#include "train/trainer_internal.h"
#include "train/trainer_vision.h"

namespace k3 {

namespace trainer_detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Tokens per second for the progress line: "12.3k" or "950".
inline std::string rate(double tps) { return tps >= 1000 ? fmt("%.1fk", tps / 1000) : fmt("%.0f", tps); }

// Runs body(i, thread) for i in [0, n): in parallel over P threads (static schedule: sequence
// i always lands on the same thread for given n and P) when par, else serially with the inner
// kernels free to use the threads. Exceptions are carried out of the parallel region.
void for_each_sequence(int64_t n, int P, bool par, const std::function<void(int64_t, int)>& body);

}  // namespace trainer_detail

// One optimiser step's shape (fixed by plan_step) and what its stages produce, in order.
struct TrainStep {
  const StageConfig* stage = nullptr;
  int64_t T = 0;           // sequence length of the stage
  int64_t nseq = 0;        // sequences per micro-batch (all ranks)
  int64_t nmicro = 0;      // micro-batches per step
  int64_t nl = 0, first = 0;  // this rank's sequences of every micro-batch: [first, first + nl)
  int64_t targets = 0;     // text targets of the step (all ranks)
  int64_t nvis = 0;        // image-text examples per micro-batch
  int64_t vtargets = 0;    // their scored targets over the step
  double scale = 0;        // 1 / (targets + vtargets): the mean loss's gradient scale
  bool par = false;        // a micro-batch's sequences on parallel threads (own gradient buffers)
  bool overlap = false;    // the gradient reduction overlaps the step's last backward
  bool weighted = false;   // long-range tasks weigh their answer targets
  trainer_detail::Clock::time_point t0;  // the step's start

  // Stage 3 (forward + backward).
  std::unique_ptr<OrderedReduction> reduction;  // the overlapped reduction, once started
  std::vector<double> part;  // [nmicro * nl * 2] per local sequence: loss_sum, aux_loss (all ranks after gather)
  int64_t long_seqs = 0;     // sequences replaced by long-range tasks (global batch)
  double vloss_sum = 0;      // image-text loss over the step
  double t_vis = 0;          // seconds in the image-text forwards and backwards
  double t_fb = 0;           // seconds from the start to the end of the last backward
  // Stages 4-5 (reductions).
  double t_reduce = 0;       // data parallel: the reduction left after the backward
  double vgnorm = 0;         // the encoder's gradient norm before clipping
  double loss_sum = 0, aux_sum = 0, loss = 0;
  // Stage 6 (update).
  trainer_detail::Clock::time_point t1;  // the update's start
  double gnorm = 0, lr = 0;
};

struct Trainer::Impl {
  // ---- The run: its file and options, data, vocabulary, model ----
  RunConfig run;
  TrainOptions opt;
  Vocabulary vocab;
  CorpusSplit data;
  double unigram_bpb = 0;
  std::string run_fp, model_json, corpus_hash;  // what a checkpoint records and a resume compares
  std::unique_ptr<K3Model> model;
  int P = 1;  // threads
  std::vector<Tensor> grads;  // [P] each [weights().size()], carved like the weights
  std::vector<std::unique_ptr<TrainScratch>> scratch;
  std::unique_ptr<ShardedOptimizer> optim;

  // ---- Data parallel (opt.dp): this rank of n_ranks ----
  // zero: ZeRO-1 (optim holds only the parameters of owner_cut[rank] .. owner_cut[rank + 1]);
  // bounds: the ranks' owned ranges of the weight and gradient buffers (whole parameters);
  // state_off: each parameter's offset in the optimiser state of all parameters (2 floats per
  // element), the checkpoint's layout.
  DataParallel* dp = nullptr;
  int rank = 0, n_ranks = 1;
  bool zero = false;
  // overlap: every rank asked for the gradient reduction overlapped with the backward
  // (--dp-overlap, plain data parallelism); threaded_rank: some rank runs P > 1 threads.
  bool overlap = false, threaded_rank = false;
  std::vector<size_t> owner_cut;
  std::vector<int64_t> bounds, state_off;
  int64_t n_trained = 0;  // parameters the optimiser trains (all ranks together)

  // ---- Expert parallel (opt.ep) ----
  // all_refs, every optimiser parameter (checkpoint order); local_refs, the indices of those
  // this rank steps (the trunk and its own experts); local_state_off: their offsets in this
  // rank's optimiser state. keep_expert: this rank's routed experts (the others' weights and
  // gradients are never written here: their pages take no memory); foreign_runs: the others'
  // experts' [begin, end) in the flat buffers, adjacent ones merged.
  ExpertParallelTraining* ep = nullptr;
  ExpertSharding shard;
  std::function<bool(int64_t)> keep_expert;
  std::vector<std::pair<int64_t, int64_t>> foreign_runs;
  std::vector<ParamRef> all_refs;
  std::vector<size_t> local_refs;
  std::vector<int64_t> local_state_off;
  std::vector<float> trunk_buf;

  // ---- Balancing ----
  std::unique_ptr<Balancer> balancer;
  LossOptions loss_opt;
  std::vector<float*> biases;  // [n_moe] e_score_correction_bias of each MoE layer
  int64_t n_moe = 0, first_moe = 0, E = 0, topk = 0;

  // ---- Progress of the run ----
  TrainState st;
  std::vector<int64_t> steps_of;  // per stage
  int64_t total_steps = 0;
  std::unique_ptr<SequenceStream> stream;
  MetricsLog metrics;
  Progress progress;
  std::string ckpt_dir;
  int64_t last_saved_step = -1;
  double session_seconds = 0;
  int64_t session_tokens = 0;
  bool begun = false;  // begin() ran
  std::vector<float> opt_state;  // the optimiser state between loading or gathering and its use

  // ---- A step's buffers (grow only) ----
  std::vector<int32_t> seqs;                     // [nl, T + 1] this rank's sequences
  std::vector<int32_t> skip_seq;                 // [T + 1] another rank's sequence (read to keep the stream global)
  std::vector<float> seq_weights, skip_weights;  // [nl, T] / [T] target weights (long tasks' answer_weight)
  std::vector<SequenceRouting> routing;
  std::vector<SequenceResult> results;
  std::unique_ptr<VisionTrainPart> vision;  // run file "vision": the encoder trained with the text
  std::vector<SequenceRouting> vrouting;
  std::vector<SequenceResult> vresults;

  struct EvalScratch {
    ForwardScratch fs;
    ForwardRecord rec;
    DecodeState ds;
    std::vector<float> logits;
  };
  std::vector<std::unique_ptr<EvalScratch>> eval_scratch;

  Impl(const RunConfig& r, const TrainOptions& o)
      : run(r), opt(o), progress(o.log ? o.log : stderr, o.log && ::isatty(::fileno(o.log)),
                                 o.quiet || !o.log || (o.dp && o.dp->rank() != 0)) {}

  // Setup (trainer_setup.cpp).
  void setup();
  void check_parallel_options();
  void load_data(const K3Config& cfg);
  void create_or_resume_model(const K3Config& cfg);
  void resolve_vocabulary(const Corpus& corpus, const K3Config& cfg);
  void load_checkpoint(const K3Config& cfg);
  void build_optimizer(const K3Config& cfg);
  void shard_experts(const K3Config& cfg, std::vector<ParamRef>& refs, std::vector<double>& lr_scale);
  void restore_optimizer_state();
  void build_balancer();

  // The run loop (trainer.cpp).
  void begin();
  void end_stage();
  TrainResult result() const;

  // One step (trainer_step.cpp) and its stages, in order.
  StepStats train_step();
  TrainStep plan_step();                                 // trainer_batch.cpp
  void zero_gradients();                                 // trainer_batch.cpp
  void assemble_micro_batch(TrainStep& s, int64_t mb);   // trainer_batch.cpp
  void forward_backward_micro_batch(TrainStep& s, int64_t mb);  // trainer_forward.cpp
  void observe_routing(const TrainStep& s);              // trainer_balance.cpp
  void reduce_gradients(TrainStep& s);                   // trainer_reduce.cpp
  void gather_losses(TrainStep& s);                      // trainer_reduce.cpp
  void reduce_routing_statistics();                      // trainer_balance.cpp
  void update_parameters(TrainStep& s);                  // trainer_update.cpp
  void update_balancer();                                // trainer_balance.cpp
  StepStats record_step(const TrainStep& s);             // trainer_log.cpp

  // Evaluation, records and checkpoints.
  EvalResult evaluate(int64_t T, int64_t max_tokens);  // trainer_eval.cpp
  void eval_and_log(bool stage_end);                   // trainer_log.cpp
  void stage_message(bool record);                     // trainer_log.cpp
  std::vector<double> step_maxvio() const;             // trainer_balance.cpp
  void save();                                         // trainer_checkpoint.cpp
  std::vector<float> gathered_optimizer_state(int root = -1);  // trainer_checkpoint.cpp

  // Expert parallelism (trainer_experts.cpp).
  void setup_expert_parallel(const K3Config& cfg);
  void sync_expert_weights(int root = -1);
  void release_foreign_experts();
  int64_t foreign_resident() const;
};

}  // namespace k3
