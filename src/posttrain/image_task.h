// RL and SFT prompts that carry an image: the vision issue's rendered arithmetic (docs/vision.md,
// train/vision_data.h arithmetic_example: "a+b", a, b in 10..99, drawn in unifont's 8 x 16
// glyphs; the answer a + b) in an XTML user message. The conversation is the text task's
// (posttrain/arith_task.h, 2-digit addition, same efforts and traces) with the user turn's text
// replaced by one image part and the vision data's question ("sum?"): the image renders as a
// `<|media_pad|>` control segment before the text, exactly as `chat --image` and the server
// render it, and infer/image_prompt.h expands it to the image's tokens and encodes it.
//
// The encoder and its projector are frozen in post-training: its rows are computed once per
// prompt (rows never change, so a resumed run recomputes them bitwise from the problem) and
// spliced into the text stream (model/k3_model.h EmbedSpliceT) in the rollout's prefill, the
// loss's forward and the reference's; image positions are prompt positions (no loss, zero
// dlogits), and the backward writes their gradient to a scratch buffer that nothing reads, so
// neither the encoder nor the `<|media_pad|>` embedding row moves.
//
// Held-out problems: the 8,100 operand pairs are split by a hash of (a, b); split "train" draws
// only pairs outside the held-out fifth, "heldout" only inside it, so an RL run never trains
// on an evaluation problem (the vision pretraining saw pairs of both: it drew from all 8,100).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/chat_vocab.h"
#include "io/chat_types.h"
#include "io/image.h"
#include "model/checkpoint.h"
#include "model/vision_encoder.h"
#include "posttrain/arith_task.h"
#include "posttrain/chat_tokens.h"
#include "posttrain/rollout.h"
#include "train/vision_data.h"

namespace k3 {

// rl.json / sft.json "task": the prompts' kind.
enum class PosttrainTask { arithmetic, image_arithmetic };
// k3::Error "<file>: task: ..." for an unknown name.
PosttrainTask parse_posttrain_task(const std::string& name, const std::string& file);
class ConfigReader;
// rl.json / sft.json "task" (default arithmetic) and "unifont" (*unifont kept when absent).
PosttrainTask read_posttrain_task(ConfigReader& rd, const std::string& file, std::string* unifont);
const char* posttrain_task_name(PosttrainTask t);

// The family's problems must be what the renderer draws: 2-digit addition without the tool
// ("digits": [2], "ops": "+" or "bands": ["2+"], tool_share 0). Fixes the defaults (digits
// {1,2,3}, ops "+*") to that when the config left them unset; k3::Error naming file and field
// otherwise. split: "train" (rl.json arithmetic, sft.json) or "heldout" (rl.json eval).
void check_image_family(ArithFamily& f, const nlohmann::json& j, const std::string& file, const std::string& field);

// Does (a, b) belong to the held-out fifth of the operand pairs?
bool image_pair_heldout(int64_t a, int64_t b);
// Problem i of an image family: arith_item(f, i) redrawn (seed + i + k * 2^32, k = 1, 2, ...)
// until its pair is in the split.
ArithItem image_arith_item(const ArithFamily& f, int64_t i, bool heldout);
// 1 when the ones column carries (7+5), else 0: the difficulty the renderer's one band has.
int image_carry(const ArithProblem& p);

// The policy's frozen encoder and the renderer's font.
struct ImageTask {
  VisionModel vm;
  Unifont font;
  std::string unifont_path;
};
// From the model directory (its vision_config and vision.safetensors) and unifont.hex.
// k3::Error "<file>: task: image_arithmetic needs a model with a vision encoder, but
// <config.json> has no vision_config" when the model has none (file: the rl/sft config).
ImageTask load_image_task(const ModelDir& md, const std::string& unifont_path, const std::string& file);

// The rendered example of the problem (train/vision_data.h); its answer equals p.answer().
VisionExample image_example(const ImageTask& task, const ArithProblem& p);
// The text task's conversation with the user turn replaced by [image] + "sum?".
chat::Conversation image_conversation(chat::Conversation text_conv, const ArithProblem& p);

// A fresh trajectory over the rendered image prompt (make_trajectory, then the placeholder
// expanded by infer/image_prompt.h's expand_image_prompt and the encoder's rows attached).
Trajectory make_image_trajectory(const ImageTask& task, const ArithProblem& p, chat::Effort e, const ChatVocab& vocab,
                                 uint64_t id);
// Re-attaches the rows of a restored trajectory (its ids are already expanded): k3::Error
// naming `what` when its image token count differs from the problem's image.
void reattach_image(Trajectory& t, const ImageTask& task, const ArithProblem& p, const std::string& what);

// The SFT sequence of the problem's image conversation (the text task's reply at effort e):
// tokenize_conversation, then the placeholder expanded (its positions masked) and the rows
// attached.
ChatSequence image_sft_sequence(const ImageTask& task, const ArithProblem& p, chat::Effort e, const ChatVocab& vocab,
                                const std::string& source);

// The frozen encoder written into a checkpoint directory being built (vision.safetensors with
// the released names, and config.json with the vision_config), so the directory is a vision
// model directory again (generate --image, --resume, the next stage).
void save_frozen_encoder(const std::string& dir, const ImageTask& task, const K3Model& model);

}  // namespace k3
