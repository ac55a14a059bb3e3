// The real server (serve/server.h) in process on 127.0.0.1, port 0, over the tiny released-layout
// model (tests/data/k3-release-tiny: random weights, K3's XTML control tokens), queried with
// httplib's client:
//  - /health (503 loading before load(), 200 after), /v1/models, /metrics (Prometheus, the
//    counters move with the requests), /tokenize + /detokenize round trip, GET / (the page);
//  - plain and streamed chat: OpenAI's shapes; the SSE stream (first delta the role, chunks,
//    finish, usage chunk with empty choices, [DONE] last) concatenates to the same message as
//    the non-streamed reply of the same greedy request; usage adds up; no marker in content;
//  - /v1/completions plain and streamed agree; n = 2 gives two choices; logprobs;
//  - bad input: a table of bodies each with its status and an OpenAI error object, 404, 413,
//    a prompt beyond the context, then a fuzz of thousands of mutated bodies (truncations, type
//    swaps, random bytes, huge numbers): every answer is JSON (an error object or a
//    completion), never a 5xx, and a valid request still succeeds afterwards;
//  - --api-key: 401 without or with a wrong key, except GET /health and GET /;
//  - a client that disconnects mid-stream cancels its engine request (the slot frees long
//    before max_tokens); a full queue is 429;
//  - response_format json_schema / json_object enforced (the content parses and validates),
//    with thinking on and off; a schema the constraint cannot compile is a 422;
//  - tool-call and reasoning plumbing with EngineOptions::forced_output (the engine emits a
//    fixed token sequence): reasoning then content; tool calls with typed arguments; the
//    missing think close; a string argument whose text spells a closing marker; streamed and
//    non-streamed parses agree in every case; stop strings over HTTP.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "common/fixture.h"
#include "common/tiny_vocab.h"
#include "infer/chat_vocab.h"
#include "serve/server.h"
#include "serve/sse.h"
#include "serve/xtml_ids.h"

using k3::serve::Json;

namespace {

using k3::test::kReleaseTiny;

using k3::test::tiny_vocab;

struct Live {
  std::unique_ptr<k3::serve::Server> server;
  std::thread thread;
  int port = 0;
  std::unique_ptr<httplib::Client> cli;

  explicit Live(k3::serve::ServerOptions so = {}, k3::EngineOptions eo = {}, bool load = true) {
    so.port = 0;
    if (eo.ctx == 4096) eo.ctx = 1024;
    eo.state_budget_mb = 256;
    server = std::make_unique<k3::serve::Server>(so, eo);
    port = server->bind();
    thread = std::thread([this] { server->run(); });
    cli = client();
    if (load) this->load();
  }
  void load() {
    k3::LoadOptions lo;
    lo.dense_as_stored = true;
    lo.log = [](const std::string&) {};
    server->load(kReleaseTiny, lo);
  }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_read_timeout(60, 0);
    c->set_keep_alive(true);
    c->set_tcp_nodelay(true);  // else each request waits out a delayed ACK (40 ms)
    return c;
  }
  ~Live() {
    cli.reset();  // an idle keep-alive connection would hold its worker until the keep-alive timeout
    server->shutdown(std::chrono::milliseconds(2000));
    thread.join();
  }
};

struct Reply {
  int status = -1;
  Json json;
  std::string body;
};

Reply post(httplib::Client& c, const std::string& path, const std::string& body, const httplib::Headers& h = {}) {
  auto r = c.Post(path.c_str(), h, body, "application/json");
  Reply out;
  if (!r) return out;
  out.status = r->status;
  out.body = r->body;
  out.json = Json::parse(r->body, nullptr, false);
  return out;
}

Reply get(httplib::Client& c, const std::string& path, const httplib::Headers& h = {}) {
  auto r = c.Get(path.c_str(), h);
  Reply out;
  if (!r) return out;
  out.status = r->status;
  out.body = r->body;
  out.json = Json::parse(r->body, nullptr, false);
  return out;
}

struct Stream {
  int status = -1;
  std::vector<std::string> events;  // data payloads, [DONE] included
  std::vector<Json> chunks;         // parsed JSON events
};

// POST with a streaming receiver; `stop_after` > 0: abort the connection after that many events.
Stream post_stream(httplib::Client& c, const std::string& path, const std::string& body, size_t stop_after = 0) {
  Stream s;
  k3::serve::SseParser parser;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    for (auto& e : parser.feed(std::string_view(data, n))) {
      s.events.push_back(e);
      if (e != "[DONE]") s.chunks.push_back(Json::parse(e, nullptr, false));
    }
    return stop_after == 0 || s.events.size() < stop_after;
  };
  httplib::Response res;
  httplib::Error err;
  c.send(req, res, err);
  s.status = res.status;
  return s;
}

void expect_error_shape(const Reply& r, int status) {
  EXPECT_EQ(r.status, status) << r.body;
  ASSERT_TRUE(r.json.is_object()) << r.body;
  ASSERT_TRUE(r.json.contains("error")) << r.body;
  const Json& e = r.json["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r.body;
  EXPECT_TRUE(e["type"].is_string()) << r.body;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << r.body;
}

// The message a client builds from a chat stream (OpenAI's accumulation rules), checking the
// wire format on the way.
struct Accumulated {
  std::vector<Json> messages;  // per choice: {content, reasoning_content, tool_calls}
  std::vector<std::string> finish;
  Json usage;
};

Accumulated accumulate_chat(const Stream& s, size_t n_choices = 1) {
  Accumulated a;
  a.messages.assign(n_choices, Json{{"content", ""}, {"reasoning_content", ""}, {"tool_calls", Json::array()}});
  a.finish.assign(n_choices, "");
  std::vector<bool> saw_role(n_choices, false);
  EXPECT_FALSE(s.events.empty());
  if (s.events.empty()) return a;
  EXPECT_EQ(s.events.back(), "[DONE]");
  std::string id;
  for (size_t k = 0; k < s.chunks.size(); ++k) {
    const Json& c = s.chunks[k];
    EXPECT_EQ(c.value("object", ""), "chat.completion.chunk") << c.dump();
    if (id.empty()) id = c.value("id", "");
    EXPECT_EQ(c.value("id", ""), id);
    if (c["choices"].empty()) {  // the usage chunk: last before [DONE]
      EXPECT_EQ(k + 1, s.chunks.size());
      a.usage = c["usage"];
      continue;
    }
    for (const Json& ch : c["choices"]) {
      const size_t i = ch["index"].get<size_t>();
      EXPECT_LT(i, n_choices);
      const Json& d = ch["delta"];
      if (!saw_role[i]) {
        EXPECT_EQ(d.value("role", ""), "assistant") << "first delta of choice " << i << ": " << d.dump();
        saw_role[i] = true;
      }
      EXPECT_TRUE(a.finish[i].empty()) << "a chunk after the finish of choice " << i;
      Json& m = a.messages[i];
      if (d.contains("content") && d["content"].is_string()) {
        m["content"] = m["content"].get<std::string>() + d["content"].get<std::string>();
      }
      if (d.contains("reasoning_content"))
        m["reasoning_content"] = m["reasoning_content"].get<std::string>() + d["reasoning_content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const Json& t : d["tool_calls"]) {
          const size_t ti = t["index"].get<size_t>();
          if (ti >= m["tool_calls"].size()) {
            EXPECT_EQ(ti, m["tool_calls"].size());
            EXPECT_TRUE(t.contains("id") && t["type"] == "function") << t.dump();
            m["tool_calls"].push_back({{"id", t["id"]}, {"type", "function"}, {"function", {{"name", t["function"]["name"]}, {"arguments", ""}}}});
          }
          if (t["function"].contains("arguments"))
            m["tool_calls"][ti]["function"]["arguments"] =
                m["tool_calls"][ti]["function"]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
        }
      if (!ch["finish_reason"].is_null()) a.finish[i] = ch["finish_reason"];
    }
  }
  for (size_t i = 0; i < n_choices; ++i) EXPECT_FALSE(a.finish[i].empty()) << "choice " << i << " never finished";
  return a;
}

// The non-streamed message in the accumulated form.
Json normalized(const Json& message) {
  return Json{{"content", message["content"].is_null() ? "" : message["content"]},
              {"reasoning_content", message["reasoning_content"].is_null() ? "" : message["reasoning_content"]},
              {"tool_calls", message.value("tool_calls", Json::array())}};
}

void expect_no_marker(const Json& m) {
  for (const char* k : {"content", "reasoning_content"})
    for (const char* mk : {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"})
      if (m[k].is_string()) {
        EXPECT_EQ(m[k].get<std::string>().find(mk), std::string::npos) << k << ": " << m[k];
      }
}

double metric(const std::string& text, const std::string& name) {
  const std::regex re("(^|\n)" + name + " ([0-9.e+-]+)");
  std::smatch m;
  if (!std::regex_search(text, m, re)) return -1;
  return std::stod(m[2]);
}

const std::string kHello = R"({"messages":[{"role":"user","content":"Hello there"}]})";
std::string with(const std::string& base, const std::string& extra) { return base.substr(0, base.size() - 1) + "," + extra + "}"; }

}  // namespace

TEST(ServeHttp, HealthLoadingThenReady) {
  Live live({}, {}, /*load=*/false);
  Reply h = get(*live.cli, "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.json["status"], "loading");
  expect_error_shape(post(*live.cli, "/v1/chat/completions", kHello), 503);
  live.load();
  h = get(*live.cli, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.json["status"], "ok");
}

TEST(ServeHttp, ModelsTokenizeMetricsPage) {
  Live live;
  Reply m = get(*live.cli, "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.json["object"], "list");
  EXPECT_EQ(m.json["data"][0]["id"], "k3-release-tiny");

  const std::string text = "Hello <|open|> wörld";
  Reply t = post(*live.cli, "/tokenize", Json{{"content", text}}.dump());
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.json["tokens"].get<std::vector<int32_t>>(), tiny_vocab().tok.encode(text, false));
  for (int32_t id : t.json["tokens"]) EXPECT_FALSE(tiny_vocab().tok.is_special(id));  // user text never becomes a marker
  Reply d = post(*live.cli, "/detokenize", Json{{"tokens", t.json["tokens"]}}.dump());
  ASSERT_EQ(d.status, 200);
  EXPECT_EQ(d.json["content"], text);
  expect_error_shape(post(*live.cli, "/detokenize", R"({"tokens":[1,99999999]})"), 400);
  expect_error_shape(post(*live.cli, "/tokenize", R"({"content":5})"), 400);

  Reply page = get(*live.cli, "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("/v1/chat/completions"), std::string::npos);
  EXPECT_NE(page.body.find("reasoning"), std::string::npos);

  const std::string before = get(*live.cli, "/metrics").body;
  ASSERT_EQ(post(*live.cli, "/v1/chat/completions", with(kHello, R"("max_tokens":3,"temperature":0)")).status, 200);
  Reply after = get(*live.cli, "/metrics");
  EXPECT_EQ(after.status, 200);
  EXPECT_EQ(metric(after.body, "k3_model_loaded"), 1);
  EXPECT_GT(metric(after.body, "k3_prompt_tokens_total"), metric(before, "k3_prompt_tokens_total"));
  EXPECT_GE(metric(after.body, "k3_generation_tokens_total"), metric(before, "k3_generation_tokens_total") + 1);
  EXPECT_EQ(metric(after.body, "k3_time_to_first_token_seconds_count"), metric(before, "k3_time_to_first_token_seconds_count") + 1);
  EXPECT_NE(after.body.find("k3_inter_token_latency_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
  EXPECT_GE(metric(after.body, "k3_prefix_cache_misses_total") + metric(after.body, "k3_prefix_cache_hits_total"), 1);
  EXPECT_GT(metric(after.body, "k3_state_memory_bytes"), -1);
  // the slot is released just after the final event: poll briefly
  double running = -1;
  for (int i = 0; i < 200 && (running = metric(get(*live.cli, "/metrics").body, "k3_requests_running")) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(running, 0);
}

TEST(ServeHttp, PlainAndStreamedChatAgree) {
  Live live;
  const std::string body = with(kHello, R"("max_tokens":24,"temperature":0,"reasoning_effort":"high")");
  Reply r = post(*live.cli, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["object"], "chat.completion");
  EXPECT_TRUE(r.json["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  const Json& ch = r.json["choices"][0];
  EXPECT_EQ(ch["message"]["role"], "assistant");
  const std::string fin = ch["finish_reason"];
  EXPECT_TRUE(fin == "stop" || fin == "length" || fin == "tool_calls") << fin;
  const Json& u = r.json["usage"];
  EXPECT_GT(u["prompt_tokens"].get<int>(), 10);
  EXPECT_GE(u["completion_tokens"].get<int>(), 1);
  EXPECT_LE(u["completion_tokens"].get<int>(), 24);
  EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  EXPECT_TRUE(u["prompt_tokens_details"]["cached_tokens"].is_number());
  expect_no_marker(ch["message"]);

  const Stream s = post_stream(*live.cli, "/v1/chat/completions",
                               with(body, R"("stream":true,"stream_options":{"include_usage":true})"));
  ASSERT_EQ(s.status, 200);
  const Accumulated a = accumulate_chat(s);
  EXPECT_EQ(a.messages[0], normalized(ch["message"]));
  EXPECT_EQ(a.finish[0], fin);
  EXPECT_EQ(a.usage["completion_tokens"], u["completion_tokens"]);
  EXPECT_EQ(a.usage["prompt_tokens"], u["prompt_tokens"]);
  // The same prompt again: its prefix came from the cache.
  EXPECT_GT(a.usage["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);

  // Without include_usage: no usage chunk.
  const Stream s2 = post_stream(*live.cli, "/v1/chat/completions", with(body, R"("stream":true)"));
  for (const Json& c : s2.chunks) EXPECT_FALSE(c["choices"].empty());
}

TEST(ServeHttp, CompletionsChoicesLogprobs) {
  Live live;
  const std::string body = R"({"prompt":"Once upon a time","max_tokens":12,"temperature":0})";
  Reply r = post(*live.cli, "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["object"], "text_completion");
  const std::string text = r.json["choices"][0]["text"];
  const Stream s = post_stream(*live.cli, "/v1/completions", with(body, R"("stream":true)"));
  std::string streamed;
  for (const Json& c : s.chunks)
    for (const Json& ch : c["choices"]) streamed += ch["text"].get<std::string>();
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(s.events.back(), "[DONE]");

  // n = 2 with sampling: two choices, each seeded on its own.
  Reply n2 = post(*live.cli, "/v1/chat/completions", with(kHello, R"("max_tokens":6,"n":2,"seed":5,"temperature":1.0)"));
  ASSERT_EQ(n2.status, 200) << n2.body;
  ASSERT_EQ(n2.json["choices"].size(), 2u);
  EXPECT_EQ(n2.json["choices"][1]["index"], 1);
  const Stream ns = post_stream(*live.cli, "/v1/chat/completions",
                                with(kHello, R"("max_tokens":6,"n":2,"seed":5,"temperature":1.0,"stream":true)"));
  const Accumulated na = accumulate_chat(ns, 2);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(na.messages[size_t(i)], normalized(n2.json["choices"][i]["message"])) << i;

  // Logprobs: one entry per generated token, top_logprobs best first.
  Reply lp = post(*live.cli, "/v1/chat/completions", with(kHello, R"("max_tokens":5,"logprobs":true,"top_logprobs":3,"temperature":0)"));
  ASSERT_EQ(lp.status, 200) << lp.body;
  const Json& content = lp.json["choices"][0]["logprobs"]["content"];
  EXPECT_EQ(content.size(), lp.json["usage"]["completion_tokens"].get<size_t>());
  for (const Json& e : content) {
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][2]["logprob"].get<double>());
    EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]);  // greedy: the chosen one is the best
  }
}

TEST(ServeHttp, BadInputGetsOpenAIErrorsAndTheServerKeepsServing) {
  k3::serve::ServerOptions so;
  so.max_body_bytes = 64 << 10;
  k3::EngineOptions eo;
  eo.ctx = 512;
  Live live(so, eo);
  struct Case {
    std::string path, body;
    int status;
  };
  const std::string longtext(3000, 'x');
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", 400},
      {"/v1/chat/completions", "", 400},
      {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", 400},
      {"/v1/chat/completions", R"({"messages":[{"role":"robot","content":"x"}]})", 400},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":{"a":1}}]})", 400},
      {"/v1/chat/completions", with(kHello, R"("max_tokens":-5)"), 400},
      {"/v1/chat/completions", with(kHello, R"("max_tokens":1e300)"), 400},
      {"/v1/chat/completions", with(kHello, R"("max_tokens":10000)"), 400},
      {"/v1/chat/completions", with(kHello, R"("n":0)"), 400},
      {"/v1/chat/completions", with(kHello, R"("temperature":[1])"), 400},
      {"/v1/chat/completions", with(kHello, R"("tools":[{"type":"function","function":{"name":"f","parameters":[1,2]}}])"), 422},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":")" + longtext + R"("}]})", 400},  // beyond ctx
      {"/v1/completions", R"({"prompt":[1,2,99999]})", 400},
      {"/v1/completions", R"({"prompt":{}})", 400},
  };
  for (const Case& c : cases) {
    const Reply r = post(*live.cli, c.path, c.body);
    expect_error_shape(r, c.status);
  }
  const Reply ctx = post(*live.cli, "/v1/chat/completions", cases[11].body);
  EXPECT_EQ(ctx.json["error"]["code"], "context_length_exceeded");
  expect_error_shape(get(*live.cli, "/v1/nothing"), 404);
  expect_error_shape(post(*live.cli, "/v1/chat/completions", std::string(100 << 10, ' ')), 413);
  auto fresh = live.client();
  const Reply ok = post(*fresh, "/v1/chat/completions", with(kHello, R"("max_tokens":2)"));
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST(ServeHttp, FuzzedBodiesNeverBreakTheServer) {
  k3::EngineOptions eo;
  eo.ctx = 400;
  Live live({}, eo);
  const std::vector<std::string> seeds = {
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":2,"temperature":0.7,"top_p":0.9,"stop":["x"],"seed":3})",
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":"b","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}],"max_tokens":2})",
      R"({"messages":[{"role":"user","content":"q"}],"max_tokens":2,"response_format":{"type":"json_object"},"reasoning_effort":"low","n":2,"logprobs":true,"top_logprobs":2})",
      R"({"messages":[{"role":"user","content":"q"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}})",
  };
  std::mt19937 rng(1234);
  const std::vector<std::string> swaps = {"null", "true", "-1", "0", "1e308", "-1e308", "99999999999999999999999",
                                          "\"\"", "\"x\"", "[]", "{}", "[[[[[]]]]]", "1.5", "\"\\ud800\""};
  int n_ok = 0, n_err = 0;
  double fuzz_seconds = 0;
  const int kIters = 4000;
  for (int it = 0; it < kIters; ++it) {
    std::string b = seeds[rng() % seeds.size()];
    const int kind = int(rng() % 5);
    if (kind == 0) {
      b = b.substr(0, rng() % b.size());  // truncation
    } else if (kind == 1) {  // a value swapped for one of another type
      std::vector<size_t> colons;
      for (size_t i = 0; i < b.size(); ++i)
        if (b[i] == ':') colons.push_back(i);
      const size_t at = colons[rng() % colons.size()] + 1;
      size_t end = at;
      int depth = 0;
      bool str = false;
      for (; end < b.size(); ++end) {
        const char c = b[end];
        if (str) {
          if (c == '\\') ++end;
          else if (c == '"') str = false;
          continue;
        }
        if (c == '"') {
          str = true;
        } else if (c == '[' || c == '{') {
          ++depth;
        } else if (c == ']' || c == '}') {
          if (depth == 0) break;
          --depth;
        } else if (c == ',' && depth == 0) {
          break;
        }
      }
      b = b.substr(0, at) + swaps[rng() % swaps.size()] + b.substr(end);
    } else if (kind == 2) {  // random bytes overwritten
      for (int k = 0, m = 1 + int(rng() % 4); k < m; ++k) b[rng() % b.size()] = char(rng() % 256);
    } else if (kind == 3) {  // random bytes inserted
      b.insert(rng() % b.size(), std::string(1 + rng() % 3, char(rng() % 256)));
    } else {  // a numeric field made huge or negative
      const size_t p = b.find("\"max_tokens\":2");
      if (p != std::string::npos) b.replace(p, 14, std::string("\"max_tokens\":") + (rng() % 2 ? "-" : "") + std::to_string(rng()) + "000000000");
    }
    const bool stream = b.find("\"stream\":true") != std::string::npos;
    const auto t_req = std::chrono::steady_clock::now();
    struct Timer {
      std::chrono::steady_clock::time_point t0;
      double* acc;
      ~Timer() { *acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    } timer{t_req, &fuzz_seconds};
    if (stream) {
      const Stream s = post_stream(*live.cli, "/v1/chat/completions", b);
      ASSERT_TRUE(s.status == 200 || (s.status >= 400 && s.status < 500)) << s.status << " for " << b;
      if (s.status == 200) {
        ++n_ok;
        ASSERT_FALSE(s.events.empty());
        EXPECT_EQ(s.events.back(), "[DONE]") << b;
      } else {
        ++n_err;
      }
      continue;
    }
    const Reply r = post(*live.cli, "/v1/chat/completions", b);
    ASSERT_TRUE(r.status == 200 || (r.status >= 400 && r.status < 500)) << r.status << " " << r.body << " for " << b;
    ASSERT_TRUE(r.json.is_object()) << r.body;
    if (r.status == 200) {
      ++n_ok;
      EXPECT_EQ(r.json["object"], "chat.completion");
    } else {
      ++n_err;
      ASSERT_TRUE(r.json.contains("error")) << r.body;
    }
  }
  std::printf("fuzz: %d bodies (%d answered 200, %d errors) in %.1f s\n", kIters, n_ok, n_err, fuzz_seconds);
  EXPECT_GT(n_ok, 50);
  EXPECT_GT(n_err, 500);
  const Reply ok = post(*live.cli, "/v1/chat/completions", seeds[0]);
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(get(*live.cli, "/health").status, 200);
}

TEST(ServeHttp, ApiKey) {
  k3::serve::ServerOptions so;
  so.api_key = "sekret-123";
  Live live(so);
  EXPECT_EQ(get(*live.cli, "/health").status, 200);
  EXPECT_EQ(get(*live.cli, "/").status, 200);
  expect_error_shape(get(*live.cli, "/v1/models"), 401);
  expect_error_shape(get(*live.cli, "/metrics"), 401);
  expect_error_shape(post(*live.cli, "/v1/chat/completions", kHello), 401);
  expect_error_shape(get(*live.cli, "/v1/models", {{"Authorization", "Bearer sekret-12"}}), 401);
  expect_error_shape(get(*live.cli, "/v1/models", {{"Authorization", "sekret-123"}}), 401);
  EXPECT_EQ(get(*live.cli, "/v1/models", {{"Authorization", "Bearer sekret-123"}}).status, 200);
  EXPECT_EQ(post(*live.cli, "/v1/chat/completions", with(kHello, R"("max_tokens":2)"), {{"Authorization", "Bearer sekret-123"}}).status,
            200);
}

TEST(ServeHttp, DisconnectCancelsAndFullQueueIs429) {
  k3::EngineOptions eo;
  eo.parallel = 1;
  eo.queue_limit = 0;
  eo.ctx = 4000;
  // forced output that never ends the message: the request runs to max_tokens unless cancelled
  eo.forced_output.assign(4000, tiny_vocab().tok.encode("a", false)[0]);
  Live live({}, eo);
  const std::string body = with(kHello, R"("max_tokens":3600,"stream":true)");
  // A client that reads 3 events and hangs up.
  const auto t0 = std::chrono::steady_clock::now();
  const Stream s = post_stream(*live.cli, "/v1/chat/completions", body, 3);
  EXPECT_EQ(s.events.size(), 3u) << "status " << s.status;
  // The slot frees within a few steps, long before 3900 tokens.
  k3::EngineStats st;
  for (int i = 0; i < 500; ++i) {
    st = live.server->stats();
    if (st.running == 0 && st.waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(st.running, 0);
  EXPECT_LT(st.generation_tokens_total, 3600u) << "the request ran to the end: the disconnect did not cancel it";
  std::printf("disconnect: slot free after %.2f s, %llu tokens generated\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              (unsigned long long)st.generation_tokens_total);
  const std::string m = get(*live.cli, "/metrics").body;
  EXPECT_GE(metric(m, "k3_streams_cancelled_total"), 1);

  // While one long request holds the only slot (queue limit 0), the next one is refused.
  std::atomic<bool> first_done{false};
  std::thread first([&] {
    auto c = live.client();
    post_stream(*c, "/v1/chat/completions", body, 40);
    first_done = true;
  });
  for (int i = 0; i < 500 && live.server->stats().running == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto c2 = live.client();
  const Reply busy = post(*c2, "/v1/chat/completions", with(kHello, R"("max_tokens":2)"));
  expect_error_shape(busy, 429);
  first.join();
}

// ---------------------------------------------------------------------------------------------
// Parsing plumbing with a forced output: what the model "says" is fixed; the server must turn
// it into the right OpenAI fields, streamed and not.

namespace {

struct ForcedCase {
  Json message;  // the non-streamed message
  std::string finish;
  Accumulated streamed;
};

ForcedCase run_forced(const std::string& xtml, const std::string& extra = R"("max_tokens":500)") {
  k3::EngineOptions eo;
  eo.forced_output = k3::test::xtml_ids(tiny_vocab(), xtml);
  Live live({}, eo);
  const std::string body = with(kHello, extra);
  const Reply r = post(*live.cli, "/v1/chat/completions", body);
  ForcedCase fc;
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return fc;
  fc.message = r.json["choices"][0]["message"];
  fc.finish = r.json["choices"][0]["finish_reason"];
  fc.streamed = accumulate_chat(post_stream(*live.cli, "/v1/chat/completions", with(body, R"("stream":true)")));
  // Call ids are fresh per response: compare the rest, and check the ids are there and distinct.
  Json a = fc.streamed.messages[0], b = normalized(fc.message);
  std::set<std::string> ids;
  for (Json* m : {&a, &b})
    for (Json& t : (*m)["tool_calls"]) {
      EXPECT_TRUE(t["id"].is_string() && !t["id"].get<std::string>().empty());
      ids.insert(t["id"].get<std::string>());
      t.erase("id");
    }
  EXPECT_EQ(ids.size(), 2 * b["tool_calls"].size());
  EXPECT_EQ(a, b) << "streamed and non-streamed parses differ";
  EXPECT_EQ(fc.streamed.finish[0], fc.finish);
  expect_no_marker(fc.message);
  return fc;
}

const std::string kClose = "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";

}  // namespace

TEST(ServeHttpForced, ReasoningThenContent) {
  const ForcedCase f = run_forced("The user greets me.<|close|>think<|sep|><|open|>response<|sep|>Hello! How can I help?" + kClose);
  EXPECT_EQ(f.message["reasoning_content"], "The user greets me.");
  EXPECT_EQ(f.message["content"], "Hello! How can I help?");
  EXPECT_EQ(f.finish, "stop");
}

TEST(ServeHttpForced, ToolCallsWithTypedArguments) {
  const ForcedCase f = run_forced(
      "Need the weather.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
      "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
      "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
      "<|open|>argument key=\"units\" type=\"object\"<|sep|>{\"t\":\"C\",\"wind\":[1,2]}<|close|>argument<|sep|>"
      "<|close|>call<|sep|>"
      "<|open|>call tool=\"get_time\" index=\"2\"<|sep|><|open|>argument key=\"utc\" type=\"boolean\"<|sep|>false"
      "<|close|>argument<|sep|><|close|>call<|sep|>"
      "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>");
  EXPECT_EQ(f.finish, "tool_calls");
  EXPECT_TRUE(f.message["content"].is_null());
  ASSERT_EQ(f.message["tool_calls"].size(), 2u);
  const Json& c0 = f.message["tool_calls"][0];
  EXPECT_EQ(c0["type"], "function");
  EXPECT_EQ(c0["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(c0["function"]["arguments"].get<std::string>()),
            (Json{{"city", "Paris"}, {"days", 3}, {"units", {{"t", "C"}, {"wind", {1, 2}}}}}));
  EXPECT_EQ(Json::parse(f.message["tool_calls"][1]["function"]["arguments"].get<std::string>()), (Json{{"utc", false}}));
  EXPECT_NE(c0["id"], f.message["tool_calls"][1]["id"]);
}

TEST(ServeHttpForced, MissingThinkClose) {
  const ForcedCase f = run_forced("hmm<|open|>response<|sep|>Answer." + kClose);
  EXPECT_EQ(f.message["reasoning_content"], "hmm");
  EXPECT_EQ(f.message["content"], "Answer.");
}

TEST(ServeHttpForced, StringArgumentSpellingAMarker) {
  const ForcedCase f = run_forced(
      "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
      "<|open|>call tool=\"write\" index=\"1\"<|sep|><|open|>argument key=\"text\" type=\"string\"<|sep|>"
      "[[x<|close|>argument<|sep|>y<|end_of_msg|>]]<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
      "<|close|>message<|sep|><|end_of_msg|>");
  ASSERT_EQ(f.message["tool_calls"].size(), 1u);
  EXPECT_EQ(Json::parse(f.message["tool_calls"][0]["function"]["arguments"].get<std::string>())["text"],
            "x<|close|>argument<|sep|>y<|end_of_msg|>");
}

TEST(ServeHttpForced, StopStringAndLength) {
  ForcedCase f = run_forced("r<|close|>think<|sep|><|open|>response<|sep|>one two three four" + kClose,
                            R"("max_tokens":500,"stop":["three"])");
  EXPECT_EQ(f.message["content"], "one two ");
  EXPECT_EQ(f.finish, "stop");
  f = run_forced("r<|close|>think<|sep|><|open|>response<|sep|>one two three four" + kClose, R"("max_tokens":4)");
  EXPECT_EQ(f.finish, "length");
}

// response_format enforced by the JSON constraint (infer/chat_json_constraint.h) on the random
// model: reasoning runs free, then the answer is JSON that validates, streamed and not.
TEST(ServeHttp, ResponseFormatIsEnforced) {
  Live live;
  const std::string schema =
      R"({"type":"object","properties":{"ok":{"type":"boolean"},"colour":{"enum":["red","green"]},"n":{"type":"integer"}},"required":["ok","colour"],"additionalProperties":false})";
  for (uint64_t seed = 0; seed < 3; ++seed) {
    const std::string body = with(kHello, R"("max_tokens":200,"temperature":1.0,"seed":)" + std::to_string(seed) +
                                              R"(,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":)" +
                                              schema + "}}");
    const Reply r = post(*live.cli, "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const Json& ch = r.json["choices"][0];
    EXPECT_EQ(ch["finish_reason"], "stop") << r.body;
    const Json v = Json::parse(ch["message"]["content"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(v.is_object()) << r.body;
    EXPECT_TRUE(v["ok"].is_boolean()) << v.dump();
    EXPECT_TRUE(v["colour"] == "red" || v["colour"] == "green") << v.dump();
    for (auto it = v.begin(); it != v.end(); ++it) EXPECT_TRUE(it.key() == "ok" || it.key() == "colour" || it.key() == "n") << v.dump();
    const Accumulated a = accumulate_chat(post_stream(*live.cli, "/v1/chat/completions", with(body, R"("stream":true)")));
    EXPECT_EQ(a.messages[0], normalized(ch["message"]));
    std::printf("json_schema seed %d: reasoning %zu bytes, content %s\n", int(seed),
                ch["message"]["reasoning_content"].is_string() ? ch["message"]["reasoning_content"].get<std::string>().size() : 0,
                ch["message"]["content"].get<std::string>().c_str());
  }
  // Thinking off: the JSON starts at once.
  const Reply off = post(*live.cli, "/v1/chat/completions",
                         with(kHello, R"("max_tokens":120,"reasoning_effort":"none","response_format":{"type":"json_schema","json_schema":{"schema":)" +
                                          schema + "}}"));
  ASSERT_EQ(off.status, 200) << off.body;
  EXPECT_TRUE(Json::parse(off.json["choices"][0]["message"]["content"].get<std::string>(), nullptr, false).is_object()) << off.body;
  EXPECT_TRUE(off.json["choices"][0]["message"]["reasoning_content"].is_null());
  // json_object: an object whenever the reply ended within max_tokens.
  const Reply obj = post(*live.cli, "/v1/chat/completions", with(kHello, R"("max_tokens":300,"seed":1,"response_format":{"type":"json_object"})"));
  ASSERT_EQ(obj.status, 200) << obj.body;
  if (obj.json["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(Json::parse(obj.json["choices"][0]["message"]["content"].get<std::string>(), nullptr, false).is_object()) << obj.body;
  }
  // A schema the constraint cannot compile is refused up front, naming the keyword.
  const Reply bad = post(*live.cli, "/v1/chat/completions",
                         with(kHello, R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"a+"}}})"));
  expect_error_shape(bad, 422);
  EXPECT_NE(bad.json["error"]["message"].get<std::string>().find("pattern"), std::string::npos) << bad.body;
}

// shutdown() (the SIGTERM path): new requests are refused, a stream in flight past the drain
// deadline is cancelled and still ends properly (a finish, then [DONE]), and run() returns.
TEST(ServeHttp, ShutdownDrainsInFlightStreams) {
  k3::EngineOptions eo;
  eo.ctx = 4000;
  eo.forced_output.assign(3900, tiny_vocab().tok.encode("a", false)[0]);
  auto live = std::make_unique<Live>(k3::serve::ServerOptions{}, eo);
  Stream s;
  std::thread t([&] {
    auto c = live->client();
    s = post_stream(*c, "/v1/chat/completions", with(kHello, R"("max_tokens":3600,"stream":true)"));
  });
  for (int i = 0; i < 500 && live->server->stats().generation_tokens_total < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(live->server->shutdown(std::chrono::milliseconds(100)), 1);  // one request cancelled
  t.join();
  live->thread.join();  // run() returned
  live->thread = std::thread([] {});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 8.0);
  ASSERT_EQ(s.status, 200);
  ASSERT_FALSE(s.events.empty());
  EXPECT_EQ(s.events.back(), "[DONE]");
  const Accumulated a = accumulate_chat(s);
  EXPECT_EQ(a.finish[0], "abort");
  EXPECT_LT(live->server->stats().generation_tokens_total, 3600u);
}

// Under --ram-budget the routed experts stream from disk into the expert cache (and, forced
// here, the dense trunk through a ring of two slots, then also the embedding and lm_head in
// blocks of 64 rows: the server's calls have one row per sequence here, where the blocked
// product equals the unblocked one): the same greedy reply, token for token and
// log-probability for log-probability, as the resident server.
TEST(ServeHttp, RamBudgetGivesTheResidentReply) {
  const std::string body = with(kHello, R"("max_tokens":12,"temperature":0,"logprobs":true,"top_logprobs":2)");
  Live resident;
  const Reply want = post(*resident.cli, "/v1/chat/completions", body);
  ASSERT_EQ(want.status, 200) << want.body;
  for (int mode : {0, 1, 2}) {
    const bool ring = mode >= 1, head = mode == 2;
    Live budgeted({}, {}, false);
    k3::LoadOptions lo;
    lo.dense_as_stored = true;
    lo.log = [](const std::string&) {};
    lo.ram_budget_bytes = 60'000'000;
    k3::StreamOptions so;
    so.tokens_per_call = 256;
    so.stream_trunk = ring;
    so.trunk_slots = ring ? 2 : 0;
    so.stream_head = head;
    so.head_block_rows = head ? 64 : 0;
    budgeted.server->load(kReleaseTiny, lo, so, 1e9);
    ASSERT_NE(budgeted.server->inference_model(), nullptr);
    ASSERT_NE(budgeted.server->inference_model()->stream, nullptr);  // really streaming
    EXPECT_EQ(budgeted.server->inference_model()->trunk != nullptr, ring);
    EXPECT_EQ(budgeted.server->inference_model()->head != nullptr, head);
    const Reply got = post(*budgeted.cli, "/v1/chat/completions", body);
    ASSERT_EQ(got.status, 200) << got.body;
    EXPECT_EQ(got.json["choices"][0]["message"], want.json["choices"][0]["message"]) << "mode " << mode;
    EXPECT_EQ(got.json["choices"][0]["logprobs"], want.json["choices"][0]["logprobs"]) << "mode " << mode;
    EXPECT_GT(budgeted.server->inference_model()->stream->stats().calls, 0);
    if (ring) {
      EXPECT_GT(budgeted.server->inference_model()->trunk->stats().acquires, 0);
    }
    if (head) {
      EXPECT_GT(budgeted.server->inference_model()->head->stats().block_reads, 0);
    }
  }
}
