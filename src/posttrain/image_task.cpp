// Image prompts for post-training (see image_task.h).
#include "posttrain/image_task.h"


#include <exception>
#include <filesystem>

#include "core/error.h"
#include "infer/image_prompt.h"
#include "io/atomic_file.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "posttrain/config_reader.h"
#include "posttrain/policy_update.h"
#include "posttrain/serial_blas.h"

namespace fs = std::filesystem;

namespace k3 {

PosttrainTask parse_posttrain_task(const std::string& name, const std::string& file) {
  if (name == "arithmetic") return PosttrainTask::arithmetic;
  if (name == "image_arithmetic") return PosttrainTask::image_arithmetic;
  fail_input(file, "task", "'" + name + "' is not a task (expected arithmetic or image_arithmetic)");
}

PosttrainTask read_posttrain_task(ConfigReader& rd, const std::string& file, std::string* unifont) {
  std::string task = "arithmetic";
  rd.get("task", task);
  rd.get("unifont", *unifont);
  return parse_posttrain_task(task, file);
}

const char* posttrain_task_name(PosttrainTask t) {
  return t == PosttrainTask::image_arithmetic ? "image_arithmetic" : "arithmetic";
}

void check_image_family(ArithFamily& f, const nlohmann::json& j, const std::string& file, const std::string& field) {
  const std::string why = " (task image_arithmetic: the renderer draws 2-digit additions a+b, a, b in 10..99)";
  if (!f.bands.empty()) {
    for (size_t k = 0; k < f.bands.size(); ++k)
      if (f.bands[k].digits != 2 || f.bands[k].op != '+')
        fail_input(file, field + ".bands[" + std::to_string(k) + "]", "must be \"2+\"" + why);
  } else {
    if (j.contains("digits") && f.digits != std::vector<int>{2}) fail_input(file, field + ".digits", "must be [2]" + why);
    if (j.contains("ops") && f.ops != "+") fail_input(file, field + ".ops", "must be \"+\"" + why);
    f.digits = {2}, f.ops = "+";
  }
  if (f.tool_share != 0) fail_input(file, field + ".tool_share", "must be 0: image prompts do not declare the calculator");
}

bool image_pair_heldout(int64_t a, int64_t b) { return mix64(uint64_t(a) * 131 + uint64_t(b) + 0x1a9eULL) % 5 == 0; }

ArithItem image_arith_item(const ArithFamily& f, int64_t i, bool heldout) {
  ArithItem it = arith_item(f, i);
  const int64_t r = i % f.problems;
  for (uint64_t k = 1; image_pair_heldout(it.problem.a, it.problem.b) != heldout; ++k)
    it.problem = make_problem(2, '+', mix64(f.seed) + uint64_t(r) + (k << 32));
  return it;
}

int image_carry(const ArithProblem& p) { return p.a % 10 + p.b % 10 >= 10 ? 1 : 0; }

ImageTask load_image_task(const ModelDir& md, const std::string& unifont_path, const std::string& file) {
  if (!md.config.vision.present)
    fail_input(file, "task", "image_arithmetic needs a model with a vision encoder, but " + md.config_path +
                                 " has no vision_config");
  ImageTask t;
  t.vm = load_vision_model(md.dir, md.config, md.config_path);
  t.font = Unifont::load(unifont_path);
  t.unifont_path = unifont_path;
  return t;
}

VisionExample image_example(const ImageTask& task, const ArithProblem& p) {
  K3_ASSERT(p.op == '+' && p.a >= 10 && p.a <= 99 && p.b >= 10 && p.b <= 99, "image task: not a renderer problem");
  VisionExample ex = arithmetic_example(task.font, int(p.a), int(p.b));
  K3_ASSERT(ex.answer == p.answer(), "image task: the renderer's answer differs from the problem's");
  return ex;
}

chat::Conversation image_conversation(chat::Conversation c, const ArithProblem& p) {
  K3_ASSERT(!c.messages.empty() && c.messages[0].role == chat::Role::user, "image task: no user turn");
  chat::Message& u = c.messages[0];
  u.content = {"sum?"};  // the vision data's question
  chat::ImagePart part;
  part.before = 0;       // the image first, then the text: the order of the vision training examples
  part.url = "image_arithmetic:" + p.expression();
  part.field = "messages[0].content[0]";
  u.images = {part};
  return c;
}

namespace {

void set_rows(Trajectory& t, const ImageTask& task, std::vector<float> rows, int64_t tokens) {
  t.image_rows = std::move(rows);
  t.image_tokens = tokens;
  t.media_id = task.vm.media_id;
}

}  // namespace

Trajectory make_image_trajectory(const ImageTask& task, const ArithProblem& p, chat::Effort e, const ChatVocab& vocab,
                                 uint64_t id) {
  Trajectory t = make_trajectory(image_conversation(prompt_conversation(p, e, false), p), vocab, id);
  const VisionExample ex = image_example(task, p);
  ImagePrompt ip;
  serial_blas([&] { ip = expand_image_prompt(task.vm, t.ids, {&ex.image}, "image prompt " + p.expression()); });
  t.ids = std::move(ip.ids);
  t.prompt_len = t.turn_start = int64_t(t.ids.size());
  t.gen.assign(t.ids.size(), 0);
  t.behav_logp.assign(t.ids.size(), 0.f);
  t.version.assign(t.ids.size(), -1);
  set_rows(t, task, std::move(ip.rows), ip.image_tokens);
  return t;
}

void reattach_image(Trajectory& t, const ImageTask& task, const ArithProblem& p, const std::string& what) {
  const VisionExample ex = image_example(task, p);
  std::vector<float> rows;
  serial_blas([&] { rows = encode_image(task.vm, ex.image); });
  const int64_t n = int64_t(rows.size()) / task.vm.dims.text_width;
  if (count_id(t.ids, task.vm.media_id) != n)
    fail_input(what, "ids", "holds " + std::to_string(count_id(t.ids, task.vm.media_id)) +
                                " image tokens, but the problem's image " + p.expression() + " has " +
                                std::to_string(n));
  set_rows(t, task, std::move(rows), n);
}

ChatSequence image_sft_sequence(const ImageTask& task, const ArithProblem& p, chat::Effort e, const ChatVocab& vocab,
                                const std::string& source) {
  const ChatSequence text = tokenize_conversation(image_conversation(sft_conversation(p, e, false), p), vocab, source, true);
  const VisionExample ex = image_example(task, p);
  ImagePrompt ip;
  serial_blas([&] { ip = expand_image_prompt(task.vm, text.ids, {&ex.image}, source); });
  ChatSequence out;
  out.ids = std::move(ip.ids);
  for (size_t i = 0; i < text.ids.size(); ++i) {
    if (text.ids[i] == task.vm.media_id) {
      if (text.loss[i]) fail(source + ": the image placeholder is a trained token");
      out.loss.insert(out.loss.end(), size_t(ip.image_tokens), 0);
    } else {
      out.loss.push_back(text.loss[i]);
    }
  }
  K3_ASSERT(out.loss.size() == out.ids.size(), "image_sft_sequence: mask and ids differ in length");
  out.image_rows = std::move(ip.rows);
  out.image_tokens = ip.image_tokens;
  out.media_id = task.vm.media_id;
  return out;
}

void save_frozen_encoder(const std::string& dir, const ImageTask& task, const K3Model& model) {
  SafetensorsWriter w;
  const VisionLayout& L = task.vm.layout;
  for (size_t i = 0; i < L.specs.size(); ++i)
    w.add(L.specs[i].name, Tensor::from_f32(L.specs[i].shape, task.vm.params.data() + L.offsets[i]));
  w.write((fs::path(dir) / "vision.safetensors").string());
  K3Config full = model.weights().config();
  full.quantization = {};
  write_text_file_atomic((fs::path(dir) / "config.json").string(), config_to_hf_json(full));
}

}  // namespace k3
