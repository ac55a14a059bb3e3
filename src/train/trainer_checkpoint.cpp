// A training run's checkpoint (see trainer.h): one model directory replaced atomically as a
// whole, written by rank 0 with every rank's share of the weights and optimiser state gathered
// to it, every rank checked to hold the same weights first.
#include <filesystem>

#include "core/error.h"
#include "io/atomic_file.h"
#include "model/checkpoint.h"
#include "train/trainer_impl.h"

namespace k3 {

namespace fs = std::filesystem;
using trainer_detail::Clock;
using trainer_detail::fmt;
using trainer_detail::seconds_since;

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
    for (int r = 0; r < n_ranks; ++r)
      if (std::string(all.data() + size_t(r) * eh.size(), eh.size()) !=
          std::string(all.data() + size_t(r % ep->size()) * eh.size(), eh.size()))
        fail("expert parallelism: rank " + std::to_string(r) + "'s experts differ from rank " +
             std::to_string(r % ep->size()) + "'s, which own the same ones; the ranks have diverged");
    sync_expert_weights(0);
  }
  if (rank == 0 || !ep)
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
  if (rank == 0) save_checkpoint(ckpt_dir, model->weights(), so);  // data parallel: rank 0 writes it
  if (dp) dp->barrier("checkpoint.written");  // no rank runs ahead of the checkpoint
  if (ep && rank == 0) release_foreign_experts();
  opt_state.clear();
  opt_state.shrink_to_fit();
  last_saved_step = st.step;
  const double secs = seconds_since(t0);
  metrics.write({{"type", "checkpoint"}, {"step", st.step}, {"dir", ckpt_dir}, {"seconds", secs}});
  progress.message("checkpoint step " + std::to_string(st.step) + " -> " + ckpt_dir + " [" + fmt("%.1f", secs) + " s]");
}

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

}  // namespace k3
