// The op harness (in the manner of llama.cpp's test-backend-ops): one table of op cases, each
// run on every backend present (the CPU on every SIMD target this machine has, the emulated
// device, the GPU) against a plain reference, with a gradient mode for the ops that have a
// backward and a performance mode (bench/bench_ops.cpp). A backend that is not present is
// reported as skipped with the reason, never as passed. docs/architecture.md, "Op harness".
//
// A case draws fresh random inputs from its seed (adversarial ones where its name says so),
// copies them to the backend's device, poisons every output with NaN, runs the op through
// kernels/ops.h, reads the outputs back and compares them with the reference: non-finite
// values first (an element the reference has finite and the backend not), then the relative
// RMS error ||out - ref|| / ||ref|| against the case's tolerance for that backend.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace k3::test {

// A backend of the harness: its ops, or why it is not here.
struct HarnessBackend {
  std::string name;
  std::shared_ptr<const Ops> ops;  // null: absent
  std::string absent_reason;
  bool bf16_products = false;      // products with bf16 weights round the activations too (the GPU)
};
// cpu, emulated, cuda (always listed; absent ones carry their reason).
const std::vector<HarnessBackend>& harness_backends();

// Inputs on the host and their copies on one backend's device.
class OpBuffers {
 public:
  explicit OpBuffers(Device* dev) : dev_(dev) {}
  float* f(const std::vector<float>& h);              // a device copy (kept alive by this object)
  int32_t* i(const std::vector<int32_t>& h);
  const uint16_t* u16(const std::vector<uint16_t>& h);
  float* out(size_t n);                               // n floats of NaN (poisoned)
  int32_t* out_i(size_t n);                           // n ints of -1 (poisoned)
  std::vector<float> read(const float* p, size_t n) const;
  std::vector<int32_t> read_i(const int32_t* p, size_t n) const;
  // Expert matrices on the device: MXFP4 from packed/scales bytes, or f32.
  const ExpertMatrix* experts_mx(const std::vector<Mxfp4Matrix>& host);
  const ExpertMatrix* experts_f32(const std::vector<std::vector<float>>& host, int64_t rows, int64_t cols);
  Device* device() const { return dev_; }

 private:
  Device* dev_;
  std::vector<std::shared_ptr<Buf<float>>> f_;
  std::vector<std::shared_ptr<Buf<int32_t>>> i_;
  std::vector<std::shared_ptr<Buf<uint16_t>>> u_;
  std::vector<std::shared_ptr<Buf<uint8_t>>> b_;
  std::vector<std::vector<ExpertMatrix>> em_;
  std::vector<std::vector<Mxfp4Matrix>> mx_;
};

// One named output of a run, and what it is compared with.
struct OpOutput {
  std::string name;
  std::vector<double> got, want;
  double tol = 0;  // relative RMS
};

// A case made ready on one backend: its inputs on the device, its outputs poisoned.
struct PreparedOp {
  std::function<void()> run;                       // the op on the backend (repeatable: timed so)
  std::function<std::vector<OpOutput>()> outputs;  // read back, beside the reference and tolerance
};

// One op case. `prepare` draws its inputs from `seed`, computes the reference when asked (the
// performance mode does not), and copies the inputs to the backend's device through `b`.
struct OpCase {
  std::string op;    // the ops.h method ("gemm", "kda", ...)
  std::string name;  // what makes this case (shape, variant, adversarial input)
  std::function<PreparedOp(const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool reference)> prepare;
  double flops = 0, bytes = 0;  // nominal work per run (performance mode)
  bool perf_only = false;       // a K3-sized shape: the performance mode only
};

// The whole table (every family's cases, in one order).
const std::vector<OpCase>& op_cases();
void add_product_cases(std::vector<OpCase>& t);
void add_rowwise_cases(std::vector<OpCase>& t);
void add_kda_cases(std::vector<OpCase>& t);
void add_attention_cases(std::vector<OpCase>& t);
void add_moe_cases(std::vector<OpCase>& t);

// Random helpers (deterministic per seed).
std::vector<float> rand_f(std::mt19937_64& rng, size_t n, double sd = 1.0, double mean = 0.0);
std::vector<uint16_t> to_bf16(const std::vector<float>& v);      // round to nearest even
std::vector<float> from_bf16(const std::vector<uint16_t>& v);
std::vector<double> widen(const std::vector<float>& v);

// The comparison of one output: `failure` empty when it passes, else what failed (non-finite
// first); `rel` the relative RMS error (NaN when the output is not comparable).
struct Comparison {
  std::string failure;
  double rel = 0;
};
Comparison compare(const OpOutput& o);

}  // namespace k3::test
