// The HTTP server (see server.h).
#include "serve/server.h"

#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <thread>
#include <random>
#include <shared_mutex>

#include "core/error.h"
#include "core/threads.h"
#include "infer/chat_json_constraint.h"
#include "infer/chat_vocab.h"
#include "infer/image_prompt.h"
#include "infer/json_schema.h"
#include "io/chat_render.h"
#include "serve/api_error.h"
#include "serve/chat_page.h"
#include "serve/image_parts.h"
#include "serve/choice.h"
#include "serve/metrics.h"
#include "serve/request.h"
#include "serve/response.h"
#include "serve/sse.h"

namespace k3::serve {

namespace {

using Clock = std::chrono::steady_clock;
using Handles = std::vector<std::shared_ptr<RequestHandle>>;

void cancel_all(const Handles& hs) {
  for (const auto& h : hs) h->cancel();
}

void send_json(httplib::Response& res, int status, const Json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_json(e)); }

// A choice's writer state in a stream.
struct StreamChoice {
  std::unique_ptr<ChatChoice> chat;
  std::unique_ptr<TextChoice> text;
  bool done = false;
};

}  // namespace

struct Server::Impl {
  ServerOptions opt;
  EngineOptions eopt;
  httplib::Server http;

  // Loaded state: vocab first, then model and engine. Readers take `mu` shared.
  mutable std::shared_mutex mu;
  std::unique_ptr<ChatVocab> vocab;
  std::shared_ptr<const JsonVocab> json_vocab;  // response_format: each id's bytes as a trie
  K3ChatJsonIds json_ids;
  std::unique_ptr<InferenceModel> model;  // the model and, under a RAM budget, its expert stream
  std::unique_ptr<VisionModel> vision;    // the encoder, when config.json has a vision_config
  std::unique_ptr<Engine> engine;
  std::string load_error;
  std::string model_name;
  int64_t created = std::time(nullptr);
  std::atomic<bool> ready{false}, stopping{false};
  // run()'s life, so a shutdown() that races the start of listening still stops it.
  std::mutex run_mu;
  bool run_entered = false;
  std::atomic<bool> run_returned{false};
  // httplib's stop() does nothing before listen starts: wait for it (or for run() to end).
  void stop_http() {
    bool entered;
    {
      std::lock_guard<std::mutex> lk(run_mu);
      entered = run_entered;
    }
    if (!entered) return;  // run() will see `stopping` and not listen
    while (!http.is_running() && !run_returned.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    http.stop();
  }

  std::mutex counters_mu;
  ServerCounters counters;

  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};

  Impl(ServerOptions o, EngineOptions e) : opt(std::move(o)), eopt(std::move(e)) { model_name = opt.model_name; }

  uint64_t draw() {
    std::lock_guard<std::mutex> lk(rng_mu);
    return rng();
  }
  std::string new_id(const char* prefix) {
    static const char* hex = "0123456789abcdef";
    std::string s = prefix;
    uint64_t a = draw(), b = draw();
    for (int i = 0; i < 16; ++i) s += hex[(a >> (4 * i)) & 15];
    for (int i = 0; i < 8; ++i) s += hex[(b >> (4 * i)) & 15];
    return s;
  }

  const ChatVocab& need_vocab() const {
    if (!vocab) throw ApiError(503, "the model is loading", "", "model_loading");
    return *vocab;
  }
  Engine& need_engine() const {
    if (!ready.load() || !engine) throw ApiError(503, load_error.empty() ? "the model is loading" : "the model failed to load: " + load_error, "", "model_loading");
    if (stopping.load()) throw ApiError(503, "the server is shutting down", "", "shutting_down");
    return *engine;
  }

  Handles submit_all(Engine& eng, std::vector<GenerationRequest> reqs) {
    Handles hs;
    try {
      for (auto& r : reqs) hs.push_back(eng.submit(std::move(r)));
    } catch (const QueueFull& e) {
      cancel_all(hs);
      throw ApiError(429, e.what(), "", "queue_full");
    } catch (const k3::Error& e) {
      cancel_all(hs);
      if (stopping.load()) throw ApiError(503, e.what(), "", "shutting_down");
      throw ApiError(400, e.what());
    }
    return hs;
  }

  void count_stop(bool hit) {
    if (!hit) return;
    std::lock_guard<std::mutex> lk(counters_mu);
    ++counters.stop_string_hits;
  }

  void setup_routes();
  void chat_completions(const httplib::Request& req, httplib::Response& res);
  void completions(const httplib::Request& req, httplib::Response& res);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void models(const httplib::Request& req, httplib::Response& res);
  void metrics(const httplib::Request& req, httplib::Response& res);
  void authorize(const httplib::Request& req) const;
  void detokenize(const httplib::Request& req, httplib::Response& res);
};

// ---------------------------------------------------------------------------------------------
// Routes

void Server::Impl::setup_routes() {
  const int threads =
      opt.http_threads > 0 ? opt.http_threads : int(std::max<int64_t>(8, eopt.parallel + eopt.queue_limit + 8));
  http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_tcp_nodelay(true);
  http.set_keep_alive_max_count(1000);
  http.set_keep_alive_timeout(5);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);

  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    if (res.status == 404) msg = "no route for " + req.method + " " + req.path;
    else if (res.status == 413) msg = "the request body is too large";
    else if (res.status == 405) msg = "method not allowed";
    else msg = "HTTP status " + std::to_string(res.status);
    res.set_content(dump(error_json(res.status, msg)), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    send_json(res, 500, error_json(500, msg));
  });
  http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    std::lock_guard<std::mutex> lk(counters_mu);
    ++counters.responses_by_status[res.status];
  });

  // Each API handler checks the key, then turns ApiError into its JSON; anything else reaches
  // the exception handler. (The key is checked in the handler, after httplib has read the body:
  // a pre-routing refusal would leave the body unread on a keep-alive connection.)
  auto api = [this](void (Impl::*fn)(const httplib::Request&, httplib::Response&)) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        authorize(req);
        (this->*fn)(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    };
  };
  http.Post("/v1/chat/completions", api(&Impl::chat_completions));
  http.Post("/v1/completions", api(&Impl::completions));
  http.Post("/tokenize", api(&Impl::tokenize));
  http.Post("/detokenize", api(&Impl::detokenize));
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready.load() && !stopping.load()) return send_json(res, 200, Json{{"status", "ok"}});
    std::shared_lock<std::shared_mutex> lk(mu);
    if (!load_error.empty())
      return send_json(res, 503, Json{{"status", "error"}, {"error", error_json(503, load_error)["error"]}});
    send_json(res, 503, Json{{"status", stopping.load() ? "shutting_down" : "loading"}});
  });
  http.Get("/v1/models", api(&Impl::models));
  http.Get("/metrics", api(&Impl::metrics));
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    const std::string_view page = chat_page_html();
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });
}

void Server::Impl::authorize(const httplib::Request& req) const {
  if (opt.api_key.empty()) return;
  const std::string want = "Bearer " + opt.api_key;
  const std::string got = req.get_header_value("Authorization");
  unsigned char diff = got.size() == want.size() ? 0 : 1;  // constant time for equal lengths
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) diff |= static_cast<unsigned char>(got[i] ^ want[i]);
  if (diff != 0)
    throw ApiError(401, got.empty() ? "missing API key: send Authorization: Bearer <key>" : "invalid API key", "",
                   "invalid_api_key");
}

void Server::Impl::models(const httplib::Request&, httplib::Response& res) {
  {
    std::shared_lock<std::shared_mutex> lk(mu);
    send_json(res, 200, models_json(model_name, created, eopt.ctx));
  }
}

void Server::Impl::metrics(const httplib::Request&, httplib::Response& res) {
  {
    EngineStats s;
    {
      std::shared_lock<std::shared_mutex> lk(mu);
      if (engine) s = engine->stats();
    }
    ServerCounters c;
    {
      std::lock_guard<std::mutex> lk(counters_mu);
      c = counters;
    }
    c.loaded = ready.load();
    res.set_content(render_metrics(s, LatencyHistogram::bounds(), c), "text/plain; version=0.0.4; charset=utf-8");
  }
}

void Server::Impl::tokenize(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req.body);
  std::shared_lock<std::shared_mutex> lk(mu);
  const ChatVocab& v = need_vocab();
  auto it = body.find("content");
  if (it == body.end() || !it->is_string()) throw ApiError(400, "content: expected a string", "content");
  bool special = false;
  if (auto p = body.find("parse_special"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) throw ApiError(400, "parse_special: expected true or false", "parse_special");
    special = p->get<bool>();
  }
  bool pieces = false;
  if (auto p = body.find("with_pieces"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) throw ApiError(400, "with_pieces: expected true or false", "with_pieces");
    pieces = p->get<bool>();
  }
  const std::vector<int32_t> ids = v.tok.encode(it->get<std::string>(), special);
  Json toks = Json::array();
  for (int32_t id : ids) {
    if (pieces) toks.push_back(Json{{"id", id}, {"piece", token_text(v, id)}});
    else toks.push_back(id);
  }
  send_json(res, 200, Json{{"tokens", toks}});
}

void Server::Impl::detokenize(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req.body);
  std::shared_lock<std::shared_mutex> lk(mu);
  const ChatVocab& v = need_vocab();
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw ApiError(400, "tokens: expected an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= v.tok.vocab_size())
      throw ApiError(400, "tokens[" + std::to_string(i) + "]: not a token id of this vocabulary (0.." +
                              std::to_string(v.tok.vocab_size() - 1) + "): " + t.dump(),
                     "tokens[" + std::to_string(i) + "]");
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  send_json(res, 200, Json{{"content", v.tok.decode(ids)}});
}

// ---------------------------------------------------------------------------------------------
// Generation: one loop for streamed and whole responses, chat and text.

namespace {

struct Job {
  bool chat = true;
  bool stream = false, include_usage = false;
  int top_logprobs = -1;
  ResponseHead head;
  Handles handles;
  std::vector<StreamChoice> choices;
  std::vector<Json> logprobs;  // per choice: the chat entries (array) / completions parts
  std::vector<std::string> finish;
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  std::string error;
};

Json completion_logprobs_init() {
  return Json{{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
}

void add_completion_logprob(Json& lp, const ChatVocab& v, const GenerationEvent& ev, size_t offset) {
  lp["tokens"].push_back(token_text(v, ev.id));
  lp["token_logprobs"].push_back(ev.logprob);
  Json top = Json::object();
  for (const TokenLogprob& t : ev.top) top[token_text(v, t.id)] = t.logprob;
  lp["top_logprobs"].push_back(top);
  lp["text_offset"].push_back(offset);
}

// Runs the job's handles to their final events, calling `out` with each SSE chunk (stream) and
// filling the job's results. `out` returning false (client gone) cancels everything and stops.
bool run_job(Job& job, const ChatVocab& v, Server::Impl& srv, const std::function<bool(const std::string&)>& out,
             std::chrono::milliseconds keepalive) {
  const size_t n = job.handles.size();
  std::vector<size_t> text_len(n, 0);
  if (job.stream && job.chat)
    for (size_t i = 0; i < n; ++i)
      if (!out(sse_event(chat_chunk_json(job.head, int(i), role_delta_json())))) return false;
  size_t open = n;
  auto last_write = Clock::now();
  auto emit = [&](const std::string& s) {
    last_write = Clock::now();
    return out(s);
  };
  while (open > 0) {
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      StreamChoice& c = job.choices[i];
      if (c.done) continue;
      GenerationEvent ev;
      // One choice: block; several: poll each in turn.
      const auto wait = std::chrono::milliseconds(n == 1 ? 100 : 2);
      int taken = 0;
      while (!c.done && job.handles[i]->next(ev, taken == 0 ? wait : std::chrono::milliseconds(0))) {
        ++taken;
        any = true;
        if (!ev.final) {
          Json lp_chunk = nullptr;
          if (job.top_logprobs >= 0) {
            if (job.chat) {
              const Json e = chat_logprob_entry(v, ev);
              job.logprobs[i]["content"].push_back(e);
              lp_chunk = Json{{"content", Json::array({e})}};
            } else {
              add_completion_logprob(job.logprobs[i], v, ev, text_len[i]);
              if (job.stream) {
                lp_chunk = completion_logprobs_init();
                add_completion_logprob(lp_chunk, v, ev, text_len[i]);
              }
            }
          }
          if (job.chat) {
            const std::vector<chat::Delta> ds = merge_deltas(c.chat->feed(ev.id));
            if (c.chat->stop_matched()) job.handles[i]->cancel();
            if (job.stream) {
              for (size_t k = 0; k < ds.size(); ++k) {
                const bool last = k + 1 == ds.size();
                if (!emit(sse_event(chat_chunk_json(job.head, int(i), delta_json(ds[k]), nullptr,
                                                    last ? lp_chunk : Json()))))
                  return false;
              }
              if (ds.empty() && !lp_chunk.is_null() &&
                  !emit(sse_event(chat_chunk_json(job.head, int(i), Json::object(), nullptr, lp_chunk))))
                return false;
            }
          } else {
            const std::string t = c.text->feed(ev.id);
            if (c.text->stop_matched()) job.handles[i]->cancel();
            text_len[i] += t.size();
            if (job.stream && (!t.empty() || !lp_chunk.is_null()) &&
                !emit(sse_event(completion_chunk_json(job.head, int(i), t, nullptr, lp_chunk))))
              return false;
          }
          continue;
        }
        // The final event.
        c.done = true;
        --open;
        if (i == 0 || job.prompt_tokens == 0) job.prompt_tokens = ev.prompt_tokens, job.cached_tokens = ev.cached_tokens;
        job.completion_tokens += ev.completion_tokens;
        if (ev.finish == "error") job.error = ev.error.empty() ? "generation failed" : ev.error;
        std::string finish;
        if (job.chat) {
          const std::vector<chat::Delta> ds = merge_deltas(c.chat->finish(ev.finish));
          finish = c.chat->result().finish_reason;
          srv.count_stop(c.chat->stop_matched());
          if (job.stream)
            for (const chat::Delta& d : ds)
              if (!emit(sse_event(chat_chunk_json(job.head, int(i), delta_json(d))))) return false;
        } else {
          const std::string t = c.text->finish(ev.finish);
          finish = c.text->finish_reason();
          srv.count_stop(c.text->stop_matched());
          text_len[i] += t.size();
          if (job.stream && !t.empty() && !emit(sse_event(completion_chunk_json(job.head, int(i), t, nullptr))))
            return false;
        }
        if (finish == "cancelled") finish = "abort";
        job.finish[i] = finish;
        if (job.stream) {
          if (finish == "error") {
            if (!emit(sse_event(error_json(500, job.error)))) return false;
          } else if (job.chat) {
            if (!emit(sse_event(chat_chunk_json(job.head, int(i), Json::object(), finish)))) return false;
          } else if (!emit(sse_event(completion_chunk_json(job.head, int(i), "", finish)))) {
            return false;
          }
        }
      }
    }
    // Silence in a stream: a comment tells us early whether the client is still there.
    if (job.stream && !any && Clock::now() - last_write >= keepalive && !emit(sse_comment("keep-alive"))) return false;
  }
  if (job.stream) {
    const Json usage = usage_json(job.prompt_tokens, job.completion_tokens, job.cached_tokens);
    if (job.include_usage &&
        !emit(sse_event(job.chat ? chat_usage_chunk_json(job.head, usage) : completion_usage_chunk_json(job.head, usage))))
      return false;
    if (!emit(sse_done())) return false;
  }
  return true;
}

}  // namespace

// The shared tail of both generating endpoints: submit, then stream or answer whole.
static void respond(Server::Impl& srv, std::shared_ptr<Job> job, const ChatVocab& v, httplib::Response& res,
                    std::shared_lock<std::shared_mutex> lk) {
  if (!job->stream) {
    run_job(*job, v, srv, [](const std::string&) { return true; }, srv.opt.keepalive);
    if (!job->error.empty()) throw ApiError(500, job->error, "", "generation_error", "server_error");
    std::vector<Json> choices;
    for (size_t i = 0; i < job->choices.size(); ++i) {
      const Json lp = job->top_logprobs >= 0 ? job->logprobs[i] : Json();
      if (job->chat) {
        chat::ParsedOutput out = job->choices[i].chat->result();
        out.finish_reason = job->finish[i];
        choices.push_back(chat_choice_json(int(i), out, lp));
      } else {
        choices.push_back(completion_choice_json(int(i), job->choices[i].text->text(), job->finish[i], lp));
      }
    }
    const Json usage = usage_json(job->prompt_tokens, job->completion_tokens, job->cached_tokens);
    send_json(res, 200, job->chat ? chat_completion_json(job->head, choices, usage) : completion_json(job->head, choices, usage));
    return;
  }
  // Stream: the provider runs the whole job on this connection's worker thread. The shared
  // lock (the engine stays alive) moves into the provider with the job.
  auto held = std::make_shared<std::shared_lock<std::shared_mutex>>(std::move(lk));
  const ChatVocab* vp = &v;
  Server::Impl* sp = &srv;
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, vp, sp, held](size_t, httplib::DataSink& sink) {
        auto write = [&sink](const std::string& s) { return sink.is_writable() && sink.write(s.data(), s.size()); };
        bool ok = false;
        try {
          ok = run_job(*job, *vp, *sp, write, sp->opt.keepalive);
        } catch (const std::exception& e) {  // never let an exception escape into httplib's writer
          write(sse_event(error_json(500, std::string("internal error: ") + e.what())));
          ok = false;
        }
        if (!ok) {
          cancel_all(job->handles);
          std::lock_guard<std::mutex> g(sp->counters_mu);
          ++sp->counters.streams_cancelled;
          return false;
        }
        sink.done();
        return true;
      },
      [job, held](bool success) {
        if (!success) cancel_all(job->handles);  // the connection broke, possibly before any write
      });
}

void Server::Impl::chat_completions(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req.body);
  ChatPlan plan = parse_chat(body, draw());
  std::shared_lock<std::shared_mutex> lk(mu);
  Engine& eng = need_engine();
  const ChatVocab& v = *vocab;
  // Image parts: decoded and checked before anything runs; their tokens must leave room in the
  // context before the encoder is started.
  const RequestImages images = decode_request_images(plan.conv, vision != nullptr, opt.max_image_pixels);
  int64_t image_tokens = 0;
  for (const Image& img : images.images) image_tokens += image_token_count(*vision, img);
  if (image_tokens >= eopt.ctx)
    throw ApiError(400,
                   "the images need " + std::to_string(image_tokens) + " tokens, beyond the context of " +
                       std::to_string(eopt.ctx) + " tokens",
                   "messages", "context_length_exceeded");
  std::vector<int32_t> ids;
  try {
    ids = v.encode(chat::render(plan.conv));
  } catch (const k3::Error& e) {
    std::string msg = e.what();
    throw ApiError(400, msg, msg.rfind("conversation: ", 0) == 0 ? msg.substr(14, msg.find(": ", 14) - 14) : "");
  }
  std::shared_ptr<const std::vector<float>> media_rows;
  std::vector<int32_t> cache_key;
  if (!images.images.empty()) {
    // Each image's <|media_pad|> expanded to its tokens, exactly as `generate --image` does.
    if (!v.control(chat::kMediaPad) || *v.control(chat::kMediaPad) != vision->media_id)
      throw ApiError(400, "the vocabulary's <|media_pad|> is not the config's media_placeholder_token_id " +
                              std::to_string(vision->media_id), "messages", "model_has_no_vision");
    ImagePrompt ip = expand_image_prompt(*vision, ids, images.ptrs(), "messages");
    // The encoder ran its OpenMP team on this HTTP worker: free it, or its parked workers beside
    // the engine's team make libgomp sleep between the engine's parallel regions (core/threads.h).
    release_idle_threads();
    ids = std::move(ip.ids);
    cache_key = std::move(ip.cache_key);
    media_rows = std::make_shared<const std::vector<float>>(std::move(ip.rows));
  }
  const int64_t max_tokens = resolve_max_tokens(plan.params, int64_t(ids.size()), eopt.ctx);
  // response_format json_object / json_schema: every choice gets its own constraint (they are
  // stateful): free reasoning for a quarter of max_tokens at most, then the forced transition
  // into the response, the JSON, the forced closing of the message.
  std::shared_ptr<const JsonGrammar> grammar;
  const chat::ResponseFormat rf = plan.conv.options.response_format;
  if (rf != chat::ResponseFormat::text) {
    try {
      grammar = rf == chat::ResponseFormat::json_object ? json_object_grammar()
                                                        : compile_json_schema(plan.conv.options.response_schema);
    } catch (const k3::Error& e) {
      throw ApiError(422, e.what(), "response_format.json_schema.schema");
    }
  }
  auto job = std::make_shared<Job>();
  job->chat = true;
  job->stream = plan.params.stream;
  job->include_usage = plan.params.include_usage;
  job->top_logprobs = plan.params.top_logprobs;
  job->head = {new_id("chatcmpl-"), int64_t(std::time(nullptr)), model_name};
  const chat::StartIn start = plan.conv.options.thinking ? chat::StartIn::think : chat::StartIn::response;
  for (int i = 0; i < plan.params.n; ++i) {
    StreamChoice c;
    c.chat = std::make_unique<ChatChoice>(v, start, plan.params.stop, "call_" + job->head.id.substr(9, 8) + "_" +
                                                                          std::to_string(i) + "_");
    job->choices.push_back(std::move(c));
    job->logprobs.push_back(Json{{"content", Json::array()}});
  }
  job->finish.assign(size_t(plan.params.n), "");
  std::vector<GenerationRequest> reqs = make_requests(plan.params, ids, max_tokens, v.stop_ids());
  if (media_rows)
    for (GenerationRequest& r : reqs) r.media_id = vision->media_id, r.media_rows = media_rows, r.cache_key = cache_key;
  if (grammar)
    for (GenerationRequest& r : reqs)
      r.constraint = std::make_shared<ChatJsonConstraint>(
          plan.conv.options.thinking, json_ids.close, json_ids.transition,
          std::make_shared<JsonConstraint>(json_vocab, grammar, std::vector<int32_t>{json_ids.suffix.front()}),
          json_ids.suffix, max_tokens / 4);
  job->handles = submit_all(eng, std::move(reqs));
  respond(*this, job, v, res, std::move(lk));
}

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req.body);
  CompletionPlan plan = parse_completion(body, draw());
  std::shared_lock<std::shared_mutex> lk(mu);
  Engine& eng = need_engine();
  const ChatVocab& v = *vocab;
  const std::vector<int32_t> ids = plan.prompt_is_ids ? plan.prompt_ids : v.tok.encode(plan.prompt, false);
  if (ids.empty()) throw ApiError(400, "prompt: encodes to no tokens", "prompt");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= v.tok.vocab_size())
      throw ApiError(400, "prompt[" + std::to_string(i) + "]: not a token id of this vocabulary", "prompt[" + std::to_string(i) + "]");
  const int64_t max_tokens = resolve_max_tokens(plan.params, int64_t(ids.size()), eopt.ctx);
  auto job = std::make_shared<Job>();
  job->chat = false;
  job->stream = plan.params.stream;
  job->include_usage = plan.params.include_usage;
  job->top_logprobs = plan.params.top_logprobs;
  job->head = {new_id("cmpl-"), int64_t(std::time(nullptr)), model_name};
  for (int i = 0; i < plan.params.n; ++i) {
    StreamChoice c;
    c.text = std::make_unique<TextChoice>(v, plan.params.stop);
    job->choices.push_back(std::move(c));
    job->logprobs.push_back(completion_logprobs_init());
  }
  job->finish.assign(size_t(plan.params.n), "");
  job->handles = submit_all(eng, make_requests(plan.params, ids, max_tokens, v.stop_ids()));
  respond(*this, job, v, res, std::move(lk));
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

Server::Server(ServerOptions opt, EngineOptions engine_opt)
    : impl_(std::make_unique<Impl>(std::move(opt), std::move(engine_opt))) {
  impl_->setup_routes();
}

Server::~Server() {
  impl_->stopping = true;
  impl_->stop_http();
  std::unique_lock<std::shared_mutex> lk(impl_->mu);
  impl_->engine.reset();  // before the model it reads
  impl_->model.reset();
}

int Server::bind() {
  const int port = impl_->opt.port == 0 ? impl_->http.bind_to_any_port(impl_->opt.host)
                                        : (impl_->http.bind_to_port(impl_->opt.host, impl_->opt.port) ? impl_->opt.port : -1);
  if (port < 0)
    fail("serve: cannot listen on " + impl_->opt.host + ":" + std::to_string(impl_->opt.port) +
         " (address in use or not local?)");
  return port;
}

void Server::run() {
  {
    std::lock_guard<std::mutex> lk(impl_->run_mu);
    if (impl_->stopping.load()) return;
    impl_->run_entered = true;
  }
  impl_->http.listen_after_bind();
  impl_->run_returned = true;
}

void Server::load(const std::string& model_dir, const LoadOptions& lo, const StreamOptions& so,
                  double disk_bytes_per_s) {
  try {
    const ModelDir md = open_model_dir(model_dir);
    auto vocab = std::make_unique<ChatVocab>(load_chat_vocab(md));
    auto json_vocab = std::make_shared<const JsonVocab>(token_byte_table(vocab->tok));
    const K3ChatJsonIds json_ids = k3_chat_json_ids(vocab->tok);
    {
      std::unique_lock<std::shared_mutex> lk(impl_->mu);
      impl_->vocab = std::move(vocab);
      impl_->json_vocab = std::move(json_vocab);
      impl_->json_ids = json_ids;
      if (impl_->model_name.empty()) impl_->model_name = std::filesystem::path(model_dir).lexically_normal().filename().string();
      if (impl_->model_name.empty()) impl_->model_name = std::filesystem::path(model_dir).lexically_normal().parent_path().filename().string();
    }
    auto model = std::make_unique<InferenceModel>(load_inference_model(md, lo, so, disk_bytes_per_s));
    std::unique_ptr<VisionModel> vision;
    if (md.config.vision.present)
      vision = std::make_unique<VisionModel>(load_vision_model(model_dir, md.config, md.config_path));
    auto engine = std::make_unique<Engine>(model->model, impl_->eopt);
    std::unique_lock<std::shared_mutex> lk(impl_->mu);
    impl_->model = std::move(model);
    impl_->vision = std::move(vision);
    impl_->engine = std::move(engine);
    impl_->ready = true;
  } catch (const k3::Error& e) {
    std::unique_lock<std::shared_mutex> lk(impl_->mu);
    impl_->load_error = e.what();
    throw;
  }
}

bool Server::ready() const { return impl_->ready.load(); }

const InferenceModel* Server::inference_model() const {
  std::shared_lock<std::shared_mutex> lk(impl_->mu);
  return impl_->model.get();
}

int64_t Server::shutdown(std::chrono::milliseconds deadline) {
  impl_->stopping = true;
  impl_->stop_http();
  int64_t cancelled = 0;
  std::shared_lock<std::shared_mutex> lk(impl_->mu);
  if (impl_->engine) cancelled = impl_->engine->drain(deadline);
  return cancelled;
}

EngineStats Server::stats() const {
  std::shared_lock<std::shared_mutex> lk(impl_->mu);
  return impl_->engine ? impl_->engine->stats() : EngineStats{};
}

}  // namespace k3::serve
