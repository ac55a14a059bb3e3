// Op cases: matrix products (gemm, gemm_batched) with f32 and bf16 weights, every transpose,
// decode-sized (the few-row path) and prefill-sized shapes, strided rows, alpha and beta.
// Reference: the same product in double over the values as held (bf16 widened exactly).
#include <memory>
#include <string>

#include "ops/op_harness.h"

namespace k3::test {

namespace {

struct GemmShape {
  bool ta, tb;
  int64_t M, N, K, count;
  bool bf16;
  float alpha, beta;
  int64_t pad;  // extra elements per row (strided operands)
};

std::string shape_name(const GemmShape& s) {
  return std::string(s.ta ? "T" : "N") + (s.tb ? "T" : "N") + " M=" + std::to_string(s.M) + " N=" +
         std::to_string(s.N) + " K=" + std::to_string(s.K) + (s.count > 1 ? " batch=" + std::to_string(s.count) : "") +
         (s.bf16 ? " bf16 B" : " f32 B") + (s.pad ? " strided" : "") + (s.beta != 0 ? " beta" : "");
}

OpCase gemm_case(const GemmShape& s, bool perf_only = false) {
  OpCase c;
  c.op = s.count > 1 ? "gemm_batched" : "gemm";
  c.name = shape_name(s);
  c.perf_only = perf_only;
  c.flops = 2.0 * double(s.M * s.N * s.K * s.count);
  c.bytes = double(s.count) * (4.0 * double(s.M * s.K + 2 * s.M * s.N) + (s.bf16 ? 2.0 : 4.0) * double(s.N * s.K));
  c.prepare = [s](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool reference) {
    std::mt19937_64 rng(seed);
    // op(A) [M, K], op(B) [K, N]; stored A [M, K] or [K, M], B [N, K] (tb) or [K, N].
    const int64_t a_rows = s.ta ? s.K : s.M, a_cols = s.ta ? s.M : s.K;
    const int64_t b_rows = s.tb ? s.N : s.K, b_cols = s.tb ? s.K : s.N;
    const int64_t lda = a_cols + s.pad, ldb = b_cols + s.pad, ldc = s.N + s.pad;
    const int64_t sA = a_rows * lda, sB = b_rows * ldb, sC = s.M * ldc;
    std::vector<float> A = rand_f(rng, size_t(sA * s.count)), Bf = rand_f(rng, size_t(sB * s.count), 0.05);
    std::vector<float> C0 = rand_f(rng, size_t(sC * s.count));
    std::vector<uint16_t> Bh;
    if (s.bf16) {
      Bh = to_bf16(Bf);
      Bf = from_bf16(Bh);  // the reference uses the values as held
    }
    auto want = std::make_shared<std::vector<double>>();
    if (reference) {
      want->resize(size_t(sC * s.count));
      for (int64_t p = 0; p < s.count; ++p)
        for (int64_t m = 0; m < s.M; ++m)
          for (int64_t n = 0; n < ldc; ++n) {
            const size_t ci = size_t(p * sC + m * ldc + n);
            if (n >= s.N) {
              (*want)[ci] = C0[ci];  // padding is never written
              continue;
            }
            double acc = 0;
            for (int64_t k = 0; k < s.K; ++k) {
              const double a = A[size_t(p * sA + (s.ta ? k * lda + m : m * lda + k))];
              const double w = Bf[size_t(p * sB + (s.tb ? n * ldb + k : k * ldb + n))];
              acc += a * w;
            }
            (*want)[ci] = double(s.alpha) * acc + double(s.beta) * C0[ci];
          }
    }
    float* C = b.f(C0);
    const float* Ad = b.f(A);
    const Mat B = s.bf16 ? Mat::from_bf16(b.u16(Bh)) : Mat(b.f(Bf));
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] {
      if (s.count > 1)
        ops->gemm_batched(s.ta, s.tb, s.M, s.N, s.K, s.alpha, Ad, lda, sA, B, ldb, sB, s.beta, C, ldc, sC, s.count);
      else
        ops->gemm(s.ta, s.tb, s.M, s.N, s.K, s.alpha, Ad, lda, B, ldb, s.beta, C, ldc);
    };
    // f32 accumulation over K terms; bf16 activations on a bf16-product backend (about 2^-9
    // relative per operand, averaging over K).
    const double tol = be.bf16_products && s.bf16 ? 1e-2 : 2e-5;
    const size_t n = size_t(sC * s.count);
    po.outputs = [=, &b] { return std::vector<OpOutput>{{"C", widen(b.read(C, n)), *want, tol}}; };
    return po;
  };
  return c;
}

}  // namespace

void add_product_cases(std::vector<OpCase>& t) {
  for (bool bf16 : {false, true}) {
    // Decode-sized linear (the few-row path), vector-friendly and ragged K.
    t.push_back(gemm_case({false, true, 1, 70, 256, 1, bf16, 1.f, 0.f, 0}));
    t.push_back(gemm_case({false, true, 5, 33, 72, 1, bf16, 1.f, 0.f, 0}));
    t.push_back(gemm_case({false, true, 16, 64, 200, 1, bf16, 1.f, 1.f, 0}));
    t.push_back(gemm_case({false, true, 3, 40, 64, 1, bf16, 0.5f, 0.f, 8}));
    // Prefill-sized and every transpose (the library path).
    t.push_back(gemm_case({false, true, 67, 48, 96, 1, bf16, 1.f, 0.f, 0}));
    t.push_back(gemm_case({false, false, 40, 24, 36, 1, bf16, 1.f, 0.f, 0}));
    t.push_back(gemm_case({true, false, 24, 40, 17, 1, bf16, 1.f, 1.f, 0}));
    t.push_back(gemm_case({true, true, 33, 20, 45, 1, bf16, 2.f, 0.f, 3}));
    // Per-head products of absorbed MLA decode (batched, strided).
    t.push_back(gemm_case({false, false, 2, 32, 16, 6, bf16, 1.f, 0.f, 0}));
    t.push_back(gemm_case({false, true, 2, 16, 32, 6, bf16, 1.f, 0.f, 0}));
    t.push_back(gemm_case({false, true, 40, 16, 32, 3, bf16, 1.f, 0.f, 0}));
  }
  // K3's widths (performance mode): a decode step's q projection and a prefill's.
  t.push_back(gemm_case({false, true, 1, 12288, 7168, 1, true, 1.f, 0.f, 0}, true));
  t.push_back(gemm_case({false, true, 8, 12288, 7168, 1, true, 1.f, 0.f, 0}, true));
  t.push_back(gemm_case({false, true, 4096, 12288, 7168, 1, true, 1.f, 0.f, 0}, true));
}

}  // namespace k3::test
