// `k3cpp chat <model dir> [--system TEXT] [--effort low|high|max] [--no-think] [--tools FILE]
//             [--prompt TEXT] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
//             [--threads N] [--no-color] [--image FILE]`
// A terminal chat in K3's XTML format (io/chat_render.h) with its tiktoken vocabulary
// (tiktoken.model + tokenizer_config.json beside the checkpoint, io/tiktoken.h). Each turn
// renders the conversation, and only the segments after what the session already holds are
// encoded and prefilled: the KDA states and MLA caches carry over from turn to turn (the
// generated tokens stay in the session as the model wrote them). The reply streams through
// the output parser (io/chat_parse.h): reasoning dimmed on a terminal, then the answer, tool
// calls as one line each; tokens/s per turn on stderr. Ctrl-C stops the generation and keeps
// the session; Ctrl-D (end of input) ends the chat. With --prompt, or with input that is not
// a terminal, each line is one user turn (scripts). Images (a model with a vision_config):
// --image FILE attaches one to the first user turn, and a line `/image FILE` attaches one to
// the next; each renders as a <|media_pad|> before the turn's text, expanded to the image's
// tokens and spliced in from the encoder (infer/image_prompt.h, as `generate --image`).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/threads.h"
#include "infer/chat_vocab.h"
#include "infer/image_prompt.h"
#include "infer/sampler.h"
#include "infer/session.h"
#include "io/chat_json.h"
#include "io/chat_parse.h"
#include "io/chat_render.h"
#include "io/image.h"
#include "io/stream_decoder.h"
#include "io/tiktoken.h"
#include "cli/ram_budget.h"
#include "model/checkpoint.h"

namespace k3::cli {

using chat::Json;

namespace {

// A message of one text part (the other fields empty).
chat::Message text_message(chat::Role role, const std::string& text) {
  chat::Message m;
  m.role = role;
  m.content = {text};
  return m;
}

const char* kChatUsage =
    "usage: k3cpp chat <model dir> [--system TEXT] [--effort low|high|max] [--no-think] [--tools FILE]\n"
    "                  [--prompt TEXT] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
    "                  [--seed S] [--threads N] [--no-color] [--image FILE]\n"
    "  --system       a system message first\n"
    "  --effort       thinking effort announced to the model (default max)\n"
    "  --no-think     thinking off (the reply opens the response directly)\n"
    "  --tools        a JSON file with an array of OpenAI tool declarations\n"
    "  --prompt       one user turn, then exit (else one turn per input line; Ctrl-D ends)\n"
    "  --max-tokens   tokens per reply (default 512)\n"
    "  --temperature  0 is greedy (default 0.6); top-k / top-p / seed as in generate\n"
    "  --no-color     no dimmed reasoning even on a terminal\n"
    "  --image FILE   a PNG or PGM/PPM image attached to the first user turn (a model with a vision_config);\n"
    "                 in the chat, a line '/image FILE' attaches one to the next turn\n"
    "The model directory needs tiktoken.model (and tokenizer_config.json) beside config.json.\n";

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

chat::Effort parse_effort(const std::string& s) {
  if (s == "low") return chat::Effort::low;
  if (s == "high") return chat::Effort::high;
  if (s == "max") return chat::Effort::max;
  fail("--effort: '" + s + "' is not one of low, high, max");
}

// Whether `a` is a prefix of `b` (segment by segment).
bool is_prefix(const std::vector<chat::Segment>& a, const std::vector<chat::Segment>& b) {
  if (a.size() > b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) return false;
  return true;
}

struct Printer {
  bool color;
  bool in_reasoning = false;
  void reasoning(const std::string& t) {
    if (!in_reasoning && color) std::fputs("\x1b[2m", stdout);
    in_reasoning = true;
    std::fputs(t.c_str(), stdout);
  }
  void end_reasoning() {
    if (in_reasoning) std::fputs(color ? "\x1b[0m\n" : "\n", stdout);
    in_reasoning = false;
  }
  void show(const std::vector<chat::Delta>& ds) {
    for (const chat::Delta& d : ds) {
      switch (d.kind) {
        case chat::Delta::Kind::reasoning: reasoning(d.text); break;
        case chat::Delta::Kind::content: end_reasoning(); std::fputs(d.text.c_str(), stdout); break;
        case chat::Delta::Kind::tool_call_start: end_reasoning(); std::printf("\n[tool call %s] ", d.name.c_str()); break;
        case chat::Delta::Kind::tool_call_arguments: std::fputs(d.text.c_str(), stdout); break;
        case chat::Delta::Kind::finish: end_reasoning(); break;
      }
    }
    std::fflush(stdout);
  }
};

}  // namespace

int cmd_chat(const std::vector<std::string>& args) {
  Args a(args,
         with_ram_budget_options(
             {"system", "effort", "tools", "prompt", "max-tokens", "temperature", "top-k", "top-p", "seed", "threads",
              "image"}),
         {"no-think", "no-color", "help"}, "chat");
  if (a.flag("help")) {
    std::fputs((std::string(kChatUsage) + kRamBudgetUsage).c_str(), stdout);
    return 0;
  }
  if (a.positional().size() != 1) fail("expected one <model dir>, got " + std::to_string(a.positional().size()));
  const std::string dir = a.positional_at(0, "model dir");
  chat::Conversation conv;
  conv.options.thinking = !a.flag("no-think");
  conv.options.effort = parse_effort(a.get_or("effort", "max"));
  if (const auto f = a.get("tools")) {
    std::ifstream in(*f);
    if (!in) fail_input(*f, "", "cannot be read (--tools)");
    std::stringstream ss;
    ss << in.rdbuf();
    Json t;
    try {
      t = Json::parse(ss.str());
    } catch (const std::exception& e) {
      fail_input(*f, "", std::string("not valid JSON: ") + e.what());
    }
    if (!t.is_array()) fail_input(*f, "", "must hold a JSON array of tool declarations");
    // The request parser validates the declarations (function name, parameters schema).
    conv.tools = chat::parse_request(Json{{"messages", Json::array({{{"role", "user"}, {"content", "x"}}})}, {"tools", t}},
                                     *f)
                     .tools;
  }
  if (const auto s = a.get("system")) conv.messages.push_back(text_message(chat::Role::system, *s));
  const int64_t max_tokens = a.get_int("max-tokens", 512);
  if (max_tokens < 1) fail("--max-tokens must be >= 1");
  SamplerOptions so;
  so.temperature = a.get_double("temperature", 0.6);
  so.top_k = a.get_int("top-k", 0);
  so.top_p = a.get_double("top-p", 0.95);
  so.seed = uint64_t(a.get_int("seed", 0));
  if (so.temperature < 0 || so.top_k < 0 || so.top_p <= 0 || so.top_p > 1)
    fail("--temperature >= 0, --top-k >= 0, 0 < --top-p <= 1");
  set_num_threads(int(a.get_int("threads", 0)));

  const ModelDir md = open_model_dir(dir);
  const ChatVocab vocab = load_chat_vocab(md);
  const Tiktoken& tok = vocab.tok;
  const int32_t open_id = vocab.markers.open, close_id = vocab.markers.close, sep_id = vocab.markers.sep,
                end_id = vocab.markers.end_of_msg;
  const std::optional<int32_t> eos_id = vocab.eos;
  auto encode = [&](const std::vector<chat::Segment>& segs) { return vocab.encode(segs); };

  LoadOptions lo;
  lo.dense_as_stored = true;
  BudgetedModel bm = load_budgeted(a, md, lo, "chat", 2048);  // turns longer than 2048 tokens may exceed the budget
  const K3Model& model = bm.im->model;
  announce_machine("chat");
  Session session(model);
  Sampler sampler(so);

  // Images: the encoder is read on first use (a model without vision_config is refused then).
  std::optional<VisionModel> vis;
  std::vector<Image> images;        // every image of the conversation, in order
  std::vector<size_t> pending;      // indices into images for the next user turn
  auto attach = [&](const std::string& path) {
    if (!vis) vis = load_vision_model(dir, md.config, md.config_path);
    Image img = load_image(path);
    std::fprintf(stderr, "[image %s: %lldx%lld pixels, %lld tokens; attached to the next message]\n", path.c_str(),
                 (long long)img.height, (long long)img.width, (long long)image_token_count(*vis, img));
    images.push_back(std::move(img));
    pending.push_back(images.size() - 1);
  };
  if (const auto f = a.get("image")) attach(*f);  // before the first turn: a bad file fails the command

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESTART;  // a Ctrl-C at the prompt does not end the input
  sigaction(SIGINT, &sa, nullptr);

  const bool interactive = !a.get("prompt") && isatty(STDIN_FILENO);
  Printer printer{!a.flag("no-color") && isatty(STDOUT_FILENO)};
  std::vector<chat::Segment> held;  // the rendering whose tokens the session holds (no generation prompt)
  int turn = 0;
  std::string line;
  auto next_line = [&]() -> bool {
    if (const auto p = a.get("prompt")) {
      if (turn > 0) return false;
      line = *p;
      return true;
    }
    if (interactive) std::fputs("> ", stdout), std::fflush(stdout);
    return bool(std::getline(std::cin, line));
  };
  while (next_line()) {
    if (line.empty()) continue;
    if (line.rfind("/image", 0) == 0 && (line.size() == 6 || line[6] == ' ')) {
      const size_t b = line.find_first_not_of(' ', 6);
      if (b == std::string::npos) {
        std::fprintf(stderr, "k3cpp chat: usage: /image FILE (attaches the image to the next message)\n");
        continue;
      }
      try {
        attach(line.substr(b));
      } catch (const k3::Error& e) {  // the chat goes on; the image is not attached
        std::fprintf(stderr, "k3cpp chat: %s\n", e.what());
      }
      continue;
    }
    ++turn;
    chat::Message user = text_message(chat::Role::user, line);
    std::vector<size_t> turn_images;
    for (size_t k : pending) {
      chat::ImagePart part;
      part.before = 0;  // the image first, then the text (as generate --image and the training data)
      part.url = "image " + std::to_string(k + 1);
      user.images.push_back(part);
      turn_images.push_back(k);
    }
    pending.clear();
    conv.messages.push_back(std::move(user));
    conv.options.add_generation_prompt = true;
    const std::vector<chat::Segment> full = chat::render(conv);
    std::vector<int32_t> ids;
    std::vector<const Image*> in_ids;  // the images whose placeholders `ids` holds
    if (is_prefix(held, full)) {
      ids = encode(std::vector<chat::Segment>(full.begin() + int64_t(held.size()), full.end()));
      for (size_t k : turn_images) in_ids.push_back(&images[k]);
    } else {  // the history renders differently (should not happen): start the session over
      std::fprintf(stderr, "k3cpp chat: the history no longer renders as its prefix; re-reading it\n");
      session.reset();
      ids = encode(full);
      for (const Image& img : images) in_ids.push_back(&img);
    }
    std::optional<ImagePrompt> ip;
    if (!in_ids.empty()) {
      ip = expand_image_prompt(*vis, ids, in_ids, "chat");
      ids = ip->ids;
    }
    const int64_t cached = session.position();
    if (cached + int64_t(ids.size()) + max_tokens > md.config.max_position_embeddings &&
        md.config.max_position_embeddings > 0)
      std::fprintf(stderr, "k3cpp chat: note: %lld tokens in the session pass max_position_embeddings %lld\n",
                   (long long)(cached + int64_t(ids.size())), (long long)md.config.max_position_embeddings);
    const auto t0 = std::chrono::steady_clock::now();
    const EmbedSpliceT<float> splice{ip ? vis->media_id : -1, ip ? ip->rows.data() : nullptr, ip ? ip->image_tokens : 0,
                                     nullptr};
    const float* logits = session.prefill(ids.data(), int64_t(ids.size()), ip ? &splice : nullptr);
    const double t_prefill = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    chat::ParserOptions po;
    po.start = conv.options.thinking ? chat::StartIn::think : chat::StartIn::response;
    chat::OutputParser parser(po);
    StreamDecoder text(tok);
    g_interrupted = false;
    int64_t n = 0;
    bool ended = false;
    const auto t1 = std::chrono::steady_clock::now();
    while (n < max_tokens && !g_interrupted) {
      const int32_t id = sampler.sample(logits, session.vocab());
      ++n;
      std::vector<chat::Delta> ds;
      if (id == end_id || (eos_id && id == *eos_id)) {
        ds = parser.feed_literal(text.flush());
        for (auto& d : parser.feed_marker(chat::Marker::end_of_msg)) ds.push_back(d);
        printer.show(ds);
        ended = true;
        logits = session.step(id);
        break;
      }
      if (id == open_id || id == close_id || id == sep_id) {
        ds = parser.feed_literal(text.flush());
        const chat::Marker m = id == open_id ? chat::Marker::open : id == close_id ? chat::Marker::close : chat::Marker::sep;
        for (auto& d : parser.feed_marker(m)) ds.push_back(d);
      } else if (id < tok.vocab_size() && !tok.is_special(id)) {
        ds = parser.feed_literal(text.push(id));
      }  // other special or out-of-vocabulary ids: no text
      printer.show(ds);
      logits = session.step(id);
    }
    std::vector<chat::Delta> tail = parser.feed_literal(text.flush());
    for (auto& d : parser.finish()) tail.push_back(d);
    printer.show(tail);
    const double t_decode = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::printf("\n");
    const chat::ParsedOutput& out = parser.result();
    chat::Message reply = text_message(chat::Role::assistant, out.content);
    reply.reasoning = out.reasoning;
    for (const chat::ParsedCall& c : out.tool_calls) {
      chat::ToolCall tc;
      tc.id = c.id;
      tc.name = c.name;
      try {
        tc.arguments = Json::parse(c.arguments);
      } catch (const std::exception&) {
        tc.json_block = c.arguments;
      }
      if (!tc.arguments.is_object()) tc.json_block = c.arguments, tc.arguments = Json::object();
      reply.tool_calls.push_back(std::move(tc));
    }
    conv.messages.push_back(std::move(reply));
    if (!ended) {  // stopped early: close the message so the next turn starts cleanly
      std::vector<int32_t> close = {close_id};
      tok.encode_append("message", false, close);
      close.push_back(sep_id);
      close.push_back(end_id);
      session.prefill(close);
    }
    conv.options.add_generation_prompt = false;
    held = chat::render(conv);
    std::fprintf(stderr,
                 "[turn %d: %zu new prompt tokens after %lld in the session, prefill %.2f s; %lld tokens in %.2f s = "
                 "%.1f tok/s; %s]\n",
                 turn, ids.size(), (long long)cached, t_prefill, (long long)n, t_decode,
                 t_decode > 0 ? double(n) / t_decode : 0.0,
                 g_interrupted ? "interrupted" : ended ? "end of message" : "max tokens");
  }
  if (interactive) std::printf("\n");
  report_budgeted(bm, "chat");
  return 0;
}

}  // namespace k3::cli
