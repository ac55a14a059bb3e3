// Backward of one decoder layer with Block Attention Residuals (see decoder.h; docs/model.md
// section 2): the five forward steps reversed from the LayerRecordT of a training forward.
// Gradient rule (llm.c): parameter gradients accumulate (+=); activation gradients are
// assigned, except the block-state gradients (blocks and partial sum), which are streams
// summed into: every AttnRes read adds to the gradients of all its sources.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/grow.h"
#include "kernels/activations.h"
#include "kernels/attn_res.h"
#include "kernels/norm.h"
#include "model/decoder.h"
#include "model/dense_ffn.h"

namespace k3 {

namespace {

// Backward of one AttnRes read x = AttnRes(blocks[0, nb) + [partial]) (or x = partial when
// nb == 0): the sources' gradients (bg's first nb blocks and dpartial) accumulate dx's
// contribution; the read's two parameter vectors accumulate theirs.
template <typename R>
void attn_read_backward(BlockGradT<R>& bg, const R* dx, const R* alpha, const R* blocks, int64_t nb,
                        const R* partial, const R* w_norm, const R* w_proj, R* dw_norm, R* dw_proj, double eps,
                        LayerScratchT<R>& s) {
  const int64_t T = bg.T, d = bg.d;
  R* dp = bg.dpartial.data();
  if (nb == 0) {  // x = partial
    for (int64_t i = 0; i < T * d; ++i) dp[i] += dx[i];
    return;
  }
  s.src.resize(size_t(nb + 1));
  s.dsrc.resize(size_t(nb + 1));
  for (int64_t i = 0; i < nb; ++i) {
    s.src[size_t(i)] = blocks + i * T * d;
    s.dsrc[size_t(i)] = bg.dblock(i);
  }
  s.src[size_t(nb)] = partial;
  s.dsrc[size_t(nb)] = dp;
  attn_res_backward<R>(s.dsrc.data(), dw_norm, dw_proj, dx, alpha, s.src.data(), nb + 1, w_norm, w_proj, T, d, eps);
}

// x = AttnRes(blocks[0, nb) + [partial]) again from the read's saved weights (or x = partial
// when nb == 0), into s.x; h = RMSNorm(x) w into s.h: the forward's own kernels on the same
// values, so both are bit for bit the forward's (LayerRecordT keeps neither).
template <typename R>
const R* recompute_read(LayerScratchT<R>& s, const R* alpha, const R* blocks, int64_t nb, const R* partial,
                        const R* w_norm, int64_t T, int64_t d, double eps) {
  const R* x = partial;
  if (nb > 0) {
    s.src.resize(size_t(nb + 1));
    for (int64_t i = 0; i < nb; ++i) s.src[size_t(i)] = blocks + i * T * d;
    s.src[size_t(nb)] = partial;
    attn_res_mix<R>(s.x.data(), alpha, s.src.data(), nb + 1, T, d);
    x = s.x.data();
  }
  rmsnorm_forward<R>(s.h.data(), nullptr, x, w_norm, T, d, eps);
  return x;
}

}  // namespace

template <typename R>
void rebase_grads(LayerGradsT<R>& g, const LayerWeightsT<R>& w, const R* from, R* to) {
  auto m = [&](const R* p) -> R* { return p ? to + (p - from) : nullptr; };
  g.input_norm = m(w.input_norm);
  g.post_norm = m(w.post_norm);
  g.attn_res_norm = m(w.attn_res_norm);
  g.attn_res_proj = m(w.attn_res_proj);
  g.mlp_res_norm = m(w.mlp_res_norm);
  g.mlp_res_proj = m(w.mlp_res_proj);
  if (w.is_mla) {
    const MLAWeightsT<R>& a = w.mla;
    g.mla = {m(a.q_a_proj), m(a.q_a_norm), m(a.q_b_proj), m(a.kv_a_proj),
             m(a.kv_a_norm), m(a.kv_b_proj), m(a.o_proj),   m(a.g_proj)};
  } else {
    const KDAWeightsT<R>& a = w.kda;
    g.kda = {m(a.q_proj), m(a.k_proj), m(a.v_proj), m(a.q_conv), m(a.k_conv), m(a.v_conv),  m(a.f_a),
             m(a.f_b),    m(a.b_proj), m(a.g_proj), m(a.o_norm), m(a.o_proj), m(a.A_log), m(a.dt_bias)};
  }
  if (w.is_moe) {
    const LatentMoEWeightsT<R>& e = w.moe;
    LatentMoEGradsT<R>& ge = g.moe;
    ge.router = m(e.router);
    ge.down = m(e.down);
    ge.up = m(e.up);
    ge.latent_norm = m(e.latent_norm);
    ge.shared_w1 = m(e.shared_w1);
    ge.shared_w3 = m(e.shared_w3);
    ge.shared_w2 = m(e.shared_w2);
    ge.experts.resize(e.w1.size());
    for (size_t j = 0; j < e.w1.size(); ++j) {
      K3_ASSERT(e.w1[j].f32 && e.w3[j].f32 && e.w2[j].f32, "rebase_grads: MXFP4 experts have no gradient");
      ge.experts[j] = {m(e.w1[j].f32), m(e.w3[j].f32), m(e.w2[j].f32)};
    }
  } else {
    g.dense_gate = m(w.dense_gate);
    g.dense_up = m(w.dense_up);
    g.dense_down = m(w.dense_down);
  }
}

template <typename R>
void BlockGradT<R>::begin(int64_t T_, int64_t d_, int64_t cap_, int64_t n_) {
  K3_ASSERT(n_ >= 0 && n_ <= cap_, "BlockGrad::begin: more blocks than capacity");
  T = T_, d = d_, cap = cap_, n = n_;
  grow(dblocks, cap * T * d);
  grow(dpartial, T * d);
  std::fill(dblocks.begin(), dblocks.begin() + n * T * d, R(0));
  std::fill(dpartial.begin(), dpartial.begin() + T * d, R(0));
}

template <typename R>
void decoder_layer_backward(BlockGradT<R>& bg, const LayerRecordT<R>& rec, const R* blocks, const LayerWeightsT<R>& w,
                            const LayerGradsT<R>& g, const ModelDims& dm, int64_t layer, LayerScratchT<R>& s,
                            const R* dscores_aux) {
  const int64_t T = rec.T, d = dm.d, n = T * d;
  const int64_t nb1 = rec.n_src_attn - 1;  // completed blocks seen by step 1
  const int64_t nb2 = rec.n_src_mlp - 1;   // ... after step 2
  K3_ASSERT(bg.T == T && bg.d == d && bg.n == nb2, "decoder_layer_backward: block gradient does not match the record");
  K3_ASSERT(rec.appended == (layer % dm.block_size == 0) && nb2 == nb1 + (rec.appended ? 1 : 0),
            "decoder_layer_backward: record of another layer");
  if (T == 0) return;
  grow(s.dx, n);
  grow(s.dh, n);
  grow(s.x, n, nullptr);
  grow(s.h, n, nullptr);
  R* dp = bg.dpartial.data();
  R* dx = s.dx.data();
  R* dh = s.dh.data();

  // 5. f = FFN(h2); partial'' = partial' + f:  d f = d partial'' (dp), d partial' = dp.
  const R* x2 = recompute_read(s, rec.alpha_mlp.data(), blocks, nb2, rec.partial_mid.data(), w.post_norm, T, d, dm.eps);
  const R* h2 = s.h.data();
  if (w.is_moe) {
    if constexpr (std::is_same_v<R, float>)
      latent_moe_backward(dh, g.moe, dp, rec.moe, w.moe, dm.moe, T, s.moe, dscores_aux, h2);
    else  // the grouped path is float-only
      latent_moe_backward_dense_reference<R>(dh, g.moe, dp, rec.moe, w.moe, dm.moe, T, s.moe, dscores_aux, h2);
  } else {
    grow(s.dgu, T * 2 * dm.dense_I);
    grow(s.dact, T * dm.dense_I);
    grow(s.act, T * dm.dense_I, nullptr);
    situ_glu_forward<R>(s.act.data(), rec.dense_gu.data(), T, dm.dense_I, dm.situ_b1, dm.situ_b2);  // as the forward
    dense_ffn_backward<R>(dh, g.dense_gate, g.dense_up, g.dense_down, s.dgu.data(), s.dact.data(), dp,
                          rec.dense_gu.data(), s.act.data(), h2, w.dense_gate, w.dense_up, w.dense_down, T, d,
                          dm.dense_I, dm.situ_b1, dm.situ_b2);
  }
  // h2 = RMSNorm_post(x2)
  rmsnorm_backward<R>(dx, g.post_norm, dh, x2, w.post_norm, rec.rstd_mlp.data(), T, d);
  // 4. x2 = AttnRes_mlp(blocks[0, nb2) + [partial']): the sources accumulate.
  attn_read_backward<R>(bg, dx, rec.alpha_mlp.data(), blocks, nb2, rec.partial_mid.data(), w.mlp_res_norm,
                        w.mlp_res_proj, g.mlp_res_norm, g.mlp_res_proj, dm.eps, s);

  // 3. a = Mixer(h1); partial' = partial + a (or a):  d a = d partial'; dh = d h1.
  const R* x1 = recompute_read(s, rec.alpha_attn.data(), blocks, nb1, rec.partial_in.data(), w.input_norm, T, d, dm.eps);
  if (w.is_mla)
    mla_mixer_backward<R>(dh, g.mla, dp, rec.mla, w.mla, dm.mla_dims, T, s.mla, s.h.data());
  else
    kda_mixer_backward<R>(dh, g.kda, dp, rec.kda, w.kda, dm.kda, T, s.kda, s.h.data());
  // 2. appended: blocks[nb1] = partial, and the restarted partial had no earlier path, so
  // d partial = d blocks[nb1]; otherwise d partial = d partial' (unchanged).
  if (rec.appended) {
    std::memcpy(dp, bg.dblock(nb1), sizeof(R) * size_t(n));
    bg.n = nb1;
  }
  // h1 = RMSNorm_in(x1)
  rmsnorm_backward<R>(dx, g.input_norm, dh, x1, w.input_norm, rec.rstd_attn.data(), T, d);
  // 1. x1 = AttnRes_attn(blocks[0, nb1) + [partial]) (or partial): the sources accumulate.
  attn_read_backward<R>(bg, dx, rec.alpha_attn.data(), blocks, nb1, rec.partial_in.data(), w.attn_res_norm,
                        w.attn_res_proj, g.attn_res_norm, g.attn_res_proj, dm.eps, s);
}

template struct BlockGradT<float>;
template struct BlockGradT<double>;
template void rebase_grads<float>(LayerGradsT<float>&, const LayerWeightsT<float>&, const float*, float*);
template void rebase_grads<double>(LayerGradsT<double>&, const LayerWeightsT<double>&, const double*, double*);
template void decoder_layer_backward<float>(BlockGradT<float>&, const LayerRecordT<float>&, const float*,
                                            const LayerWeightsT<float>&, const LayerGradsT<float>&, const ModelDims&,
                                            int64_t, LayerScratchT<float>&, const float*);
template void decoder_layer_backward<double>(BlockGradT<double>&, const LayerRecordT<double>&, const double*,
                                             const LayerWeightsT<double>&, const LayerGradsT<double>&,
                                             const ModelDims&, int64_t, LayerScratchT<double>&, const double*);

}  // namespace k3
