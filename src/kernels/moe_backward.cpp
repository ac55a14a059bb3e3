// Routed SiTU-GLU experts backward: grouped gemm path and plain reference (see moe.h).
// Activation gradients (dz, dtopk_w) are assigned, expert weight gradients accumulated.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "core/error.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "kernels/moe_exchange.h"
#include "kernels/situ_simd.h"

namespace k3 {

namespace {

// Training needs the plain weights and a gradient for each of an expert's three matrices.
template <typename R>
void check_trainable(const ExpertMatrixT<R>& m, int64_t rows, int64_t cols, const R* grad) {
  K3_ASSERT(m.f32 != nullptr && m.mx == nullptr, "moe backward: only f32 experts train (MXFP4 is inference-only)");
  K3_ASSERT(m.rows == rows && m.cols == cols, "moe backward: expert matrix has the wrong shape");
  K3_ASSERT(grad != nullptr, "moe backward: an expert with tokens has no gradient buffer");
}

}  // namespace

void moe_experts_backward(float* dz, float* dtopk_w, const ExpertGrad* grads, const float* du,
                          const float* gu_saved, const float* y_saved, const float* z, const int32_t* topk_idx,
                          const float* topk_w, const ExpertMatrix* w1, const ExpertMatrix* w3, const ExpertMatrix* w2,
                          int64_t Tn, int64_t n_in, int64_t F, int64_t E, int64_t k, double b1, double b2,
                          MoEExpertScratch& scratch, const std::function<void()>* overlap) {
  K3_ASSERT(k > 0, "moe: top_k must be positive");
  K3_ASSERT(gu_saved && y_saved, "moe_experts_backward: the grouped path needs the forward's saved gu and y");
  MoEDispatch& dp = scratch.dispatch;
  moe_dispatch(dp, topk_idx, Tn, k, E);
  if (scratch.slots.size() < size_t(Tn * k * n_in)) scratch.slots.resize(size_t(Tn * k * n_in));
  float* dslots = scratch.slots.data();  // [T * k, n_in]: dz contribution of each (token, slot)
  // Forward: u[t] += p_s y_s  ->  dp_s = du[t] . y_s,  dy_s = p_s du[t] (row r of a block).
  auto mixture_grad = [&](float* dYr, int64_t t, int64_t s) {
    const float* dut = du + t * n_in;
    const float* ys = y_saved + s * n_in;
    const float p = topk_w[s];
    float acc = 0;
    for (int64_t c = 0; c < n_in; ++c) {
      acc += dut[c] * ys[c];
      dYr[c] = p * dut[c];
    }
    dtopk_w[s] = acc;
  };

  if (ExpertTrainExchange* tex = expert_train_exchange()) {
    // Expert-parallel training (moe_exchange.h): the owners hold the rows and gu of the forward
    // and accumulate their experts' parameter gradients; here only the mixture and the slots.
    const int64_t rows = Tn * k;
    if (scratch.ep_in.size() < size_t(rows * n_in)) scratch.ep_in.resize(size_t(rows * n_in));
    if (scratch.ep_out.size() < size_t(rows * n_in)) scratch.ep_out.resize(size_t(rows * n_in));
    for (int64_t p = 0; p < rows; ++p) mixture_grad(scratch.ep_in.data() + p * n_in, dp.token[p], dp.slot[p]);
    static const std::function<void()> nothing = [] {};
    tex->backward(scratch.ep_out.data(), scratch.ep_in.data(), dp, w1, w3, w2, E, n_in, F, b1, b2,
                  overlap ? *overlap : nothing);
    for (int64_t p = 0; p < rows; ++p)
      std::memcpy(dslots + dp.slot[p] * n_in, scratch.ep_out.data() + p * n_in, sizeof(float) * size_t(n_in));
  } else {
    if (overlap) (*overlap)();
    scratch.active.clear();
    int64_t max_rows = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = dp.offset[e + 1] - dp.offset[e];
      if (n == 0) continue;
      check_trainable(w1[e], F, n_in, grads[e].w1);
      check_trainable(w3[e], F, n_in, grads[e].w3);
      check_trainable(w2[e], n_in, F, grads[e].w2);
      scratch.active.push_back(int32_t(e));
      max_rows = std::max(max_rows, n);
    }
    const int64_t n_active = int64_t(scratch.active.size());
    // Per-thread: gathered z, dY (= p du), gu, dZ rows, and moe_expert_rows_backward's 4F.
    const int64_t per_thread = max_rows * (n_in + n_in + 2 * F + n_in + 4 * F);
    const int nthreads = n_active > 1 ? omp_get_max_threads() : 1;
    if (scratch.work.size() < size_t(per_thread * nthreads)) scratch.work.resize(size_t(per_thread * nthreads));

#pragma omp parallel for schedule(dynamic, 1) if (n_active > 1)
    for (int64_t ai = 0; ai < n_active; ++ai) {
      const int64_t e = scratch.active[ai];
      const int64_t begin = dp.offset[e], n = dp.offset[e + 1] - begin;
      float* zg = scratch.work.data() + per_thread * (n_active > 1 ? omp_get_thread_num() : 0);
      float* dY = zg + max_rows * n_in;    // [n, n_in]
      float* gu = dY + max_rows * n_in;    // [n, 2F]
      float* dZ = gu + max_rows * 2 * F;   // [n, n_in]
      float* work = dZ + max_rows * n_in;  // [n, 4F]
      for (int64_t r = 0; r < n; ++r) {
        const int64_t t = dp.token[begin + r], s = dp.slot[begin + r];
        std::memcpy(zg + r * n_in, z + t * n_in, sizeof(float) * size_t(n_in));
        std::memcpy(gu + r * 2 * F, gu_saved + s * 2 * F, sizeof(float) * size_t(2 * F));
        mixture_grad(dY + r * n_in, t, s);
      }
      moe_expert_rows_backward(dZ, grads[e], dY, zg, gu, w1[e], w3[e], w2[e], n, n_in, F, b1, b2, work);
      for (int64_t r = 0; r < n; ++r)
        std::memcpy(dslots + dp.slot[begin + r] * n_in, dZ + r * n_in, sizeof(float) * size_t(n_in));
    }
  }

  // dz[t] = sum of its slots, in slot order (fixed reduction order).
#pragma omp parallel for schedule(static) if (Tn * k * n_in > 65536)
  for (int64_t t = 0; t < Tn; ++t) {
    float* dzt = dz + t * n_in;
    std::memcpy(dzt, dslots + t * k * n_in, sizeof(float) * size_t(n_in));
    for (int64_t i = 1; i < k; ++i) {
      const float* src = dslots + (t * k + i) * n_in;
      for (int64_t c = 0; c < n_in; ++c) dzt[c] += src[c];
    }
  }
}

void moe_expert_rows_backward(float* dZ, const ExpertGrad& g, const float* dY, const float* zg, const float* gu,
                              const ExpertMatrix& w1, const ExpertMatrix& w3, const ExpertMatrix& w2, int64_t n,
                              int64_t n_in, int64_t F, double b1, double b2, float* work) {
  check_trainable(w1, F, n_in, g.w1);
  check_trainable(w3, F, n_in, g.w3);
  check_trainable(w2, n_in, F, g.w2);
  float* act = work;           // [n, F]
  float* dact = act + n * F;   // [n, F]
  float* dgu = dact + n * F;   // [n, 2F]
  situ_glu_forward_fast(act, gu, n, F, b1, b2);  // the forward's activation, recomputed
  // Forward: y = act W2^T  ->  dW2 += dY^T act;  dact = dY W2.
  gemm(true, false, n_in, F, n, 1.f, dY, n_in, act, F, 1.f, g.w2, F);
  gemm(false, false, n, F, n_in, 1.f, dY, n_in, w2.f32, F, 0.f, dact, F);
  // Forward: act = SiTU(gate, up).
  situ_glu_backward_fast(dgu, dact, gu, n, F, b1, b2);
  // Forward: [gate | up] = [Z W1^T | Z W3^T]  ->  dW1 += dG^T Z, dW3 += dU^T Z, dZ = dG W1 + dU W3.
  gemm(true, false, F, n_in, n, 1.f, dgu, 2 * F, zg, n_in, 1.f, g.w1, n_in);
  gemm(true, false, F, n_in, n, 1.f, dgu + F, 2 * F, zg, n_in, 1.f, g.w3, n_in);
  gemm(false, false, n, n_in, F, 1.f, dgu, 2 * F, w1.f32, n_in, 0.f, dZ, n_in);
  gemm(false, false, n, n_in, F, 1.f, dgu + F, 2 * F, w3.f32, n_in, 1.f, dZ, n_in);
}

template <typename R>
void moe_experts_backward_reference(R* dz, R* dtopk_w, const ExpertGradT<R>* grads, const R* du,
                                    const R* /*gu_saved*/, const R* /*y_saved*/, const R* z, const int32_t* topk_idx,
                                    const R* topk_w, const ExpertMatrixT<R>* w1, const ExpertMatrixT<R>* w3,
                                    const ExpertMatrixT<R>* w2, int64_t Tn, int64_t n_in, int64_t F, int64_t E,
                                    int64_t k, double b1, double b2, MoEExpertScratch& /*scratch*/) {
  const size_t nF = static_cast<size_t>(F), nI = static_cast<size_t>(n_in);
  std::vector<double> g(nF), up(nF), act(nF), y(nI), dy(nI), dact(nF), dzt(nI);
  for (int64_t t = 0; t < Tn; ++t) {
    const R* zt = z + t * n_in;
    const R* dut = du + t * n_in;
    std::fill(dzt.begin(), dzt.end(), 0.0);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t slot = t * k + i, e = topk_idx[slot];
      K3_ASSERT(e >= 0 && e < E, "moe: expert index out of range");
      check_trainable(w1[e], F, n_in, grads[e].w1);
      check_trainable(w3[e], F, n_in, grads[e].w3);
      check_trainable(w2[e], n_in, F, grads[e].w2);
      const R *W1 = w1[e].f32, *W3 = w3[e].f32, *W2 = w2[e].f32;
      // Recompute: gate = W1 z, up = W3 z, act = SiTU(gate, up), y = W2 act.
      for (int64_t j = 0; j < F; ++j) {
        double a = 0, b = 0;
        for (int64_t c = 0; c < n_in; ++c) {
          a += double(W1[j * n_in + c]) * double(zt[c]);
          b += double(W3[j * n_in + c]) * double(zt[c]);
        }
        g[j] = a;
        up[j] = b;
        act[j] = situ(a, b, b1, b2);
      }
      const double p = double(topk_w[slot]);
      double dp = 0;
      for (int64_t c = 0; c < n_in; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < F; ++j) acc += double(W2[c * F + j]) * act[j];
        y[c] = acc;
        dp += double(dut[c]) * acc;  // u += p y  ->  dp = du . y
        dy[c] = p * double(dut[c]);  //           ->  dy = p du
      }
      dtopk_w[slot] = R(dp);
      // y = W2 act: dW2 += dy act^T; dact = W2^T dy.
      std::fill(dact.begin(), dact.end(), 0.0);
      for (int64_t c = 0; c < n_in; ++c)
        for (int64_t j = 0; j < F; ++j) {
          grads[e].w2[c * F + j] += R(dy[c] * act[j]);
          dact[j] += double(W2[c * F + j]) * dy[c];
        }
      // act = SiTU(gate, up); gate = W1 z, up = W3 z.
      for (int64_t j = 0; j < F; ++j) {
        double dg, dup;
        situ_grad(g[j], up[j], b1, b2, &dg, &dup);
        dg *= dact[j];
        dup *= dact[j];
        for (int64_t c = 0; c < n_in; ++c) {
          grads[e].w1[j * n_in + c] += R(dg * double(zt[c]));
          grads[e].w3[j * n_in + c] += R(dup * double(zt[c]));
          dzt[c] += dg * double(W1[j * n_in + c]) + dup * double(W3[j * n_in + c]);
        }
      }
    }
    for (int64_t c = 0; c < n_in; ++c) dz[t * n_in + c] = R(dzt[c]);
  }
}

template void moe_experts_backward_reference<float>(float*, float*, const ExpertGrad*, const float*, const float*,
                                                    const float*, const float*, const int32_t*, const float*,
                                                    const ExpertMatrix*, const ExpertMatrix*, const ExpertMatrix*,
                                                    int64_t, int64_t, int64_t, int64_t, int64_t, double, double,
                                                    MoEExpertScratch&);
template void moe_experts_backward_reference<double>(double*, double*, const ExpertGradT<double>*, const double*,
                                                     const double*, const double*, const double*, const int32_t*,
                                                     const double*, const ExpertMatrixT<double>*,
                                                     const ExpertMatrixT<double>*, const ExpertMatrixT<double>*,
                                                     int64_t, int64_t, int64_t, int64_t, int64_t, double, double,
                                                     MoEExpertScratch&);

}  // namespace k3
