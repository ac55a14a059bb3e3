// Supervised fine-tuning (see sft.h).
#include "posttrain/sft.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/chat_json.h"
#include "model/checkpoint.h"
#include "posttrain/chat_tokens.h"
#include "posttrain/config_reader.h"
#include "posttrain/token_grad.h"
#include "train/metrics.h"

namespace fs = std::filesystem;

namespace k3 {

namespace {


std::vector<ChatSequence> load_sequences(const SFTConfig& c, const ChatVocab& vocab, const ImageTask* img) {
  std::vector<ChatSequence> out;
  if (c.arith) {
    for (int64_t i = 0; i < c.arith->problems; ++i) {
      const std::string src = c.path + ": arithmetic problem " + std::to_string(i);
      if (img) {
        const ArithItem it = image_arith_item(*c.arith, i, false);
        out.push_back(image_sft_sequence(*img, it.problem, it.effort, vocab, src));
        continue;
      }
      const ArithItem it = arith_item(*c.arith, i);
      out.push_back(tokenize_conversation(sft_conversation(it.problem, it.effort, it.tool), vocab, src));
    }
  } else {
    std::ifstream in(c.data);
    if (!in) fail_system("cannot open the SFT data", c.data);
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string src = c.data + ":" + std::to_string(n);
      out.push_back(tokenize_conversation(chat::parse_request_text(line, src), vocab, src));
    }
    if (out.empty()) fail_input(c.data, "", "has no conversations");
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (int64_t(out[i].ids.size()) > c.max_tokens)
      fail_input(c.path, "max_tokens", "conversation " + std::to_string(i) + " has " + std::to_string(out[i].ids.size()) +
                                           " tokens, more than max_tokens " + std::to_string(c.max_tokens));
  return out;
}

}  // namespace

double posttrain_lr(int64_t step, int64_t total, double lr, double lr_end, int64_t warmup) {
  if (step < warmup) return lr * double(step + 1) / double(warmup);
  if (total <= warmup + 1) return lr;
  const double f = double(step - warmup) / double(total - warmup - 1);
  return lr + (lr_end - lr) * std::min(f, 1.0);
}

SFTConfig load_sft_config(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  SFTConfig c;
  c.path = path;
  ConfigReader rd(j, path);
  if (!rd.get("model", c.model)) rd.bad("model", "missing (the pretrained model directory)");
  c.model = resolve_config_path(path, c.model);
  rd.get("data", c.data);
  c.task = read_posttrain_task(rd, path, &c.unifont);
  const bool image = c.task == PosttrainTask::image_arithmetic;
  if (const nlohmann::json* a = rd.sub("arithmetic")) {
    c.arith = parse_arith_family(*a, path, "arithmetic");
    if (image) check_image_family(*c.arith, *a, path, "arithmetic");
  }
  if (image && !c.arith) rd.bad("arithmetic", "missing: the image_arithmetic task draws its problems from it");
  if (c.data.empty() == !c.arith) rd.bad("data", "give exactly one of data (a JSONL file) and arithmetic");
  c.data = resolve_config_path(path, c.data);
  rd.get("steps", c.steps);
  rd.get("batch", c.batch);
  rd.get("max_tokens", c.max_tokens);
  rd.get("lr", c.lr);
  rd.get("lr_end", c.lr_end);
  rd.get("warmup_steps", c.warmup_steps);
  rd.get("optimizer", c.update.optimizer);
  rd.get("weight_decay", c.update.weight_decay);
  rd.get("grad_clip", c.update.grad_clip);
  rd.get("threads", c.update.threads);
  rd.get("checkpoint_every", c.checkpoint_every);
  rd.get("log_every", c.log_every);
  rd.get("seed", c.seed);
  rd.finish();
  if (!image && j.contains("unifont")) rd.bad("unifont", "only the image_arithmetic task renders images");
  if (image) c.unifont = resolve_config_path(path, c.unifont);
  if (c.steps < 1) rd.bad("steps", "must be at least 1");
  if (c.batch < 1) rd.bad("batch", "must be at least 1");
  if (c.max_tokens < 2) rd.bad("max_tokens", "must be at least 2");
  if (!(c.lr > 0) || c.lr_end < 0) rd.bad("lr", "must be positive (lr_end non-negative)");
  if (c.update.optimizer != "adamw" && c.update.optimizer != "muon") rd.bad("optimizer", "must be adamw or muon");
  if (c.checkpoint_every < 1) rd.bad("checkpoint_every", "must be at least 1");
  return c;
}

SFTResult run_sft(const SFTConfig& c, const SFTOptions& o) {
  if (o.out_dir.empty()) fail("sft: --out is required");
  const std::string ckpt = (fs::path(o.out_dir) / "checkpoint").string();
  const std::string src = o.resume ? ckpt : c.model;
  if (o.resume && !fs::exists(ckpt)) fail("sft --resume: " + ckpt + " does not exist");
  const ModelDir md = open_model_dir(src);
  LoadOptions lo;
  lo.dequantize_experts = true;
  K3Model model = load_model(md, lo);
  const ChatVocab vocab = load_chat_vocab(md);
  const Vocabulary voc = Vocabulary::load_dir(md.dir);
  std::optional<ImageTask> img;
  if (c.task == PosttrainTask::image_arithmetic) img.emplace(load_image_task(md, c.unifont, c.path));
  const std::vector<ChatSequence> data = load_sequences(c, vocab, img ? &*img : nullptr);
  PolicyUpdater up(model, c.update);
  int64_t step = 0;
  const std::string cfg_fp = read_json_file(c.path).dump();
  MetricsLog metrics;
  make_directories(o.out_dir);
  if (o.resume) {
    const nlohmann::json st = up.load_state(ckpt);
    if (st.value("kind", "") != "sft") fail_input(ckpt + "/posttrain_state.json", "state.kind", "is not an SFT checkpoint");
    if (st.value("config", "") != cfg_fp)
      fail_input(c.path, "", "differs from the config the checkpoint in " + ckpt + " was trained with");
    step = st.at("step").get<int64_t>();
    metrics.open((fs::path(o.out_dir) / "metrics.jsonl").string(), step);
  } else {
    metrics.open((fs::path(o.out_dir) / "metrics.jsonl").string());
    metrics.write({{"type", "run"}, {"kind", "sft"}, {"model", c.model}, {"conversations", data.size()},
                   {"threads", up.threads()}});
  }
  const int64_t end = o.stop_at_step >= 0 ? std::min(o.stop_at_step, c.steps) : c.steps;
  SFTResult res;
  res.checkpoint_dir = ckpt;
  auto save = [&]() {
    up.save(ckpt, voc, {{"kind", "sft"}, {"step", step}, {"config", cfg_fp}}, [&](const std::string& tmp) {
      if (img) save_frozen_encoder(tmp, *img, model);
    });
  };
  std::vector<int64_t> pick(size_t(c.batch));
  std::vector<double> loss(size_t(c.batch));
  while (step < end) {
    int64_t N = 0;
    for (int64_t j = 0; j < c.batch; ++j) {
      pick[size_t(j)] = int64_t(mix64(mix64(c.seed) ^ uint64_t(step * c.batch + j)) % uint64_t(data.size()));
      N += data[size_t(pick[size_t(j)])].trained();
    }
    const double lr = posttrain_lr(step, c.steps, c.lr, c.lr_end, c.warmup_steps);
    const UpdateStats us = up.step(
        c.batch,
        [&](int64_t j, float* g, TrainScratch& s) {
          const ChatSequence& q = data[size_t(pick[size_t(j)])];
          const int64_t T = int64_t(q.ids.size()) - 1;
          EmbedSpliceT<float> sp{q.media_id, q.image_rows.data(), q.image_tokens, nullptr};  // frozen encoder
          loss[size_t(j)] = token_objective_backward_t<float>(
              model, q.ids.data(), T,
              [&](const double* logp, int64_t n, double* c_out) {
                double l = 0;
                for (int64_t t = 0; t < n; ++t) {
                  const bool m = q.loss[size_t(t + 1)] != 0;  // target t is ids[t + 1]
                  c_out[t] = m ? -1.0 / double(N) : 0.0;
                  if (m) l -= logp[t];
                }
                return l;
              },
              g, s, nullptr, q.image_tokens > 0 ? &sp : nullptr);
        },
        lr);
    double total = 0;
    for (double l : loss) total += l;
    res.last_loss = total / double(N);
    res.seconds += us.seconds;
    ++step;
    if (step % c.log_every == 0 || step == end)
      metrics.write({{"type", "step"}, {"step", step}, {"loss", res.last_loss}, {"tokens", N}, {"lr", lr},
                     {"grad_norm", us.grad_norm}, {"seconds", us.seconds}});
    if (!o.quiet)
      std::fprintf(o.log, "sft step %lld/%lld loss %.4f grad_norm %.3f lr %.2e [%.2f s]\n", (long long)step,
                   (long long)c.steps, res.last_loss, us.grad_norm, lr, us.seconds);
    if (step % c.checkpoint_every == 0 && step < end) save();
  }
  save();
  metrics.write({{"type", step == c.steps ? "end" : "stopped"}, {"step", step}});
  res.steps = step;
  return res;
}

}  // namespace k3
