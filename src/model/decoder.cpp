// One decoder layer with Block Attention Residuals, forward (see decoder.h; docs/model.md
// section 2). The backward is in decoder_backward.cpp.
#include "model/decoder.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/grow.h"
#include "kernels/attn_res.h"
#include "kernels/norm.h"
#include "model/dense_ffn.h"

namespace k3 {

namespace {

// dst = src[0, n) (assign keeps the capacity: no allocation once grown).
template <typename R>
void save(std::vector<R>& dst, const R* src, int64_t n) {
  dst.assign(src, src + n);
}

}  // namespace

ModelDims model_dims(const K3Config& c) {
  ModelDims m;
  m.d = c.hidden_size;
  m.V = c.vocab_size;
  m.L = c.num_hidden_layers;
  m.block_size = c.attn_res_block_size;
  m.dense_I = c.intermediate_size;
  m.first_moe = c.first_k_dense_replace;
  m.eps = c.rms_norm_eps;
  m.situ_b1 = c.situ_beta;
  m.situ_b2 = c.situ_linear_beta;
  m.mla.resize(size_t(m.L));
  for (int64_t i = 0; i < m.L; ++i) m.mla[size_t(i)] = c.is_mla_layer(i);
  m.kda = {c.hidden_size,           c.kda_num_heads,    c.kda_head_dim, c.short_conv_kernel_size,
           c.has_gate_lower_bound,  c.gate_lower_bound, c.rms_norm_eps};
  m.mla_dims = {c.hidden_size,      c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
                c.qk_rope_head_dim, c.v_head_dim,          c.mla_use_output_gate, c.rms_norm_eps};
  m.moe = {c.hidden_size,
           c.routed_expert_hidden_size,
           c.moe_intermediate_size,
           c.num_experts,
           c.num_experts_per_token,
           c.num_shared_experts * c.moe_intermediate_size,
           c.moe_renormalize,
           c.latent_moe_use_norm,
           c.routed_scaling_factor,
           c.rms_norm_eps,
           c.situ_beta,
           c.situ_linear_beta};
  return m;
}

template <typename R>
void BlockStateT<R>::begin(int64_t T_, int64_t d_, int64_t cap_, Device* dev) {
  T = T_, d = d_, cap = cap_, n = 0;
  partial_empty = false;
  grow(blocks, cap * T * d, dev);
  grow(partial, T * d, dev);
}

template <typename R>
void block_attn_res(const OpsT<R>& ops, R* out, R* alpha, const BlockStateT<R>& bs, const R* w_norm, const R* w_proj,
                    int64_t row0, int64_t rows, double eps, std::vector<const R*>& src) {
  const int64_t d = bs.d;
  K3_ASSERT(row0 >= 0 && row0 + rows <= bs.T && !bs.partial_empty, "block_attn_res: bad rows or empty partial");
  if (bs.n == 0) {  // a single source: softmax weight 1
    ops.copy(out, bs.partial.data() + row0 * d, rows * d);
    if (alpha) ops.fill(alpha, 1.0, rows);
    return;
  }
  src.resize(size_t(bs.n + 1));
  for (int64_t i = 0; i < bs.n; ++i) src[size_t(i)] = bs.block(i) + row0 * d;
  src[size_t(bs.n)] = bs.partial.data() + row0 * d;
  ops.attn_res(out, alpha, src.data(), bs.n + 1, w_norm, w_proj, rows, d, eps);
}

template <typename R>
void decoder_layer_forward(const OpsT<R>& ops, BlockStateT<R>& bs, LayerStateT<R>& st, const LayerWeightsT<R>& w,
                           const ModelDims& dm, int64_t layer, int64_t T, MixerMode mode, KDAPath kda_path,
                           LayerScratchT<R>& s, LayerRecordT<R>* rec, const LayerBatchT<R>* batch) {
  Device* dev = ops.device();
  const int64_t d = dm.d, n = T * d;
  K3_ASSERT(bs.T == T && bs.d == d && !bs.partial_empty, "decoder_layer_forward: block state not begun for T");
  K3_ASSERT(layer >= 0 && layer < dm.L && dm.block_size >= 1, "decoder_layer_forward: bad layer");
  K3_ASSERT(!rec || mode == MixerMode::Prefill, "decoder_layer_forward: a record needs Prefill mode");
  K3_ASSERT(!rec || !dev, "decoder_layer_forward: a training record is CPU-only");
  K3_ASSERT(!batch || (mode == MixerMode::Decode && !rec && batch->n >= 1 && batch->seg[batch->n] == T),
            "decoder_layer_forward: a batch is a Decode call whose segments cover the T rows");
  grow(s.x, n, dev);
  grow(s.h, n, dev);
  grow(s.a, n, dev);
  grow(s.rstd, T, dev);
  R* partial = bs.partial.data();
  if (rec) {
    rec->T = T;
    save(rec->partial_in, partial, n);
    // The layer recomputes the mixers' and the MoE block's input in the backward.
    rec->kda.keep_input = rec->mla.keep_input = rec->moe.keep_input = false;
  }

  // 1. x = AttnRes_attn(blocks + [partial]), or partial itself before the first block.
  const R* x = partial;
  const int64_t nsrc1 = bs.n + 1;
  // alpha always goes to a buffer (saved, or the scratch): attn_res_forward would allocate.
  grow(s.alpha, T * (bs.n + 2), dev);
  if (bs.n > 0) {
    R* alpha = s.alpha.data();
    if (rec) {
      rec->alpha_attn.resize(size_t(T * nsrc1));
      alpha = rec->alpha_attn.data();
    }
    block_attn_res<R>(ops, s.x.data(), alpha, bs, w.attn_res_norm, w.attn_res_proj, 0, T, dm.eps, s.src);
    x = s.x.data();
  } else if (rec) {
    rec->alpha_attn.assign(size_t(T), R(1));
  }
  // The mixer input RMSNorm_in(x) is formed before partial can be overwritten (step 3).
  R* rstd = s.rstd.data();
  if (rec) {
    rec->rstd_attn.resize(size_t(T));
    rstd = rec->rstd_attn.data();
  }
  ops.rmsnorm(s.h.data(), d, rstd, x, d, w.input_norm, T, d, dm.eps);
  if (rec) rec->n_src_attn = nsrc1;

  // 2. A new block starts at every S-th layer: the partial sum becomes a completed block.
  const bool append = layer % dm.block_size == 0;
  if (append) {
    K3_ASSERT(bs.n < bs.cap, "decoder_layer_forward: block stack capacity exceeded");
    ops.copy(bs.block(bs.n), partial, n);
    ++bs.n;
    bs.partial_empty = true;
  }
  if (rec) rec->appended = append;

  // 3. a = Mixer(RMSNorm_in(x)); partial = partial + a (or a when the block just started).
  R* a = bs.partial_empty ? partial : s.a.data();
  if (batch) {
    if constexpr (std::is_same_v<R, float>) {
      if (w.is_mla) {
        s.seg_mla.resize(size_t(batch->n));
        for (int64_t j = 0; j < batch->n; ++j) s.seg_mla[size_t(j)] = &batch->states[j]->mla;
        mla_mixer_decode_batch(ops, a, s.seg_mla.data(), batch->seg, batch->n, s.h.data(), w.mla, dm.mla_dims,
                               s.mla);
      } else {
        s.seg_kda.resize(size_t(batch->n));
        for (int64_t j = 0; j < batch->n; ++j) s.seg_kda[size_t(j)] = &batch->states[j]->kda;
        kda_mixer_forward_batch(ops, a, s.seg_kda.data(), batch->seg, batch->n, s.h.data(), w.kda, dm.kda,
                                kda_path, s.kda);
      }
    } else {
      K3_ASSERT(false, "decoder_layer_forward: batched decode is float-only");
    }
  } else if (w.is_mla) {
    if (mode == MixerMode::Prefill) {
      mla_mixer_forward<R>(ops, a, st.mla, s.h.data(), w.mla, dm.mla_dims, T, s.mla, rec ? &rec->mla : nullptr);
    } else if constexpr (std::is_same_v<R, float>) {
      mla_mixer_decode(ops, a, st.mla, s.h.data(), w.mla, dm.mla_dims, T, s.mla);
    } else {
      K3_ASSERT(false, "decoder_layer_forward: MLA Decode mode is float-only");
    }
  } else {
    // Decode: one token takes the mixer's decode step (its fast or reference variant per
    // kda_path); several take it token by token (Fast: the fast step, as that many one-token
    // calls would; otherwise the recurrent reference).
    const KDAPath p = mode == MixerMode::Decode && T > 1 ? (kda_path == KDAPath::Fast ? KDAPath::Steps : KDAPath::Recurrent)
                                                         : kda_path;
    kda_mixer_forward<R>(ops, a, st.kda, s.h.data(), w.kda, dm.kda, T, p, s.kda, rec ? &rec->kda : nullptr,
                         st.kda_log.enabled && mode == MixerMode::Decode ? &st.kda_log : nullptr);
  }
  if (!bs.partial_empty) ops.add(partial, a, n);
  bs.partial_empty = false;
  if (rec) save(rec->partial_mid, partial, n);

  // 4. x = AttnRes_mlp(blocks + [partial]).
  R* alpha2 = s.alpha.data();
  const int64_t nsrc2 = bs.n + 1;
  if (rec) {
    rec->n_src_mlp = nsrc2;
    rec->alpha_mlp.resize(size_t(T * nsrc2));
    alpha2 = rec->alpha_mlp.data();
  }
  block_attn_res<R>(ops, s.x.data(), alpha2, bs, w.mlp_res_norm, w.mlp_res_proj, 0, T, dm.eps, s.src);
  rstd = s.rstd.data();
  if (rec) {
    rec->rstd_mlp.resize(size_t(T));
    rstd = rec->rstd_mlp.data();
  }
  ops.rmsnorm(s.h.data(), d, rstd, s.x.data(), d, w.post_norm, T, d, dm.eps);

  // 5. f = FFN(RMSNorm_post(x)); partial += f.
  if (w.is_moe) {
    LatentMoESavedT<R>* saved = rec ? &rec->moe : nullptr;
    if constexpr (std::is_same_v<R, float>)
      latent_moe_forward(ops, s.a.data(), s.h.data(), w.moe, dm.moe, T, s.moe, nullptr, saved);
    else  // the grouped path is float-only
      latent_moe_forward_dense_reference<R>(s.a.data(), s.h.data(), w.moe, dm.moe, T, s.moe, nullptr, saved);
  } else {
    R* gu = nullptr;
    grow(s.act, T * dm.dense_I, dev);  // the SiTU output: recomputed by the backward
    R* act = s.act.data();
    if (rec) {
      rec->dense_gu.resize(size_t(T * 2 * dm.dense_I));
      gu = rec->dense_gu.data();
    } else {
      grow(s.gu, T * 2 * dm.dense_I, dev);
      gu = s.gu.data();
    }
    dense_ffn_forward<R>(ops, s.a.data(), gu, act, s.h.data(), w.dense_gate, w.dense_up, w.dense_down, T, d, dm.dense_I,
                         dm.situ_b1, dm.situ_b2);
  }
  ops.add(partial, s.a.data(), n);
}

template struct BlockStateT<float>;
template struct BlockStateT<double>;
template void block_attn_res<float>(const OpsT<float>&, float*, float*, const BlockStateT<float>&, const float*,
                                    const float*, int64_t, int64_t, double, std::vector<const float*>&);
template void block_attn_res<double>(const OpsT<double>&, double*, double*, const BlockStateT<double>&, const double*,
                                     const double*, int64_t, int64_t, double, std::vector<const double*>&);
template void decoder_layer_forward<float>(const OpsT<float>&, BlockStateT<float>&, LayerStateT<float>&,
                                           const LayerWeightsT<float>&, const ModelDims&, int64_t, int64_t, MixerMode,
                                           KDAPath, LayerScratchT<float>&, LayerRecordT<float>*,
                                           const LayerBatchT<float>*);
template void decoder_layer_forward<double>(const OpsT<double>&, BlockStateT<double>&, LayerStateT<double>&,
                                            const LayerWeightsT<double>&, const ModelDims&, int64_t, int64_t,
                                            MixerMode, KDAPath, LayerScratchT<double>&, LayerRecordT<double>*,
                                            const LayerBatchT<double>*);

}  // namespace k3
