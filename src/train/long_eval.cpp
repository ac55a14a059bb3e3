// Long-context scoring (see long_eval.h).
#include "train/long_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "kernels/log_sum_exp.h"

namespace k3 {

namespace {

double nll_of(const float* logits, int64_t V, int32_t target) {
  return log_sum_exp(logits, V) - double(logits[target]);
}

int32_t argmax(const float* l, int64_t V) { return int32_t(std::max_element(l, l + V) - l); }

// Appends ids [p, e) to st in chunks through PrefillLatent; logits of the last one in `last`.
void prefill_chunked(const K3Model& m, DecodeState& st, ForwardScratch& s, const std::vector<int32_t>& ids,
                     int64_t p, int64_t e, int64_t chunk, std::vector<float>& last) {
  ForwardOptions fo;
  fo.mode = MixerMode::PrefillLatent;
  fo.last_only = true;
  for (; p < e; p += chunk) m.forward(last.data(), ids.data() + p, std::min(chunk, e - p), st, s, fo);
}

}  // namespace

LongScore score_long_sample(const K3Model& m, const LongSample& s, int64_t chunk) {
  K3_ASSERT(chunk >= 1, "score_long_sample: chunk must be positive");
  const int64_t V = m.dims().V;
  DecodeState st = m.new_state();
  ForwardScratch scratch;
  std::vector<float> logits(static_cast<size_t>(V));
  LongScore r;
  int64_t pos = 0;
  for (const LongQuery& q : s.queries) {
    K3_ASSERT(q.at > pos, "score_long_sample: queries out of order");
    const auto t0 = std::chrono::steady_clock::now();
    prefill_chunked(m, st, scratch, s.ids, pos, q.at, chunk, logits);
    r.prefill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.prefill_tokens += q.at - pos;
    bool right = true;
    ForwardOptions fo;
    fo.mode = MixerMode::Decode;
    fo.last_only = true;
    for (int32_t a : q.answer) {
      right = right && argmax(logits.data(), V) == a;
      r.answer_nll += nll_of(logits.data(), V, a);
      ++r.answer_tokens;
      m.forward(logits.data(), &a, 1, st, scratch, fo);
    }
    pos = q.at + int64_t(q.answer.size());
    ++r.queries;
    r.correct += right ? 1 : 0;
  }
  r.state_bytes = decode_state_bytes(st);
  r.state_tokens = st.n_tokens;
  return r;
}

std::vector<double> loss_by_position(const K3Model& m, const std::vector<int32_t>& ids, int64_t bucket,
                                     int64_t chunk) {
  K3_ASSERT(bucket >= 1 && chunk >= 1, "loss_by_position: bucket and chunk must be positive");
  const int64_t V = m.dims().V, T = int64_t(ids.size());
  std::vector<double> sum, count;
  DecodeState st = m.new_state();
  ForwardScratch s;
  std::vector<float> logits(static_cast<size_t>(chunk * V));
  ForwardOptions fo;
  fo.mode = MixerMode::PrefillLatent;
  for (int64_t p = 0; p + 1 < T; p += chunk) {
    const int64_t n = std::min(chunk, T - 1 - p);  // predicts tokens p+1 .. p+n
    m.forward(logits.data(), ids.data() + p, n, st, s, fo);
    for (int64_t t = 0; t < n; ++t) {
      const size_t b = size_t((p + t) / bucket);
      if (sum.size() <= b) sum.resize(b + 1, 0.0), count.resize(b + 1, 0.0);
      sum[b] += nll_of(logits.data() + t * V, V, ids[size_t(p + t + 1)]);
      count[b] += 1;
    }
  }
  for (size_t b = 0; b < sum.size(); ++b) sum[b] /= count[b];
  return sum;
}

int64_t decode_state_bytes(const DecodeState& st) {
  int64_t n = 0;
  for (const LayerState& l : st.layers)
    n += int64_t(l.kda.S.size() + l.kda.conv_q.size() + l.kda.conv_k.size() + l.kda.conv_v.size() +
                 l.mla.c_kv.size() + l.mla.k_rope.size());
  return n * int64_t(sizeof(float));
}

int64_t decode_state_formula_bytes(const ModelDims& d, int64_t n) {
  int64_t floats = 0;
  for (int64_t i = 0; i < d.L; ++i)
    floats += d.mla[size_t(i)] ? n * (d.mla_dims.kv_lora + d.mla_dims.rope)
                               : d.kda.H * d.kda.D * d.kda.D + 3 * d.kda.H * d.kda.D * (d.kda.conv_k - 1);
  return floats * int64_t(sizeof(float));
}

}  // namespace k3
