// `k3cpp serve <model dir> [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N]
//              [--api-key KEY] [--threads N] [--queue-limit N] [--state-budget-mb N]`
// The OpenAI-compatible HTTP server (serve/server.h) on loopback by default. It listens before
// it loads the model (GET /health answers 503 {"status":"loading"} until the model is in) and
// prints `listening on http://HOST:PORT` (with --port 0, the port picked) on stdout. SIGTERM or
// SIGINT: stop accepting, let running requests finish (up to --drain-s seconds, then cancel
// them), exit 0.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "cli/ram_budget.h"
#include "core/error.h"
#include "core/threads.h"
#include "serve/server.h"

namespace k3::cli {

namespace {

const char* kUsage =
    "usage: k3cpp serve <model dir> [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N]\n"
    "                   [--api-key KEY] [--threads N] [--queue-limit N] [--state-budget-mb N]\n"
    "                   [--prefill-chunk N] [--no-prefix-cache] [--drain-s S] [--model-name NAME]\n"
    "                   [--max-image-pixels N]\n"
    "                   [--ram-budget GB [--cache-policy s3fifo|lru] [--io auto|direct|buffered] [--disk-gbps X]]\n"
    "  --host             address to bind (default 127.0.0.1, loopback only)\n"
    "  --port             TCP port (default 8080; 0 picks a free one, printed on stdout)\n"
    "  --parallel         sequences decoded together at most (default 8)\n"
    "  --ctx              prompt + generated tokens per request at most (default 4096)\n"
    "  --api-key          require 'Authorization: Bearer KEY' (all but GET /health and GET /)\n"
    "  --threads          compute threads (default: K3_THREADS, OMP_NUM_THREADS, all cores)\n"
    "  --queue-limit      waiting requests at most; beyond it 429 (default 64)\n"
    "  --state-budget-mb  memory for sequence states and prefix-cache snapshots (default 2048)\n"
    "  --prefill-chunk    prompt tokens per prefill chunk, the prefix-cache granularity (default 256)\n"
    "  --no-prefix-cache  do not keep prompt-state snapshots\n"
    "  --drain-s          on SIGTERM/SIGINT, seconds running requests may take to finish (default 30)\n"
    "  --model-name       the id /v1/models reports (default: the directory's name)\n"
    "  --max-image-pixels image parts with more pixels are refused with 413 (default 1048576)\n"
    "Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,\n"
    "GET /metrics, POST /tokenize, POST /detokenize, GET / (a chat page). docs/serving.md.\n";

}  // namespace

int cmd_serve(const std::vector<std::string>& args) {
  Args a(args,
         with_ram_budget_options({"host", "port", "parallel", "ctx", "api-key", "threads", "queue-limit",
                                  "state-budget-mb", "prefill-chunk", "drain-s", "model-name", "max-image-pixels"}),
         {"no-prefix-cache", "help"}, "serve");
  if (a.flag("help")) {
    std::fputs(kUsage, stdout);
    std::fputs(kRamBudgetUsage, stdout);
    return 0;
  }
  if (a.positional().size() != 1) fail("expected one <model dir>, got " + std::to_string(a.positional().size()));
  const std::string dir = a.positional_at(0, "model dir");
  serve::ServerOptions so;
  so.host = a.get_or("host", "127.0.0.1");
  const long long port = a.get_int("port", 8080);
  if (port < 0 || port > 65535) fail("--port must be 0..65535, got " + std::to_string(port));
  so.port = int(port);
  so.api_key = a.get_or("api-key", "");
  so.model_name = a.get_or("model-name", "");
  so.max_image_pixels = a.get_int("max-image-pixels", so.max_image_pixels);
  if (so.max_image_pixels < 1) fail("--max-image-pixels must be >= 1");
  EngineOptions eo;
  eo.parallel = a.get_int("parallel", 8);
  eo.ctx = a.get_int("ctx", 4096);
  eo.queue_limit = a.get_int("queue-limit", 64);
  eo.state_budget_mb = a.get_int("state-budget-mb", 2048);
  eo.prefill_chunk = a.get_int("prefill-chunk", 256);
  eo.prefix_cache = !a.flag("no-prefix-cache");
  if (eo.parallel < 1 || eo.parallel > 1024) fail("--parallel must be 1..1024");
  if (eo.ctx < 2) fail("--ctx must be >= 2");
  if (eo.queue_limit < 0 || eo.queue_limit > 100000) fail("--queue-limit must be 0..100000");
  if (eo.state_budget_mb < 1) fail("--state-budget-mb must be >= 1");
  if (eo.prefill_chunk < 1) fail("--prefill-chunk must be >= 1");
  // The engine's largest forward call: a prefill chunk or a decode batch of every slot.
  const BudgetArgs budget = parse_budget_args(a, std::max(eo.prefill_chunk, eo.parallel));
  const double drain_s = a.get_double("drain-s", 30);
  if (drain_s < 0) fail("--drain-s must be >= 0");
  set_num_threads(int(a.get_int("threads", 0)));

  // Signals go to one thread (sigwait); every thread started from here inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that goes away is a failed write, not a dead server

  serve::Server server(so, eo);
  const int bound = server.bind();
  std::printf("listening on http://%s:%d\n", so.host.c_str(), bound);
  std::fflush(stdout);
  std::thread http([&] { server.run(); });
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "k3cpp serve: %s: draining\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    const int64_t cancelled = server.shutdown(std::chrono::milliseconds(int64_t(drain_s * 1000)));
    std::fprintf(stderr, "k3cpp serve: stopped (%lld requests cancelled)\n", (long long)cancelled);
  });
  int rc = 0;
  try {
    LoadOptions lo;
    lo.dense_as_stored = true;
    lo.ram_budget_bytes = budget.budget;
    server.load(dir, lo, budget.stream, budget.disk_bytes_per_s);
    announce_machine("serve");
    if (budget.budget) {
      const InferenceModel* im = server.inference_model();
      std::fprintf(stderr, "k3cpp serve: %s\n", stream_projection_line(im->plan).c_str());
      std::fprintf(stderr, "k3cpp serve: %s\n", im->trunk_note.c_str());
    }
    const EngineStats s = server.stats();
    std::fprintf(stderr, "k3cpp serve: model loaded from %s; %lld slots, ctx %lld, state budget %lld MB\n", dir.c_str(),
                 (long long)eo.parallel, (long long)eo.ctx, (long long)(s.state_budget_bytes >> 20));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3cpp serve: error: %s\n", e.what());
    rc = 1;
    pthread_kill(waiter.native_handle(), SIGTERM);  // stop serving
  }
  waiter.join();
  http.join();
  return rc;
}

}  // namespace k3::cli
