// `mpirun ... k3cpp train --dp N` jobs started by the test (ctest dist_failures, run without
// mpirun; the jobs use the built k3cpp):
//  - a rank killed (SIGKILL) mid-run ends the job within seconds with mpirun naming the rank and
//    the signal, and leaves the last checkpoint intact; resuming it with the same rank count
//    finishes bitwise equal to a run that never stopped (one process of 2 threads: the same
//    summation tree as 2 ranks of 1 thread); resuming it with 1 rank does too, and with 4
//    ranks it completes (a different summation tree: float rounding only);
//  - a rank that exits without MPI_Finalize ends the job the same way;
//  - a rank that hangs makes the others abort at --comm-timeout, naming the collective;
//  - --dp without mpirun, and mpirun without --dp, are refused with one line; so are
//    --dp-overlap without --dp and a --dp-overlap other than on / off.
//  - `generate --ep 2` and `--ep 4` print the single process's tokens, with MXFP4 experts and
//    with plain ones (each rank then releases the memory of the others' experts).
//  - expert parallel (`--ep 2`): the job logs and records (comm_stats.json) the bytes of its
//    token dispatch, equal to the rows it sent to the other rank's experts x 16 (the latent
//    width) x 4, and each rank its resident memory; the trunk's traffic (ZeRO-1 of the trunk,
//    the default: reduce-scatter + parameter gather) equals the planner's; stopped at step 4
//    and resumed as one process of 2 threads it ends bitwise equal to that process's
//    uninterrupted run (the checkpoint is whole); --ep that does not fit the rank count or the
//    expert count is refused with one line; a rank killed mid-run ends the job and leaves the
//    last checkpoint.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/cli_run.h"
#include "train/test_trainer_util.h"

namespace fs = std::filesystem;

namespace k3::test {
namespace {

struct Job {
  int rc = -1;
  double seconds = 0;
  std::string out;  // stdout and stderr
};

// Runs `cmd` under /bin/sh with a hard limit (timeout(1)), stdout and stderr together.
// stdout_only: stderr discarded instead.
Job sh(const std::string& cmd, int limit_s = 60, bool stdout_only = false) {
  Job j;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string full = "timeout -s KILL " + std::to_string(limit_s) + " " + cmd + (stdout_only ? " 2>/dev/null" : " 2>&1");
  FILE* p = ::popen(full.c_str(), "r");
  if (!p) return j;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) j.out.append(buf, n);
  const int st = ::pclose(p);
  j.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  j.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return j;
}

std::string mpirun(int np, const std::string& fault = "") {
  std::string s = std::string(K3_MPIEXEC) + " -np " + std::to_string(np) + " --oversubscribe --bind-to none";
  if (!fault.empty()) s = "env K3_DIST_FAULT=" + fault + " " + s + " -x K3_DIST_FAULT";
  return s;
}

std::string train_args(const std::string& dir, const std::string& out) {
  return shell_quote(K3_CLI_PATH) + " train --config " + shell_quote(dir + "/run.json") + " --out " +
         shell_quote(out) + " --quiet";
}

// The counters and content hashes a checkpoint's train_state.safetensors records.
nlohmann::json train_state(const std::string& ckpt) {
  const std::string bytes = slurp(ckpt + "/train_state.safetensors");
  if (bytes.size() < 8) return {};
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, size_t(n)));
  return nlohmann::json::parse(header["__metadata__"]["k3cpp.train_state"].get<std::string>());
}

double last_loss(const std::string& metrics) {
  double loss = 0;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") loss = j["loss"].get<double>();
  }
  return loss;
}

// 8 steps of 256 tokens (2 micro-batches of 4 sequences of 32), a checkpoint every 2 steps.
std::string write_job_files(const std::string& dir) {
  nlohmann::json run = tiny_run();
  run["stages"] = nlohmann::json::parse(
      R"([{"name": "s1", "seq_len": 32, "tokens": 2048, "lr_peak": 0.01, "lr_end": 0.002, "decay_frac": 0.5}])");
  run["eval_every"] = 0, run["eval_tokens"] = 256, run["checkpoint_every"] = 2;
  return write_run_files(dir, run);
}

int count_lines_with(const std::string& text, const std::string& piece) {
  int n = 0;
  for (size_t p = text.find(piece); p != std::string::npos; p = text.find(piece, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(DistJobs, KilledRankEndsTheJobKeepsTheCheckpointAndResumesExactlyWithAnyRankCount) {
  TempDir t("k3_dist_jobs");
  write_job_files(t.path);
  // The run that never stops: one process, 2 threads.
  Job ref = sh(train_args(t.path, t.sub("ref")) + " --threads 2");
  ASSERT_EQ(ref.rc, 0) << ref.out;
  const auto want = train_state(t.sub("ref/checkpoint"));
  ASSERT_EQ(want["step"], 8);

  // Rank 1 is killed at its 5th gradient reduction (step 5): the checkpoint of step 4 stays.
  Job killed = sh(mpirun(2, "kill:1:5") + " " + train_args(t.path, t.sub("a")) + " --dp 2 --threads 1 --comm-timeout 30");
  EXPECT_NE(killed.rc, 0) << killed.out;
  EXPECT_LT(killed.seconds, 30) << killed.out;
  EXPECT_NE(killed.out.find("signal 9"), std::string::npos) << killed.out;
  const auto at4 = train_state(t.sub("a/checkpoint"));
  ASSERT_EQ(at4["step"], 4) << killed.out;
  fs::copy(t.sub("a"), t.sub("b"), fs::copy_options::recursive);
  fs::copy(t.sub("a"), t.sub("c"), fs::copy_options::recursive);

  // Same rank count: bitwise the run that never stopped.
  Job same = sh(mpirun(2) + " " + train_args(t.path, t.sub("a")) + " --dp 2 --threads 1 --resume");
  ASSERT_EQ(same.rc, 0) << same.out;
  const auto got = train_state(t.sub("a/checkpoint"));
  EXPECT_EQ(got["step"], 8);
  EXPECT_EQ(got["weights_hash"], want["weights_hash"]);
  EXPECT_EQ(got["optimizer_hash"], want["optimizer_hash"]);
  EXPECT_EQ(slurp(t.sub("a/checkpoint/model.safetensors")), slurp(t.sub("ref/checkpoint/model.safetensors")));
  // One process of 2 threads: the same summation tree, so bitwise too.
  Job one = sh(train_args(t.path, t.sub("b")) + " --threads 2 --resume");
  ASSERT_EQ(one.rc, 0) << one.out;
  const auto got1 = train_state(t.sub("b/checkpoint"));
  EXPECT_EQ(got1["weights_hash"], want["weights_hash"]);
  EXPECT_EQ(got1["optimizer_hash"], want["optimizer_hash"]);
  // 4 ranks (ZeRO-1 over 4 owners): completes; its sums are grouped differently, so the run
  // agrees to float rounding.
  Job four = sh(mpirun(4) + " " + train_args(t.path, t.sub("c")) + " --dp 4 --threads 1 --resume");
  ASSERT_EQ(four.rc, 0) << four.out;
  EXPECT_EQ(train_state(t.sub("c/checkpoint"))["step"], 8);
  EXPECT_NEAR(last_loss(t.sub("c/metrics.jsonl")), last_loss(t.sub("ref/metrics.jsonl")),
              1e-3 * last_loss(t.sub("ref/metrics.jsonl")));
  // The per-collective byte counts of the 4-rank job against the planner's projection
  // (k3cpp plan --dp): summed over the ranks, per step, exactly N x the per-rank figures.
  const auto cs = nlohmann::json::parse(slurp(t.sub("c/comm_stats.json")));
  ASSERT_EQ(cs["ranks"], 4);
  Job plan = sh(shell_quote(K3_CLI_PATH) + " plan " + shell_quote(t.sub("model.json")) + " --dp 4 --qb-bins 200 --json");
  ASSERT_EQ(plan.rc, 0) << plan.out;
  const auto dpp = nlohmann::json::parse(plan.out)["data_parallel"];
  double grad = 0, hist = 0;
  int64_t steps = 0;
  for (const auto& r : cs["per_rank"]) {
    grad += r["grad.reduce.reduce_scatter"]["bytes_sent"].get<double>() + r["param.allgather"]["bytes_sent"].get<double>();
    hist += r["balancer.qb_histogram.reduce_scatter"]["bytes_sent"].get<double>() +
            r["balancer.qb_histogram.allgather"]["bytes_sent"].get<double>();
    steps = r["loss.gather"]["calls"].get<int64_t>();
  }
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(grad / double(steps), 4 * dpp["gradient_bytes_per_rank_step"].get<double>());
  EXPECT_EQ(hist / double(steps), 4 * dpp["histogram_bytes_per_rank_step"].get<double>());
}

TEST(DistJobs, ExitingOrHungRankEndsTheJobWithAClearError) {
  TempDir t("k3_dist_jobs");
  write_job_files(t.path);
  Job gone = sh(mpirun(2, "exit:1:3") + " " + train_args(t.path, t.sub("a")) + " --dp 2 --threads 1 --comm-timeout 30");
  EXPECT_NE(gone.rc, 0) << gone.out;
  EXPECT_LT(gone.seconds, 30) << gone.out;
  EXPECT_NE(gone.out.find("K3_DIST_FAULT: exit"), std::string::npos) << gone.out;
  EXPECT_EQ(train_state(t.sub("a/checkpoint"))["step"], 2) << gone.out;

  Job hung = sh(mpirun(2, "hang:1:3") + " " + train_args(t.path, t.sub("b")) + " --dp 2 --threads 1 --comm-timeout 3");
  EXPECT_NE(hung.rc, 0) << hung.out;
  EXPECT_LT(hung.seconds, 30) << hung.out;
  EXPECT_NE(hung.out.find("rank 0 of 2: collective 'grad.reduce.reduce_scatter' did not complete within 3 s"),
            std::string::npos)
      << hung.out;
  EXPECT_EQ(train_state(t.sub("b/checkpoint"))["step"], 2) << hung.out;
}

TEST(DistJobs, RefusesAMismatchedRankCount) {
  TempDir t("k3_dist_jobs");
  write_job_files(t.path);
  Job alone = sh(train_args(t.path, t.sub("a")) + " --dp 2");
  EXPECT_EQ(alone.rc, 1) << alone.out;
  EXPECT_NE(alone.out.find("--dp 2 but the job has 1 MPI rank(s): start it with mpirun -np 2"), std::string::npos)
      << alone.out;
  Job bare = sh(mpirun(2) + " " + train_args(t.path, t.sub("b")));
  EXPECT_NE(bare.rc, 0) << bare.out;
  EXPECT_NE(bare.out.find("without --dp: pass --dp 2"), std::string::npos) << bare.out;
  // --dp-overlap: only with --dp, and only on or off.
  Job lone = sh(train_args(t.path, t.sub("c")) + " --dp-overlap off");
  EXPECT_EQ(lone.rc, 1) << lone.out;
  EXPECT_NE(lone.out.find("--dp-overlap and --dp-overlap-inflight go with --dp"), std::string::npos) << lone.out;
  Job odd = sh(mpirun(2) + " " + train_args(t.path, t.sub("d")) + " --dp 2 --dp-overlap maybe");
  EXPECT_NE(odd.rc, 0) << odd.out;
  EXPECT_NE(odd.out.find("--dp-overlap: expected on or off, got 'maybe'"), std::string::npos) << odd.out;
}

TEST(DistJobs, ExpertParallelGenerateEqualsOneProcess) {
  const std::string model = shell_quote(std::string(K3_TEST_DATA_DIR) + "/k3-release-tiny");
  const std::string args = " generate " + model + " --ids 1,2,3,4,5 --max-tokens 12 --ids-out --threads 1";
  Job one = sh(shell_quote(K3_CLI_PATH) + args, 60, true);
  ASSERT_EQ(one.rc, 0) << one.out;
  ASSERT_GT(one.out.size(), 12u);
  for (int np : {2, 4}) {
    Job ep = sh(mpirun(np) + " " + shell_quote(K3_CLI_PATH) + args + " --ep " + std::to_string(np), 60, true);
    ASSERT_EQ(ep.rc, 0) << ep.out;
    EXPECT_EQ(ep.out, one.out) << np << " ranks";  // rank 0 alone prints
  }
  // Plain (f32) experts: each rank converts only its own and gives the others' memory back;
  // the tokens are still the single process's.
  TempDir t("k3_dist_jobs");
  Job init = sh(shell_quote(K3_CLI_PATH) + " init " + shell_quote(std::string(K3_SOURCE_DIR) + "/configs/tiny.json") + " " +
                shell_quote(t.sub("plain")) + " --seed 2 --experts plain");
  ASSERT_EQ(init.rc, 0) << init.out;
  const std::string pargs = " generate " + shell_quote(t.sub("plain")) + " --ids 1,2,3,4,5 --max-tokens 12 --ids-out --threads 1";
  Job pone = sh(shell_quote(K3_CLI_PATH) + pargs, 60, true);
  ASSERT_EQ(pone.rc, 0) << pone.out;
  const std::string err = t.sub("ep.err");
  Job pep = sh("sh -c " + shell_quote(mpirun(2) + " " + shell_quote(K3_CLI_PATH) + pargs + " --ep 2 2>" + shell_quote(err)),
               60, true);
  ASSERT_EQ(pep.rc, 0) << pep.out << slurp(err);
  EXPECT_EQ(pep.out, pone.out);
  EXPECT_EQ(count_lines_with(slurp(err), "of the routed experts other ranks compute"), 2) << slurp(err);
}

TEST(DistJobs, ExpertParallelJobCountsItsDispatchAndResumesAsOneProcess) {
  TempDir t("k3_dist_jobs");
  write_job_files(t.path);
  Job ref = sh(train_args(t.path, t.sub("ref")) + " --threads 2");
  ASSERT_EQ(ref.rc, 0) << ref.out;
  const std::string loud = shell_quote(K3_CLI_PATH) + " train --config " + shell_quote(t.path + "/run.json") +
                           " --out " + shell_quote(t.sub("ep"));
  Job ep = sh(mpirun(2) + " " + loud + " --ep 2 --threads 1 --steps 4");
  ASSERT_EQ(ep.rc, 0) << ep.out;
  EXPECT_EQ(train_state(t.sub("ep/checkpoint"))["step"], 4);
  const auto cs = nlohmann::json::parse(slurp(t.sub("ep/comm_stats.json")));
  ASSERT_EQ(cs["ranks"], 2);
  for (int r = 0; r < 2; ++r) {
    const auto& pr = cs["per_rank"][size_t(r)];
    const int64_t rows = pr["ep.fwd.rows_sent"]["rows"].get<int64_t>();
    EXPECT_GT(rows, 0);
    EXPECT_EQ(pr["ep.fwd.dispatch"]["bytes_sent"].get<int64_t>(), rows * 16 * 4) << "rank " << r;
    EXPECT_EQ(pr["ep.bwd.dispatch"]["bytes_sent"], pr["ep.fwd.dispatch"]["bytes_sent"]) << "rank " << r;
    // 4 steps x 2 micro-batches x 2 sequences per rank x 3 MoE layers, 4 counts of 8 bytes each.
    EXPECT_EQ(pr["ep.fwd.counts"]["calls"].get<int64_t>(), 4 * 2 * 2 * 3) << "rank " << r;
    EXPECT_EQ(pr["ep.fwd.counts"]["bytes_sent"].get<int64_t>(), 4 * 2 * 2 * 3 * 4 * 8) << "rank " << r;
    EXPECT_NE(ep.out.find("train: rank " + std::to_string(r) + ": expert dispatch sent " +
                          std::to_string(rows * 64) + " bytes"),
              std::string::npos)
        << ep.out;
    EXPECT_NE(ep.out.find("train: rank " + std::to_string(r) + ": resident "), std::string::npos) << ep.out;
  }
  // Against the planner (k3cpp plan --dp 2 --ep 2): the trunk's gradient traffic exactly; the
  // all-to-all volume per token within 10 % (the planner assumes uniform routing, (ep - 1)/ep
  // of the rows leaving their rank; the run's QB-balanced routing decides the real share).
  Job plan = sh(shell_quote(K3_CLI_PATH) + " plan " + shell_quote(t.sub("model.json")) + " --dp 2 --ep 2 --json");
  ASSERT_EQ(plan.rc, 0) << plan.out;
  const auto dpp = nlohmann::json::parse(plan.out)["data_parallel"];
  double trunk = 0, a2a = 0;
  for (const auto& pr : cs["per_rank"]) {
    // ZeRO-1 of the trunk (the default): the reduce-scatter, then the updated parameters' gather.
    ASSERT_FALSE(pr.contains("grad.reduce.allgather")) << pr.dump();
    trunk += pr["grad.reduce.reduce_scatter"]["bytes_sent"].get<double>() + pr["param.allgather"]["bytes_sent"].get<double>();
    for (const char* l : {"ep.fwd.dispatch", "ep.fwd.combine", "ep.bwd.dispatch", "ep.bwd.combine"})
      a2a += pr[l]["bytes_sent"].get<double>();
  }
  EXPECT_EQ(trunk / 4, 2 * dpp["ep_trunk_gradient_bytes_per_rank_step"].get<double>());
  const double per_token = a2a / (4 * 256), planned = dpp["ep_train_alltoall_bytes_per_token"].get<double>();
  EXPECT_NEAR(per_token, planned, 0.1 * planned) << "measured " << per_token << " bytes per token";
  std::printf("measured all-to-all %.1f bytes per token (planner, uniform routing: %.1f)\n", per_token, planned);
  Job one = sh(train_args(t.path, t.sub("ep")) + " --threads 2 --resume");
  ASSERT_EQ(one.rc, 0) << one.out;
  const auto got = train_state(t.sub("ep/checkpoint")), want = train_state(t.sub("ref/checkpoint"));
  EXPECT_EQ(got["step"], 8);
  EXPECT_EQ(got["weights_hash"], want["weights_hash"]);
  EXPECT_EQ(got["optimizer_hash"], want["optimizer_hash"]);

  // A rank killed mid-run (step 3) ends the job; the step-2 checkpoint stays.
  Job killed = sh(mpirun(2, "kill:1:3") + " " + train_args(t.path, t.sub("k")) + " --ep 2 --threads 1 --comm-timeout 30");
  EXPECT_NE(killed.rc, 0) << killed.out;
  EXPECT_LT(killed.seconds, 30) << killed.out;
  EXPECT_NE(killed.out.find("signal 9"), std::string::npos) << killed.out;
  EXPECT_EQ(train_state(t.sub("k/checkpoint"))["step"], 2) << killed.out;

  Job wide = sh(mpirun(2) + " " + train_args(t.path, t.sub("a")) + " --ep 4");
  EXPECT_NE(wide.rc, 0) << wide.out;
  EXPECT_NE(wide.out.find("--ep 4 x --dp 1 but the job has 2 MPI rank(s): start it with mpirun -np 4"), std::string::npos)
      << wide.out;
  nlohmann::json run3 = tiny_run();  // 6 sequences per micro-batch: 3 ranks share them
  run3["batch_tokens"] = 384, run3["micro_batch_tokens"] = 192;
  write_run_files(t.path, run3, "run3.json");
  Job three = sh(mpirun(3) + " " + shell_quote(K3_CLI_PATH) + " train --config " + shell_quote(t.path + "/run3.json") +
                 " --out " + shell_quote(t.sub("c")) + " --quiet --ep 3 --threads 1");
  EXPECT_NE(three.rc, 0) << three.out;
  EXPECT_NE(three.out.find("num_experts: 8 routed experts per layer cannot be split over --ep 3"), std::string::npos)
      << three.out;
}

}  // namespace k3::test
