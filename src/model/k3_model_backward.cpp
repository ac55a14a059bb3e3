// Backward of the K3 stack (see k3_model.h; docs/model.md section 2), from a ForwardRecordT
// and the gradient of the logits: lm_head, final RMSNorm, the output AttnRes read, the
// decoder layers in reverse (decoder_backward.cpp), the embedding (scatter-add of rows).
// Parameter gradients accumulate (+=) into one buffer carved like the weights.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/grow.h"
#include "kernels/attn_res.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "model/k3_model.h"

namespace k3 {

template <typename R>
void K3ModelT<R>::backward(R* grads, const R* dlogits, const int32_t* ids, const ForwardRecordT<R>& rec,
                           BackwardScratchT<R>& s, LayerScratchT<R>& ls, const R* const* dscores_aux,
                           const EmbedSpliceT<R>* splice, const GradRangeDone* done) const {
  const int64_t T = rec.T, d = dims_.d, V = dims_.V, L = dims_.L;
  K3_ASSERT(!rec.last_only && int64_t(rec.layers.size()) == L, "K3Model::backward: record of a full training forward needed");
  K3_ASSERT(store_.expert_storage() == ExpertStorage::Plain, "K3Model::backward: MXFP4 experts cannot train");
  // Section k of the layout is final (k = 0 the embedding, i + 1 layer i, L + 1 the head).
  auto final_section = [&](int64_t k) {
    if (done && sections_[size_t(k)] < sections_[size_t(k + 1)]) (*done)(sections_[size_t(k)], sections_[size_t(k + 1)]);
  };
  if (T <= 0) {
    for (int64_t k = L + 1; k >= 0; --k) final_section(k);
    return;
  }
  // Gradient views: each weight pointer moved from params_ to grads (same layout).
  auto gv = [&](const R* p) { return grads + (p - params_); };
  s.grads.resize(size_t(L));
  for (int64_t i = 0; i < L; ++i) rebase_grads<R>(s.grads[size_t(i)], layers_[size_t(i)], params_, grads);
  grow(s.dh_final, T * d);
  grow(s.dh_out, T * d);

  // logits = h_final lm_head^T  (tied: the embedding's gradient gets this part too)
  linear_backward<R>(s.dh_final.data(), gv(lm_head_), dlogits, rec.h_final.data(), lm_head_, T, d, V, false);
  // h_final = RMSNorm(h_out) * w_final
  rmsnorm_backward<R>(s.dh_out.data(), gv(final_norm_), s.dh_final.data(), rec.h_out.data(), final_norm_,
                      rec.rstd_final.data(), T, d);
  // h_out = AttnRes_out(blocks + [partial]): the block-state gradient starts here.
  const int64_t nb = rec.n_blocks;
  BlockGradT<R>& bg = s.bg;
  bg.begin(T, d, std::max<int64_t>(nb, 1), nb);
  if (nb == 0) {
    std::memcpy(bg.dpartial.data(), s.dh_out.data(), sizeof(R) * size_t(T * d));
  } else {
    s.src.resize(size_t(nb + 1));
    s.dsrc.resize(size_t(nb + 1));
    for (int64_t i = 0; i < nb; ++i) {
      s.src[size_t(i)] = rec.blocks.data() + i * T * d;
      s.dsrc[size_t(i)] = bg.dblock(i);
    }
    s.src[size_t(nb)] = rec.partial.data();
    s.dsrc[size_t(nb)] = bg.dpartial.data();
    attn_res_backward<R>(s.dsrc.data(), gv(final_res_norm_), gv(final_res_proj_), s.dh_out.data(),
                         rec.alpha_out.data(), s.src.data(), nb + 1, final_res_norm_, final_res_proj_, T, d, dims_.eps);
  }
  final_section(L + 1);  // the output read, final norm and lm_head (tied: the embedding waits)
  // The layers in reverse; each turns the state gradient after it into the one before it.
  for (int64_t i = L - 1; i >= 0; --i) {
    decoder_layer_backward<R>(bg, rec.layers[size_t(i)], rec.blocks.data(), layers_[size_t(i)], s.grads[size_t(i)],
                              dims_, i, ls, dscores_aux ? dscores_aux[i] : nullptr);
    final_section(i + 1);
  }
  K3_ASSERT(bg.n == 0, "K3Model::backward: blocks left after layer 0");
  // partial before layer 0 = embedding rows: scatter-add (tokens in order: deterministic).
  R* gE = gv(embed_);
  const R* dp = bg.dpartial.data();
  int64_t spliced = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (splice && ids[t] == splice->media_id) {  // an image token: its gradient goes to the encoder
      K3_ASSERT(spliced < splice->n && splice->drows);
      std::copy_n(dp + t * d, d, splice->drows + spliced * d);
      ++spliced;
      continue;
    }
    R* row = gE + int64_t(ids[t]) * d;
    for (int64_t c = 0; c < d; ++c) row[c] += dp[t * d + c];
  }
  final_section(0);
}

template void K3ModelT<float>::backward(float*, const float*, const int32_t*, const ForwardRecordT<float>&,
                                        BackwardScratchT<float>&, LayerScratchT<float>&, const float* const*, const EmbedSpliceT<float>*,
                                        const GradRangeDone*) const;
template void K3ModelT<double>::backward(double*, const double*, const int32_t*, const ForwardRecordT<double>&,
                                         BackwardScratchT<double>&, LayerScratchT<double>&,
                                         const double* const*, const EmbedSpliceT<double>*, const GradRangeDone*) const;

}  // namespace k3
