// Inputs and the double-precision reference shared by the chunked-KDA kernel tests: on the GPU
// (test_kda_chunk.cpp) and the host emulation of the same kernel code
// (test_kda_chunk_emulated.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/kda.h"

namespace k3::test::kda_cases {

// The gates of the adversarial cases (docs/kda-numerics.md). Most channels decay slowly (long
// memory: tokens a chunk apart and the carried state matter), a few fast:
//   Bounded      K3's gate, g = -5 sigmoid(z), z ~ N(-4, 2^2): g in (-5, 0), typically -0.1;
//   FloorPinned  Bounded with every even channel of every token at the floor -5;
//   Unbounded    Kimi Linear's -softplus(z), z ~ N(-3, 1.5^2), and every fourth channel in
//                [-50, -20]: anchored tile exponents far beyond e^88, where only the safe
//                diagonal path is valid.
enum class Gate { Bounded, FloorPinned, Unbounded };

struct Inputs {
  int64_t T, H, Dk, Dv;
  std::vector<float> q, k, v, g, beta, s0;  // s0 [H, Dk, Dv]: zeros, or random
};

// q, k unit rows per head (the mixer L2-normalises them), v ~ N(0, 1), beta = sigmoid(N(0, 1)).
inline Inputs make_inputs(int64_t T, int64_t H, int64_t Dk, int64_t Dv, Gate gate, bool random_state,
                          unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_real_distribution<float> u(-50.f, -20.f);
  Inputs in{T, H, Dk, Dv, {}, {}, {}, {}, {}, {}};
  in.q.resize(T * H * Dk);
  in.k.resize(T * H * Dk);
  for (auto* x : {&in.q, &in.k})
    for (int64_t r = 0; r < T * H; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < Dk; ++c) {
        const float e = n(rng);
        (*x)[r * Dk + c] = e;
        ss += double(e) * e;
      }
      for (int64_t c = 0; c < Dk; ++c) (*x)[r * Dk + c] = float((*x)[r * Dk + c] / std::sqrt(ss));
    }
  in.v.resize(T * H * Dv);
  for (auto& e : in.v) e = n(rng);
  in.beta.resize(T * H);
  for (auto& e : in.beta) e = 1.f / (1.f + std::exp(-n(rng)));
  in.g.resize(T * H * Dk);
  for (int64_t i = 0; i < T * H * Dk; ++i) {
    if (gate == Gate::Unbounded) {
      const float z = -3.f + 1.5f * n(rng);
      in.g[i] = (i % 4 == 0) ? u(rng) : -std::log1p(std::exp(z));
    } else {
      const float z = -4.f + 2.f * n(rng);
      in.g[i] = (gate == Gate::FloorPinned && i % 2 == 0) ? -5.f : -5.f / (1.f + std::exp(-z));
    }
  }
  in.s0.assign(H * Dk * Dv, 0.f);
  if (random_state)
    for (auto& e : in.s0) e = 0.5f * n(rng);
  return in;
}

// The plain recurrence (kernels/kda.h) in double on the float inputs: o [T, H, Dv] and the final
// state. Tokens [t0, t1) of `in`, continuing from `state` (updated).
inline std::vector<double> reference(const Inputs& in, std::vector<double>& state, double scale, int64_t t0,
                                     int64_t t1) {
  const int64_t H = in.H, Dk = in.Dk, Dv = in.Dv, T = t1 - t0;
  auto slice = [&](const std::vector<float>& x, int64_t w) {
    return std::vector<double>(x.begin() + t0 * H * w, x.begin() + t1 * H * w);
  };
  const auto q = slice(in.q, Dk), k = slice(in.k, Dk), g = slice(in.g, Dk), v = slice(in.v, Dv), b = slice(in.beta, 1);
  std::vector<double> o(T * H * Dv);
  kda_recurrent_forward<double>(o.data(), state.data(), q.data(), k.data(), v.data(), g.data(), b.data(), T, H, Dk,
                                Dv, scale);
  return o;
}

// ||a - b|| / ||b||; NaN when a has a non-finite entry (so no tolerance passes it).
inline double rel_rms(const float* a, const double* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return NAN;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}
inline int64_t count_nonfinite(const std::vector<float>& x) {
  int64_t c = 0;
  for (float e : x) c += !std::isfinite(e);
  return c;
}

}  // namespace k3::test::kda_cases
