// Batched group sampling with budgets, the calculator tool and partial rollouts (see rollout.h).
#include "posttrain/rollout.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "kernels/log_sum_exp.h"
#include "io/chat_json.h"
#include "io/chat_parse.h"
#include "io/chat_render.h"
#include "posttrain/calculator.h"
#include "posttrain/chat_tokens.h"
#include "posttrain/policy_update.h"
#include "posttrain/serial_blas.h"

namespace k3 {

int32_t draw_token(const float* l, int64_t V, double u, double* logp) {
  // The same terms as the normaliser's, walked until their running sum passes u z.
  const LogSumExpParts<float> lse = log_sum_exp_parts(l, V);
  const double target = u * lse.sum;
  double acc = 0;
  int32_t pick = int32_t(V - 1);
  for (int64_t v = 0; v < V; ++v) {
    acc += exp_term(l[v], lse.max);
    if (acc > target) {
      pick = int32_t(v);
      break;
    }
  }
  *logp = double(l[pick]) - double(lse.max) - std::log(lse.sum);
  return pick;
}

Trajectory make_trajectory(const chat::Conversation& conv, const ChatVocab& vocab, uint64_t id) {
  Trajectory t;
  t.id = id;
  t.prompt = conv;
  t.prompt.options.add_generation_prompt = true;
  t.ids = vocab.encode(chat::render(t.prompt));
  t.prompt_len = t.turn_start = int64_t(t.ids.size());
  t.gen.assign(t.ids.size(), 0);
  t.behav_logp.assign(t.ids.size(), 0.f);
  t.version.assign(t.ids.size(), -1);
  return t;
}

// The assistant turn that just ended (ids [turn_start, end)): its response is recorded; with
// the tool on and calls made, the tool results and the next generation prompt are appended.
void end_turn(Trajectory& t, const ChatVocab& vocab, const RolloutOptions& o) {
  chat::OutputParser parser;
  auto decode = [&](int32_t id) { return vocab.tok.decode({id}); };
  for (size_t i = size_t(t.turn_start); i < t.ids.size(); ++i) feed_token(parser, vocab.markers, t.ids[i], decode);
  parser.finish();
  const chat::ParsedOutput& out = parser.result();
  t.responses.push_back(out.content);
  if (!t.tool || out.tool_calls.empty()) {
    t.finished = true, t.finish = "stop";
    return;
  }
  if (t.tool_rounds >= o.max_tool_rounds) {
    t.finished = true, t.finish = "tool_rounds";
    return;
  }
  t.tool_rounds++;
  chat::Message a;
  a.role = chat::Role::assistant;
  a.reasoning = out.reasoning;
  if (!out.content.empty()) a.content = {out.content};
  std::vector<chat::Message> results;
  for (size_t k = 0; k < out.tool_calls.size(); ++k) {
    const chat::ParsedCall& pc = out.tool_calls[k];
    chat::ToolCall call;
    call.id = "call_" + std::to_string(t.tool_calls + 1);
    call.name = pc.name;
    chat::parse_arguments(chat::Json(pc.arguments), call, "model output", "arguments");
    a.tool_calls.push_back(call);
    std::string text;
    if (pc.name != "calculator") text = "error: unknown tool '" + pc.name + "'";
    else if (!call.arguments.is_object() || !call.arguments.contains("expression") || !call.arguments["expression"].is_string())
      text = "error: calculator needs a string argument 'expression'";
    else {
      const CalcResult r = calculate(call.arguments["expression"].get<std::string>());
      text = r.text;
      t.tool_ok += r.ok ? 1 : 0;
    }
    t.tool_calls++;
    chat::Message res;
    res.role = chat::Role::tool;
    res.tool_call_id = call.id;
    res.tool_name = pc.name;
    res.content = {text};
    results.push_back(res);
  }
  chat::Conversation before = t.prompt, after = t.prompt;
  before.messages.push_back(a);
  before.options.add_generation_prompt = false;
  after.messages.push_back(a);
  for (auto& r : results) after.messages.push_back(r);
  after.options.add_generation_prompt = true;
  const std::vector<int32_t> add =
      vocab.encode(segment_suffix(chat::render(before), chat::render(after), "tool results"));
  t.prompt = after;
  t.to_feed = {t.ids.back()};  // the <|end_of_msg|> just drawn, then the tool messages
  for (int32_t id : add) {
    t.ids.push_back(id), t.gen.push_back(0), t.behav_logp.push_back(0.f), t.version.push_back(-1);
    t.to_feed.push_back(id);
  }
  t.turn_start = int64_t(t.ids.size());
}

namespace {

RolloutStats advance_serial(const K3Model& model, const ChatVocab& vocab, std::vector<Trajectory*>& ts, int64_t need,
                            int32_t version, const RolloutOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t V = model.dims().V;
  need = std::min<int64_t>(need, int64_t(ts.size()));
  RolloutStats st;
  ForwardScratch fs;
  std::vector<float> logits;
  auto finished = [&] {
    int64_t n = 0;
    for (Trajectory* t : ts) n += t->finished ? 1 : 0;
    return n;
  };
  auto on_logits = [&](Trajectory& t, const float* l) {
    const uint64_t r = mix64(mix64(o.seed) ^ mix64(t.id * 0x100000001b3ull + uint64_t(t.ids.size())));
    const double u = double(r >> 11) * 0x1.0p-53;
    double lp = 0;
    const int32_t tok = draw_token(l, V, u, &lp);
    t.ids.push_back(tok), t.gen.push_back(1), t.behav_logp.push_back(float(lp)), t.version.push_back(version);
    t.generated++, st.tokens++;
    t.to_feed.clear();
    if (t.image_tokens > 0 && tok == t.media_id) {
      // An image placeholder is no reply token: the reply ends there unanswered (malformed), and
      // the placeholder, never fed back, stays a target only (every input placeholder is the image's).
      t.finished = true, t.finish = "media";
    } else if (tok == vocab.markers.end_of_msg || (vocab.eos && tok == *vocab.eos)) {
      end_turn(t, vocab, o);
    } else {
      t.to_feed = {tok};
    }
    if (!t.finished && t.generated >= t.budget) t.finished = true, t.finish = "budget";
  };
  ForwardOptions pre;
  pre.mode = MixerMode::Prefill;
  pre.last_only = true;
  logits.resize(size_t(V));
  // A group's members share their prompt (and image): the first one's prefill (state and last
  // logits, as they were right after it) is copied to the others, which is what each would
  // have computed (the same ids and rows through the same deterministic forward).
  struct Prefilled {
    const Trajectory* t;
    DecodeState state;
    std::vector<float> logits;
  };
  std::vector<Prefilled> shared;
  auto same_prompt = [](const Trajectory& a, const Trajectory& b) {
    return a.prompt_len == b.prompt_len && a.image_rows == b.image_rows && a.media_id == b.media_id &&
           std::equal(a.ids.begin(), a.ids.begin() + a.prompt_len, b.ids.begin());
  };
  while (finished() < need) {
    // Prompts and tool results: one prefill each on the trajectory's own state.
    shared.clear();
    for (Trajectory* t : ts) {
      if (t->finished) continue;
      if (!t->started) {
        const Prefilled* hit = nullptr;
        if (int64_t(t->ids.size()) == t->prompt_len)
          for (const Prefilled& p : shared)
            if (same_prompt(*p.t, *t)) hit = &p;
        if (hit) {
          t->state = hit->state;
          std::copy(hit->logits.begin(), hit->logits.end(), logits.begin());  // [V]
        } else {
          t->state = model.new_state();
          EmbedSpliceT<float> sp;
          model.forward(logits.data(), t->ids.data(), int64_t(t->ids.size()), t->state, fs, pre, nullptr, t->splice(sp));
          st.prefills++;
          if (int64_t(t->ids.size()) == t->prompt_len)
            shared.push_back({t, t->state, std::vector<float>(logits.begin(), logits.begin() + V)});
        }
        t->started = true;
        on_logits(*t, logits.data());
      } else if (t->to_feed.size() > 1) {
        model.forward(logits.data(), t->to_feed.data(), int64_t(t->to_feed.size()), t->state, fs, pre);
        st.prefills++;
        on_logits(*t, logits.data());
      }
    }
    if (finished() >= need) break;
    // One batched decode step of every running trajectory.
    std::vector<Trajectory*> run;
    std::vector<int32_t> ids;
    std::vector<int64_t> seg = {0};
    std::vector<DecodeState*> states;
    for (Trajectory* t : ts)
      if (!t->finished && t->to_feed.size() == 1) {
        run.push_back(t), ids.push_back(t->to_feed[0]), seg.push_back(seg.back() + 1), states.push_back(&t->state);
      }
    if (run.empty()) break;
    logits.resize(size_t(V) * run.size());
    model.forward_batch(logits.data(), ids.data(), seg.data(), int64_t(run.size()), states.data(), fs);
    st.decode_steps++;
    for (size_t j = 0; j < run.size(); ++j) on_logits(*run[j], logits.data() + j * size_t(V));
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace

RolloutStats advance(const K3Model& model, const ChatVocab& vocab, std::vector<Trajectory*>& ts, int64_t need,
                     int32_t version, const RolloutOptions& o) {
  RolloutStats st;
  serial_blas([&] { st = advance_serial(model, vocab, ts, need, version, o); });  // small gemms (serial_blas.h)
  return st;
}

}  // namespace k3
