// Setting a training run up (see trainer.h, trainer_impl.h): the parallel options, the corpus
// and its vocabulary, the model (fresh, or the checkpoint with --resume, refusing a missing,
// corrupt or mismatched one), the gradient buffers and the optimiser shards (data parallel,
// ZeRO-1, expert parallel), the balancer.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/simd_target.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "io/bpe_trainer.h"
#include "io/tiktoken_config.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "model/param_specs.h"
#include "train/long_mix.h"
#include "train/trainer_impl.h"

namespace k3 {

namespace fs = std::filesystem;
using trainer_detail::Clock;
using trainer_detail::fmt;
using trainer_detail::seconds_since;

namespace {

bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
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

}  // namespace

void Trainer::Impl::setup() {
  if (opt.out_dir.empty()) fail("train: --out is required (the output directory)");
  set_num_threads(opt.threads > 0 ? opt.threads : int(run.threads));
  P = num_threads();
  check_parallel_options();
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
  load_data(cfg);
  create_or_resume_model(cfg);
  build_optimizer(cfg);
  const ModelDims& dims = model->dims();
  first_moe = std::min(dims.first_moe, dims.L);
  n_moe = dims.L - first_moe;
  E = cfg.num_experts, topk = cfg.num_experts_per_token;
  if (ep) setup_expert_parallel(cfg);
  build_balancer();
}

// Data and expert parallelism: the ranks, their groups, and whether the gradient reduction
// overlaps the backward (every rank must take the same path: it changes the order in which the
// ranks start their collectives, and it depends on the thread count, so the ranks agree on
// both first).
void Trainer::Impl::check_parallel_options() {
  dp = opt.dp;
  if (dp) rank = dp->rank(), n_ranks = dp->size();
  ep = opt.ep;
  if (ep && (!dp || n_ranks % ep->size() != 0 || rank != ep->group() * ep->size() + ep->rank()))
    fail("train: expert parallelism needs data-parallel ranks in groups of " + std::to_string(ep ? ep->size() : 0) +
         " (--ep must divide --dp's rank count)");
  for (size_t i = 0; i < run.stages.size() && n_ranks > 1; ++i)
    if ((run.micro_batch_tokens / run.stages[i].seq_len) % n_ranks != 0)
      fail_input(run.path, "micro_batch_tokens",
                 "holds " + std::to_string(run.micro_batch_tokens / run.stages[i].seq_len) + " sequences of stage " +
                     std::to_string(i) + " (seq_len " + std::to_string(run.stages[i].seq_len) +
                     "), which the " + std::to_string(n_ranks) +
                     " data-parallel ranks cannot share equally: make it a multiple of seq_len x ranks");
  if (dp && n_ranks > 1 && !ep) {
    const int8_t mine[2] = {int8_t(opt.dp_overlap ? 1 : 0), int8_t(P > 1 ? 1 : 0)};
    const std::vector<int8_t> all = dp->allgatherv(mine, 2, "dp.overlap.agree");
    overlap = true;
    for (int r = 0; r < n_ranks; ++r) overlap &= all[size_t(2 * r)] != 0, threaded_rank |= all[size_t(2 * r + 1)] != 0;
  }
}

// The corpus, the vocabulary, the tokenised split, the fingerprints a checkpoint records, and
// every stage's step count (a stage too short for its held-out windows or its long-range
// tasks fails now, naming the field, not at its first step).
void Trainer::Impl::load_data(const K3Config& cfg) {
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
    try {
      check_long_task_mix(s.long_tasks, [this](const std::string& t) { return vocab.encode(t); }, s.seq_len);
    } catch (const Error& e) {
      fail_input(run.path, "stages[" + std::to_string(i) + "].long_tasks", e.what());
    }
  }
}

// The model: the checkpoint with --resume, else drawn by init_weights; and the vision encoder
// of a run with images (as saved, with where its example stream stopped, on --resume).
void Trainer::Impl::create_or_resume_model(const K3Config& cfg) {
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
  if (run.vision.enabled && n_ranks > 1)
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
    if (rank != 0) {  // data parallel: rank 0 learns and writes the vocabulary, the others read it
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
  if (keep_expert && rank != 0) lo.keep_expert = keep_expert, lo.log = [](const std::string&) {};
  model = std::make_unique<K3Model>(load_model(md, lo));
  if (!lo.keep_expert) {
    const std::string h = content_hash(model->weights().data(), size_t(model->weights().size()) * sizeof(float));
    if (h != st.weights_hash)
      fail_input(ckpt_dir, "weights", "content hash " + h + " does not match the " + st.weights_hash +
                                          " recorded in train_state.safetensors (corrupted or replaced weights)");
  }
  if (keep_expert && rank == 0) model->weights().release_routed_experts(keep_expert);
}

// One gradient buffer and scratch per thread (expert parallel runs its sequences one at a time,
// the kernels taking the threads, so one of each, mapped: the other ranks' experts' ranges,
// never written, take no memory); the optimiser's parameters (the encoder's too), each one's
// offset in the checkpoint's optimiser state, the ranks' owned ranges, and the optimiser over
// this rank's share.
void Trainer::Impl::build_optimizer(const K3Config& cfg) {
  const int64_t total = model->weights().size();
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
  owner_cut = partition_params(refs, n_ranks);
  bounds.assign(size_t(n_ranks) + 1, total);
  bounds[0] = 0;
  for (int r = 1; r < n_ranks; ++r)
    bounds[size_t(r)] = owner_cut[size_t(r)] < refs.size() ? refs[owner_cut[size_t(r)]].g - grads[0].data<float>() : total;
  zero = dp && opt.shard_optimizer && n_ranks > 1;
  if (ep) shard_experts(cfg, refs, lr_scale);
  if (zero && !ep) {
    const auto b = int64_t(owner_cut[size_t(rank)]), e = int64_t(owner_cut[size_t(rank) + 1]);
    refs = std::vector<ParamRef>(refs.begin() + b, refs.begin() + e);
    lr_scale = std::vector<double>(lr_scale.begin() + b, lr_scale.begin() + e);
  }
  optim = std::make_unique<ShardedOptimizer>(std::move(refs), oo, 4 * P, lr_scale);
  if (opt.resume) restore_optimizer_state();
}

// Expert parallel: the parameters this rank steps (the trunk, or its ZeRO-1 share over all
// ranks, and its own experts), the other ranks' experts' ranges of the flat buffers, and (on
// --resume) a check that every rank read the same trunk.
void Trainer::Impl::shard_experts(const K3Config& cfg, std::vector<ParamRef>& refs, std::vector<double>& lr_scale) {
  const int64_t total = model->weights().size();
  if (vision) fail_input(run.path, "vision", "expert parallelism (--ep) of a run with images is not supported");
  all_refs = refs;
  shard.build(refs, grads[0].data<float>(), total, cfg.num_experts, ep->size(), ep->rank(), ep->group(), n_ranks);
  if (zero) {  // ZeRO-1 of the trunk over all ranks: whole parameters, as data parallelism cuts them
    std::vector<ParamRef> trunk_refs;
    for (size_t i = 0; i < refs.size(); ++i)
      if (shard.owner[i] < 0) trunk_refs.push_back(refs[i]);
    shard.shard_trunk(refs, grads[0].data<float>(), partition_params(trunk_refs, n_ranks));
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

// --resume: this rank's share of the checkpoint's optimiser state (any layout resumes any
// checkpoint: the checkpoint holds every parameter's moments in checkpoint order).
void Trainer::Impl::restore_optimizer_state() {
  if (int64_t(opt_state.size()) != state_off.back()) fail_input(ckpt_dir, "train_state", "optimizer state size");
  if (zero && !ep)  // this rank's parameters' moments
    opt_state = std::vector<float>(opt_state.begin() + state_off[owner_cut[size_t(rank)]],
                                   opt_state.begin() + state_off[owner_cut[size_t(rank) + 1]]);
  if (ep) {  // the trunk's (or its ZeRO-1 share) and this rank's experts' moments
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

// The run file's balancer over the MoE layers, the router biases it owns, and the auxiliary
// loss coefficient (balancer "aux").
void Trainer::Impl::build_balancer() {
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

}  // namespace k3
