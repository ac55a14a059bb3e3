// The training run (see trainer.h): the public Trainer, the run loop (a step, and the stage
// end, evaluation or periodic checkpoint that follows it), stage changes. The step itself is
// Trainer::Impl::train_step (trainer_step.cpp); the parts of the run are listed in
// trainer_impl.h.
#include "train/trainer.h"

#include "model/activation_bytes.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/simd_target.h"
#include "train/trainer_impl.h"

namespace k3 {

namespace fs = std::filesystem;
using json = nlohmann::json;
using trainer_detail::Clock;
using trainer_detail::fmt;
using trainer_detail::rate;
using trainer_detail::seconds_since;

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
  if (rank == 0) metrics.open((fs::path(opt.out_dir) / "metrics.jsonl").string(), opt.resume ? st.step : -1);
  const int64_t n_params = n_trained;
  metrics.write({{"type", opt.resume ? "resume" : "start"}, {"step", st.step}, {"run", run.path},
                 {"model", run.model_config}, {"parameters", n_params}, {"threads", P}, {"dp_ranks", n_ranks},
                 {"zero1", zero}, {"ep_ranks", ep ? ep->size() : 1},
                 {"total_steps", total_steps}, {"train_tokens", int64_t(data.train.size())},
                 {"heldout_tokens", int64_t(data.heldout.size())}, {"unigram_bpb", unigram_bpb},
                 {"cpu", cpu_model_name()}, {"simd_target", simd_target().name}});
  progress.message("train: " + std::to_string(n_params) + " trained parameters, " + std::to_string(data.train.size()) +
                   " train / " + std::to_string(data.heldout.size()) + " held-out tokens (unigram baseline " +
                   fmt("%.3f", unigram_bpb) + " bits/byte), " + std::to_string(n_stages) + " stages, " +
                   std::to_string(total_steps) + " steps of " + std::to_string(run.batch_tokens) + " tokens, " +
                   std::to_string(P) + " threads" +
                   (n_ranks > 1 ? " x " + std::to_string(n_ranks) + " data-parallel ranks" + (zero ? " (ZeRO-1)" : "") : "") +
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

int64_t Trainer::activation_bytes() const {
  int64_t b = 0;
  for (const auto& s : impl_->scratch) b += activation_bytes_total(s->rec);
  return b;
}
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

}  // namespace k3
