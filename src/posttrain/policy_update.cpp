// The shared policy update and its checkpoint (see policy_update.h).
#include "posttrain/policy_update.h"

#include <omp.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "model/checkpoint.h"
#include "train/optimizer.h"
#include "train/train_state.h"
#include "train/trainer.h"
#include "train/trainer_internal.h"

namespace fs = std::filesystem;

namespace k3 {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct PolicyUpdater::Impl {
  std::vector<std::vector<float>> grads;  // [P][weights().size()]
  std::vector<std::unique_ptr<TrainScratch>> scratch;
  std::unique_ptr<ShardedOptimizer> optim;
  UpdateOptions opt;
};

PolicyUpdater::PolicyUpdater(K3Model& model, const UpdateOptions& opt) : model_(model), impl_(std::make_unique<Impl>()) {
  if (model.weights().expert_storage() != ExpertStorage::Plain)
    fail("post-training needs f32 routed experts (load the checkpoint with dequantize_experts)");
  if (opt.optimizer != "adamw" && opt.optimizer != "muon")
    fail("optimizer '" + opt.optimizer + "' is not one of adamw, muon");
  set_num_threads(opt.threads);
  P_ = num_threads();
  impl_->opt = opt;
  const size_t n = size_t(model.weights().size());
  impl_->grads.assign(size_t(P_), std::vector<float>(n, 0.f));
  for (int t = 0; t < P_; ++t) impl_->scratch.push_back(make_train_scratch());
  std::vector<ParamRef> refs = optimizer_params(model.weights(), impl_->grads[0].data(), opt.optimizer == "muon");
  OptimizerOptions oo;
  oo.weight_decay = opt.weight_decay, oo.beta1 = opt.beta1, oo.beta2 = opt.beta2;
  impl_->optim = std::make_unique<ShardedOptimizer>(std::move(refs), oo, 4 * P_);
}

PolicyUpdater::~PolicyUpdater() = default;

TrainScratch& PolicyUpdater::scratch(int t) { return *impl_->scratch.at(size_t(t)); }
const float* PolicyUpdater::gradient() const { return impl_->grads[0].data(); }

void PolicyUpdater::accumulate(int64_t n, const SequenceBody& body) {
  const int64_t total = model_.weights().size();
  for (auto& g : impl_->grads) std::memset(g.data(), 0, sizeof(float) * size_t(total));
  const bool par = P_ > 1 && n > 1;
  if (!par) {
    for (int64_t i = 0; i < n; ++i) body(i, impl_->grads[0].data(), *impl_->scratch[0]);
    return;
  }
  std::vector<std::exception_ptr> err(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) num_threads(P_)
  for (int64_t i = 0; i < n; ++i) {
    const int t = omp_get_thread_num();
    try {
      body(i, impl_->grads[size_t(t)].data(), *impl_->scratch[size_t(t)]);
    } catch (...) {
      err[size_t(i)] = std::current_exception();
    }
  }
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
  float* g0 = impl_->grads[0].data();
  for (int t = 1; t < P_; ++t) {  // thread order: deterministic
    const float* gt = impl_->grads[size_t(t)].data();
#pragma omp parallel for schedule(static) num_threads(P_)
    for (int64_t i = 0; i < total; ++i) g0[i] += gt[i];
  }
}

UpdateStats PolicyUpdater::step(int64_t n, const SequenceBody& body, double lr) {
  const auto t0 = std::chrono::steady_clock::now();
  accumulate(n, body);
  UpdateStats st;
  st.grad_norm = clip_grad_norm(impl_->optim->params(), impl_->opt.grad_clip);
  if (!std::isfinite(st.grad_norm)) fail("post-training: the gradient norm is not finite (diverged); lower the learning rate");
  impl_->optim->step(lr);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

void PolicyUpdater::save(const std::string& dir, const Vocabulary& vocab, const nlohmann::json& state,
                         const std::function<void(const std::string& tmp)>& extra) const {
  std::vector<float> moments;
  impl_->optim->get_state(moments);
  nlohmann::json j;
  j["format"] = "k3cpp.posttrain_state";
  j["version"] = 1;
  j["optimizer"] = impl_->opt.optimizer;
  j["optimizer_steps"] = impl_->optim->steps();
  j["optimizer_elements"] = int64_t(moments.size());
  j["optimizer_hash"] = content_hash(moments.data(), moments.size() * sizeof(float));
  j["weights_hash"] = content_hash(model_.weights().data(), size_t(model_.weights().size()) * sizeof(float));
  j["state"] = state;
  SaveOptions so;
  so.before_commit = [&](const std::string& tmp) {
    vocab.save(tmp);
    write_text_file_atomic((fs::path(tmp) / "posttrain_state.json").string(), j.dump(1) + "\n");
    write_file_atomic((fs::path(tmp) / "optimizer.bin").string(), [&](std::FILE* f) {
      std::fwrite(moments.data(), sizeof(float), moments.size(), f);
    });
    if (extra) extra(tmp);
  };
  save_checkpoint(dir, model_.weights(), so);
}

nlohmann::json PolicyUpdater::load_state(const std::string& dir) {
  const std::string sp = (fs::path(dir) / "posttrain_state.json").string();
  std::ifstream in(sp);
  if (!in) fail_input(sp, "", "missing: " + dir + " is not a post-training checkpoint");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    fail_input(sp, "", std::string("not valid JSON (") + e.what() + ")");
  }
  auto need = [&](const char* k) -> const nlohmann::json& {
    if (!j.contains(k)) fail_input(sp, k, "missing");
    return j[k];
  };
  if (need("format") != "k3cpp.posttrain_state" || need("version") != 1) fail_input(sp, "format", "not a k3cpp post-training state (version 1)");
  if (need("optimizer") != impl_->opt.optimizer)
    fail_input(sp, "optimizer", "is " + j["optimizer"].get<std::string>() + " in the checkpoint but " + impl_->opt.optimizer + " in the config");
  const int64_t n = need("optimizer_elements").get<int64_t>();
  if (n != impl_->optim->state_elements()) fail_input(sp, "optimizer_elements", "does not match the model");
  if (need("weights_hash") != content_hash(model_.weights().data(), size_t(model_.weights().size()) * sizeof(float)))
    fail_input(sp, "weights_hash", "does not match the weights in " + dir + " (corrupted or replaced)");
  const std::string bp = (fs::path(dir) / "optimizer.bin").string();
  std::vector<float> moments(static_cast<size_t>(n));
  std::FILE* f = std::fopen(bp.c_str(), "rb");
  if (!f) fail_system("cannot open the optimizer state", bp);
  const size_t got = std::fread(moments.data(), sizeof(float), moments.size(), f);
  const bool extra = std::fgetc(f) != EOF;
  std::fclose(f);
  if (got != moments.size() || extra) fail_input(bp, "", "has the wrong size for the model");
  if (need("optimizer_hash") != content_hash(moments.data(), moments.size() * sizeof(float)))
    fail_input(bp, "", "content hash differs from posttrain_state.json (corrupted)");
  impl_->optim->set_state(moments);
  impl_->optim->set_steps(need("optimizer_steps").get<int64_t>());
  return need("state");
}

}  // namespace k3
