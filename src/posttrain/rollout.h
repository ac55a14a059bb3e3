// Group sampling for RL: trajectories decoded together through K3Model::forward_batch (one
// batched decode step for every running trajectory; a prompt or a tool result enters through
// a prefill on the trajectory's own DecodeState), each token drawn at temperature 1 from the
// current policy with its log-probability recorded (log softmax of the raw logits: exactly the
// sampling distribution, the denominator of the importance ratio) and the policy version
// that drew it.
//  - Budgets: an effort's token budget counts generated tokens (tool results excluded); a
//    trajectory that reaches it unfinished stops with finish "budget" (reward -1).
//  - Tool: when an assistant turn ends (<|end_of_msg|>) with calls to "calculator", the
//    environment evaluates each (posttrain/calculator.h), appends the tool messages and the
//    next generation prompt, rendered by io/chat_render.h, as non-loss tokens (gen = 0), and
//    the trajectory continues; at most max_tool_rounds rounds.
//  - Partial rollouts (k1.5): advance() returns once `need` of the given trajectories have
//    finished; the others keep their DecodeState and pending token and continue in a later
//    call, under whatever policy the model then holds (their state is reused, not
//    re-prefilled; the tokens they draw then carry the new version and its logprobs).
// Draws are a function of (seed, trajectory id, token index) only (mix64 -> inverse CDF), so
// a trajectory's tokens do not depend on how it was batched or interrupted.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "infer/chat_vocab.h"
#include "io/chat_types.h"
#include "model/k3_model.h"

namespace k3 {

struct Trajectory {
  uint64_t id = 0;                // seeds the draws
  int64_t group = 0, item = 0;    // group (one prompt) and the task item
  chat::Conversation prompt;      // the conversation so far (for tool-result rendering)
  std::string answer;             // expected canonical answer
  chat::Effort effort = chat::Effort::high;
  bool tool = false;              // the calculator is declared and executed
  int64_t budget = 0;             // generated tokens allowed
  std::vector<int32_t> ids;       // prompt, then everything appended
  int64_t prompt_len = 0;
  std::vector<uint8_t> gen;       // [ids]: 1 drawn by the policy (a loss token)
  std::vector<float> behav_logp;  // [ids]: the drawing policy's logprob (gen only)
  std::vector<int32_t> version;   // [ids]: the policy version that drew it (-1: not drawn)
  int64_t generated = 0;
  int64_t turn_start = 0;         // ids index where the current assistant turn's output begins
  bool finished = false;
  std::string finish;             // "stop" | "budget" | "tool_rounds" | "media" (an image prompt's reply drew <|media_pad|>: malformed)
  int tool_calls = 0, tool_ok = 0, tool_rounds = 0;
  std::vector<std::string> responses;  // the response channel of each finished assistant turn
  // Image prompts (posttrain/image_task.h): the frozen encoder's rows [image_tokens, d] for the
  // positions of ids holding media_id, spliced into every forward over the prompt.
  std::vector<float> image_rows;
  int64_t image_tokens = 0;
  int32_t media_id = -1;
  // The splice for a forward over ids from position 0 (nullptr without an image); drows, when
  // given, receives the rows' gradient in a backward (then discarded: the encoder is frozen).
  const EmbedSpliceT<float>* splice(EmbedSpliceT<float>& sp, float* drows = nullptr) const {
    if (image_tokens == 0) return nullptr;
    sp = {media_id, image_rows.data(), image_tokens, drows};
    return &sp;
  }
  // Decode state between calls.
  DecodeState state;
  std::vector<int32_t> to_feed;   // tokens appended but not yet run through the model
  bool started = false;
};

struct RolloutOptions {
  int max_tool_rounds = 2;
  uint64_t seed = 1;
};

struct RolloutStats {
  int64_t decode_steps = 0, prefills = 0, tokens = 0;
  double seconds = 0;
};

// A fresh trajectory over the rendered prompt (conv with add_generation_prompt).
Trajectory make_trajectory(const chat::Conversation& conv, const ChatVocab& vocab, uint64_t id);

// Decodes the unfinished trajectories among `ts` until at least `need` of all `ts` are
// finished (need >= ts.size(): all). `version`: the current policy's.
RolloutStats advance(const K3Model& model, const ChatVocab& vocab, std::vector<Trajectory*>& ts, int64_t need,
                     int32_t version, const RolloutOptions& o);

// The environment's step when an assistant turn has ended (its <|end_of_msg|> is the last id):
// records the response; runs the tool calls and appends their results and the next generation
// prompt (gen = 0), or finishes the trajectory. advance() calls it; public for tests.
void end_turn(Trajectory& t, const ChatVocab& vocab, const RolloutOptions& o);

// The token drawn from logits [V] with uniform u in [0, 1) (inverse CDF of softmax); its
// log-probability in *logp.
int32_t draw_token(const float* logits, int64_t V, double u, double* logp);

}  // namespace k3
