// KDA mixer wiring (see kda_mixer.h; K3_REFERENCE section 3). Composes kernels/ ops; all
// buffers come from KDAScratch.
#include "model/kda_mixer.h"

#include <cmath>

#include "core/error.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/kda_gate.h"
#include "kernels/norm.h"
#include "kernels/shortconv.h"

namespace k3 {

namespace {
constexpr double kL2Eps = 1e-6;  // q, k L2Norm eps (K3_REFERENCE section 3)
constexpr int64_t kChunk = 64;

void grow(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
}
}  // namespace

void KDAState::reset(const KDADims& dims) {
  const int64_t HD = dims.H * dims.D, P = dims.conv_k - 1;
  S.assign(size_t(dims.H * dims.D * dims.D), 0.0f);
  conv_q.assign(size_t(HD * P), 0.0f);
  conv_k.assign(size_t(HD * P), 0.0f);
  conv_v.assign(size_t(HD * P), 0.0f);
}

void KDAScratch::ensure(int64_t T, const KDADims& dims) {
  const int64_t HD = dims.H * dims.D;
  for (auto* b : {&q_lin, &k_lin, &v_lin, &q_pre, &k_pre, &v_pre, &q_act, &k_act, &v, &q, &k, &z, &g, &o,
                  &o_normed, &gate_lin, &y})
    grow(*b, T * HD);
  for (auto* b : {&q_inv, &k_inv, &beta, &o_rstd}) grow(*b, T * dims.H);
  grow(fa, T * dims.D);
}

void kda_mixer_forward(float* out, KDAState& state, const float* x, const KDAWeights& w, const KDADims& dims,
                       int64_t T, KDAPath path, KDAScratch& s) {
  const int64_t d = dims.d, H = dims.H, D = dims.D, HD = H * D, K = dims.conv_k;
  K3_ASSERT(K >= 1 && H >= 1 && D >= 1 && d >= 1, "kda_mixer_forward: bad dims");
  K3_ASSERT(int64_t(state.S.size()) == H * D * D && int64_t(state.conv_q.size()) == HD * (K - 1) &&
                int64_t(state.conv_k.size()) == HD * (K - 1) && int64_t(state.conv_v.size()) == HD * (K - 1),
            "kda_mixer_forward: state not sized for these dims (call KDAState::reset)");
  if (T == 0) return;
  s.ensure(T, dims);

  // q, k, v = ShortConv_SiLU(W x), conv state carried.
  linear(s.q_lin.data(), x, w.q_proj, T, d, HD);
  linear(s.k_lin.data(), x, w.k_proj, T, d, HD);
  linear(s.v_lin.data(), x, w.v_proj, T, d, HD);
  shortconv_silu_forward<float>(s.q_act.data(), s.q_pre.data(), state.conv_q.data(), s.q_lin.data(), w.q_conv, T,
                                HD, K);
  shortconv_silu_forward<float>(s.k_act.data(), s.k_pre.data(), state.conv_k.data(), s.k_lin.data(), w.k_conv, T,
                                HD, K);
  shortconv_silu_forward<float>(s.v.data(), s.v_pre.data(), state.conv_v.data(), s.v_lin.data(), w.v_conv, T, HD,
                                K);
  // q, k L2-normalised per head; the D^-0.5 on q is the recurrence's scale.
  l2norm_forward<float>(s.q.data(), s.q_inv.data(), s.q_act.data(), T * H, D, kL2Eps);
  l2norm_forward<float>(s.k.data(), s.k_inv.data(), s.k_act.data(), T * H, D, kL2Eps);
  const double scale = 1.0 / std::sqrt(double(D));

  // beta = sigmoid(W_b x)
  linear(s.beta.data(), x, w.b_proj, T, d, H);
  for (int64_t i = 0; i < T * H; ++i) s.beta[i] = sigmoid(s.beta[i]);

  // g = gate(W_fb(W_fa x)), A_log per head.
  linear(s.fa.data(), x, w.f_a, T, d, D);
  linear(s.z.data(), s.fa.data(), w.f_b, T, D, HD);
  kda_gate_forward<float>(s.g.data(), s.z.data(), w.A_log, w.dt_bias, T, H, D, dims.bounded, dims.lower_bound);

  // The recurrence, state carried.
  if (T == 1)
    kda_decode_step(s.o.data(), state.S.data(), s.q.data(), s.k.data(), s.v.data(), s.g.data(), s.beta.data(), H, D,
                    D, scale);
  else if (path == KDAPath::Chunked)
    kda_chunk_forward<float>(s.o.data(), state.S.data(), s.q.data(), s.k.data(), s.v.data(), s.g.data(),
                             s.beta.data(), T, H, D, D, scale, kChunk);
  else
    kda_recurrent_forward<float>(s.o.data(), state.S.data(), s.q.data(), s.k.data(), s.v.data(), s.g.data(),
                                 s.beta.data(), T, H, D, D, scale);

  // y = RMSNorm_head(o) * o_norm * sigmoid(W_g x);  out = W_o y
  rmsnorm_forward<float>(s.o_normed.data(), s.o_rstd.data(), s.o.data(), w.o_norm, T * H, D, dims.rms_eps);
  linear(s.gate_lin.data(), x, w.g_proj, T, d, HD);
  for (int64_t i = 0; i < T * HD; ++i) s.y[i] = s.o_normed[i] * sigmoid(s.gate_lin[i]);
  linear(out, s.y.data(), w.o_proj, T, HD, d);
}

}  // namespace k3
