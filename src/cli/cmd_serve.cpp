// `k3cpp serve <model dir> [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N]
//              [--api-key KEY] [--threads N] [--queue-limit N] [--state-budget-mb N]`
// The OpenAI-compatible HTTP server (serve/server.h) on loopback by default. It listens before
// it loads the model (GET /health answers 503 {"status":"loading"} until the model is in) and
// prints `listening on http://HOST:PORT` (with --port 0, the port picked) on stdout. SIGTERM or
// SIGINT: stop accepting, let running requests finish (up to --drain-s seconds, then cancel
// them), exit 0.
// `mpirun -np R k3cpp serve <model dir> --ep R ...`: expert parallel (docs/distributed.md):
// rank 0 serves HTTP and schedules; every rank holds the trunk and 1/R of each layer's routed
// experts, the followers replaying rank 0's engine steps (dist/step_channel.h). SIGTERM to
// rank 0 drains and ends every rank with exit 0.
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "cli/ram_budget.h"
#include "core/error.h"
#include "core/threads.h"
#include "dist/comm.h"
#include "dist/expert_parallel.h"
#include "dist/runtime.h"
#include "dist/step_channel.h"
#include "infer/weight_stream.h"
#include "kernels/moe_exchange.h"
#include "serve/server.h"

namespace k3::cli {

namespace {

const char* kServeUsage =
    "usage: k3cpp serve <model dir> [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N]\n"
    "                   [--api-key KEY] [--threads N] [--queue-limit N] [--state-budget-mb N]\n"
    "                   [--prefill-chunk N] [--no-prefix-cache] [--drain-s S] [--model-name NAME]\n"
    "                   [--max-image-pixels N] [--ep R [--comm-timeout S]]\n"
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
    "  --ep R             expert parallel, under mpirun -np R: rank 0 serves, each rank computes 1/R of\n"
    "                     every layer's routed experts; the same tokens as one process. Stop it with\n"
    "                     SIGTERM to rank 0 (its pid is on stderr)\n"
    "  --comm-timeout     --ep: seconds a collective may wait for the other ranks (default 600)\n"
    "Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,\n"
    "GET /metrics, POST /tokenize, POST /detokenize, GET / (a chat page). docs/serving.md.\n";

// Expert-parallel options are checked before MPI starts and alike on every rank; rank 0 alone
// reports (one error, not one per rank); the others wait for mpirun to end the job, which it
// does when rank 0 exits 1.
[[noreturn]] void refuse_on_every_rank(const std::string& msg) {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!r || std::atoi(r) == 0) fail(msg);
  std::fflush(stdout);
  ::sleep(10);
  std::_Exit(1);
}

int launcher_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  return 1;
}

// Ranks 1..R-1 of `serve --ep R`: load the model, then replay rank 0's engine steps until it
// stops. SIGTERM and SIGINT (mpirun forwards them to every rank) stay blocked: rank 0 decides
// when the group stops, after its drain.
int serve_follower(const std::string& dir, const EngineOptions& eo, dist::Comm& comm, StepChannel& channel,
                   const std::function<bool(int64_t)>& keep) {
  std::unique_ptr<InferenceModel> im;
  try {
    LoadOptions lo;
    lo.dense_as_stored = true;
    lo.keep_expert = keep;
    const int rank = comm.rank(), ranks = comm.size();
    lo.log = [rank, ranks](const std::string& line) {  // rank 0 prints the load's other notices
      if (line.rfind("released ", 0) == 0) std::fprintf(stderr, "k3cpp serve: rank %d of %d: %s\n", rank, ranks, line.c_str());
    };
    im = std::make_unique<InferenceModel>(load_inference_model(open_model_dir(dir), lo));
  } catch (const std::exception& e) {
    comm.abort(std::string("serve: ") + e.what(), 1);
  }
  run_engine_follower(im->model, eo, channel);
  return 0;
}

// "serve.step 12 calls 49152 bytes, ep.combine ...": this rank's collectives at the end.
std::string comm_summary(const dist::Comm& comm) {
  std::string s;
  for (const auto& [label, st] : comm.stats())
    s += (s.empty() ? "" : ", ") + label + " " + std::to_string(st.calls) + " calls " + std::to_string(st.bytes_sent) +
         " bytes";
  return s;
}

}  // namespace

int cmd_serve(const std::vector<std::string>& args) {
  Args a(args,
         with_ram_budget_options({"host", "port", "parallel", "ctx", "api-key", "threads", "queue-limit",
                                  "state-budget-mb", "prefill-chunk", "drain-s", "model-name", "max-image-pixels", "ep",
                                  "comm-timeout"}),
         {"no-prefix-cache", "help"}, "serve");
  if (a.flag("help")) {
    std::fputs(kServeUsage, stdout);
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
  const long long ep = a.get_int("ep", 0);
  if (a.get("ep") && ep < 1) fail("--ep: expected a positive integer, got " + std::to_string(ep));
  const double comm_timeout = a.get_double("comm-timeout", 600);
  if (comm_timeout <= 0) fail("--comm-timeout must be > 0");
  const int world = dist::launched_by_mpirun() ? launcher_world_size() : 1;
  if (world > 1 && ep == 0)
    refuse_on_every_rank("started by mpirun with " + std::to_string(world) + " ranks but without --ep: pass --ep " +
                         std::to_string(world));
  if (ep >= 1 && world != ep)
    refuse_on_every_rank("--ep " + std::to_string(ep) + " but the job has " + std::to_string(world) +
                         " MPI rank(s): start it with mpirun -np " + std::to_string(ep));
  if (ep > 1 && budget.budget)
    refuse_on_every_rank("--ep and --ram-budget cannot be combined (expert parallelism holds each rank's experts "
                         "resident)");
  if (ep > 1) {
    ModelDir md;
    try {
      md = open_model_dir(dir);
    } catch (const std::exception& e) {
      refuse_on_every_rank(e.what());
    }
    if (md.config.num_experts % ep != 0)
      refuse_on_every_rank(md.config_path + ": num_experts: " + std::to_string(md.config.num_experts) +
                           " experts cannot be split over " + std::to_string(ep) +
                           " expert-parallel ranks (--ep must divide it)");
  }
  // Signals go to one thread (sigwait); every thread started from here inherits the mask (MPI's
  // own threads too: so MPI_Init comes after). A follower never takes them: rank 0 decides when
  // the group stops.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that goes away is a failed write, not a dead server
  std::unique_ptr<dist::Runtime> rt;
  std::unique_ptr<dist::Comm> comm;
  std::unique_ptr<dist::CommExpertExchange> exchange;
  std::unique_ptr<dist::CommStepChannel> channel;
  std::function<bool(int64_t)> keep_expert;
  struct Unset {
    ~Unset() { set_expert_exchange(nullptr); }
  } unset;
  if (ep > 1) {
    rt = std::make_unique<dist::Runtime>(/*serialized=*/true);  // rank 0's engine thread runs the collectives
    comm = dist::make_comm("mpi", comm_timeout);
    exchange = std::make_unique<dist::CommExpertExchange>(*comm);
    channel = std::make_unique<dist::CommStepChannel>(*comm);
    set_expert_exchange(exchange.get());
    eo.step_channel = channel.get();
    // Without a thread count, the ranks on this machine share its cores.
    if (!a.get("threads") && !std::getenv("K3_THREADS") && !std::getenv("OMP_NUM_THREADS"))
      set_num_threads(std::max(1, omp_get_num_procs() / rt->local_size()));
    else
      set_num_threads(int(a.get_int("threads", 0)));
    const int64_t E = open_model_dir(dir).config.num_experts, per = E / ep, me = rt->rank();
    keep_expert = [per, me](int64_t e) { return e / per == me; };  // only this rank's experts stay in memory
    std::fprintf(stderr, "k3cpp serve: rank %d of %lld (pid %d): %s; routed experts [%lld, %lld) of %lld per MoE layer\n",
                 rt->rank(), ep, int(::getpid()), rt->rank() == 0 ? "serves HTTP" : "follows rank 0",
                 (long long)(rt->rank() * per), (long long)((rt->rank() + 1) * per), (long long)E);
    if (rt->rank() != 0) {
      const int rc = serve_follower(dir, eo, *comm, *channel, keep_expert);
      std::fprintf(stderr, "k3cpp serve: rank %d of %lld: stopped (%s)\n", rt->rank(), ep, comm_summary(*comm).c_str());
      return rc;
    }
  } else {
    set_num_threads(int(a.get_int("threads", 0)));
  }

  auto server_ptr = std::make_unique<serve::Server>(so, eo);
  serve::Server& server = *server_ptr;
  int bound = 0;
  try {
    bound = server.bind();
  } catch (const std::exception& e) {
    if (comm) comm->abort(std::string("serve: ") + e.what(), 1);  // the followers wait for this rank
    throw;
  }
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
    lo.keep_expert = keep_expert;
    lo.backend = backend_from(a, "serve");
    if (keep_expert)
      lo.log = [ep](const std::string& line) {
        if (line.rfind("released ", 0) == 0) std::fprintf(stderr, "k3cpp serve: rank 0 of %lld: %s\n", ep, line.c_str());
        else std::fprintf(stderr, "%s\n", line.c_str());
      };
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
    // Expert parallel: the followers wait for this rank's engine; end the whole job.
    if (comm) comm->abort(std::string("serve: ") + e.what(), 1);
    std::fprintf(stderr, "k3cpp serve: error: %s\n", e.what());
    rc = 1;
    pthread_kill(waiter.native_handle(), SIGTERM);  // stop serving
  }
  waiter.join();
  http.join();
  if (comm) {
    server_ptr.reset();  // its engine's last message stops the followers
    std::fprintf(stderr, "k3cpp serve: rank 0 of %lld: stopped (%s)\n", ep, comm_summary(*comm).c_str());
  }
  return rc;
}

}  // namespace k3::cli
