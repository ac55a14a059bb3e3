// KDA mixer forward wiring (see kda_mixer.h; docs/model.md section 3). Composes kernels/ ops;
// all buffers come from KDAScratchT, or from KDASavedT for the quantities a backward needs.
#include "model/kda_mixer.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "core/grow.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/kda_gate.h"
#include "kernels/norm.h"
#include "kernels/shortconv.h"

namespace k3 {

KDAFastOptions kda_mixer_fast_options(const KDADims& dims, bool save) {
  KDAFastOptions opt;
  opt.chunk = kKdaMixerChunk;
  // The Dense diagonal tiles are safe for g >= -5 (kda_fast.h); a lower floor or the
  // unbounded gate takes the Safe path.
  opt.gate_bounded = dims.bounded && dims.lower_bound >= -5.0;
  opt.save_for_backward = save;
  return opt;
}

template <typename R>
void KDAStateT<R>::reset(const KDADims& dims, Device* dev) {
  const int64_t HD = dims.H * dims.D, P = dims.conv_k - 1;
  for (Buf<R>* b : {&S, &conv_q, &conv_k, &conv_v}) b->place(dev);
  S.assign_zeros(size_t(dims.H * dims.D * dims.D));
  conv_q.assign_zeros(size_t(HD * P));
  conv_k.assign_zeros(size_t(HD * P));
  conv_v.assign_zeros(size_t(HD * P));
}

template <typename R>
void KDAStateT<R>::move_to(Device* dev) {
  for (Buf<R>* b : {&S, &conv_q, &conv_k, &conv_v}) b->move_to(dev);
}

void KDAStepLog::restore(KDAState& state, int64_t n) const {
  K3_ASSERT(n >= 1 && n < tokens, "KDAStepLog::restore: no logged state after that many tokens");
  const size_t nS = state.S.size(), nc = state.conv_q.size(), i = size_t(n - 1);
  state.S.write(0, S.data() + i * nS, nS);
  state.conv_q.write(0, conv_q.data() + i * nc, nc);
  state.conv_k.write(0, conv_k.data() + i * nc, nc);
  state.conv_v.write(0, conv_v.data() + i * nc, nc);
}

template <typename R>
void KDAScratchT<R>::ensure(int64_t T, const KDADims& dims, Device* dev) {
  const int64_t HD = dims.H * dims.D;
  for (auto* b : {&q_lin, &k_lin, &v_lin, &q_pre, &k_pre, &v_pre, &q_act, &k_act, &v, &q, &k, &z, &g, &o,
                  &o_normed, &gate_lin, &y})
    grow(*b, T * HD, dev);
  for (auto* b : {&q_inv, &k_inv, &beta, &o_rstd}) grow(*b, T * dims.H, dev);
  grow(fa, T * dims.D, dev);
}

template <typename R>
void KDAScratchT<R>::ensure_backward(int64_t T, const KDADims& dims) {
  const int64_t HD = dims.H * dims.D;
  for (auto* b : {&q_act, &k_act, &q_pre, &k_pre, &v_pre, &q, &k, &v, &g, &o_normed, &y, &dy, &dgate, &d_o, &dq, &dk,
                  &dv, &dg, &dact, &dlin})
    grow(*b, T * HD, nullptr);
  grow(dbeta, T * dims.H, nullptr);
  grow(dfa, T * dims.D, nullptr);
  grow(conv0, HD * (dims.conv_k - 1), nullptr);
}

template <typename R>
void KDASavedT<R>::ensure(int64_t T, const KDADims& dims) {
  const int64_t HD = dims.H * dims.D, P = dims.conv_k - 1;
  if (keep_input) grow(x, T * dims.d);
  grow(S0, dims.H * dims.D * dims.D);
  for (auto* b : {&conv_q0, &conv_k0, &conv_v0}) grow(*b, HD * P);
  for (auto* b : {&q_lin, &k_lin, &v_lin, &z, &o, &gate_lin}) grow(*b, T * HD);
  for (auto* b : {&q_inv, &k_inv, &beta, &o_rstd}) grow(*b, T * dims.H);
  grow(fa, T * dims.D);
}

namespace {

// The core variant of a call on one sequence of Tj tokens (see kda_mixer_forward).
template <typename R>
KDACore core_for(KDAPath path, int64_t Tj, bool saved) {
  if (Tj == 1 && !saved) return path == KDAPath::Fast || path == KDAPath::Steps ? KDACore::StepFast : KDACore::Step;
  switch (path) {
    case KDAPath::Steps: return saved ? KDACore::Recurrent : KDACore::StepFast;
    case KDAPath::Fast: return KDACore::Fast;
    case KDAPath::Chunked: return KDACore::Chunked;
    default: return KDACore::Recurrent;
  }
}

// The forward over n_seg sequences (rows [seg[j], seg[j+1]) carry states[j]); one sequence is
// the single-state call. Per-token work runs over all rows; the conv and the core per sequence.
template <typename R>
void kda_forward_segments(const OpsT<R>& ops, R* out, KDAStateT<R>* const* states, const int64_t* seg, int64_t n_seg,
                          const R* x, const KDAWeightsT<R>& w, const KDADims& dims, int64_t T, KDAPath path,
                          KDAScratchT<R>& s, KDASavedT<R>* saved, KDAStepLog* log) {
  const int64_t d = dims.d, H = dims.H, D = dims.D, HD = H * D, K = dims.conv_k;
  Device* dev = ops.device();
  K3_ASSERT(K >= 1 && H >= 1 && D >= 1 && d >= 1, "kda_mixer_forward: bad dims");
  K3_ASSERT(n_seg >= 1 && seg[0] == 0 && seg[n_seg] == T, "kda_mixer_forward: segments do not cover the rows");
  K3_ASSERT(!saved || n_seg == 1, "kda_mixer_forward: a training forward (saved) runs one sequence");
  K3_ASSERT(!(saved || log) || !dev, "kda_mixer_forward: training saves and the step log are CPU-only");
  for (int64_t j = 0; j < n_seg; ++j) {
    const KDAStateT<R>& st = *states[j];
    K3_ASSERT(seg[j + 1] >= seg[j], "kda_mixer_forward: segments out of order");
    K3_ASSERT(int64_t(st.S.size()) == H * D * D && int64_t(st.conv_q.size()) == HD * (K - 1) &&
                  int64_t(st.conv_k.size()) == HD * (K - 1) && int64_t(st.conv_v.size()) == HD * (K - 1),
              "kda_mixer_forward: state not sized for these dims (call KDAState::reset)");
    K3_ASSERT(st.S.device() == dev && st.conv_q.device() == dev, "kda_mixer_forward: state not on the backend's device");
  }
  KDAStateT<R>& state = *states[0];  // the one sequence of a training forward
  if (saved) {
    saved->T = T;
    saved->path = path;
  }
  if (T == 0) return;
  s.ensure(T, dims, dev);

  // Saved quantities go to `saved` when given (with the input and the starting state), else
  // to the scratch; both name them alike.
  if (saved) {
    saved->ensure(T, dims);
    if (saved->keep_input) std::copy(x, x + T * d, saved->x.begin());
    std::copy(state.S.begin(), state.S.end(), saved->S0.begin());
    std::copy(state.conv_q.begin(), state.conv_q.end(), saved->conv_q0.begin());
    std::copy(state.conv_k.begin(), state.conv_k.end(), saved->conv_k0.begin());
    std::copy(state.conv_v.begin(), state.conv_v.end(), saved->conv_v0.begin());
  }
  using SavedBuf = std::vector<R> KDASavedT<R>::*;
  using ScratchBuf = Buf<R> KDAScratchT<R>::*;
  auto buf = [&](ScratchBuf sb, SavedBuf vb) { return saved ? ((*saved).*vb).data() : (s.*sb).data(); };
  using Sc = KDAScratchT<R>;
  using Sv = KDASavedT<R>;
  R* q_lin = buf(&Sc::q_lin, &Sv::q_lin);
  R* k_lin = buf(&Sc::k_lin, &Sv::k_lin);
  R* v_lin = buf(&Sc::v_lin, &Sv::v_lin);
  // Recomputed by the backward (KDASavedT): always the scratch.
  R* q_pre = s.q_pre.data();
  R* k_pre = s.k_pre.data();
  R* v_pre = s.v_pre.data();
  R* q = s.q.data();
  R* k = s.k.data();
  R* v = s.v.data();
  R* g = s.g.data();
  R* q_inv = buf(&Sc::q_inv, &Sv::q_inv);
  R* k_inv = buf(&Sc::k_inv, &Sv::k_inv);
  R* beta = buf(&Sc::beta, &Sv::beta);
  R* fa = buf(&Sc::fa, &Sv::fa);
  R* z = buf(&Sc::z, &Sv::z);
  R* o = buf(&Sc::o, &Sv::o);
  R* o_rstd = buf(&Sc::o_rstd, &Sv::o_rstd);
  R* gate_lin = buf(&Sc::gate_lin, &Sv::gate_lin);

  // q, k, v = ShortConv_SiLU(W x), conv state carried.
  linear(ops, q_lin, x, w.q_proj, T, d, HD);
  linear(ops, k_lin, x, w.k_proj, T, d, HD);
  linear(ops, v_lin, x, w.v_proj, T, d, HD);
  // The step log: token by token (one token, or the Steps path) in float, one sequence.
  const bool logging = log && std::is_same_v<R, float> && n_seg == 1 && !saved && (T == 1 || path == KDAPath::Steps);
  if (log) log->tokens = 0;
  if constexpr (std::is_same_v<R, float>) {
    if (logging) {
      // The conv windows after each prefix: the last K-1 entries of [carried | inputs so far].
      const int64_t P = K - 1, n_log = T - 1;
      const KDAStateT<R>& st = *states[0];
      for (auto* b : {&log->conv_q, &log->conv_k, &log->conv_v}) grow(*b, n_log * HD * P);
      grow(log->S, n_log * H * D * D);
      const R* lin[3] = {q_lin, k_lin, v_lin};
      const R* carried[3] = {st.conv_q.data(), st.conv_k.data(), st.conv_v.data()};
      float* dst[3] = {log->conv_q.data(), log->conv_k.data(), log->conv_v.data()};
      for (int a = 0; a < 3; ++a)
        for (int64_t t = 0; t < n_log; ++t)
          for (int64_t c = 0; c < HD; ++c)
            for (int64_t j = 0; j < P; ++j) {
              const int64_t src = t + 1 - P + j;  // < 0: still a carried entry
              dst[a][(t * HD + c) * P + j] = src >= 0 ? lin[a][src * HD + c] : carried[a][c * P + P + src];
            }
    }
  }
  for (int64_t j = 0; j < n_seg; ++j) {
    const int64_t r = seg[j] * HD, n = seg[j + 1] - seg[j];
    KDAStateT<R>& st = *states[j];
    ops.shortconv_silu(s.q_act.data() + r, q_pre + r, st.conv_q.data(), q_lin + r, w.q_conv, n, HD, K);
    ops.shortconv_silu(s.k_act.data() + r, k_pre + r, st.conv_k.data(), k_lin + r, w.k_conv, n, HD, K);
    ops.shortconv_silu(v + r, v_pre + r, st.conv_v.data(), v_lin + r, w.v_conv, n, HD, K);
  }
  // q, k L2-normalised per head; the D^-0.5 on q is the recurrence's scale.
  ops.l2norm(q, q_inv, s.q_act.data(), T * H, D, kKdaL2Eps);
  ops.l2norm(k, k_inv, s.k_act.data(), T * H, D, kKdaL2Eps);
  const double scale = 1.0 / std::sqrt(double(D));

  // beta = sigmoid(W_b x)
  linear(ops, beta, x, w.b_proj, T, d, H);
  ops.sigmoid(beta, beta, T * H);

  // g = gate(W_fb(W_fa x)), A_log per head.
  linear(ops, fa, x, w.f_a, T, d, D);
  linear(ops, z, fa, w.f_b, T, D, HD);
  ops.kda_gate(g, z, w.A_log, w.dt_bias, T, H, D, dims.bounded, dims.lower_bound);

  // The recurrence, state carried, per sequence.
  const KDAFastOptions fast = kda_mixer_fast_options(dims, saved);
  for (int64_t j = 0; j < n_seg; ++j) {
    const int64_t r = seg[j] * HD, Tj = seg[j + 1] - seg[j];
    if (Tj == 0) continue;
    R* S = states[j]->S.data();
    R* o_j = o + r;
    const R *q_j = q + r, *k_j = k + r, *v_j = v + r, *g_j = g + r, *beta_j = beta + seg[j] * H;
    const KDACore core = core_for<R>(path, Tj, saved);
    if constexpr (std::is_same_v<R, float>) {
      if (saved && saved->ws.has_saved() && path != KDAPath::Fast)
        saved->ws.release();  // stale per-chunk states of an earlier call: the backward recomputes them
    }
    if constexpr (std::is_same_v<R, float>) {
      if (logging && core == KDACore::StepFast && Tj > 1) {
        // Token by token, keeping the state after each token but the last.
        const int64_t HDD = H * D * D;
        for (int64_t t = 0; t < Tj; ++t) {
          ops.kda(core, o_j + t * HD, S, q_j + t * HD, k_j + t * HD, v_j + t * HD, g_j + t * HD, beta_j + t * H,
                  1, H, D, D, scale, fast, s.ws);
          if (t + 1 < Tj) states[j]->S.read(log->S.data() + t * HDD, 0, size_t(HDD));
        }
        continue;
      }
    }
    ops.kda(core, o_j, S, q_j, k_j, v_j, g_j, beta_j, Tj, H, D, D, scale, fast, saved ? saved->ws : s.ws);
  }

  // y = RMSNorm_head(o) * o_norm * sigmoid(W_g x);  out = W_o y
  ops.rmsnorm(s.o_normed.data(), D, o_rstd, o, D, w.o_norm, T * H, D, dims.rms_eps);
  linear(ops, gate_lin, x, w.g_proj, T, d, HD);
  ops.mul_sigmoid(s.y.data(), s.o_normed.data(), gate_lin, T * HD);
  linear(ops, out, s.y.data(), w.o_proj, T, HD, d);
  if (logging) log->tokens = T;
}

}  // namespace

template <typename R>
void kda_mixer_forward(const OpsT<R>& ops, R* out, KDAStateT<R>& state, const R* x, const KDAWeightsT<R>& w,
                       const KDADims& dims, int64_t T, KDAPath path, KDAScratchT<R>& s, KDASavedT<R>* saved,
                       KDAStepLog* log) {
  KDAStateT<R>* st = &state;
  const int64_t seg[2] = {0, T};
  kda_forward_segments<R>(ops, out, &st, seg, 1, x, w, dims, T, path, s, saved, log);
}

void kda_mixer_forward_batch(const Ops& ops, float* out, KDAState* const* states, const int64_t* seg, int64_t n_seg,
                             const float* x, const KDAWeights& w, const KDADims& dims, KDAPath path, KDAScratch& s) {
  kda_forward_segments<float>(ops, out, states, seg, n_seg, x, w, dims, seg[n_seg], path, s, nullptr, nullptr);
}

template struct KDAStateT<float>;
template struct KDAStateT<double>;
template struct KDAScratchT<float>;
template struct KDAScratchT<double>;
template struct KDASavedT<float>;
template struct KDASavedT<double>;
template void kda_mixer_forward<float>(const OpsT<float>&, float*, KDAStateT<float>&, const float*,
                                       const KDAWeightsT<float>&, const KDADims&, int64_t, KDAPath,
                                       KDAScratchT<float>&, KDASavedT<float>*, KDAStepLog*);
template void kda_mixer_forward<double>(const OpsT<double>&, double*, KDAStateT<double>&, const double*,
                                        const KDAWeightsT<double>&, const KDADims&, int64_t, KDAPath,
                                        KDAScratchT<double>&, KDASavedT<double>*, KDAStepLog*);

}  // namespace k3
