// Partial rollouts in RL checkpoints (see rollout_io.h).
#include "posttrain/rollout_io.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "train/train_state.h"

namespace fs = std::filesystem;

namespace k3 {

namespace {

using chat::Json;  // insertion-ordered: tool-call arguments render in the order they were written

// The conversation fields an RL trajectory's prompt uses (chat_types.h); system-message tool
// declarations never occur in RL prompts and are refused. Image parts keep their place and
// source name; their rows are not saved (the encoder is frozen: rl.cpp recomputes them from the
// trajectory's problem, posttrain/image_task.h).
Json message_json(const chat::Message& m) {
  if (m.tools) fail("rl checkpoint: a message with tool declarations cannot be saved");
  Json j = {{"role", chat::role_name(m.role)}, {"content", m.content}, {"name", m.name}};
  if (!m.images.empty()) {
    Json imgs = Json::array();
    for (const chat::ImagePart& p : m.images) imgs.push_back({{"before", p.before}, {"url", p.url}, {"field", p.field}});
    j["images"] = imgs;
  }
  if (m.reasoning) j["reasoning"] = *m.reasoning;
  if (m.tool_call_id) j["tool_call_id"] = *m.tool_call_id;
  if (m.tool_name) j["tool_name"] = *m.tool_name;
  Json calls = Json::array();
  for (const chat::ToolCall& c : m.tool_calls) {
    Json cj = {{"name", c.name}, {"arguments", c.arguments}};
    if (c.id) cj["id"] = *c.id;
    if (c.json_block) cj["json_block"] = *c.json_block;
    calls.push_back(cj);
  }
  j["tool_calls"] = calls;
  return j;
}

Json conversation_json(const chat::Conversation& c) {
  Json msgs = Json::array();
  for (const chat::Message& m : c.messages) msgs.push_back(message_json(m));
  const chat::Options& o = c.options;
  return {{"messages", msgs},
          {"tools", c.tools},
          {"options",
           {{"thinking", o.thinking}, {"effort", int(o.effort)}, {"tool_choice", int(o.tool_choice)},
            {"response_format", int(o.response_format)}, {"response_schema", o.response_schema},
            {"add_generation_prompt", o.add_generation_prompt}}}};
}

chat::Role role_of(const std::string& s) {
  for (chat::Role r : {chat::Role::system, chat::Role::user, chat::Role::assistant, chat::Role::tool})
    if (s == chat::role_name(r)) return r;
  throw std::runtime_error("unknown role '" + s + "'");
}

chat::Conversation conversation_of(const Json& j) {
  chat::Conversation c;
  for (const Json& mj : j.at("messages")) {
    chat::Message m;
    m.role = role_of(mj.at("role").get<std::string>());
    m.content = mj.at("content").get<std::vector<std::string>>();
    m.name = mj.at("name").get<std::string>();
    if (mj.contains("reasoning")) m.reasoning = mj["reasoning"].get<std::string>();
    if (mj.contains("tool_call_id")) m.tool_call_id = mj["tool_call_id"].get<std::string>();
    if (mj.contains("tool_name")) m.tool_name = mj["tool_name"].get<std::string>();
    if (mj.contains("images"))
      for (const Json& ij : mj["images"])
        m.images.push_back({ij.at("before").get<size_t>(), ij.at("url").get<std::string>(), ij.at("field").get<std::string>()});
    for (const Json& cj : mj.at("tool_calls")) {
      chat::ToolCall call;
      call.name = cj.at("name").get<std::string>();
      call.arguments = cj.at("arguments");
      if (cj.contains("id")) call.id = cj["id"].get<std::string>();
      if (cj.contains("json_block")) call.json_block = cj["json_block"].get<std::string>();
      m.tool_calls.push_back(call);
    }
    c.messages.push_back(m);
  }
  c.tools = j.at("tools");
  const Json& o = j.at("options");
  c.options.thinking = o.at("thinking").get<bool>();
  c.options.effort = chat::Effort(o.at("effort").get<int>());
  c.options.tool_choice = chat::ToolChoice(o.at("tool_choice").get<int>());
  c.options.response_format = chat::ResponseFormat(o.at("response_format").get<int>());
  c.options.response_schema = o.at("response_schema");
  c.options.add_generation_prompt = o.at("add_generation_prompt").get<bool>();
  return c;
}

// The f32 arrays of a decode state, in file order (per layer: KDA S, conv q / k / v, MLA
// c_kv, k_rope; a layer's arrays of the other mixer kind are empty).
template <typename State>
auto state_arrays(State& s) {
  std::vector<decltype(&s.layers[0].kda.S)> v;
  for (auto& l : s.layers)
    for (auto* a : {&l.kda.S, &l.kda.conv_q, &l.kda.conv_k, &l.kda.conv_v, &l.mla.c_kv, &l.mla.k_rope}) v.push_back(a);
  return v;
}

}  // namespace

void save_rollouts(const std::string& dir, const std::vector<Trajectory>& buffer) {
  std::vector<float> bin;
  Json list = Json::array();
  for (const Trajectory& t : buffer) {
    Json j = {{"id", t.id}, {"group", t.group}, {"item", t.item}, {"answer", t.answer}, {"effort", int(t.effort)},
              {"tool", t.tool}, {"budget", t.budget}, {"ids", t.ids}, {"prompt_len", t.prompt_len}, {"gen", t.gen},
              {"version", t.version}, {"generated", t.generated}, {"turn_start", t.turn_start},
              {"finished", t.finished}, {"finish", t.finish}, {"tool_calls", t.tool_calls}, {"tool_ok", t.tool_ok},
              {"tool_rounds", t.tool_rounds}, {"responses", t.responses}, {"to_feed", t.to_feed},
              {"started", t.started}, {"prompt", conversation_json(t.prompt)}};
    bin.insert(bin.end(), t.behav_logp.begin(), t.behav_logp.end());
    // Only a trajectory that is mid-decode needs its state; a finished one waits for its group.
    if (t.started && !t.finished) {
      Json sizes = Json::array();
      const DecodeState& st = t.state;
      for (const Buf<float>* a : state_arrays(st)) {  // rollouts run on the CPU: host buffers
        sizes.push_back(a->size());
        bin.insert(bin.end(), a->begin(), a->end());
      }
      Json mla_n = Json::array();
      for (const auto& l : st.layers) mla_n.push_back(l.mla.n);
      j["state"] = {{"n_tokens", st.n_tokens}, {"layers", st.layers.size()}, {"arrays", sizes}, {"mla_n", mla_n}};
    }
    list.push_back(j);
  }
  const Json doc = {{"format", "k3cpp.rollouts"}, {"version", 1}, {"floats", bin.size()},
                    {"bin_hash", content_hash(bin.data(), bin.size() * sizeof(float))}, {"trajectories", list}};
  write_file_atomic((fs::path(dir) / "rollouts.bin").string(), [&](std::FILE* f) {
    std::fwrite(bin.data(), sizeof(float), bin.size(), f);
  });
  write_text_file_atomic((fs::path(dir) / "rollouts.json").string(), doc.dump() + "\n");
}

std::vector<Trajectory> load_rollouts(const std::string& dir, const K3Model& model) {
  const std::string jp = (fs::path(dir) / "rollouts.json").string(), bp = (fs::path(dir) / "rollouts.bin").string();
  std::vector<Trajectory> out;
  if (!fs::exists(jp)) return out;
  std::ifstream in(jp);
  std::stringstream ss;
  ss << in.rdbuf();
  Json doc;
  try {
    doc = Json::parse(ss.str());
  } catch (const std::exception& e) {
    fail_input(jp, "", std::string("not valid JSON (") + e.what() + ")");
  }
  if (doc.value("format", "") != "k3cpp.rollouts" || doc.value("version", 0) != 1)
    fail_input(jp, "format", "not a k3cpp rollout buffer (version 1)");
  const size_t n = doc.at("floats").get<size_t>();
  std::vector<float> bin(n);
  std::FILE* f = std::fopen(bp.c_str(), "rb");
  if (!f) fail_system("cannot open the saved rollouts", bp);
  const size_t got = std::fread(bin.data(), sizeof(float), n, f);
  const bool extra = std::fgetc(f) != EOF;
  std::fclose(f);
  if (got != n || extra) fail_input(bp, "", "has the wrong size for rollouts.json (truncated or replaced)");
  if (doc.at("bin_hash") != content_hash(bin.data(), n * sizeof(float)))
    fail_input(bp, "", "content hash differs from rollouts.json (corrupted)");
  const DecodeState fresh = model.new_state();
  size_t at = 0;
  auto take = [&](std::vector<float>& v, size_t k, const std::string& field) {
    if (at + k > n) fail_input(jp, field, "needs more floats than rollouts.bin holds");
    v.assign(bin.begin() + std::ptrdiff_t(at), bin.begin() + std::ptrdiff_t(at + k));
    at += k;
  };
  const Json& list = doc.at("trajectories");
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& j = list[i];
    const std::string field = "trajectories[" + std::to_string(i) + "]";
    Trajectory t;
    try {
      t.id = j.at("id").get<uint64_t>(), t.group = j.at("group").get<int64_t>(), t.item = j.at("item").get<int64_t>();
      t.answer = j.at("answer").get<std::string>(), t.effort = chat::Effort(j.at("effort").get<int>());
      t.tool = j.at("tool").get<bool>(), t.budget = j.at("budget").get<int64_t>();
      t.ids = j.at("ids").get<std::vector<int32_t>>(), t.prompt_len = j.at("prompt_len").get<int64_t>();
      t.gen = j.at("gen").get<std::vector<uint8_t>>(), t.version = j.at("version").get<std::vector<int32_t>>();
      t.generated = j.at("generated").get<int64_t>(), t.turn_start = j.at("turn_start").get<int64_t>();
      t.finished = j.at("finished").get<bool>(), t.finish = j.at("finish").get<std::string>();
      t.tool_calls = j.at("tool_calls").get<int>(), t.tool_ok = j.at("tool_ok").get<int>();
      t.tool_rounds = j.at("tool_rounds").get<int>();
      t.responses = j.at("responses").get<std::vector<std::string>>();
      t.to_feed = j.at("to_feed").get<std::vector<int32_t>>(), t.started = j.at("started").get<bool>();
      t.prompt = conversation_of(j.at("prompt"));
    } catch (const std::exception& e) {
      fail_input(jp, field, std::string("malformed (") + e.what() + ")");
    }
    if (t.gen.size() != t.ids.size() || t.version.size() != t.ids.size())
      fail_input(jp, field + ".gen", "gen and version must have one entry per id");
    take(t.behav_logp, t.ids.size(), field + ".ids");
    if (t.started && !t.finished) {
      if (!j.contains("state")) fail_input(jp, field + ".state", "missing for a trajectory that is mid-decode");
      const Json& s = j["state"];
      if (s.at("layers").get<size_t>() != fresh.layers.size())
        fail_input(jp, field + ".state.layers", "does not match the model's layer count");
      t.state = fresh;
      t.state.n_tokens = s.at("n_tokens").get<int64_t>();
      const Json& sizes = s.at("arrays");
      std::vector<Buf<float>*> arrays = state_arrays(t.state);
      if (sizes.size() != arrays.size()) fail_input(jp, field + ".state.arrays", "has the wrong number of arrays");
      for (size_t k = 0; k < arrays.size(); ++k) {
        const size_t want = sizes[k].get<size_t>();
        if (k % 6 < 4 && want != arrays[k]->size())  // KDA S and conv states have the model's sizes
          fail_input(jp, field + ".state.arrays", "a KDA state's size does not match the model");
        take(arrays[k]->host(), want, field + ".state");
      }
      for (size_t l = 0; l < t.state.layers.size(); ++l) t.state.layers[l].mla.n = s.at("mla_n").at(l).get<int64_t>();
    }
    out.push_back(std::move(t));
  }
  if (at != n) fail_input(jp, "floats", "rollouts.bin holds floats no trajectory claims");
  return out;
}

}  // namespace k3
