// The training run (see trainer.h): setup, the step loop, evaluation, checkpoints, resume.
#include "train/trainer.h"

#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/simd_target.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "io/bpe_trainer.h"
#include "io/tiktoken_config.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "model/param_specs.h"
#include "kernels/moe_exchange.h"
#include "train/balancer.h"
#include "train/data.h"
#include "train/expert_sharding.h"
#include "train/long_mix.h"
#include "train/metrics.h"
#include "train/model_grad.h"
#include "train/parallel.h"
#include "train/trainer_internal.h"
#include "train/trainer_vision.h"

namespace k3 {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The model config as a training checkpoint records and compares it: the architecture,
// serialised by this build, so a checkpoint whose config an older k3cpp wrote (before the
// released top-level fields) still resumes; quantisation, vision and token ids do not change
// what is trained.
std::string model_record(K3Config c) {
  c.model_type.clear(), c.architectures.clear();
  c.bos_token_id = c.eos_token_id = c.pad_token_id = c.media_placeholder_token_id = -1;
  c.quantization = {}, c.vision = {};
  return config_to_hf_json(c);
}
std::string model_record(const std::string& recorded, const std::string& source) {
  try {
    return model_record(parse_config(recorded, source));
  } catch (const Error&) {
    return recorded;  // unparsable: compared as it is, so it shows up as a difference
  }
}

std::string rate(double tps) { return tps >= 1000 ? fmt("%.1fk", tps / 1000) : fmt("%.0f", tps); }

// Runs body(i) for i in [0, n): in parallel over P threads (static schedule: sequence i
// always lands on the same thread for given n and P) when par, else serially with the inner
// kernels free to use the threads. Exceptions are carried out of the parallel region.
template <typename F>
void for_each_sequence(int64_t n, int P, bool par, F&& body) {
  if (!par) {
    for (int64_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  std::vector<std::exception_ptr> err(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) num_threads(P)
  for (int64_t i = 0; i < n; ++i) {
    try {
      body(i, omp_get_thread_num());
    } catch (...) {
      err[size_t(i)] = std::current_exception();
    }
  }
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

}  // namespace

struct Trainer::Impl {
  RunConfig run;
  TrainOptions opt;
  Vocabulary vocab;
  CorpusSplit data;
  double unigram_bpb = 0;
  std::string run_fp, model_json, corpus_hash;
  std::unique_ptr<K3Model> model;
  int P = 1;
  std::vector<Tensor> grads;  // [P] each [weights().size()], carved like the weights
  std::vector<std::unique_ptr<TrainScratch>> scratch;
  std::unique_ptr<ShardedOptimizer> optim;
  // Data parallel (opt.dp): this rank R of NR; zero: ZeRO-1 (optim holds only the parameters
  // of owner_cut[R] .. owner_cut[R + 1]); bounds: the ranks' owned ranges of the weight and
  // gradient buffers (whole parameters); state_off: each parameter's offset in the optimiser
  // state of all parameters (2 floats per element), the checkpoint's layout.
  DataParallel* dp = nullptr;
  int R = 0, NR = 1;
  bool zero = false;
  // overlap: every rank asked for the gradient reduction overlapped with the backward
  // (--dp-overlap, plain data parallelism); threaded_rank: some rank runs P > 1 threads.
  bool overlap = false, threaded_rank = false;
  std::vector<size_t> owner_cut;
  std::vector<int64_t> bounds, state_off;
  int64_t n_trained = 0;  // parameters the optimiser trains (all ranks together)
  // Expert parallel (opt.ep): all_refs, every optimiser parameter (checkpoint order);
  // local_refs, the indices of those this rank steps (the trunk and its own experts);
  // local_state_off: their offsets in this rank's optimiser state.
  // keep_expert: this rank's routed experts (the others' weights and gradients are never
  // written here: their pages take no memory); foreign_runs: the others' experts' [begin, end)
  // in the flat buffers, adjacent ones merged.
  ExpertParallelTraining* ep = nullptr;
  ExpertSharding shard;
  std::function<bool(int64_t)> keep_expert;
  std::vector<std::pair<int64_t, int64_t>> foreign_runs;
  std::vector<ParamRef> all_refs;
  std::vector<size_t> local_refs;
  std::vector<int64_t> local_state_off;
  std::vector<float> trunk_buf;
  std::vector<int32_t> skip_seq;
  std::unique_ptr<Balancer> balancer;
  LossOptions loss_opt;
  std::vector<float*> biases;  // [n_moe] e_score_correction_bias of each MoE layer
  int64_t n_moe = 0, first_moe = 0, E = 0, topk = 0;
  TrainState st;
  std::vector<int64_t> steps_of;  // per stage
  int64_t total_steps = 0;
  std::unique_ptr<SequenceStream> stream;
  std::vector<int32_t> seqs;
  std::vector<float> seq_weights, skip_weights;  // [nl, T] target weights (long tasks' answer_weight)
  std::vector<SequenceRouting> routing;
  std::vector<SequenceResult> results;
  std::vector<float> opt_state;
  MetricsLog metrics;
  Progress progress;
  std::string ckpt_dir;
  int64_t last_saved_step = -1;
  double session_seconds = 0;
  int64_t session_tokens = 0;
  bool begun = false;  // begin() ran
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

  void setup();
  void setup_expert_parallel(const K3Config& cfg);
  void sync_expert_weights(int root = -1);
  void release_foreign_experts();
  int64_t foreign_resident() const;
  std::vector<float> gathered_optimizer_state(int root = -1);
  void resolve_vocabulary(const Corpus& corpus, const K3Config& cfg);
  void load_checkpoint(const K3Config& cfg);
  StepStats train_step();
  void begin();
  void end_stage();
  void eval_and_log(bool stage_end);
  EvalResult evaluate(int64_t T, int64_t max_tokens);
  void save();
  void stage_message(bool record);
  TrainResult result() const;
  std::vector<double> step_maxvio() const;
};

void Trainer::Impl::setup() {
  if (opt.out_dir.empty()) fail("train: --out is required (the output directory)");
  set_num_threads(opt.threads > 0 ? opt.threads : int(run.threads));
  P = num_threads();
  dp = opt.dp;
  if (dp) R = dp->rank(), NR = dp->size();
  ep = opt.ep;
  if (ep && (!dp || NR % ep->size() != 0 || R != ep->group() * ep->size() + ep->rank()))
    fail("train: expert parallelism needs data-parallel ranks in groups of " + std::to_string(ep ? ep->size() : 0) +
         " (--ep must divide --dp's rank count)");
  for (size_t i = 0; i < run.stages.size() && NR > 1; ++i)
    if ((run.micro_batch_tokens / run.stages[i].seq_len) % NR != 0)
      fail_input(run.path, "micro_batch_tokens",
                 "holds " + std::to_string(run.micro_batch_tokens / run.stages[i].seq_len) + " sequences of stage " +
                     std::to_string(i) + " (seq_len " + std::to_string(run.stages[i].seq_len) +
                     "), which the " + std::to_string(NR) +
                     " data-parallel ranks cannot share equally: make it a multiple of seq_len x ranks");
  // Overlapping the gradient reduction with the backward changes the order in which the ranks
  // start their collectives, so every rank must take the same path; it depends on the thread
  // count (train_step), so the ranks agree on both first.
  if (dp && NR > 1 && !ep) {
    const int8_t mine[2] = {int8_t(opt.dp_overlap ? 1 : 0), int8_t(P > 1 ? 1 : 0)};
    const std::vector<int8_t> all = dp->allgatherv(mine, 2, "dp.overlap.agree");
    overlap = true;
    for (int r = 0; r < NR; ++r) overlap &= all[size_t(2 * r)] != 0, threaded_rank |= all[size_t(2 * r + 1)] != 0;
  }
  make_directories(opt.out_dir);
  ckpt_dir = (fs::path(opt.out_dir) / "checkpoint").string();
  std::error_code ec;
  const bool exists = fs::exists(ckpt_dir, ec);
  if (!opt.resume && exists)
    fail_input(ckpt_dir, "",
               "a checkpoint already exists: pass --resume to continue it, or choose another --out (a new run never "
               "overwrites a checkpoint)");
  if (opt.resume && !exists) fail_input(ckpt_dir, "", "no checkpoint to resume (run without --resume to start)");

  const K3Config cfg = load_config(run.model_config);
  if (ep) {
    if (cfg.num_experts % ep->size() != 0)
      fail_input(run.model_config, "num_experts",
                 std::to_string(cfg.num_experts) + " routed experts per layer cannot be split over --ep " +
                     std::to_string(ep->size()) + " ranks: make --ep divide it");
    const int64_t per = cfg.num_experts / ep->size();
    const int j = ep->rank();
    if (ep->size() > 1) keep_expert = [per, j](int64_t e) { return e / per == j; };
  }
  progress.message("train: " + machine_summary());  // the log's first line: CPU and SIMD target
  progress.message("train: loading corpus '" + run.data + "'");
  const Corpus corpus = load_corpus(run.data);
  resolve_vocabulary(corpus, cfg);
  const auto t_tok = Clock::now();
  data = split_and_tokenize(corpus, vocab, run.heldout_every);
  progress.message("train: tokenised " + std::to_string(data.train_docs + data.heldout_docs) + " documents with the " +
                   vocab.describe() + " [" + fmt("%.2f", seconds_since(t_tok)) + " s]");
  unigram_bpb = unigram_bits_per_byte(data, vocab);
  corpus_hash = content_hash_i32(data.train, data.heldout);
  run_fp = run_fingerprint(run);
  model_json = model_record(cfg);
  for (size_t i = 0; i < run.stages.size(); ++i) {
    const StageConfig& s = run.stages[i];
    steps_of.push_back((s.tokens + run.batch_tokens - 1) / run.batch_tokens);
    total_steps += steps_of.back();
    if (int64_t(data.heldout.size()) < s.seq_len + 1)
      fail_input(run.path, "stages[" + std::to_string(i) + "].seq_len",
                 "is longer than the held-out stream (" + std::to_string(data.heldout.size()) + " tokens)");
    // A stage too short for its long-range tasks fails now, naming the field, not at its first step.
    try {
      check_long_task_mix(s.long_tasks, [this](const std::string& t) { return vocab.encode(t); }, s.seq_len);
    } catch (const Error& e) {
      fail_input(run.path, "stages[" + std::to_string(i) + "].long_tasks", e.what());
    }
  }

  if (opt.resume) {
    load_checkpoint(cfg);
  } else {
    InitOptions io;
    io.seed = run.init_seed >= 0 ? uint64_t(run.init_seed) : run.seed;
    io.keep_expert = keep_expert;  // expert parallel: the others' experts are never drawn
    model = std::make_unique<K3Model>(init_weights(cfg, io));
    st.seed = run.seed;
    st.run_json = run_fp;
    st.model_json = model_json;
    st.corpus_hash = corpus_hash;
    for (size_t i = 0; i < run.stages.size(); ++i) {
      StageSummary s;
      s.name = run.stages[i].name;
      s.seq_len = run.stages[i].seq_len;
      s.steps = steps_of[i];
      st.stages.push_back(s);
    }
  }

  if (run.vision.enabled && NR > 1)
    fail_input(run.path, "vision", "data parallelism (--dp) of a run with images is not supported yet (every rank would "
               "train every image-text example)");
  if (run.vision.enabled) {
    vision = std::make_unique<VisionTrainPart>(run, cfg, vocab, P, run.init_seed >= 0 ? uint64_t(run.init_seed) : run.seed);
    if (opt.resume) {  // the encoder as saved (f32: bitwise), and where its example stream stopped
      vision->load(ckpt_dir);
      if (vision->params_hash() != st.vision_hash)
        fail_input((fs::path(ckpt_dir) / "vision.safetensors").string(), "",
                   "content hash " + vision->params_hash() + " does not match the " + st.vision_hash +
                       " recorded in train_state.safetensors (corrupted or replaced encoder)");
      vision->set_cursor(st.vision_cursor);
    }
  }
  const int64_t total = model->weights().size();
  // One gradient buffer and scratch per thread; expert parallel runs its sequences one at a
  // time (the kernels take the threads), so one of each.
  // Expert parallel: mapped, so the other ranks' experts' ranges, never written, take no memory.
  for (int t = 0; t < (opt.ep ? 1 : P); ++t) {
    grads.push_back(opt.ep ? Tensor::zeros_mapped(DType::F32, {total}) : Tensor::zeros(DType::F32, {total}));
    scratch.push_back(make_train_scratch());
  }
  OptimizerOptions oo;
  oo.beta1 = run.beta1, oo.beta2 = run.beta2, oo.weight_decay = run.weight_decay, oo.muon_momentum = run.muon_momentum;
  std::vector<ParamRef> refs = optimizer_params(model->weights(), grads[0].data<float>(), run.optimizer == "muon");
  std::vector<double> lr_scale;
  if (vision)
    for (ParamRef& p : vision->optimizer_params(run.optimizer == "muon")) refs.push_back(p);
  for (const ParamRef& p : refs)
    lr_scale.push_back(p.name.ends_with(".block_sparse_moe.gate.weight") ? run.router_lr_scale : 1.0);
  state_off.assign(refs.size() + 1, 0);
  for (size_t i = 0; i < refs.size(); ++i) state_off[i + 1] = state_off[i] + 2 * refs[i].rows * refs[i].cols;
  n_trained = state_off.back() / 2;
  owner_cut = partition_params(refs, NR);
  bounds.assign(size_t(NR) + 1, total);
  bounds[0] = 0;
  for (int r = 1; r < NR; ++r)
    bounds[size_t(r)] = owner_cut[size_t(r)] < refs.size() ? refs[owner_cut[size_t(r)]].g - grads[0].data<float>() : total;
  zero = dp && opt.shard_optimizer && NR > 1;
  if (ep) {
    if (vision) fail_input(run.path, "vision", "expert parallelism (--ep) of a run with images is not supported");
    all_refs = refs;
    shard.build(refs, grads[0].data<float>(), total, cfg.num_experts, ep->size(), ep->rank(), ep->group(), NR);
    if (zero) {  // ZeRO-1 of the trunk over all NR ranks: whole parameters, as data parallelism cuts them
      std::vector<ParamRef> trunk_refs;
      for (size_t i = 0; i < refs.size(); ++i)
        if (shard.owner[i] < 0) trunk_refs.push_back(refs[i]);
      shard.shard_trunk(refs, grads[0].data<float>(), partition_params(trunk_refs, NR));
    }
    std::vector<std::pair<int64_t, int64_t>> foreign;
    for (size_t i = 0; i < refs.size(); ++i)
      if (shard.owner[i] >= 0 && shard.owner[i] != ep->rank()) {
        const int64_t b = refs[i].w - model->weights().data();
        foreign.emplace_back(b, b + refs[i].rows * refs[i].cols);
      }
    std::sort(foreign.begin(), foreign.end());
    for (const auto& [b, e] : foreign)  // adjacent ones (only alignment padding between) merged
      if (!foreign_runs.empty() && b <= (foreign_runs.back().second + ParamLayout::kParamAlign - 1) /
                                            ParamLayout::kParamAlign * ParamLayout::kParamAlign)
        foreign_runs.back().second = std::max(foreign_runs.back().second, e);
      else
        foreign_runs.emplace_back(b, e);
    if (opt.resume && keep_expert) {  // every rank read the same trunk (rank 0 checked the whole hash)
      std::vector<float> t(size_t(shard.trunk_elems));
      shard.pack(model->weights().data(), t.data());
      const std::string h = content_hash(t.data(), t.size() * sizeof(float));
      dp->check_identical(h.data(), h.size(), "resumed trunk weights");
    }
    std::vector<ParamRef> mine;
    std::vector<double> mine_scale;
    local_state_off.assign(1, 0);
    for (size_t i = 0; i < refs.size(); ++i)
      if (shard.mine(i)) {
        local_refs.push_back(i);
        mine.push_back(refs[i]);
        mine_scale.push_back(lr_scale[i]);
        local_state_off.push_back(local_state_off.back() + 2 * refs[i].rows * refs[i].cols);
      }
    refs = std::move(mine);
    lr_scale = std::move(mine_scale);
    trunk_buf.resize(size_t(shard.trunk_elems));
  }
  if (zero && !ep) {
    const auto b = int64_t(owner_cut[size_t(R)]), e = int64_t(owner_cut[size_t(R) + 1]);
    refs = std::vector<ParamRef>(refs.begin() + b, refs.begin() + e);
    lr_scale = std::vector<double>(lr_scale.begin() + b, lr_scale.begin() + e);
  }
  optim = std::make_unique<ShardedOptimizer>(std::move(refs), oo, 4 * P, lr_scale);
  if (opt.resume) {
    if (int64_t(opt_state.size()) != state_off.back()) fail_input(ckpt_dir, "train_state", "optimizer state size");
    if (zero && !ep)  // this rank's parameters' moments (the checkpoint holds every parameter's)
      opt_state = std::vector<float>(opt_state.begin() + state_off[owner_cut[size_t(R)]],
                                     opt_state.begin() + state_off[owner_cut[size_t(R) + 1]]);
    if (ep) {  // the trunk's (or its ZeRO-1 share) and this rank's experts' moments: any layout resumes any checkpoint
      std::vector<float> mine;
      for (size_t i : local_refs) mine.insert(mine.end(), opt_state.begin() + state_off[i], opt_state.begin() + state_off[i + 1]);
      opt_state = std::move(mine);
    }
    optim->set_state(opt_state);
    optim->set_steps(st.optimizer_steps);
    opt_state.clear();
    opt_state.shrink_to_fit();
    last_saved_step = st.step;
  }

  const ModelDims& dims = model->dims();
  first_moe = std::min(dims.first_moe, dims.L);
  n_moe = dims.L - first_moe;
  E = cfg.num_experts, topk = cfg.num_experts_per_token;
  if (ep) setup_expert_parallel(cfg);
  if (n_moe > 0) {
    if (run.balancer == "qb-hist" || run.balancer == "qb-exact") {
      QuantileBalancerOptions qo;
      qo.exact = run.balancer == "qb-exact";
      qo.bins = run.qb_bins;
      balancer = std::make_unique<QuantileBalancer>(n_moe, E, topk, qo);
    } else if (run.balancer == "sign") {
      balancer = std::make_unique<SignBalancer>(n_moe, E, topk, run.sign_u);
    } else {
      balancer = std::make_unique<NoBalancer>(n_moe, E, topk, run.balancer);
    }
    for (int64_t l = 0; l < n_moe; ++l)
      biases.push_back(model->weights().param(layer_prefix(first_moe + l) + "block_sparse_moe.gate.e_score_correction_bias"));
  }
  loss_opt.aux_alpha = run.balancer == "aux" ? run.aux_alpha : 0.0;
}

// The run's vocabulary (RunConfig::tokenizer): the byte tokenizer, a given tiktoken
// directory, or (train) the checkpoint's on --resume, else one learnt now from the training
// documents only and saved as OUT/tokenizer (each file atomically), then read back from there
// so the run trains with exactly what it saved. The model config must hold every id.
void Trainer::Impl::resolve_vocabulary(const Corpus& corpus, const K3Config& cfg) {
  const TokenizerConfig& tc = run.tokenizer;
  if (tc.kind == "bytes") {
    vocab = Vocabulary();
  } else if (tc.kind == "tiktoken") {
    vocab = Vocabulary::load_tiktoken_dir(tc.dir);
  } else if (opt.resume) {
    if (!Vocabulary::dir_has_tiktoken(ckpt_dir))
      fail_input((fs::path(ckpt_dir) / "tiktoken.model").string(), "",
                 "missing: the run file's tokenizer is a trained vocabulary but the checkpoint has none (was it trained "
                 "with \"tokenizer\": \"bytes\"?)");
    vocab = Vocabulary::load_tiktoken_dir(ckpt_dir);
  } else {
    const int64_t n = tc.vocab_size > 0 ? tc.vocab_size : cfg.vocab_size;
    if (n > cfg.vocab_size)
      fail_input(run.model_config, "vocab_size",
                 std::to_string(cfg.vocab_size) + " is below the " + std::to_string(n) +
                     " ids of the vocabulary the run file trains (tokenizer.vocab_size in " + run.path + ")");
    if (n < 256 + kReservedSpecialIds)
      fail_input(run.model_config, "vocab_size",
                 std::to_string(cfg.vocab_size) + " leaves no room for a trained vocabulary (at least " +
                     std::to_string(256 + kReservedSpecialIds) +
                     " ids: 256 byte tokens and K3's 256 special ids); raise it, or set \"tokenizer\": \"bytes\" in " +
                     run.path);
    const auto t0 = Clock::now();
    BpeTrainOptions bo;
    bo.base_vocab = int32_t(n - kReservedSpecialIds);
    bo.min_frequency = tc.min_frequency;
    const DocumentSplit docs = split_documents(corpus, run.heldout_every, true);
    const std::string dir = (fs::path(opt.out_dir) / "tokenizer").string();
    if (R != 0) {  // data parallel: rank 0 learns and writes the vocabulary, the others read it
      dp->barrier("tokenizer.written");
      vocab = Vocabulary::load_tiktoken_dir(dir);
    } else {
      const BpeTrainResult r = train_bpe(docs.train, bo);  // the held-out documents are never seen
      write_tokenizer_dir(dir, r.ranks);
      if (dp) dp->barrier("tokenizer.written");
      vocab = Vocabulary::load_tiktoken_dir(dir);
      const std::string early =
          r.exhausted ? ", stopped early: no pair left occurring " + std::to_string(tc.min_frequency) + "+ times" : "";
      progress.message("train: vocabulary of " + std::to_string(vocab.vocab_size()) + " ids (" +
                       std::to_string(r.merges) + " merges" + early + ") learnt from the " +
                       std::to_string(docs.train.size()) + " training documents -> " + dir + " [" +
                       fmt("%.2f", seconds_since(t0)) + " s]");
    }
  }
  if (vocab.vocab_size() > cfg.vocab_size)
    fail_input(run.model_config, "vocab_size",
               std::to_string(cfg.vocab_size) + " is below the vocabulary's " + std::to_string(vocab.vocab_size()) +
                   " ids (" + vocab.describe() + ")");
}

// --resume: every check that can refuse runs before anything is written.
void Trainer::Impl::load_checkpoint(const K3Config& cfg) {
  const std::string tsp = (fs::path(ckpt_dir) / "train_state.safetensors").string();
  const ModelDir md = open_model_dir(ckpt_dir);
  if (!is_file(tsp)) fail_input(tsp, "", "missing: " + ckpt_dir + " is not a complete training checkpoint");
  // Images on one side only: said before the optimiser state's size would be.
  const bool has_vision = is_file((fs::path(ckpt_dir) / "vision.safetensors").string());
  if (run.vision.enabled != has_vision)
    fail_input(tsp, "", has_vision ? "the checkpoint was trained with images (vision.safetensors) but the run file " +
                                         run.path + " has no \"vision\"; the checkpoint was left as it is"
                                   : "the checkpoint was trained without images but the run file " + run.path +
                                         " has \"vision\"; the checkpoint was left as it is");
  int64_t expect = 0;
  {
    const ParamLayout lay(cfg, ExpertStorage::Plain);
    for (const ParamSpec& s : lay.specs())
      if (s.name.find("gate.e_score_correction_bias") == std::string::npos) expect += 2 * s.numel();
    // A run with images: the encoder's moments follow (every encoder tensor is trained).
    if (run.vision.enabled) expect += 2 * VisionLayout(resolve_vision_dims(cfg, run.model_config)).total;
  }
  st = load_train_state(tsp, opt_state, expect);
  if (run.vision.enabled && st.vision_hash.empty())
    fail_input(tsp, "vision_hash", "missing: the checkpoint holds an encoder but no record of its training state");
  st.model_json = model_record(st.model_json, tsp);
  const std::string diff = compare_fingerprint(st, run_fp, model_json, corpus_hash);
  if (!diff.empty())
    fail_input(tsp, "", "does not match the run file " + run.path + ": " + diff + "; the checkpoint was left as it is");
  if (model_record(md.config) != st.model_json)
    fail_input(md.config_path, "", "differs from the model config recorded in train_state.safetensors (replaced or corrupted checkpoint)");
  {
    const Vocabulary saved = Vocabulary::load_dir(ckpt_dir);
    if (saved.identity() != vocab.identity())
      fail_input(ckpt_dir, saved.is_bytes() ? "tokenizer.json" : "tiktoken.model",
                 "the checkpoint's " + saved.describe() + " differs from the " + vocab.describe() +
                     " this run trains with");
  }
  if (st.stages.size() != run.stages.size() || st.stage > int64_t(run.stages.size()) ||
      (st.stage < int64_t(run.stages.size()) && st.stage_step > steps_of[size_t(st.stage)]))
    fail_input(tsp, "stage", "the saved stage position does not fit the run's stages");
  LoadOptions lo;
  lo.dequantize_experts = true;
  // Expert parallel: rank 0 loads the whole model to check its hash, then gives the other
  // ranks' experts back; the others never convert them.
  if (keep_expert && R != 0) lo.keep_expert = keep_expert, lo.log = [](const std::string&) {};
  model = std::make_unique<K3Model>(load_model(md, lo));
  if (!lo.keep_expert) {
    const std::string h = content_hash(model->weights().data(), size_t(model->weights().size()) * sizeof(float));
    if (h != st.weights_hash)
      fail_input(ckpt_dir, "weights", "content hash " + h + " does not match the " + st.weights_hash +
                                          " recorded in train_state.safetensors (corrupted or replaced weights)");
  }
  if (keep_expert && R == 0) model->weights().release_routed_experts(keep_expert);
}

std::vector<double> Trainer::Impl::step_maxvio() const {
  std::vector<double> mv;
  if (!balancer) return mv;
  for (auto& l : balancer->last_loads()) mv.push_back(max_violation(l.data(), E));
  return mv;
}

StepStats Trainer::Impl::train_step() {
  const StageConfig& sc = run.stages[size_t(st.stage)];
  const int64_t T = sc.seq_len, nseq = run.micro_batch_tokens / T, nmicro = run.batch_tokens / run.micro_batch_tokens;
  // Data parallel: this rank trains sequences [first, first + nl) of every micro-batch; every
  // rank reads the whole micro-batch from the stream, so the stream position stays global.
  const int64_t nl = nseq / NR, first = R * nl;
  const int64_t targets = nmicro * nseq * T;
  const auto t0 = Clock::now();
  // Image-text examples of the whole step, prepared first: their scored targets join the
  // text's in the one mean loss (scale).
  const int64_t nvis = vision ? run.vision.examples_per_micro_batch : 0;
  const int64_t vtargets = vision ? vision->prepare(nmicro * nvis) : 0;
  if (vision) vision->zero_grads();
  const double scale = 1.0 / double(targets + vtargets);
  double vloss_sum = 0, t_vis = 0;
  const int64_t total = model->weights().size();
  const bool par = P > 1 && nl > 1 && !ep;  // expert parallel: one sequence at a time (MPI from the main thread)
  // The reduction overlaps the last sequence's backward where a rank adds every sequence into
  // one buffer (one thread, or one sequence per micro-batch): only then is a range final when
  // the backward leaves it. With sequences on several threads the buffers are summed after the
  // backward (below), so nothing is final before; the ranks agree (setup) since the reduction's
  // collectives start in another order.
  const bool overlap_step = overlap && (!threaded_rank || nl == 1);
  std::unique_ptr<OrderedReduction> reduction;
  const GradRangeDone on_done = [&reduction](int64_t lo, int64_t hi) {
    reduction->ready(lo, hi);
    reduction->poll();
  };
  if (ep) ep->begin_step();
  // Zero the gradient buffers (each thread its own: first touch stays local).
  if (ep) {  // the trunk only: the own experts' are zeroed by begin_step, the others' never touched
    float* g = grads[0].data<float>();
    for (const auto& [b, e] : shard.trunk) std::memset(g + b, 0, sizeof(float) * size_t(e - b));
  } else {
#pragma omp parallel for schedule(static) num_threads(P)
    for (int t = 0; t < int(grads.size()); ++t) std::memset(grads[size_t(t)].data<float>(), 0, sizeof(float) * size_t(total));
  }

  seqs.resize(size_t(nl * (T + 1)));
  skip_seq.resize(size_t(T + 1));
  const bool weighted = sc.long_tasks.active() && sc.long_tasks.answer_weight != 1.0;
  if (weighted) seq_weights.resize(size_t(nl * T)), skip_weights.resize(size_t(T));
  routing.resize(size_t(nl));
  results.resize(size_t(nl));
  std::vector<double> part(size_t(2 * nmicro * nl));  // per local sequence: loss_sum, aux_loss
  int64_t long_seqs = 0;  // of the global batch (every rank forms every sequence's data)
  const TextEncoder encode = [this](const std::string& text) { return vocab.encode(text); };
  for (int64_t mb = 0; mb < nmicro; ++mb) {
    for (int64_t s = 0; s < nseq; ++s) {
      const bool mine = s >= first && s < first + nl;
      int32_t* seq = mine ? seqs.data() + (s - first) * (T + 1) : skip_seq.data();
      float* wt = !weighted ? nullptr : mine ? seq_weights.data() + (s - first) * T : skip_weights.data();
      stream->next(seq);  // advances even when replaced: the data position never depends on the mix
      long_seqs += mix_long_sample(sc.long_tasks, encode, run.seed, st.step, mb * nseq + s, T, seq, wt);
    }
    {
      // Expert parallel: the MoE layers' training forwards and backwards exchange rows with
      // the experts' owners (kernels/moe_exchange.h) for these sequences only.
      struct ExchangeScope {
        explicit ExchangeScope(ExpertParallelTraining* e) { if (e) set_expert_train_exchange(e->exchange()); }
        ~ExchangeScope() { set_expert_train_exchange(nullptr); }
      } scope(ep);
      // The step's last backward: the reduction starts on each range as the backward finishes
      // it (no other collective runs before it ends, after the loop).
      if (overlap_step && mb == nmicro - 1)
        reduction = dp->begin_reduce_sum_ordered(grads[0].data<float>(), total, bounds, !zero, "grad.reduce");
      for_each_sequence(nl, P, par, [&](int64_t s, int tid) {
        LossOptions lo = loss_opt;
        if (weighted) lo.target_weight = seq_weights.data() + s * T;
        const GradRangeDone* done = reduction && s == nl - 1 ? &on_done : nullptr;
        K3_ASSERT(!done || tid == 0, "train: an overlapped reduction needs the sequences in one buffer");
        results[size_t(s)] = forward_backward(*model, seqs.data() + s * (T + 1), T, scale, grads[size_t(tid)].data<float>(),
                                              *scratch[size_t(tid)], lo, balancer ? &routing[size_t(s)] : nullptr, done);
      });
    }
    for (int64_t s = 0; s < nl; ++s)
      part[size_t(2 * (mb * nl + s))] = results[size_t(s)].loss_sum, part[size_t(2 * (mb * nl + s) + 1)] = results[size_t(s)].aux_loss;
    if (vision) {
      const auto tv = Clock::now();
      vrouting.resize(size_t(nvis));
      vresults.resize(size_t(nvis));
      for_each_sequence(nvis, P, P > 1 && nvis > 1, [&](int64_t s, int tid) {
        vresults[size_t(s)] = vision->run(*model, mb * nvis + s, tid, scale, grads[size_t(tid)].data<float>(),
                                          *scratch[size_t(tid)], loss_opt, balancer ? &vrouting[size_t(s)] : nullptr);
      });
      for (int64_t s = 0; s < nvis; ++s) vloss_sum += vresults[size_t(s)].loss_sum;
      t_vis += seconds_since(tv);
    }
    if (balancer) {
      // Per layer, sequences in order (layers are independent in the balancer).
#pragma omp parallel for schedule(static) num_threads(P)
      for (int64_t l = 0; l < n_moe; ++l)
        for (int64_t s = 0; s < nl; ++s) {
          const SequenceRouting& r = routing[size_t(s)];
          balancer->observe(l, r.scores[size_t(l)].data(), r.bias[size_t(l)].data(), r.topk[size_t(l)].data(), r.T);
        }
      if (vision)  // the image-text sequences' routing too: the balancer sees every token it trains on
#pragma omp parallel for schedule(static) num_threads(P)
        for (int64_t l = 0; l < n_moe; ++l)
          for (int64_t s = 0; s < nvis; ++s) {
            const SequenceRouting& r = vrouting[size_t(s)];
            balancer->observe(l, r.scores[size_t(l)].data(), r.bias[size_t(l)].data(), r.topk[size_t(l)].data(), r.T);
          }
    }
  }
  const double t_fb = seconds_since(t0);
  // Sum the per-thread gradients into buffer 0, in thread order (deterministic).
  float* g0 = grads[0].data<float>();
  if (par) {
    const int64_t chunk = 1 << 14;
#pragma omp parallel for schedule(static) num_threads(P)
    for (int64_t c0 = 0; c0 < total; c0 += chunk) {
      const int64_t c1 = std::min(total, c0 + chunk);
      for (int t = 1; t < P; ++t) {
        const float* gt = grads[size_t(t)].data<float>();
        for (int64_t i = c0; i < c1; ++i) g0[i] += gt[i];
      }
    }
  }
  // The step's losses in the order one process sums them: micro-batch, then sequence (the
  // ranks' sequences of a micro-batch follow each other in rank order).
  double t_reduce = 0;  // the reduction's time after the backward (all of it unless overlapped)
  if (dp) {
    // The gradients, summed in rank order (((g_0 + g_1) + g_2) ...), the order in which one
    // process of NR threads sums its thread buffers above.
    const auto tr = Clock::now();
    if (reduction) {
      reduction->finish();
    } else if (ep) {
      // The trunk as data parallelism reduces it (packed: the routed experts are not in it);
      // the experts on their owners, summed in the same rank order.
      // Under ZeRO-1 only each rank's owned trunk parameters are summed (the rest of the
      // unpacked trunk is left partial: nobody steps it here).
      shard.pack(g0, trunk_buf.data());
      dp->reduce_sum_ordered(trunk_buf.data(), shard.trunk_elems, shard.trunk_bounds, !zero, "grad.reduce");
      shard.unpack(trunk_buf.data(), g0);
      ep->reduce_gradients();
    } else {
      dp->reduce_sum_ordered(g0, total, bounds, !zero, "grad.reduce");
    }
    t_reduce = seconds_since(tr);
    // Then the losses, ranks in order (after the reduction: none may start while it runs).
    part = dp->allgatherv(part.data(), part.size(), "loss.gather");
    if (balancer) balancer->reduce_across(*dp);
  }
  double loss_sum = 0, aux_sum = 0;
  for (int64_t mb = 0; mb < nmicro; ++mb)
    for (int r = 0; r < NR; ++r)
      for (int64_t s = 0; s < nl; ++s) {
        const size_t i = size_t(2 * ((int64_t(r) * nmicro + mb) * nl + s));
        loss_sum += part[i], aux_sum += part[i + 1];
      }
  double vgnorm = 0;
  if (vision) {
    vision->reduce_grads();
    vgnorm = vision->grad_norm();
  }
  const double loss = (loss_sum + vloss_sum) / double(targets + vtargets);
  if (!std::isfinite(loss))
    fail("train: the loss is " + fmt("%g", loss) + " at step " + std::to_string(st.step + 1) +
         " (diverged); the last checkpoint is kept: lower the learning rate and resume or restart");
  const auto t1 = Clock::now();
  double gnorm;
  if (ep) {  // every parameter's squared norm in parameter order: the experts' from their owners
    const std::vector<double> mine_sq = param_sq_norms(optim->params());
    std::vector<double> local_sq(all_refs.size(), 0.0);
    for (size_t j = 0; j < local_refs.size(); ++j) local_sq[local_refs[j]] = mine_sq[j];
    gnorm = norm_of_sq_norms(shard.assemble<double>(
        *dp, all_refs.size(), [](size_t) { return size_t(1); }, [&](size_t i) { return &local_sq[i]; }, "grad.norm"));
    clip_grads_to(optim->params(), gnorm, run.grad_clip);
  } else if (zero) {  // each rank holds the summed gradients of its own parameters only
    const std::vector<double> sq = param_sq_norms(optim->params());
    gnorm = norm_of_sq_norms(dp->allgatherv(sq.data(), sq.size(), "grad.norm"));
    clip_grads_to(optim->params(), gnorm, run.grad_clip);
  } else {
    gnorm = clip_grad_norm(optim->params(), run.grad_clip);
  }
  const int64_t nsteps = steps_of[size_t(st.stage)];
  const double lr = wsd_lr(st.stage_step, nsteps, sc.lr_peak, sc.lr_end, sc.warmup_steps,
                           std::llround(sc.decay_frac * double(nsteps)));
  optim->step(lr);
  if (zero && ep) {  // the trunk's owners' updates to every rank (packed: no expert range is touched)
    shard.pack(model->weights().data(), trunk_buf.data());
    dp->allgather_ranges(trunk_buf.data(), shard.trunk_bounds, "param.allgather");
    shard.unpack(trunk_buf.data(), model->weights().data());
  } else if (zero) {
    dp->allgather_ranges(model->weights().data(), bounds, "param.allgather");
  }
  if (balancer) balancer->update(biases);  // QB: the new biases route the next step
  if (dp && balancer) {
    std::vector<float> all_bias;
    for (float* b : biases) all_bias.insert(all_bias.end(), b, b + E);
    dp->check_identical(all_bias.data(), all_bias.size() * sizeof(float), "router biases (e_score_correction_bias)");
  }
  const double dt = seconds_since(t0), t_opt = seconds_since(t1);

  st.step++, st.stage_step++;
  st.tokens_seen += targets;
  st.train_seconds += dt;
  st.optimizer_steps = optim->steps();
  StageSummary& ss = st.stages[size_t(st.stage)];
  ss.steps_done++, ss.tokens += targets, ss.train_seconds += dt, ss.last_loss = loss;
  session_seconds += dt, session_tokens += targets;

  const bool stage_end = st.stage_step == nsteps;
  const bool eval_step = run.eval_every > 0 && st.step % run.eval_every == 0;
  const std::vector<double> mv = step_maxvio();
  if (st.step % run.log_every == 0 || stage_end || st.step == 1) {
    json j = {{"type", "step"},         {"step", st.step}, {"stage", st.stage}, {"stage_name", sc.name},
              {"seq_len", T},           {"loss", loss},    {"lr", lr},          {"grad_norm", gnorm},
              {"tokens", st.tokens_seen}, {"tokens_per_s", double(targets) / dt}, {"seconds", dt}, {"seconds_fwd_bwd", t_fb},
              {"seconds_update", t_opt},  {"maxvio", mv}};
    if (dp) j["seconds_grad_reduce"] = t_reduce;  // the gradient reduction left after the backward
    if (loss_opt.aux_alpha > 0) j["aux_loss"] = aux_sum / double(nmicro * nseq);
    if (sc.long_tasks.active()) j["long_task_seqs"] = long_seqs;  // sequences replaced by long-range tasks
    if (vision) {
      j["text_loss"] = loss_sum / double(targets);
      j["vision_loss"] = vloss_sum / double(std::max<int64_t>(vtargets, 1));
      j["vision_targets"] = vtargets;
      j["vision_grad_norm"] = vgnorm;  // the encoder and projector, before clipping
      j["seconds_vision"] = t_vis;     // forward + backward of the image-text sequences
      const auto [enc_s, enc_n] = vision->take_encoder_time();
      j["encoder_thread_seconds"] = enc_s;  // the encoder's forward + backward, summed over threads
      j["encoder_images"] = enc_n;
    }
    if (balancer && (stage_end || eval_step || st.step == 1)) j["loads"] = balancer->last_loads();
    metrics.write(j);
  }
  double mvmax = 0;
  for (double v : mv) mvmax = std::max(mvmax, v);
  int64_t remaining = 0;
  for (size_t i = size_t(st.stage); i < steps_of.size(); ++i)
    remaining += (steps_of[i] - (i == size_t(st.stage) ? st.stage_step : 0)) * run.batch_tokens;
  const double tps = session_tokens / std::max(session_seconds, 1e-9);
  progress.update("[" + std::to_string(st.stage + 1) + "/" + std::to_string(run.stages.size()) + " " + sc.name + " T=" +
                      std::to_string(T) + "] step " + std::to_string(st.step) + "/" + std::to_string(total_steps) +
                      " | loss " + fmt("%.4f", loss) + " | lr " + fmt("%.2e", lr) + " | MaxVio " + fmt("%.2f", mvmax) +
                      " | " + rate(double(targets) / dt) + " tok/s | ETA " + format_duration(double(remaining) / tps),
                  stage_end || st.step == 1);
  StepStats out;
  out.step = st.step, out.stage = st.stage, out.seq_len = T, out.tokens = targets;
  out.loss = loss, out.grad_norm = gnorm, out.lr = lr;
  out.seconds = dt, out.seconds_fwd_bwd = t_fb, out.seconds_update = t_opt, out.seconds_grad_reduce = t_reduce;
  out.maxvio = mv;
  return out;
}

EvalResult Trainer::Impl::evaluate(int64_t T, int64_t max_tokens) {
  // Expert parallel: every rank evaluates its windows with every expert, gathered for the
  // evaluation and given back after it.
  sync_expert_weights();
  struct Release {
    Impl* m;
    ~Release() { m->release_foreign_experts(); }
  } release{this};
  const int64_t avail = T > 0 ? (int64_t(data.heldout.size()) - 1) / T : 0;
  if (avail < 1)
    fail("evaluate: the held-out stream (" + std::to_string(data.heldout.size()) + " tokens) holds no window of " +
         std::to_string(T) + " + 1 tokens");
  const int64_t n = max_tokens > 0 ? std::min(avail, (max_tokens + T - 1) / T) : avail;
  while (int64_t(eval_scratch.size()) < P) eval_scratch.push_back(std::make_unique<EvalScratch>());
  const int64_t V = model->dims().V;
  std::vector<double> nats(size_t(n), 0.0);
  std::vector<int64_t> bytes(size_t(n), 0);
  std::vector<std::vector<int64_t>> loads(size_t(P), std::vector<int64_t>(size_t(n_moe * E), 0));
  // Data parallel: rank R evaluates windows [w0, w1); the per-window figures are gathered, so
  // the totals are summed in window order as one process sums them.
  const int64_t w0 = n * R / NR, w1 = n * (R + 1) / NR;
  for_each_sequence(w1 - w0, P, P > 1 && w1 - w0 > 1, [&](int64_t i, int tid) {
    const int64_t w = w0 + i;
    EvalScratch& es = *eval_scratch[size_t(tid)];
    const int32_t* ids = data.heldout.data() + w * T;
    es.ds.reset(model->dims());
    es.logits.resize(size_t(T * V));
    model->forward(es.logits.data(), ids, T, es.ds, es.fs, {}, &es.rec);
    double sum = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float* row = es.logits.data() + t * V;
      float mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, row[v]);
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v] - mx));
      const int32_t target = ids[t + 1];
      sum += std::log(z) + double(mx) - double(row[target]);
    }
    nats[size_t(w)] = sum;
    bytes[size_t(w)] = target_bytes(ids, T, vocab.token_bytes());
    for (int64_t l = 0; l < n_moe; ++l)
      count_loads(loads[size_t(tid)].data() + l * E, es.rec.layers[size_t(first_moe + l)].routing.idx.data(), T, topk, E);
  });
  if (dp) {
    std::vector<double> mine(nats.begin() + w0, nats.begin() + w1);
    nats = dp->allgatherv(mine.data(), mine.size(), "eval.gather");
    std::vector<int64_t> mb(bytes.begin() + w0, bytes.begin() + w1);
    bytes = dp->allgatherv(mb.data(), mb.size(), "eval.gather");
    for (int t = 1; t < P; ++t)
      for (size_t j = 0; j < loads[0].size(); ++j) loads[0][j] += loads[size_t(t)][j];
    for (int t = 1; t < P; ++t) std::fill(loads[size_t(t)].begin(), loads[size_t(t)].end(), 0);
    dp->allreduce_sum_i64(loads[0].data(), int64_t(loads[0].size()), "eval.loads");
  }
  EvalResult r;
  double total = 0;
  for (int64_t w = 0; w < n; ++w) total += nats[size_t(w)], r.bytes += bytes[size_t(w)];
  r.targets = n * T;
  r.loss = total / double(r.targets);
  r.bpb = r.bytes > 0 ? total / std::log(2.0) / double(r.bytes) : 0;
  for (int64_t l = 0; l < n_moe; ++l) {
    std::vector<int64_t> sum(size_t(E), 0);
    for (int t = 0; t < P; ++t)
      for (int64_t j = 0; j < E; ++j) sum[size_t(j)] += loads[size_t(t)][size_t(l * E + j)];
    r.maxvio.push_back(max_violation(sum.data(), E));
  }
  return r;
}

void Trainer::Impl::eval_and_log(bool stage_end) {
  const StageConfig& sc = run.stages[size_t(st.stage)];
  const auto t0 = Clock::now();
  const EvalResult r = evaluate(sc.seq_len, run.eval_tokens);
  const double secs = seconds_since(t0);
  if (stage_end) {
    StageSummary& ss = st.stages[size_t(st.stage)];
    ss.evaluated = true, ss.eval_loss = r.loss, ss.eval_bpb = r.bpb, ss.eval_maxvio = r.maxvio;
  }
  metrics.write({{"type", "eval"}, {"step", st.step}, {"stage", st.stage}, {"seq_len", sc.seq_len}, {"stage_end", stage_end},
                 {"loss", r.loss}, {"bpb", r.bpb}, {"targets", r.targets}, {"bytes", r.bytes}, {"maxvio", r.maxvio},
                 {"seconds", secs}});
  double mvmax = 0;
  for (double v : r.maxvio) mvmax = std::max(mvmax, v);
  progress.message("eval  step " + std::to_string(st.step) + " (T=" + std::to_string(sc.seq_len) + ", " +
                   std::to_string(r.targets) + " held-out tokens): loss " + fmt("%.4f", r.loss) + ", " +
                   fmt("%.3f", r.bpb) + " bits/byte (unigram " + fmt("%.3f", unigram_bpb) + "), max MaxVio " +
                   fmt("%.2f", mvmax) + " [" + fmt("%.1f", secs) + " s]");
}

// A stage begins: the log line, and (record) the metrics record. A run resumed exactly at a
// stage boundary already has the record (written before that checkpoint).
void Trainer::Impl::stage_message(bool record) {
  const StageConfig& sc = run.stages[size_t(st.stage)];
  const int64_t n = steps_of[size_t(st.stage)];
  progress.message("stage " + std::to_string(st.stage + 1) + "/" + std::to_string(run.stages.size()) + " '" + sc.name +
                   "': seq_len " + std::to_string(sc.seq_len) + ", " + std::to_string(n) + " steps (" +
                   std::to_string(n * run.batch_tokens) + " tokens), lr " + fmt("%.2e", sc.lr_peak) + " -> " +
                   fmt("%.2e", sc.lr_end) + " (warmup " + std::to_string(sc.warmup_steps) + ", decay " +
                   std::to_string(std::llround(sc.decay_frac * double(n))) + " steps)");
  if (record)
    metrics.write({{"type", "stage"}, {"step", st.step}, {"stage", st.stage}, {"name", sc.name}, {"seq_len", sc.seq_len},
                 {"steps", n}, {"lr_peak", sc.lr_peak}, {"lr_end", sc.lr_end}});
}

// The stage is trained: its held-out evaluation, then the next stage's sequence length (the
// stream keeps its epoch and restarts its cursor; no restart of anything else).
void Trainer::Impl::end_stage() {
  eval_and_log(true);
  const StageSummary& ss = st.stages[size_t(st.stage)];
  progress.message("stage " + std::to_string(st.stage + 1) + "/" + std::to_string(run.stages.size()) + " '" + ss.name +
                   "' done: " + std::to_string(ss.steps_done) + " steps, " + std::to_string(ss.tokens) + " tokens, " +
                   rate(double(ss.tokens) / std::max(ss.train_seconds, 1e-9)) + " tok/s, held-out " +
                   fmt("%.3f", ss.eval_bpb) + " bits/byte");
  st.stage++, st.stage_step = 0;
  if (st.stage < int64_t(run.stages.size())) {
    stream->set_seq_len(run.stages[size_t(st.stage)].seq_len);
    stage_message(true);
  }
}

void Trainer::Impl::save() {
  const auto t0 = Clock::now();
  const bool running = stream && st.stage < int64_t(run.stages.size());
  st.data_epoch = running ? stream->epoch() : 0;
  st.data_cursor = running ? stream->cursor() : 0;
  st.optimizer_steps = optim->steps();
  if (ep) {
    // Every rank the same trunk, every replica the same experts; then rank 0 alone gathers
    // the experts (and the optimiser state) to write them, and gives them back afterwards.
    shard.pack(model->weights().data(), trunk_buf.data());
    const std::string th = content_hash(trunk_buf.data(), trunk_buf.size() * sizeof(float));
    dp->check_identical(th.data(), th.size(), "trunk weights");
    std::string mine;
    for (size_t i = 0; i < all_refs.size(); ++i)
      if (shard.owner[i] == ep->rank()) mine += content_hash(all_refs[i].w, size_t(all_refs[i].rows * all_refs[i].cols) * 4);
    const std::string eh = content_hash(mine.data(), mine.size());
    const std::vector<char> all = dp->allgatherv(eh.data(), eh.size(), "check.experts");
    for (int r = 0; r < NR; ++r)
      if (std::string(all.data() + size_t(r) * eh.size(), eh.size()) !=
          std::string(all.data() + size_t(r % ep->size()) * eh.size(), eh.size()))
        fail("expert parallelism: rank " + std::to_string(r) + "'s experts differ from rank " +
             std::to_string(r % ep->size()) + "'s, which own the same ones; the ranks have diverged");
    sync_expert_weights(0);
  }
  if (R == 0 || !ep)
    st.weights_hash = content_hash(model->weights().data(), size_t(model->weights().size()) * sizeof(float));
  if (vision) st.vision_cursor = vision->cursor(), st.vision_hash = vision->params_hash();
  if (dp && !ep) dp->check_identical(st.weights_hash.data(), st.weights_hash.size(), "weights");
  opt_state = gathered_optimizer_state(0);
  SaveOptions so;
  so.before_commit = [&](const std::string& tmp) {
    vocab.save(tmp);  // the checkpoint is a model directory: tokenizer beside config and weights
    save_train_state((fs::path(tmp) / "train_state.safetensors").string(), st, opt_state);
    if (vision) {
      // The directory holds the encoder too, so its config.json states the vision_config
      // (save_checkpoint writes the text model's alone).
      vision->save(tmp);
      K3Config full = model->weights().config();
      full.quantization = {};
      write_text_file_atomic((fs::path(tmp) / "config.json").string(), config_to_hf_json(full));
    }
    write_text_file_atomic((fs::path(tmp) / "run.json").string(), run_config_to_json(run));
  };
  if (R == 0) save_checkpoint(ckpt_dir, model->weights(), so);  // data parallel: rank 0 writes it
  if (dp) dp->barrier("checkpoint.written");  // no rank runs ahead of the checkpoint
  if (ep && R == 0) release_foreign_experts();
  opt_state.clear();
  opt_state.shrink_to_fit();
  last_saved_step = st.step;
  const double secs = seconds_since(t0);
  metrics.write({{"type", "checkpoint"}, {"step", st.step}, {"dir", ckpt_dir}, {"seconds", secs}});
  progress.message("checkpoint step " + std::to_string(st.step) + " -> " + ckpt_dir + " [" + fmt("%.1f", secs) + " s]");
}

TrainResult Trainer::Impl::result() const {
  TrainResult r;
  r.complete = st.stage == int64_t(run.stages.size());
  r.steps = st.step;
  r.total_steps = total_steps;
  r.tokens_seen = st.tokens_seen;
  r.train_seconds = st.train_seconds;
  r.unigram_bpb = unigram_bpb;
  r.stages = st.stages;
  r.checkpoint_dir = ckpt_dir;
  return r;
}

Trainer::Trainer(const RunConfig& run, const TrainOptions& opt) : impl_(std::make_unique<Impl>(run, opt)) {
  impl_->setup();
}

Trainer::~Trainer() = default;

// Opens the metrics log and the data stream of the current stage (once per Trainer).
void Trainer::Impl::begin() {
  if (begun) return;
  begun = true;
  const int64_t n_stages = int64_t(run.stages.size());
  if (R == 0) metrics.open((fs::path(opt.out_dir) / "metrics.jsonl").string(), opt.resume ? st.step : -1);
  const int64_t n_params = n_trained;
  metrics.write({{"type", opt.resume ? "resume" : "start"}, {"step", st.step}, {"run", run.path},
                 {"model", run.model_config}, {"parameters", n_params}, {"threads", P}, {"dp_ranks", NR},
                 {"zero1", zero}, {"ep_ranks", ep ? ep->size() : 1},
                 {"total_steps", total_steps}, {"train_tokens", int64_t(data.train.size())},
                 {"heldout_tokens", int64_t(data.heldout.size())}, {"unigram_bpb", unigram_bpb},
                 {"cpu", cpu_model_name()}, {"simd_target", simd_target().name}});
  progress.message("train: " + std::to_string(n_params) + " trained parameters, " + std::to_string(data.train.size()) +
                   " train / " + std::to_string(data.heldout.size()) + " held-out tokens (unigram baseline " +
                   fmt("%.3f", unigram_bpb) + " bits/byte), " + std::to_string(n_stages) + " stages, " +
                   std::to_string(total_steps) + " steps of " + std::to_string(run.batch_tokens) + " tokens, " +
                   std::to_string(P) + " threads" +
                   (NR > 1 ? " x " + std::to_string(NR) + " data-parallel ranks" + (zero ? " (ZeRO-1)" : "") : "") +
                   (ep ? " in expert-parallel groups of " + std::to_string(ep->size()) : "") +
                   ", optimizer " + run.optimizer + ", balancer " + run.balancer);
  if (st.stage < n_stages) {
    stream = std::make_unique<SequenceStream>(&data.train, run.stages[size_t(st.stage)].seq_len, run.seed);
    if (opt.resume) {
      stream->set_position(st.data_epoch, st.data_cursor);
      progress.message("resumed " + ckpt_dir + " at step " + std::to_string(st.step) + " (stage " +
                       std::to_string(st.stage + 1) + ", step " + std::to_string(st.stage_step) + " of it)");
    }
    if (st.stage_step == 0) stage_message(!opt.resume);
  } else {
    progress.message("the run in " + ckpt_dir + " is already complete");
  }
}

// One iteration of the training loop: a step, then whatever follows it in run() (the end of
// a stage, an evaluation, a periodic checkpoint).
StepStats Trainer::step() {
  Impl& m = *impl_;
  m.begin();
  const int64_t n_stages = int64_t(m.run.stages.size());
  if (m.st.stage >= n_stages) fail("train: the run is complete; there is no step left to train");
  StepStats s = m.train_step();
  if (m.st.stage_step == m.steps_of[size_t(m.st.stage)]) m.end_stage();
  else if (m.run.eval_every > 0 && m.st.step % m.run.eval_every == 0) m.eval_and_log(false);
  if (m.run.checkpoint_every > 0 && m.st.step % m.run.checkpoint_every == 0 && m.st.stage < n_stages) m.save();
  return s;
}

TrainResult Trainer::run() {
  Impl& m = *impl_;
  const int64_t n_stages = int64_t(m.run.stages.size());
  m.begin();
  while (m.st.stage < n_stages) {
    if (m.opt.stop_at_step >= 0 && m.st.step >= m.opt.stop_at_step) break;
    step();
  }
  m.progress.finish();
  if (m.last_saved_step != m.st.step) m.save();
  TrainResult r = m.result();
  if (m.vision && r.complete) {
    const auto t0 = Clock::now();
    const json ve = m.vision->evaluate(*m.model, (fs::path(m.opt.out_dir) / "vision_eval.json").string());
    m.metrics.write({{"type", "vision_eval"}, {"step", m.st.step}, {"results", ve}, {"seconds", seconds_since(t0)}});
    for (const auto& [task, tj] : ve.items())
      m.progress.message("vision " + task + ": accuracy " + fmt("%.3f", tj["image"]["accuracy"].get<double>()) +
                         " (zeros " + fmt("%.3f", tj["zeros"]["accuracy"].get<double>()) + ", other image " +
                         fmt("%.3f", tj["other_image"]["accuracy"].get<double>()) + ") on " +
                         std::to_string(tj["image"]["examples"].get<int64_t>()) + " test examples");
  }
  m.metrics.write({{"type", r.complete ? "end" : "stopped"}, {"step", m.st.step}, {"tokens", m.st.tokens_seen},
                   {"train_seconds", m.st.train_seconds}});
  if (!r.complete)
    m.progress.message("stopped at step " + std::to_string(m.st.step) + " of " + std::to_string(m.total_steps) +
                       " (--steps); continue with --resume");
  return r;
}

const K3Model& Trainer::model() const { return *impl_->model; }
const Vocabulary& Trainer::tokenizer() const { return impl_->vocab; }
const RunConfig& Trainer::run_config() const { return impl_->run; }
EvalResult Trainer::evaluate(int64_t seq_len, int64_t max_tokens) { return impl_->evaluate(seq_len, max_tokens); }
int64_t Trainer::stage_steps(size_t stage) const { return impl_->steps_of.at(stage); }

std::vector<float> Trainer::last_gradients() {
  Impl& m = *impl_;
  float* g = m.grads[0].data<float>();
  std::vector<float> out;
  if (m.ep) {  // the trunk's ranges only (the other ranks' experts' are never read: they take no memory)
    out.assign(size_t(m.model->weights().size()), 0.f);
    for (const auto& [b, e] : m.shard.trunk) std::memcpy(out.data() + b, g + b, sizeof(float) * size_t(e - b));
  } else {
    out.assign(g, g + m.model->weights().size());
  }
  if (m.zero && !m.ep) m.dp->allgather_ranges(out.data(), m.bounds, "last_gradients");
  if (m.ep) {  // every parameter's from its holder (the experts' owners, the trunk's ZeRO-1 owners)
    const std::vector<ParamRef>& refs = m.all_refs;
    const std::vector<float> all = m.shard.assemble<float>(
        *m.dp, refs.size(), [&](size_t i) { return size_t(refs[i].rows * refs[i].cols); },
        [&](size_t i) { return static_cast<const float*>(refs[i].g); }, "last_gradients");
    size_t at = 0;
    for (const ParamRef& p : refs) {
      std::memcpy(out.data() + (p.g - g), all.data() + at, sizeof(float) * size_t(p.rows * p.cols));
      at += size_t(p.rows * p.cols);
    }
  }
  return out;
}

std::vector<float> Trainer::optimizer_state() { return impl_->gathered_optimizer_state(); }

void Trainer::sync_expert_weights(int root) { impl_->sync_expert_weights(root); }
void Trainer::release_foreign_experts() { impl_->release_foreign_experts(); }
int64_t Trainer::foreign_expert_resident_bytes() const { return impl_->foreign_resident(); }

// Every parameter's moments in checkpoint order (on every rank, or on root only): gathered
// from the ZeRO-1 owners, or from the experts' (and the trunk's ZeRO-1) owners under expert
// parallelism.
std::vector<float> Trainer::Impl::gathered_optimizer_state(int root) {
  std::vector<float> s;
  optim->get_state(s);
  if (zero && !ep) s = root < 0 ? dp->allgatherv(s.data(), s.size(), "optimizer_state") : dp->gatherv(s.data(), s.size(), root, "optimizer_state");
  if (ep) {
    std::vector<int64_t> at(all_refs.size(), -1);
    for (size_t j = 0; j < local_refs.size(); ++j) at[local_refs[j]] = local_state_off[j];
    s = shard.assemble<float>(
        *dp, all_refs.size(), [&](size_t i) { return size_t(2 * all_refs[i].rows * all_refs[i].cols); },
        [&](size_t i) { return static_cast<const float*>(s.data() + at[i]); }, "optimizer_state", root, [&] {
          if (zero) std::vector<float>().swap(s);  // ZeRO-1: every moment has a holder, s is not read again
        });
  }
  return s;
}

// Expert parallel: every rank's copy (root < 0) or root's of every routed expert set to its
// owner's (group 0), so a rank can evaluate, hash and write the whole model (the training
// steps use only its own). A few MiB of experts at a time, so nothing but the weight buffer
// grows by the whole experts.
void Trainer::Impl::sync_expert_weights(int root) {
  if (!ep || ep->size() == 1) return;
  const std::vector<ParamRef>& refs = all_refs;
  std::vector<size_t> ex;  // the routed experts' parameters, in order
  for (size_t i = 0; i < refs.size(); ++i)
    if (shard.owner[i] >= 0) ex.push_back(i);
  const int64_t chunk_floats = int64_t(4) << 20;
  std::vector<float> mine;
  for (size_t a = 0; a < ex.size();) {
    size_t b = a;
    int64_t n = 0;
    while (b < ex.size() && (b == a || n + refs[ex[b]].rows * refs[ex[b]].cols <= chunk_floats))
      n += refs[ex[b]].rows * refs[ex[b]].cols, ++b;
    mine.clear();
    for (size_t k = a; k < b; ++k)
      if (shard.holder[ex[k]] == R) mine.insert(mine.end(), refs[ex[k]].w, refs[ex[k]].w + refs[ex[k]].rows * refs[ex[k]].cols);
    std::vector<size_t> counts;
    const std::vector<float> all = root < 0 ? dp->allgatherv(mine.data(), mine.size(), "ep.weights.gather", &counts)
                                            : dp->gatherv(mine.data(), mine.size(), root, "ep.weights.gather", &counts);
    if (root < 0 || root == R) {
      std::vector<size_t> cursor(counts.size(), 0);
      for (size_t r = 1; r < counts.size(); ++r) cursor[r] = cursor[r - 1] + counts[r - 1];
      for (size_t k = a; k < b; ++k) {
        const ParamRef& p = refs[ex[k]];
        const size_t c = size_t(p.rows * p.cols);
        size_t& at = cursor[size_t(shard.holder[ex[k]])];
        if (shard.owner[ex[k]] != ep->rank()) std::memcpy(p.w, all.data() + at, sizeof(float) * c);
        at += c;
      }
    }
    a = b;
  }
}

// Expert parallel: the other ranks' experts' pages of the weight buffer back to the system
// (they read as zeros until the next gather); the gradient buffer's were never written.
void Trainer::Impl::release_foreign_experts() {
  float* w = model->weights().data();
  for (const auto& [b, e] : foreign_runs) release_pages(w + b, sizeof(float) * size_t(e - b));
}

int64_t Trainer::Impl::foreign_resident() const {
  int64_t n = 0;
  const float* w = model->weights().data();
  const float* g = grads[0].data<float>();
  for (const auto& [b, e] : foreign_runs)
    n += resident_bytes(w + b, sizeof(float) * size_t(e - b)) + resident_bytes(g + b, sizeof(float) * size_t(e - b));
  return n;
}

// Expert parallel: where the owner's summed expert gradients go (grads[0], the optimiser's).
void Trainer::Impl::setup_expert_parallel(const K3Config& cfg) {
  const int64_t per = E / ep->size();
  std::vector<std::vector<ExpertGrad>> owned(static_cast<size_t>(n_moe));
  float* g0 = grads[0].data<float>();
  const WeightStore& w = model->weights();
  auto grad_of = [&](const std::string& name) { return g0 + (w.param(name) - w.data()); };
  K3_ASSERT(n_moe > 0, "train: --ep needs a model with MoE layers");
  for (int64_t l = 0; l < n_moe; ++l)
    for (int64_t j = 0; j < per; ++j) {
      const std::string x = layer_prefix(first_moe + l) + "block_sparse_moe.experts." + std::to_string(ep->rank() * per + j) + ".";
      owned[size_t(l)].push_back({grad_of(x + "w1.weight"), grad_of(x + "w3.weight"), grad_of(x + "w2.weight")});
    }
  (void)cfg;
  ep->bind_gradients(owned, model->dims().moe.l, model->dims().moe.F);
}

}  // namespace k3
