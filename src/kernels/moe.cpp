// Routed SiTU-GLU experts: grouped gemm path and plain reference (see moe.h).
#include "kernels/moe.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/moe_exchange.h"
#include "kernels/mxfp4_linear.h"
#include "kernels/situ_simd.h"
#include "kernels/small_matmul.h"

namespace k3 {

namespace {

template <typename R>
void check_expert(const ExpertMatrixT<R>& m, int64_t rows, int64_t cols) {
  K3_ASSERT((m.f32 != nullptr) != (m.mx != nullptr), "moe: an expert matrix needs exactly one of f32 / mx");
  K3_ASSERT(m.rows == rows && m.cols == cols, "moe: expert matrix has the wrong shape");
  K3_ASSERT(!m.mx || (m.mx->rows == rows && m.mx->cols == cols), "moe: MXFP4 matrix has the wrong shape");
}

// An MXFP4 expert meets at most this many gathered rows through the fused-decode product
// (kernels/mxfp4_linear.h: W read once at 4.25 bits, no dequantised copy); more rows go as
// columns through linear_cols_mxfp4 (kernels/small_matmul.h), which dequantises 6 rows at a
// time into L1 and reuses them for every column.
constexpr int64_t kFusedMaxRows = 8;

// y [n, ldy] (first m.rows columns) = x [n, m.cols] m^T: fused MXFP4 decode (few rows), or
// gemm on the f32 matrix.
void expert_linear(float* y, int64_t ldy, const float* x, const ExpertMatrix& m, int64_t n) {
  if (m.mx) {
    mxfp4_linear(y, x, m.mx->packed.data<uint8_t>(), m.mx->scales.data<uint8_t>(), n, m.cols, m.rows, ldy);
    return;
  }
  gemm(false, true, n, m.rows, m.cols, 1.f, x, m.cols, m.f32, m.cols, 0.f, y, ldy);
}

// yt [rows, ld] = m xt for n columns: MXFP4 rows dequantised block by block inside the product
// (kernels/small_matmul.h linear_cols_mxfp4), f32 directly.
void expert_cols(float* yt, const float* xt, const ExpertMatrix& m, int64_t n, int64_t ld) {
  if (m.mx)
    linear_cols_mxfp4(yt, xt, m.mx->packed.data<uint8_t>(), m.mx->scales.data<uint8_t>(), n, m.cols, m.rows, ld, ld);
  else
    linear_cols(yt, xt, m.f32, n, m.cols, m.rows, ld, ld);
}

}  // namespace

void moe_dispatch(MoEDispatch& out, const int32_t* topk_idx, int64_t Tn, int64_t k, int64_t E) {
  out.offset.assign(size_t(E + 1), 0);
  out.cursor.resize(size_t(E));
  out.token.resize(size_t(Tn * k));
  out.slot.resize(size_t(Tn * k));
  for (int64_t a = 0; a < Tn * k; ++a) {
    K3_ASSERT(topk_idx[a] >= 0 && topk_idx[a] < E, "moe: expert index out of range");
    ++out.offset[size_t(topk_idx[a]) + 1];
  }
  for (int64_t e = 0; e < E; ++e) out.offset[e + 1] += out.offset[e];
  std::copy(out.offset.begin(), out.offset.end() - 1, out.cursor.begin());
  for (int64_t a = 0; a < Tn * k; ++a) {  // ascending (token, slot): stable by token
    const int64_t pos = out.cursor[topk_idx[a]]++;
    out.token[pos] = int32_t(a / k);
    out.slot[pos] = a;
  }
}

void moe_distinct_experts(std::vector<int32_t>& out, const int32_t* topk_idx, int64_t Tn, int64_t k, int64_t E) {
  out.clear();
  std::vector<uint8_t> seen(size_t(E), 0);
  for (int64_t a = 0; a < Tn * k; ++a) {
    K3_ASSERT(topk_idx[a] >= 0 && topk_idx[a] < E, "moe: expert index out of range");
    seen[size_t(topk_idx[a])] = 1;
  }
  for (int64_t e = 0; e < E; ++e)
    if (seen[size_t(e)]) out.push_back(int32_t(e));
}

void moe_experts_forward(float* u, const float* z, const int32_t* topk_idx, const float* topk_w,
                         const ExpertMatrix* w1, const ExpertMatrix* w3, const ExpertMatrix* w2, int64_t Tn,
                         int64_t n_in, int64_t F, int64_t E, int64_t k, double b1, double b2,
                         MoEExpertScratch& scratch, float* gu_saved, float* y_saved, ExpertProvider* provider,
                         const std::function<void()>* overlap) {
  K3_ASSERT(k > 0, "moe: top_k must be positive");
  MoEDispatch& dp = scratch.dispatch;
  moe_dispatch(dp, topk_idx, Tn, k, E);
  scratch.active.clear();
  int64_t max_rows = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = dp.offset[e + 1] - dp.offset[e];
    if (n == 0) continue;
    if (!provider) {
      check_expert(w1[e], F, n_in);
      check_expert(w3[e], F, n_in);
      check_expert(w2[e], n_in, F);
    }
    scratch.active.push_back(int32_t(e));
    max_rows = std::max(max_rows, n);
  }
  const int64_t n_active = int64_t(scratch.active.size());
  // Per-thread work area, sized for either layout: rows (gathered z, [W1 z | W3 z], SiTU, W2
  // output: [n, n_in], [n, 2F], [n, F], [n, n_in]) or columns (the same transposed, n padded
  // to ld).
  const int64_t ld = (max_rows + 15) / 16 * 16;
  const int64_t per_thread = ld * (n_in + 2 * F + F + n_in);
  const int nthreads = n_active > 1 ? omp_get_max_threads() : 1;
  if (scratch.work.size() < size_t(per_thread * nthreads)) scratch.work.resize(size_t(per_thread * nthreads));
  if (scratch.slots.size() < size_t(Tn * k * n_in)) scratch.slots.resize(size_t(Tn * k * n_in));
  float* slots = scratch.slots.data();

  // One expert e with its matrices (m1, m3, m2) on its gathered rows, on the calling thread.
  auto run_expert = [&](int64_t e, const ExpertMatrix& m1, const ExpertMatrix& m3, const ExpertMatrix& m2,
                        float* zg) {
    const int64_t begin = dp.offset[e], n = dp.offset[e + 1] - begin;
    float* gu = zg + ld * n_in;   // [n, 2F] laid out [gate | up]   (columns: [2F, ld])
    float* act = gu + ld * 2 * F;  // [n, F]                        (columns: [F, ld])
    float* y = act + ld * F;       // [n, n_in]                     (columns: [n_in, ld])
    const bool mx = m1.mx || m3.mx || m2.mx;
    if (mx && n > kFusedMaxRows) {
      // Prefill sizes: rows as columns (kernels/small_matmul.h), MXFP4 rows dequantised per
      // block of 6 inside the product.
      // Transposes go in tiles of 16 columns, so the 16 rows of the column-major side being
      // written or read stay in L1 across the n rows.
      for (int64_t c0 = 0; c0 < n_in; c0 += 16)
        for (int64_t r = 0; r < n; ++r) {
          const float* zr = z + int64_t(dp.token[begin + r]) * n_in;
          for (int64_t c = c0; c < std::min(c0 + 16, n_in); ++c) zg[c * ld + r] = zr[c];
        }
      expert_cols(gu, zg, m1, n, ld);
      expert_cols(gu + F * ld, zg, m3, n, ld);
      for (int64_t j = 0; j < F; ++j) situ_forward_fast(act + j * ld, gu + j * ld, gu + (F + j) * ld, n, b1, b2);
      expert_cols(y, act, m2, n, ld);
      for (int64_t c0 = 0; c0 < n_in; c0 += 16)
        for (int64_t r = 0; r < n; ++r) {
          const int64_t s = dp.slot[begin + r];
          const float p = topk_w[s];
          for (int64_t c = c0; c < std::min(c0 + 16, n_in); ++c) {
            slots[s * n_in + c] = p * y[c * ld + r];
            if (y_saved) y_saved[s * n_in + c] = y[c * ld + r];
          }
        }
      if (gu_saved)
        for (int64_t j0 = 0; j0 < 2 * F; j0 += 16)
          for (int64_t r = 0; r < n; ++r) {
            const int64_t s = dp.slot[begin + r];
            for (int64_t j = j0; j < std::min(j0 + 16, 2 * F); ++j) gu_saved[s * 2 * F + j] = gu[j * ld + r];
          }
      return;
    }
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(zg + r * n_in, z + int64_t(dp.token[begin + r]) * n_in, sizeof(float) * size_t(n_in));
    moe_expert_rows_forward(gu, act, y, zg, m1, m3, m2, n, n_in, F, b1, b2);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t s = dp.slot[begin + r];
      if (gu_saved) std::memcpy(gu_saved + s * 2 * F, gu + r * 2 * F, sizeof(float) * size_t(2 * F));
      if (y_saved) std::memcpy(y_saved + s * n_in, y + r * n_in, sizeof(float) * size_t(n_in));
      const float p = topk_w[s];
      float* dst = slots + s * n_in;
      for (int64_t c = 0; c < n_in; ++c) dst[c] = p * y[r * n_in + c];
    }
  };

  // Expert-parallel training (moe_exchange.h): every row goes to its expert's owner and its
  // output comes back; the mixture weight and the slot rows are applied here exactly as
  // run_expert does, so the combine below is the single process's, bit for bit.
  ExpertTrainExchange* tex = provider || !gu_saved || !y_saved ? nullptr : expert_train_exchange();
  if (overlap && !tex) (*overlap)();
  if (tex) {
    const int64_t rows = Tn * k;
    if (scratch.ep_in.size() < size_t(rows * n_in)) scratch.ep_in.resize(size_t(rows * n_in));
    if (scratch.ep_out.size() < size_t(rows * n_in)) scratch.ep_out.resize(size_t(rows * n_in));
    for (int64_t p = 0; p < rows; ++p)
      std::memcpy(scratch.ep_in.data() + p * n_in, z + int64_t(dp.token[p]) * n_in, sizeof(float) * size_t(n_in));
    static const std::function<void()> nothing = [] {};
    tex->forward(scratch.ep_out.data(), scratch.ep_in.data(), dp, w1, w3, w2, E, n_in, F, b1, b2,
                 overlap ? *overlap : nothing);
    for (int64_t p = 0; p < rows; ++p) {
      const int64_t s = dp.slot[p];
      const float* y = scratch.ep_out.data() + p * n_in;
      std::memcpy(y_saved + s * n_in, y, sizeof(float) * size_t(n_in));
      const float pw = topk_w[s];
      float* dst = slots + s * n_in;
      for (int64_t c = 0; c < n_in; ++c) dst[c] = pw * y[c];
    }
  }
  // Expert parallelism at inference (moe_exchange.h): only this rank's experts run here; the
  // exchange fills the other experts' slot rows, so the combine below is the single process's.
  ExpertExchange* ex = provider || tex ? nullptr : expert_exchange();
  K3_ASSERT(!ex || (!gu_saved && !y_saved), "moe: expert parallelism at inference does not train (use the training exchange)");
  if (tex) {
  } else if (!provider) {
#pragma omp parallel for schedule(dynamic, 1) if (n_active > 1)
    for (int64_t ai = 0; ai < n_active; ++ai) {
      const int64_t e = scratch.active[ai];
      if (ex && !ex->owns(e, E)) continue;
      run_expert(e, w1[e], w3[e], w2[e], scratch.work.data() + per_thread * (n_active > 1 ? omp_get_thread_num() : 0));
    }
    if (ex) ex->exchange(slots, dp, Tn, k, E, n_in);
  } else {
    // Groups as the provider makes them valid; each expert exactly once.
    int64_t handed = 0;
    for (ExpertGroup g = provider->next(); g.n > 0; g = provider->next()) {
      for (int64_t i = 0; i < g.n; ++i) {
        const int64_t e = g.experts[i];
        K3_ASSERT(e >= 0 && e < E && dp.offset[e + 1] > dp.offset[e], "moe: provider handed out an expert without tokens");
        check_expert(g.w1[i], F, n_in);
        check_expert(g.w3[i], F, n_in);
        check_expert(g.w2[i], n_in, F);
      }
      handed += g.n;
      const bool par = g.n > 1 && nthreads > 1;
#pragma omp parallel for schedule(dynamic, 1) if (par)
      for (int64_t i = 0; i < g.n; ++i)
        run_expert(g.experts[i], g.w1[i], g.w3[i], g.w2[i],
                   scratch.work.data() + per_thread * (par ? omp_get_thread_num() : 0));
    }
    provider->finish();
    K3_ASSERT(handed == n_active, "moe: the provider did not hand out every expert of the call");
  }

  // Combine in slot order: a fixed reduction order per token.
#pragma omp parallel for schedule(static) if (Tn * k * n_in > 65536)
  for (int64_t t = 0; t < Tn; ++t) {
    float* ut = u + t * n_in;
    std::memcpy(ut, slots + t * k * n_in, sizeof(float) * size_t(n_in));
    for (int64_t i = 1; i < k; ++i) {
      const float* src = slots + (t * k + i) * n_in;
      for (int64_t c = 0; c < n_in; ++c) ut[c] += src[c];
    }
  }
}

void moe_expert_rows_forward(float* gu, float* act, float* y, const float* zg, const ExpertMatrix& m1,
                             const ExpertMatrix& m3, const ExpertMatrix& m2, int64_t n, int64_t n_in, int64_t F,
                             double b1, double b2) {
  expert_linear(gu, 2 * F, zg, m1, n);
  expert_linear(gu + F, 2 * F, zg, m3, n);
  for (int64_t r = 0; r < n; ++r) situ_forward_fast(act + r * F, gu + r * 2 * F, gu + r * 2 * F + F, F, b1, b2);
  expert_linear(y, n_in, act, m2, n);
}

namespace {

// Row r of an expert matrix dotted with v, in double (an MXFP4 row is decoded into `buf`).
template <typename R>
double row_dot(const ExpertMatrixT<R>& m, int64_t r, const double* v, float* buf) {
  double acc = 0;
  if (m.f32) {
    const R* row = m.f32 + r * m.cols;
    for (int64_t c = 0; c < m.cols; ++c) acc += double(row[c]) * v[c];
    return acc;
  }
  const Mxfp4Matrix& mx = *m.mx;
  mxfp4_decode_row(mx.packed.data<uint8_t>() + r * (m.cols / 2), mx.scales.data<uint8_t>() + r * (m.cols / 32), buf,
                   size_t(m.cols));
  for (int64_t c = 0; c < m.cols; ++c) acc += double(buf[c]) * v[c];
  return acc;
}

}  // namespace

template <typename R>
void moe_experts_forward_reference(R* u, const R* z, const int32_t* topk_idx, const R* topk_w,
                                   const ExpertMatrixT<R>* w1, const ExpertMatrixT<R>* w3, const ExpertMatrixT<R>* w2,
                                   int64_t Tn, int64_t n_in, int64_t F, int64_t E, int64_t k, double b1, double b2,
                                   MoEExpertScratch& scratch, R* gu_saved, R* y_saved) {
  scratch.row.resize(size_t(std::max(n_in, F)));
  std::vector<double> zd(static_cast<size_t>(n_in)), act(static_cast<size_t>(F)), acc(static_cast<size_t>(n_in));
  for (int64_t t = 0; t < Tn; ++t) {
    for (int64_t c = 0; c < n_in; ++c) zd[c] = double(z[t * n_in + c]);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t e = topk_idx[t * k + i], slot = t * k + i;
      K3_ASSERT(e >= 0 && e < E, "moe: expert index out of range");
      check_expert(w1[e], F, n_in);
      check_expert(w3[e], F, n_in);
      check_expert(w2[e], n_in, F);
      for (int64_t j = 0; j < F; ++j) {
        const double g = row_dot(w1[e], j, zd.data(), scratch.row.data());
        const double up = row_dot(w3[e], j, zd.data(), scratch.row.data());
        if (gu_saved) {
          gu_saved[slot * 2 * F + j] = R(g);
          gu_saved[slot * 2 * F + F + j] = R(up);
        }
        act[j] = situ(g, up, b1, b2);
      }
      const double p = double(topk_w[slot]);
      for (int64_t c = 0; c < n_in; ++c) {
        const double y = row_dot(w2[e], c, act.data(), scratch.row.data());
        if (y_saved) y_saved[slot * n_in + c] = R(y);
        acc[c] += p * y;
      }
    }
    for (int64_t c = 0; c < n_in; ++c) u[t * n_in + c] = R(acc[c]);
  }
}

template void moe_experts_forward_reference<float>(float*, const float*, const int32_t*, const float*,
                                                   const ExpertMatrix*, const ExpertMatrix*, const ExpertMatrix*,
                                                   int64_t, int64_t, int64_t, int64_t, int64_t, double, double,
                                                   MoEExpertScratch&, float*, float*);
template void moe_experts_forward_reference<double>(double*, const double*, const int32_t*, const double*,
                                                    const ExpertMatrixT<double>*, const ExpertMatrixT<double>*,
                                                    const ExpertMatrixT<double>*, int64_t, int64_t, int64_t, int64_t,
                                                    int64_t, double, double, MoEExpertScratch&, double*, double*);

}  // namespace k3
