// The vision part of a training run (see trainer_vision.h).
#include "train/trainer_vision.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/train_state.h"

namespace k3 {

using json = nlohmann::json;

std::pair<size_t, int64_t> vision_example_at(int64_t n, const std::vector<int64_t>& weights) {
  int64_t cycle = 0;
  for (int64_t w : weights) cycle += w;
  K3_ASSERT(cycle > 0, "vision_example_at: no task weights");
  int64_t k = n % cycle;
  size_t t = 0;
  while (k >= weights[t]) k -= weights[t], ++t;
  return {t, n / cycle * weights[t] + k};
}

VisionTrainPart::VisionTrainPart(const RunConfig& run, const K3Config& cfg, const Vocabulary& vocab, int threads,
                                 uint64_t init_seed)
    : run_(run), vocab_(vocab) {
  dims_ = resolve_vision_dims(cfg, run.model_config);
  layout_ = VisionLayout(dims_);
  media_ = int32_t(cfg.media_placeholder_token_id);
  if (media_ < 0)
    fail_input(run.model_config, "media_placeholder_token_id", "missing: the run file trains images (\"vision\")");
  if (media_ < 256 || media_ == vocab.bos() || media_ == vocab.eos())
    fail_input(run.model_config, "media_placeholder_token_id",
               std::to_string(media_) + " is a byte or the bos/eos id of the run's vocabulary");
  params_.resize(size_t(layout_.total));
  init_vision_params(params_.data(), layout_, init_seed ^ 0x5157ULL);
  for (int t = 0; t < std::max(threads, 1); ++t) {
    grads_.emplace_back(size_t(layout_.total), 0.0f);
    scratch_.push_back(std::make_unique<VisionScratchT<float>>());
  }
  for (const std::string& n : run.vision.tasks) tasks_.push_back(parse_vision_task(n, run.path));
  if (run_.vision.task_weights.size() != tasks_.size()) run_.vision.task_weights.assign(tasks_.size(), 1);
  data_ = std::make_unique<VisionDataSource>(run.vision.fashion_dir, run.vision.unifont, run.seed);
}

VisionTrainPart::~VisionTrainPart() = default;

int64_t VisionTrainPart::parameter_count() const { return layout_.total; }

std::vector<ParamRef> VisionTrainPart::optimizer_params(bool muon) {
  std::vector<ParamRef> refs;
  for (size_t i = 0; i < layout_.specs.size(); ++i) {
    const VisionParamSpec& s = layout_.specs[i];
    ParamRef p;
    p.name = s.name;
    p.w = params_.data() + layout_.offsets[i];
    p.g = grads_[0].data() + layout_.offsets[i];
    p.rows = s.shape[0], p.cols = s.numel() / s.shape[0];
    const bool matrix = s.shape.size() == 2;  // wqkv, wo, fc0, fc1, proj.0, proj.2
    p.kind = muon && matrix ? OptKind::Muon : OptKind::AdamW;
    p.decay = s.shape.size() >= 2 && s.name.find("pos_emb") == std::string::npos;
    if (s.shape.size() == 1) p.rows = 1, p.cols = s.numel();
    refs.push_back(p);
  }
  return refs;
}

std::pair<double, int64_t> VisionTrainPart::take_encoder_time() {
  std::pair<double, int64_t> r{0.0, 0};
  for (auto& s : scratch_) r.first += s->seconds_encoder, r.second += s->images, s->seconds_encoder = 0, s->images = 0;
  return r;
}

void VisionTrainPart::zero_grads() {
  for (auto& g : grads_) std::fill(g.begin(), g.end(), 0.0f);
}

void VisionTrainPart::reduce_grads() {
  for (size_t t = 1; t < grads_.size(); ++t)
    for (size_t i = 0; i < grads_[0].size(); ++i) grads_[0][i] += grads_[t][i];
}

double VisionTrainPart::grad_norm() const {
  double s = 0;
  for (float g : grads_[0]) s += double(g) * double(g);
  return std::sqrt(s);
}

VisionTrainPart::Item VisionTrainPart::make_item(const VisionExample& ex, const Image* replace, bool zeros) const {
  Item it;
  const Image& img = replace ? *replace : ex.image;
  if (zeros) {
    Image z = img;
    std::fill(z.rgb.begin(), z.rgb.end(), 0.5f);  // 0 after normalisation
    append_image(it.images, dims_, z.rgb.data(), z.height, z.width);
  } else {
    append_image(it.images, dims_, img.rgb.data(), img.height, img.width);
  }
  const int64_t n = it.images.token_count(dims_);
  it.tokens.assign(size_t(n), media_);
  for (int32_t t : vocab_.encode(" " + ex.question + " ")) it.tokens.push_back(t);
  const size_t answer_at = it.tokens.size();
  for (int32_t t : vocab_.encode(ex.answer)) it.tokens.push_back(t);
  it.tokens.push_back(vocab_.eos());
  const int64_t T = int64_t(it.tokens.size()) - 1;
  it.mask.assign(size_t(T), 0);
  for (int64_t t = int64_t(answer_at) - 1; t < T; ++t) it.mask[size_t(t)] = 1;  // targets = answer + eos
  return it;
}

int64_t VisionTrainPart::prepare(int64_t n) {
  items_.clear();
  int64_t targets = 0;
  for (int64_t i = 0; i < n; ++i, ++cursor_) {
    const auto [slot, index] = vision_example_at(cursor_, run_.vision.task_weights);
    const VisionTask task = tasks_[slot];
    items_.push_back(make_item(data_->example(task, false, index), nullptr, false));
    for (uint8_t m : items_.back().mask) targets += m;
  }
  return targets;
}

SequenceResult VisionTrainPart::run(const K3Model& model, int64_t i, int tid, double scale, float* text_grads,
                                    TrainScratch& s, const LossOptions& opt, SequenceRouting* routing) {
  const Item& it = items_[size_t(i)];
  LossOptions o = opt;
  o.target_mask = it.mask.data();
  const VisionModelRef vm{&layout_, &dims_, media_};
  return vision_forward_backward_t<float>(model, params_.data(), vm, it.images, it.tokens.data(),
                                          int64_t(it.tokens.size()) - 1, scale, text_grads, grads_[size_t(tid)].data(),
                                          s, *scratch_[size_t(tid)], o, routing);
}

std::string VisionTrainPart::greedy_answer(const K3Model& model, const Item& it, int tid) {
  VisionScratchT<float>& vs = *scratch_[size_t(tid)];
  const int64_t N = it.images.token_count(dims_), V = model.dims().V;
  vs.rows.resize(size_t(N * dims_.text_width));
  vision_forward<float>(vs.rows.data(), nullptr, params_.data(), layout_, dims_, it.images);
  // The prompt: everything before the first scored target's input (image tokens + question).
  int64_t prompt = 0;
  while (prompt < int64_t(it.mask.size()) && !it.mask[size_t(prompt)]) ++prompt;
  prompt += 1;
  DecodeState st = model.new_state();
  ForwardScratch fs;
  std::vector<float> logits(static_cast<size_t>(V));
  ForwardOptions fo;
  fo.last_only = true;
  const EmbedSpliceT<float> sp{media_, vs.rows.data(), N, nullptr};
  model.forward(logits.data(), it.tokens.data(), prompt, st, fs, fo, nullptr, &sp);
  std::vector<int32_t> out;
  fo.mode = MixerMode::Decode;
  for (int k = 0; k < 16; ++k) {
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (next == vocab_.eos()) break;
    out.push_back(next);
    model.forward(logits.data(), &next, 1, st, fs, fo);
  }
  return vocab_.decode_bytes(out);
}

json VisionTrainPart::evaluate(const K3Model& model, const std::string& path) {
  json res = json::object();
  const int P = int(scratch_.size());
  for (VisionTask task : tasks_) {
    int64_t n = run_.vision.eval_examples;
    const int64_t avail = data_->size(task, true);
    if (avail > 0 && (n == 0 || n > avail)) n = avail;
    if (n == 0) n = 1000;
    std::vector<VisionExample> exs;
    for (int64_t i = 0; i < n; ++i) exs.push_back(data_->example(task, true, i));
    const char* modes[3] = {"image", "zeros", "other_image"};
    json tj = json::object();
    std::vector<std::vector<int64_t>> confusion(11, std::vector<int64_t>(10, 0));  // [predicted or 10 = other][true]
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<uint8_t> right(size_t(n), 0);
      std::vector<int> pred(size_t(n), 10);
#pragma omp parallel for schedule(dynamic, 8) num_threads(P)
      for (int64_t i = 0; i < n; ++i) {
        const Item it = make_item(exs[size_t(i)], mode == 2 ? &exs[size_t((i + 1) % n)].image : nullptr, mode == 1);
        const std::string a = greedy_answer(model, it, omp_get_thread_num());
        right[size_t(i)] = a == exs[size_t(i)].answer;
        if (task == VisionTask::Fashion) {
          const auto& names = fashion_class_names();
          pred[size_t(i)] = int(std::find(names.begin(), names.end(), a) - names.begin());
        }
      }
      int64_t ok = 0;
      std::vector<int64_t> qn(4, 0), qok(4, 0);
      for (int64_t i = 0; i < n; ++i) {
        ok += right[size_t(i)];
        qn[size_t(exs[size_t(i)].qtype)]++, qok[size_t(exs[size_t(i)].qtype)] += right[size_t(i)];
        if (task == VisionTask::Fashion && mode == 0) confusion[size_t(pred[size_t(i)])][size_t(exs[size_t(i)].label)]++;
      }
      json mj = {{"accuracy", double(ok) / double(n)}, {"correct", ok}, {"examples", n}};
      if (task == VisionTask::Scenes) {
        json per = json::object();
        for (int q = 0; q < 4; ++q)
          per[scene_question_type(q)] = {{"accuracy", qn[size_t(q)] ? double(qok[size_t(q)]) / double(qn[size_t(q)]) : 0.0},
                                         {"examples", qn[size_t(q)]}, {"chance", scene_chance(q)}};
        mj["by_question"] = per;
      }
      tj[modes[mode]] = mj;
    }
    if (task == VisionTask::Fashion) tj["confusion_predicted_by_true"] = confusion;  // row 10: not a class name
    res[vision_task_name(task)] = tj;
  }
  if (!path.empty()) write_text_file_atomic(path, res.dump(2) + "\n");
  return res;
}

void VisionTrainPart::load(const std::string& dir) {
  load_vision_params(params_.data(), layout_, CheckpointReader::open(dir));
}

std::string VisionTrainPart::params_hash() const { return content_hash(params_.data(), params_.size() * sizeof(float)); }

void VisionTrainPart::save(const std::string& dir) const {
  SafetensorsWriter w;
  for (size_t i = 0; i < layout_.specs.size(); ++i)
    w.add(layout_.specs[i].name, Tensor::from_f32(layout_.specs[i].shape, params_.data() + layout_.offsets[i]));
  w.write(dir + "/vision.safetensors");
}

}  // namespace k3
