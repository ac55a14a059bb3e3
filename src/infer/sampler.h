// Token sampling from logits: greedy (temperature 0), temperature, top-k, top-p (nucleus),
// with a seeded generator whose stream is defined here (not by the standard library's
// distributions), so a seed gives the same tokens on every platform.
#pragma once
#include <cstdint>
#include <vector>

namespace k3 {

struct SamplerOptions {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& opt);
  int32_t sample(const float* logits, int64_t vocab);
  double next_uniform();  // [0, 1), splitmix64-based

 private:
  SamplerOptions opt_;
  uint64_t state_;
  std::vector<int32_t> idx_;
  std::vector<double> prob_;
};

}  // namespace k3
