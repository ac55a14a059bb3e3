// Fast chunked Kimi Delta Attention: forward, backward and the one-token decode step
// (docs/model.md section 3; plain references: kernels/kda.h, kernels/kda_backward_ref.h).
// Same recurrence and layouts as kda.h, one sequence, heads in parallel (OpenMP):
//   q, k, g [Tn, H, Dk]; v, o [Tn, H, Dv]; beta [Tn, H]; state [H, Dk, Dv] f32;
//   per token: S = diag(e^g) S;  u = S^T k;  S += k (beta (v - u))^T;  o = S^T (scale q).
//
// Chunked form (chunk C = 64 by default, in 16-token sub-tiles), per head and chunk, with
// G = in-chunk cumulative sum of g, E = e^G, El = e^G_last, Kd = K e^(G_last - G):
//   Akk = StrictLower(K_i . K_j e^(G_i - G_j)),  Aqk = LowerIncl(Q_i . K_j e^(G_i - G_j))
//   Tm  = (I + diag(beta) Akk)^-1 diag(beta)                (UT transform)
//   R   = V - (K E) S;   V' = Tm R;   O = (Q E) S + Aqk V';   S = diag(El) S + Kd^T V'
// (V' = Tm R is fla's U - W S regrouped: one product fewer.) Akk and Aqk are built tile by
// tile (16 x 16) as dense products X_I diag(f_IJ) Y_J^T with X_I = K_I e^(G_I - G_rI),
// Y_J = K_J e^(G_cJ - G_J), f_IJ = e^(G_rI - G_cJ):
//   DiagPath::Dense: every tile, diagonal ones included, uses rI = cJ = the tile's middle row.
//     With g >= -5 every exponent is within 8 * 5 = 40 in size (e^40 ~ 2e17, far from the
//     f32/bf16 limit e^88), so no tile needs a per-token branch. Unbounded gates can overflow.
//   DiagPath::Safe: off-diagonal tiles anchor at the tile boundaries (all factors <= 1) and
//     the 16 diagonal tiles' pairs are formed token by token as products of e^g (<= 1).
//   DiagPath::Auto: Dense when opt.gate_bounded, else Safe.
// bf16 = true: the same float inputs; every matrix product rounds its operands to bf16
// (nearest even) and accumulates in f32 (AVX512-BF16 vdpbf16ps); cumulative sums, exps,
// decay scalings, the UT forward substitution and the state itself stay f32. The C x C
// products of the UT backward (Linv^T dLinv Linv^T) stay f32 in both modes.
//
// The kernels run with subnormals flushed to zero (FTZ/DAZ, each thread's MXCSR restored on
// return): decays drive state entries through the subnormal range, where FMAs are slow.
// Contracts: chunk is a multiple of 16 in [16, 128]; any Dk, Dv (padded to 16 inside);
// g <= 0 expected (decay), Dense additionally g >= -5 (or close: the bound is what makes the
// exponents safe). Outputs must not alias inputs. Gradients are assigned (not accumulated).
#pragma once
#include <cstdint>
#include <memory>

namespace k3 {

struct KDAFastOptions {
  int64_t chunk = 64;
  bool bf16 = false;
  enum class DiagPath { Auto, Dense, Safe } diag = DiagPath::Auto;
  bool gate_bounded = true;  // Auto: Dense if bounded (K3's g >= -5), else Safe (Kimi Linear)
  // Forward keeps, per head and chunk, the state at the chunk start, R, V', Akk and Aqk in
  // the workspace (4 (Dk Dv + 2 C Dv + 2 C^2) bytes per chunk and head: 2.5 KB per token and
  // head at D = 128) so that the backward does not recompute them (training). Without it the
  // backward reruns the forward's state pass itself.
  bool save_for_backward = false;
};

// Dense or Safe, as the kernel will run it.
KDAFastOptions::DiagPath kda_fast_diag_path(const KDAFastOptions& opt);

// Scratch (per thread) and the forward's saved per-chunk quantities. Reuse one workspace
// across calls to avoid allocations; the backward must get the workspace of the forward on
// the same inputs and options (it checks the shapes and the options).
class KDAWorkspace {
 public:
  KDAWorkspace();
  ~KDAWorkspace();
  KDAWorkspace(KDAWorkspace&&) noexcept;
  KDAWorkspace& operator=(KDAWorkspace&&) noexcept;
  bool has_saved() const;  // a forward with save_for_backward ran and nothing reset it
  size_t bytes() const;    // memory held
  void release();          // frees everything

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// state [H, Dk, Dv]: initial state in (zeros for a fresh sequence), final state out; null
// means a zero initial state and no final state. o may be null (a state-only pass).
void kda_chunk_fast_forward(float* o, float* state, const float* q, const float* k, const float* v, const float* g,
                            const float* beta, int64_t Tn, int64_t H, int64_t Dk, int64_t Dv, double scale,
                            const KDAFastOptions& opt, KDAWorkspace& ws);

// Gradients of (o, final state) for the forward above. do_ [Tn, H, Dv]; dstate_final
// [H, Dk, Dv] or null (zero); state0 [H, Dk, Dv] the forward's initial state or null (zero).
// Outputs: dq, dk, dg [Tn, H, Dk]; dv [Tn, H, Dv]; dbeta [Tn, H]; dstate0 [H, Dk, Dv] or null.
void kda_chunk_fast_backward(float* dq, float* dk, float* dv, float* dg, float* dbeta, float* dstate0,
                             const float* do_, const float* dstate_final, const float* q, const float* k,
                             const float* v, const float* g, const float* beta, const float* state0, int64_t Tn,
                             int64_t H, int64_t Dk, int64_t Dv, double scale, const KDAFastOptions& opt,
                             KDAWorkspace& ws);

// One token (kda_decode_step's contract): o [H, Dv]; q, k, g [H, Dk]; v [H, Dv]; beta [H];
// state [H, Dk, Dv] in/out. AVX-512 over Dv: one read sweep of each head's state (u = S_a^T k,
// p = S_a^T q with S_a = diag(e^g) S), one read-modify-write sweep (S = S_a + k d^T).
void kda_decode_step_fast(float* o, float* state, const float* q, const float* k, const float* v, const float* g,
                          const float* beta, int64_t H, int64_t Dk, int64_t Dv, double scale);

// Nominal FLOPs of the matrix products the kernel performs (2 per multiply-add, triangles
// counted as computed), for GFLOP/s figures: forward, and backward (with saved workspace).
double kda_chunk_fast_flops(int64_t Tn, int64_t H, int64_t Dk, int64_t Dv, int64_t chunk, bool backward);

}  // namespace k3
