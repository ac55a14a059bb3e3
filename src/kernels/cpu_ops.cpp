// The CPU backend of kernels/ops.h: each op is the kernel named in its contract, on host
// memory, with the same arguments, so the wiring through OpsT computes bit for bit what it
// computed calling the kernels directly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/activations.h"
#include "kernels/attn_res.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/kda_gate.h"
#include "kernels/norm.h"
#include "kernels/ops.h"
#include "kernels/router.h"
#include "kernels/shortconv.h"

namespace k3 {

namespace {

template <typename R>
class CpuOps final : public OpsT<R> {
 public:
  const char* name() const override { return "cpu"; }
  Device* device() const override { return nullptr; }

  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, R alpha, const R* A, int64_t lda, const MatT<R>& B,
            int64_t ldb, R beta, R* C, int64_t ldc) const override {
    k3::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, R alpha, const R* A, int64_t lda, int64_t sA,
                    const MatT<R>& B, int64_t ldb, int64_t sB, R beta, R* C, int64_t ldc, int64_t sC,
                    int64_t count) const override {
#pragma omp parallel for schedule(static) if (count > 1)
    for (int64_t i = 0; i < count; ++i)
      k3::gemm(ta, tb, M, N, K, alpha, A + i * sA, lda, B.offset(i * sB), ldb, beta, C + i * sC, ldc);
  }
  void rmsnorm(R* y, int64_t ldy, R* rstd, const R* x, int64_t ldx, const R* w, int64_t rows, int64_t dim,
               double eps) const override {
    if (ldy == dim && ldx == dim) return rmsnorm_forward<R>(y, rstd, x, w, rows, dim, eps);
    for (int64_t r = 0; r < rows; ++r)
      rmsnorm_forward<R>(y + r * ldy, rstd ? rstd + r : nullptr, x + r * ldx, w, 1, dim, eps);
  }
  void l2norm(R* y, R* inv, const R* x, int64_t rows, int64_t dim, double eps) const override {
    l2norm_forward<R>(y, inv, x, rows, dim, eps);
  }
  void shortconv_silu(R* y, R* pre, R* state, const R* x, const R* w, int64_t T, int64_t C,
                      int64_t K) const override {
    shortconv_silu_forward<R>(y, pre, state, x, w, T, C, K);
  }
  void kda_gate(R* g, const R* z, const R* A_log, const R* dt_bias, int64_t T, int64_t H, int64_t D, bool bounded,
                double lower_bound) const override {
    kda_gate_forward<R>(g, z, A_log, dt_bias, T, H, D, bounded, lower_bound);
  }
  void kda(KDACore core, R* o, R* S, const R* q, const R* k, const R* v, const R* g, const R* beta, int64_t T,
           int64_t H, int64_t Dk, int64_t Dv, double scale, const KDAFastOptions& opt,
           KDAWorkspace& ws) const override {
    if constexpr (std::is_same_v<R, float>) {
      switch (core) {
        case KDACore::Fast:
          return kda_chunk_fast_forward(o, S, q, k, v, g, beta, T, H, Dk, Dv, scale, opt, ws);
        case KDACore::Step:
        case KDACore::StepFast:
          for (int64_t t = 0; t < T; ++t) {
            const int64_t a = t * H * Dk, b = t * H * Dv;
            if (core == KDACore::StepFast)
              kda_decode_step_fast(o + b, S, q + a, k + a, v + b, g + a, beta + t * H, H, Dk, Dv, scale);
            else
              kda_decode_step(o + b, S, q + a, k + a, v + b, g + a, beta + t * H, H, Dk, Dv, scale);
          }
          return;
        default:
          break;
      }
    } else {
      (void)opt, (void)ws;
    }
    // The references (and, in double, the fast cores' stand-ins: Fast -> Chunked, steps -> Recurrent).
    if (core == KDACore::Chunked || core == KDACore::Fast)
      kda_chunk_forward<R>(o, S, q, k, v, g, beta, T, H, Dk, Dv, scale, opt.chunk);
    else
      kda_recurrent_forward<R>(o, S, q, k, v, g, beta, T, H, Dk, Dv, scale);
  }
  void attention(R* o, const R* q, const R* k, const R* kr, const R* v, const AttentionDims& dims,
                 AttentionScratch& scratch, R* lse) const override {
    if constexpr (std::is_same_v<R, float>) attention_forward(o, q, k, kr, v, dims, scratch, lse);
    else attention_forward_ref<R>(o, q, k, kr, v, dims, lse);
  }
  void router(int32_t* idx, R* w, R* scores, const R* x, const MatT<R>& W_r, const R* bias, int64_t T, int64_t d,
              int64_t E, int64_t k, bool renorm, double scale) const override {
    router_forward<R>(idx, w, scores, x, W_r, bias, T, d, E, k, renorm, scale);
  }
  void moe_experts(R* u, const R* z, const int32_t* idx, const R* w, const ExpertMatrixT<R>* w1,
                   const ExpertMatrixT<R>* w3, const ExpertMatrixT<R>* w2, int64_t T, int64_t n_in, int64_t F,
                   int64_t E, int64_t k, double b1, double b2, MoEExpertScratch& scratch,
                   const MoEExpertsExtras& x) const override {
    if constexpr (std::is_same_v<R, float>) {
      moe_experts_forward(u, z, idx, w, w1, w3, w2, T, n_in, F, E, k, b1, b2, scratch, x.gu_saved, x.y_saved,
                          x.provider, x.overlap);
    } else {
      K3_ASSERT(false, "the grouped routed experts are float-only (the double wiring runs the dense reference)");
    }
  }
  void situ_glu(R* act, const R* gu, int64_t rows, int64_t F, double b1, double b2) const override {
    situ_glu_forward<R>(act, gu, rows, F, b1, b2);
  }
  void attn_res(R* out, R* alpha, const R* const* sources, int64_t S, const R* w_norm, const R* w_proj, int64_t T,
                int64_t d, double eps) const override {
    attn_res_forward<R>(out, alpha, sources, S, w_norm, w_proj, T, d, eps);
  }
  void embed_rows(R* dst, const MatT<R>& W, const int32_t* ids, int64_t T, int64_t d) const override {
    for (int64_t t = 0; t < T; ++t) mat_row(dst + t * d, W, int64_t(ids[t]), d);
  }
  void add(R* y, const R* x, int64_t n) const override {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  void sigmoid(R* y, const R* x, int64_t n) const override {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] = k3::sigmoid(x[i]);
  }
  void mul_sigmoid(R* y, const R* a, const R* gate, int64_t n) const override {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] * k3::sigmoid(gate[i]);
  }
  void scale(R* x, double f, int64_t n) const override {
    const R s = R(f);
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
  }
  void copy(R* dst, const R* src, int64_t n) const override {
    if (n > 0 && dst != src) std::memmove(dst, src, sizeof(R) * size_t(n));
  }
  void fill(R* dst, double v, int64_t n) const override { std::fill(dst, dst + n, R(v)); }
  void copy_rows(R* dst, int64_t ldd, const R* src, int64_t lds, int64_t rows, int64_t cols) const override {
    for (int64_t r = 0; r < rows; ++r) std::memmove(dst + r * ldd, src + r * lds, sizeof(R) * size_t(cols));
  }
  void argmax_rows(int32_t* ids, uint8_t* nonfinite, const R* logits, int64_t ld, int64_t V, const int64_t* rows,
                   int64_t n) const override {
    for (int64_t i = 0; i < n; ++i) {
      const R* l = logits + rows[i] * ld;
      int64_t best = 0;
      bool bad = false;
      for (int64_t v = 0; v < V; ++v) {
        bad |= !std::isfinite(l[v]);
        if (l[v] > l[best]) best = v;
      }
      ids[i] = int32_t(best);
      nonfinite[i] = bad;
    }
  }
};

}  // namespace

template <typename R>
const OpsT<R>& cpu_ops() {
  static const CpuOps<R> ops;
  return ops;
}

template const OpsT<float>& cpu_ops<float>();
template const OpsT<double>& cpu_ops<double>();

}  // namespace k3
