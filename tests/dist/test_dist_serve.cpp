// `mpirun -np 2 k3cpp serve MODEL --ep 2` against `k3cpp serve MODEL` (ctest dist_failures; the
// test starts both servers itself, on the tiny released-layout model, port 0):
//  - the same requests, one at a time (plain and streamed /v1/completions and
//    /v1/chat/completions, sampled with a seed and greedy, logprobs with top candidates, a
//    response_format constraint, an image part, a repeated prompt the prefix cache restores over several
//    prefill chunks) get byte-identical bodies but for the ids and timestamps;
//  - the same requests at once: each gets the tokens the one-process server gave it, and
//    logprobs within 1e-5 (the decode batches then depend on arrival; batching a row with
//    others regroups float sums, in one process as much as with --ep);
//  - SIGTERM to rank 0 drains and ends both ranks with exit 0 (mpirun's status), each rank
//    reporting its collectives;
//  - a follower killed with SIGKILL ends the job within seconds, mpirun naming the signal;
//    rank 0 stopped (SIGSTOP) makes the follower abort the job at --comm-timeout;
//  - --ep without mpirun, mpirun without --ep, --ep with --ram-budget and --ep 3 with 4 experts
//    are refused with one error each.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <random>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "common/cli_run.h"
#include "io/image.h"
#include "io/tiktoken_file.h"

namespace k3::test {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A command under /bin/sh in its own process group, stdout and stderr read into `out` by a
// thread; the destructor kills the group if it is still running.
class Child {
 public:
  explicit Child(const std::string& cmd) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
    reader_ = std::thread([this] {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd_, buf, sizeof buf)) > 0) {
        std::lock_guard<std::mutex> lk(mu_);
        out_.append(buf, size_t(n));
      }
    });
  }
  ~Child() {
    if (pid_ > 0 && rc_ < 0) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (reader_.joinable()) reader_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  std::string out() {
    std::lock_guard<std::mutex> lk(mu_);
    return out_;
  }
  // The first match of `re` in the output, group 1, waiting up to `limit_s`; "" if none.
  std::string wait_for(const std::string& re, double limit_s = 30) {
    const std::regex r(re);
    const auto t0 = Clock::now();
    while (std::chrono::duration<double>(Clock::now() - t0).count() < limit_s) {
      std::smatch m;
      const std::string o = out();
      if (std::regex_search(o, m, r)) return m.size() > 1 ? m[1].str() : m[0].str();
      if (exited(0)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return "";
  }
  // Waits up to limit_s for the exit; true once exited (status in rc()).
  bool exited(double limit_s) {
    if (rc_ >= 0) return true;
    const auto t0 = Clock::now();
    do {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        rc_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
        if (reader_.joinable()) reader_.join();
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::duration<double>(Clock::now() - t0).count() < limit_s);
    return false;
  }
  int rc() const { return rc_; }
  double seconds() const { return seconds_; }  // from the exited() call that saw the exit
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1, rc_ = -1;
  double seconds_ = 0;
  std::mutex mu_;
  std::string out_;
  std::thread reader_;
};

std::string serve_mpirun(int np) {
  return std::string(K3_MPIEXEC) + " -np " + std::to_string(np) + " --oversubscribe --bind-to none ";
}

const std::string kModel = std::string(K3_TEST_DATA_DIR) + "/k3-release-tiny";
// Small prefill chunks: the prompts below span several, so the prefix cache snapshots and
// restores them.
const std::string kServe = shell_quote(K3_CLI_PATH) + " serve " + shell_quote(kModel) +
                           " --port 0 --threads 1 --parallel 4 --ctx 640 --state-budget-mb 64 --prefill-chunk 8";

// A started server: its port, once /health answers 200.
struct Server {
  Child proc;
  int port = 0;
  explicit Server(const std::string& cmd) : proc(cmd) {
    const std::string p = proc.wait_for("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    if (p.empty()) return;
    port = std::stoi(p);
    httplib::Client c("127.0.0.1", port);
    for (int i = 0; i < 1500; ++i) {
      auto r = c.Get("/health");
      if (r && r->status == 200) return;
      if (proc.exited(0)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    port = 0;
  }
  std::string post(const std::string& path, const Json& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return "no reply";
    return std::to_string(r->status) + " " + r->body;
  }
};

struct Req {
  std::string path;
  Json body;
};

// A PNG data URL of a random 16 x 16 image (the model's vision encoder runs on rank 0; its rows
// travel to the followers with the admission).
std::string image_url() {
  TempDir t("k3_dist_serve");
  Image img;
  img.height = img.width = 16;
  img.rgb.resize(3 * 16 * 16);
  std::mt19937_64 rng(3);
  for (float& v : img.rgb) v = float(rng() % 256) / 255.0f;
  save_image(t.sub("a.png"), img);
  return "data:image/png;base64," + base64_encode(slurp(t.sub("a.png")));
}

std::vector<Req> requests() {
  const std::string text = "The quick brown fox jumps over the lazy dog; then it naps in the warm sun.";
  const Json chat_msgs = Json::array({{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", text}}});
  return {
      {"/v1/completions", {{"prompt", text}, {"max_tokens", 12}, {"temperature", 0.9}, {"seed", 5}, {"logprobs", 3}}},
      {"/v1/completions",
       {{"prompt", text + " And more."}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", 2}, {"stream", true}}},
      {"/v1/chat/completions",
       {{"messages", chat_msgs}, {"max_tokens", 10}, {"temperature", 1.0}, {"seed", 3}, {"logprobs", true}, {"top_logprobs", 2}}},
      {"/v1/chat/completions",
       {{"messages", chat_msgs}, {"max_tokens", 10}, {"temperature", 0.7}, {"seed", 9}, {"stream", true},
        {"logprobs", true}, {"top_logprobs", 1}}},
      {"/v1/chat/completions",
       {{"messages", chat_msgs}, {"max_tokens", 12}, {"temperature", 0.8}, {"seed", 11},
        {"response_format", {{"type", "json_object"}}}, {"reasoning_effort", "none"}}},
      {"/v1/chat/completions",
       {{"messages", Json::array({{{"role", "user"},
                                   {"content", Json::array({{{"type", "image_url"}, {"image_url", {{"url", image_url()}}}},
                                                            {{"type", "text"}, {"text", "what is this?"}}})}}})},
        {"max_tokens", 8}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}}},
  };
}

// Ids and timestamps differ between servers; nothing else may.
std::string normalise(const std::string& body) {
  static const std::regex ids("\"(id|created)\":(\"[^\"]*\"|[0-9]+)");
  return std::regex_replace(body, ids, "\"$1\":_");
}

// The generated tokens and their log-probabilities, from a reply (plain or SSE).
struct ServedTokens {
  std::vector<std::string> text;
  std::vector<double> logprob;
};

void collect(const Json& choice, ServedTokens& t) {
  const Json& lp = choice.value("logprobs", Json());
  if (lp.is_null()) return;
  if (lp.contains("content")) {
    for (const auto& c : lp["content"]) t.text.push_back(c["token"]), t.logprob.push_back(c["logprob"]);
  } else {
    for (size_t i = 0; i < lp["tokens"].size(); ++i)
      t.text.push_back(lp["tokens"][i]), t.logprob.push_back(lp["token_logprobs"][i]);
  }
}

ServedTokens tokens(const std::string& reply) {
  ServedTokens t;
  const std::string body = reply.substr(reply.find(' ') + 1);
  if (body.rfind("data: ", 0) == 0) {
    size_t p = 0;
    while ((p = body.find("data: ", p)) != std::string::npos) {
      const size_t e = body.find("\n\n", p);
      const std::string ev = body.substr(p + 6, e - p - 6);
      p = e;
      if (ev == "[DONE]") break;
      const Json j = Json::parse(ev, nullptr, false);
      if (j.is_object() && j.contains("choices"))
        for (const auto& c : j["choices"]) collect(c, t);
    }
  } else {
    const Json j = Json::parse(body, nullptr, false);
    if (j.is_object() && j.contains("choices"))
      for (const auto& c : j["choices"]) collect(c, t);
  }
  return t;
}

int count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(DistJobs, ExpertParallelServeAnswersAsOneProcessAndStopsCleanly) {
  Server one(kServe);
  ASSERT_GT(one.port, 0) << one.proc.out();
  Server ep(serve_mpirun(2) + kServe + " --ep 2");
  ASSERT_GT(ep.port, 0) << ep.proc.out();
  const std::vector<Req> reqs = requests();

  // One at a time (a repeated prompt second: the prefix cache restores it): bitwise.
  std::vector<std::string> want;
  for (int round = 0; round < 2; ++round)
    for (const Req& r : reqs) {
      want.push_back(one.post(r.path, r.body));
      const std::string got = ep.post(r.path, r.body);
      ASSERT_EQ(want.back().substr(0, 4), "200 ") << want.back();
      EXPECT_EQ(normalise(got), normalise(want.back())) << r.body.dump();
      EXPECT_FALSE(tokens(want.back()).text.empty() && r.body.contains("logprobs")) << want.back();
    }
  EXPECT_NE(want[size_t(reqs.size())].find("\"cached_tokens\":"), std::string::npos);

  // All at once: the tokens of the one-process answers, the logprobs to float rounding.
  std::vector<std::string> got(reqs.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < reqs.size(); ++i) th.emplace_back([&, i] { got[i] = ep.post(reqs[i].path, reqs[i].body); });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const ServedTokens a = tokens(want[i]), b = tokens(got[i]);
    EXPECT_EQ(a.text, b.text) << got[i];
    ASSERT_EQ(a.logprob.size(), b.logprob.size());
    for (size_t k = 0; k < a.logprob.size(); ++k) EXPECT_NEAR(a.logprob[k], b.logprob[k], 1e-5) << i << " " << k;
  }

  // SIGTERM to rank 0: drained, every rank exits 0.
  const std::string pid0 = ep.proc.wait_for("rank 0 of 2 \\(pid ([0-9]+)\\)");
  ASSERT_FALSE(pid0.empty()) << ep.proc.out();
  ASSERT_EQ(::kill(std::stoi(pid0), SIGTERM), 0);
  ASSERT_TRUE(ep.proc.exited(20)) << ep.proc.out();
  EXPECT_EQ(ep.proc.rc(), 0) << ep.proc.out();
  const std::string log = ep.proc.out();
  EXPECT_NE(log.find("k3cpp serve: rank 0 of 2: stopped (ep.combine "), std::string::npos) << log;
  EXPECT_NE(log.find("k3cpp serve: rank 1 of 2: stopped (ep.combine "), std::string::npos) << log;
  ASSERT_EQ(::kill(one.proc.pid(), SIGTERM), 0);
  ASSERT_TRUE(one.proc.exited(20));
  EXPECT_EQ(one.proc.rc(), 0) << one.proc.out();
}

TEST(DistJobs, ExpertParallelServeEndsWhenARankDiesAndRefusesBadOptions) {
  {
    Server ep(serve_mpirun(2) + kServe + " --ep 2");
    ASSERT_GT(ep.port, 0) << ep.proc.out();
    const std::string pid1 = ep.proc.wait_for("rank 1 of 2 \\(pid ([0-9]+)\\)");
    ASSERT_FALSE(pid1.empty()) << ep.proc.out();
    ASSERT_EQ(::kill(std::stoi(pid1), SIGKILL), 0);
    ASSERT_TRUE(ep.proc.exited(20)) << ep.proc.out();
    EXPECT_NE(ep.proc.rc(), 0) << ep.proc.out();
    EXPECT_LT(ep.proc.seconds(), 10) << ep.proc.out();
    EXPECT_NE(ep.proc.out().find("signal 9"), std::string::npos) << ep.proc.out();
  }
  {
    // Rank 0 stopped (SIGSTOP): its heartbeats cease and the follower aborts the job at
    // --comm-timeout, naming the step broadcast.
    Server ep(serve_mpirun(2) + kServe + " --ep 2 --comm-timeout 2");
    ASSERT_GT(ep.port, 0) << ep.proc.out();
    const std::string pid0 = ep.proc.wait_for("rank 0 of 2 \\(pid ([0-9]+)\\)");
    ASSERT_FALSE(pid0.empty()) << ep.proc.out();
    ASSERT_EQ(::kill(std::stoi(pid0), SIGSTOP), 0);
    ASSERT_TRUE(ep.proc.exited(20)) << ep.proc.out();
    EXPECT_NE(ep.proc.rc(), 0) << ep.proc.out();
    EXPECT_LT(ep.proc.seconds(), 10) << ep.proc.out();
    EXPECT_NE(ep.proc.out().find("rank 1 of 2: collective 'serve.step' did not complete within 2 s"), std::string::npos)
        << ep.proc.out();
  }
  // The refused jobs end when rank 0 exits 1; mpirun then gives the waiting ranks a second
  // before SIGKILL (odls_base_sigkill_timeout), which these jobs need not wait for.
  const std::string quick = " --mca odls_base_sigkill_timeout 0 ";
  const struct {
    std::string cmd, message;
  } bad[] = {
      {kServe + " --ep 2", "--ep 2 but the job has 1 MPI rank(s): start it with mpirun -np 2"},
      {serve_mpirun(2) + quick + kServe, "started by mpirun with 2 ranks but without --ep: pass --ep 2"},
      {serve_mpirun(2) + quick + kServe + " --ep 2 --ram-budget 1", "--ep and --ram-budget cannot be combined"},
      {serve_mpirun(3) + quick + kServe + " --ep 3", "num_experts: 4 experts cannot be split over 3 expert-parallel ranks"},
  };
  for (const auto& b : bad) {
    Child c(b.cmd);
    ASSERT_TRUE(c.exited(30)) << b.cmd;
    EXPECT_NE(c.rc(), 0) << c.out();
    EXPECT_EQ(count(c.out(), b.message), 1) << b.cmd << "\n" << c.out();
    EXPECT_EQ(c.out().find("listening on"), std::string::npos) << c.out();
  }
}

}  // namespace k3::test
