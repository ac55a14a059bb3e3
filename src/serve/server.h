// `k3cpp serve`: an OpenAI-compatible HTTP server over infer/engine.h, on cpp-httplib.
// Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
// GET /metrics, POST /tokenize, POST /detokenize, GET / (the chat page, chat_page.h).
//
// Lifecycle: bind() opens the socket (port 0 picks a free one), run() serves until shutdown()
// (any thread); load() (any thread, while run() serves) reads the vocabulary, then the model,
// then starts the engine: until then /health answers 503 {"status":"loading"} and the
// generating endpoints 503 (tokenize works once the vocabulary is in). shutdown(deadline)
// stops accepting, drains the engine (Engine::drain) and lets in-flight streams end; run()
// returns once every connection is done.
//
// A request: body -> request.h (validation) -> chat::render + ChatVocab::encode (or raw text)
// -> one engine request per choice -> events -> choice.h (token-level parse, stop strings) ->
// response.h JSON, or SSE chunks (sse.h) written as they come. A client that goes away during
// a stream (a failed write, found at the latest by a keep-alive comment after 2 s of silence,
// or httplib's releaser reporting failure) cancels its engine requests. Bad input of any kind
// is an OpenAI-shaped error (api_error.h) and the server keeps serving: 400/422 invalid, 401
// without the API key, 404 unknown route, 413 over the body limit, 429 queue full, 503 loading
// or shutting down, 500 for an engine error.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "infer/engine.h"
#include "infer/weight_stream.h"
#include "model/checkpoint.h"

namespace k3::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                          // 0: a free port (bind() returns it)
  std::string api_key;                      // "": no authentication
  size_t max_body_bytes = size_t(8) << 20;  // larger bodies: 413
  int http_threads = 0;                     // 0: parallel + queue_limit + 8 (each stream holds one)
  std::string model_name;                   // /v1/models id ("" -> the model directory's name)
  std::chrono::milliseconds keepalive{2000};  // SSE comment after this much silence in a stream
  int64_t max_image_pixels = int64_t(1) << 20;  // an image part with more pixels: 413
};

class Server {
 public:
  Server(ServerOptions opt, EngineOptions engine_opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int bind();  // the port bound; k3::Error when the address cannot be bound
  void run();  // blocks until shutdown()
  // Reads the vocabulary and the model and starts the engine; k3::Error on bad input (the
  // server then answers 503 with the error on /health). lo.ram_budget_bytes > 0: the routed
  // experts stream from disk under that budget (infer/weight_stream.h, with `so`).
  void load(const std::string& model_dir, const LoadOptions& lo = {}, const StreamOptions& so = {},
            double disk_bytes_per_s = 0);
  // The loaded model and its expert stream (null before load).
  const InferenceModel* inference_model() const;
  bool ready() const;
  // Stops accepting, then Engine::drain(deadline); returns the number of requests cancelled.
  int64_t shutdown(std::chrono::milliseconds deadline);
  EngineStats stats() const;  // zeros before load

  struct Impl;  // the implementation (server.cpp)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::serve
