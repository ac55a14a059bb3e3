// What a training run reports (see trainer_impl.h): a step's counters, its metrics.jsonl
// record and progress line; the held-out evaluation's record; a stage's start.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "train/trainer_impl.h"

namespace k3 {

using json = nlohmann::json;
using trainer_detail::fmt;
using trainer_detail::rate;
using trainer_detail::seconds_since;

StepStats Trainer::Impl::record_step(const TrainStep& s) {
  const double dt = seconds_since(s.t0), t_opt = seconds_since(s.t1);
  const StageConfig& sc = *s.stage;
  const int64_t T = s.T, targets = s.targets;
  st.step++, st.stage_step++;
  st.tokens_seen += targets;
  st.train_seconds += dt;
  st.optimizer_steps = optim->steps();
  StageSummary& ss = st.stages[size_t(st.stage)];
  ss.steps_done++, ss.tokens += targets, ss.train_seconds += dt, ss.last_loss = s.loss;
  session_seconds += dt, session_tokens += targets;

  const bool stage_end = st.stage_step == steps_of[size_t(st.stage)];
  const bool eval_step = run.eval_every > 0 && st.step % run.eval_every == 0;
  const std::vector<double> mv = step_maxvio();
  if (st.step % run.log_every == 0 || stage_end || st.step == 1) {
    json j = {{"type", "step"},         {"step", st.step}, {"stage", st.stage}, {"stage_name", sc.name},
              {"seq_len", T},           {"loss", s.loss},  {"lr", s.lr},        {"grad_norm", s.gnorm},
              {"tokens", st.tokens_seen}, {"tokens_per_s", double(targets) / dt}, {"seconds", dt}, {"seconds_fwd_bwd", s.t_fb},
              {"seconds_update", t_opt},  {"maxvio", mv}};
    if (dp) j["seconds_grad_reduce"] = s.t_reduce;  // the gradient reduction left after the backward
    if (loss_opt.aux_alpha > 0) j["aux_loss"] = s.aux_sum / double(s.nmicro * s.nseq);
    if (sc.long_tasks.active()) j["long_task_seqs"] = s.long_seqs;  // sequences replaced by long-range tasks
    if (vision) {
      j["text_loss"] = s.loss_sum / double(targets);
      j["vision_loss"] = s.vloss_sum / double(std::max<int64_t>(s.vtargets, 1));
      j["vision_targets"] = s.vtargets;
      j["vision_grad_norm"] = s.vgnorm;  // the encoder and projector, before clipping
      j["seconds_vision"] = s.t_vis;     // forward + backward of the image-text sequences
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
                      " | loss " + fmt("%.4f", s.loss) + " | lr " + fmt("%.2e", s.lr) + " | MaxVio " + fmt("%.2f", mvmax) +
                      " | " + rate(double(targets) / dt) + " tok/s | ETA " + format_duration(double(remaining) / tps),
                  stage_end || st.step == 1);
  StepStats out;
  out.step = st.step, out.stage = st.stage, out.seq_len = T, out.tokens = targets;
  out.loss = s.loss, out.grad_norm = s.gnorm, out.lr = s.lr;
  out.seconds = dt, out.seconds_fwd_bwd = s.t_fb, out.seconds_update = t_opt, out.seconds_grad_reduce = s.t_reduce;
  out.maxvio = mv;
  return out;
}

void Trainer::Impl::eval_and_log(bool stage_end) {
  const StageConfig& sc = run.stages[size_t(st.stage)];
  const auto t0 = trainer_detail::Clock::now();
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

}  // namespace k3
