// The CUDA backend's ops (see cuda_ops.h): argument checks, cuBLAS products, the launchers of
// src/cuda/kernels, and the device tables of routed experts.
#include "cuda/cuda_ops.h"

#include <cublas_v2.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace k3::cuda {

namespace {

// Elements of A a product reads (rows of op(A) and their strides), from A's first element.
int64_t extent(bool trans, int64_t rows, int64_t cols, int64_t ld) {
  if (rows == 0 || cols == 0) return 0;
  return trans ? (cols - 1) * ld + rows : (rows - 1) * ld + cols;
}

class CudaOps final : public Ops {
 public:
  explicit CudaOps(int index) : dev_(std::make_unique<CudaDevice>(index)) {
    K3_CUBLAS_CHECK(cublasCreate(&blas_));
    K3_CUBLAS_CHECK(cublasSetStream(blas_, dev_->stream()));
    // The default math mode keeps f32 products in f32 (TF32 only when asked for): the CPU
    // reference's accuracy; bf16 weights take the bf16 tensor cores explicitly (gemm_batched).
    K3_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    convert_.place(dev_.get());
    moe_ws_.place(dev_.get());
    attn_ws_.place(dev_.get());
    argmax_ws_.place(dev_.get());
  }
  ~CudaOps() override {
    if (blas_) cublasDestroy(blas_);
  }

  const char* name() const override { return "cuda"; }
  Device* device() const override { return dev_.get(); }
  CudaDevice* cuda() const { return dev_.get(); }

  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const Mat& B, int64_t ldb, float beta, float* C, int64_t ldc) const override {
    gemm_batched(ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
  }

  void gemm_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    int64_t sA, const Mat& B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc, int64_t sC,
                    int64_t count) const override {
    dev_->make_current();
    if (M == 0 || N == 0 || count == 0) return;
    K3_ASSERT(B.present(), "cuda gemm: no B");
    std::lock_guard<std::mutex> lock(mu_);
    if (!ta && tb && M <= kCudaGemvMaxRows) {  // decode-sized: stream B once
      launch_gemv_nt(dev_->stream(), M, N, K, alpha, A, lda, sA, B.f, B.bf16, ldb, sB, beta, C, ldc, sC, count);
      return;
    }
    // cuBLAS is column-major: C^T [N, M] = op(B)^T op(A)^T on the same memory.
    const cublasOperation_t opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!B.is_bf16()) {
      K3_CUBLAS_CHECK(cublasSgemmStridedBatched(blas_, opB, opA, int(N), int(M), int(K), &alpha, B.f, int(ldb), sB, A,
                                                int(lda), sA, &beta, C, int(ldc), sC, int(count)));
      return;
    }
    // bf16 weights: the activations rounded to bf16 (nearest even) once, then the tensor cores
    // with f32 accumulation (the tolerance of bf16 operands: about 1e-2 relative, tests/ops).
    const int64_t n = extent(ta, M, K, lda) + (count - 1) * sA;
    grow_convert(n);
    launch_f32_to_bf16(dev_->stream(), convert_.data(), A, n);
    K3_CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas_, opB, opA, int(N), int(M), int(K), &alpha, B.bf16, CUDA_R_16BF,
                                               int(ldb), sB, convert_.data(), CUDA_R_16BF, int(lda), sA, &beta, C,
                                               CUDA_R_32F, int(ldc), sC, int(count), CUBLAS_COMPUTE_32F,
                                               CUBLAS_GEMM_DEFAULT));
  }

  void rmsnorm(float* y, int64_t ldy, float* rstd, const float* x, int64_t ldx, const float* w, int64_t rows,
               int64_t dim, double eps) const override {
    dev_->make_current();
    launch_rmsnorm(dev_->stream(), y, ldy, rstd, x, ldx, w, rows, dim, float(eps));
  }
  void l2norm(float* y, float* inv, const float* x, int64_t rows, int64_t dim, double eps) const override {
    dev_->make_current();
    launch_l2norm(dev_->stream(), y, inv, x, rows, dim, float(eps));
  }
  void shortconv_silu(float* y, float* pre, float* state, const float* x, const float* w, int64_t T, int64_t C,
                      int64_t K) const override {
    dev_->make_current();
    launch_shortconv_silu(dev_->stream(), y, pre, state, x, w, T, C, K);
  }
  void kda_gate(float* g, const float* z, const float* A_log, const float* dt_bias, int64_t T, int64_t H, int64_t D,
                bool bounded, double lower_bound) const override {
    dev_->make_current();
    launch_kda_gate(dev_->stream(), g, z, A_log, dt_bias, T, H, D, bounded, float(lower_bound));
  }
  void kda(KDACore core, float* o, float* S, const float* q, const float* k, const float* v, const float* g,
           const float* beta, int64_t T, int64_t H, int64_t Dk, int64_t Dv, double scale, const KDAFastOptions& opt,
           KDAWorkspace&) const override {
    dev_->make_current();
    if (T <= 0) return;
    // Multi-token cores take the chunked form on the tensor cores (kernels/kda_chunk.cu; head
    // widths 64 and 128), the Dense diagonal tiles only where the gate is bounded; decode steps
    // and other widths the recurrence token by token (exact f32).
    const bool chunk_widths = (Dk == 64 || Dk == 128) && (Dv == 64 || Dv == 128);
    if ((core == KDACore::Fast || core == KDACore::Chunked) && chunk_widths) {
      const bool dense = opt.diag == KDAFastOptions::DiagPath::Dense ||
                         (opt.diag == KDAFastOptions::DiagPath::Auto && opt.gate_bounded);
      launch_kda_chunk(dev_->stream(), o, S, q, k, v, g, beta, T, H, Dk, Dv, float(scale), dense);
    } else {
      launch_kda_steps(dev_->stream(), o, S, q, k, v, g, beta, T, H, Dk, Dv, float(scale));
    }
  }
  void attention(float* o, const float* q, const float* k, const float* kr, const float* v, const AttentionDims& dims,
                 AttentionScratch&, float* lse) const override {
    dev_->make_current();
    std::lock_guard<std::mutex> lock(mu_);
    grow_bytes(attn_ws_, attention_workspace_bytes(dims));
    launch_attention(dev_->stream(), o, q, k, kr, v, dims, lse, attn_ws_.data());
  }
  void router(int32_t* idx, float* w, float* scores, const float* x, const Mat& W_r, const float* bias, int64_t T,
              int64_t d, int64_t E, int64_t k, bool renorm, double scale) const override {
    dev_->make_current();
    linear(*this, scores, x, W_r, T, d, E);
    launch_sigmoid(dev_->stream(), scores, scores, T * E);
    launch_router_topk(dev_->stream(), idx, w, scores, bias, T, E, k, renorm, float(scale));
  }
  void moe_experts(float* u, const float* z, const int32_t* idx, const float* w, const ExpertMatrix* w1,
                   const ExpertMatrix* w3, const ExpertMatrix* w2, int64_t T, int64_t n_in, int64_t F, int64_t E,
                   int64_t k, double b1, double b2, MoEExpertScratch&, const MoEExpertsExtras& extras) const override {
    dev_->make_current();
    if (extras.gu_saved || extras.y_saved || extras.provider)
      fail("the CUDA backend does not train or stream routed experts (use the CPU backend)");
    if (extras.overlap) (*extras.overlap)();  // the shared experts: queued ahead of the routed ones
    if (T == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const Tables& t = tables(w1, w3, w2, E);
    grow_bytes(moe_ws_, moe_workspace_bytes(T, n_in, F, E, k));
    launch_moe_experts(dev_->stream(), u, z, idx, w, t.w1, t.w3, t.w2, T, n_in, F, E, k, float(b1), float(b2),
                       moe_ws_.data());
  }
  void situ_glu(float* act, const float* gu, int64_t rows, int64_t F, double b1, double b2) const override {
    dev_->make_current();
    launch_situ_glu(dev_->stream(), act, gu, rows, F, float(b1), float(b2));
  }
  void attn_res(float* out, float* alpha, const float* const* sources, int64_t S, const float* w_norm,
                const float* w_proj, int64_t T, int64_t d, double eps) const override {
    dev_->make_current();
    launch_attn_res(dev_->stream(), out, alpha, sources, S, w_norm, w_proj, T, d, float(eps));
  }
  void embed_rows(float* dst, const Mat& W, const int32_t* ids, int64_t T, int64_t d) const override {
    dev_->make_current();
    launch_embed_rows(dev_->stream(), dst, W.f, W.bf16, ids, T, d);
  }
  void add(float* y, const float* x, int64_t n) const override {
    dev_->make_current();
    launch_add(dev_->stream(), y, x, n);
  }
  void sigmoid(float* y, const float* x, int64_t n) const override {
    dev_->make_current();
    launch_sigmoid(dev_->stream(), y, x, n);
  }
  void mul_sigmoid(float* y, const float* a, const float* gate, int64_t n) const override {
    dev_->make_current();
    launch_mul_sigmoid(dev_->stream(), y, a, gate, n);
  }
  void scale(float* x, double f, int64_t n) const override {
    dev_->make_current();
    launch_scale(dev_->stream(), x, float(f), n);
  }
  void copy(float* dst, const float* src, int64_t n) const override {
    if (n > 0 && dst != src) dev_->copy(dst, src, sizeof(float) * size_t(n));
  }
  void fill(float* dst, double v, int64_t n) const override {
    dev_->make_current(); launch_fill(dev_->stream(), dst, float(v), n); }
  void argmax_rows(int32_t* ids, uint8_t* nonfinite, const float* logits, int64_t ld, int64_t V, const int64_t* rows,
                   int64_t n) const override {
    dev_->make_current();
    if (n <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    // One staging buffer: the row indices up, the ids and flags back (int64 slots each).
    const size_t bytes = size_t(n) * (sizeof(int64_t) + sizeof(int32_t) + sizeof(uint8_t)) + 16;
    grow_bytes(argmax_ws_, bytes);
    auto* rows_d = reinterpret_cast<int64_t*>(argmax_ws_.data());
    auto* ids_d = reinterpret_cast<int32_t*>(rows_d + n);
    auto* flag_d = reinterpret_cast<uint8_t*>(ids_d + n);
    dev_->to_device(rows_d, rows, sizeof(int64_t) * size_t(n));
    launch_argmax_rows(dev_->stream(), ids_d, flag_d, logits, ld, V, rows_d, n);
    dev_->to_host(ids, ids_d, sizeof(int32_t) * size_t(n));
    dev_->to_host(nonfinite, flag_d, size_t(n));
  }
  void copy_rows(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) const override {
    dev_->make_current();
    launch_copy_rows(dev_->stream(), dst, ldd, src, lds, rows, cols);
  }

 private:
  // Device arrays of one layer's expert pointers (ExpertTable), made once per layer.
  struct Tables {
    Buf<const void*> ptrs;  // w1 (f32 or packed, scales), w3, w2, in that order
    ExpertTable w1, w3, w2;
  };

  const Tables& tables(const ExpertMatrix* w1, const ExpertMatrix* w3, const ExpertMatrix* w2, int64_t E) const {
    auto it = tables_.find(w1);
    if (it != tables_.end()) return it->second;
    const bool mx = w1[0].mx != nullptr;
    std::vector<const void*> h;
    for (const ExpertMatrix* m : {w1, w3, w2})
      for (int64_t e = 0; e < E; ++e) {
        const ExpertMatrix& x = m[e];
        if (mx != (x.mx != nullptr) || (!mx && !x.f32))
          fail("the CUDA backend needs every routed expert resident, all MXFP4 or all f32");
        h.push_back(mx ? x.mx->packed.raw() : static_cast<const void*>(x.f32));
      }
    if (mx)
      for (const ExpertMatrix* m : {w1, w3, w2})
        for (int64_t e = 0; e < E; ++e) h.push_back(m[e].mx->scales.raw());
    Tables& t = tables_[w1];
    t.ptrs.place(dev_.get());
    t.ptrs.append(h.data(), h.size());
    const void* const* p = t.ptrs.data();
    ExpertTable* tabs[3] = {&t.w1, &t.w3, &t.w2};
    for (int i = 0; i < 3; ++i) {
      if (mx) {
        tabs[i]->packed = reinterpret_cast<const uint8_t* const*>(p + i * E);
        tabs[i]->scales = reinterpret_cast<const uint8_t* const*>(p + (3 + i) * E);
      } else {
        tabs[i]->f32 = reinterpret_cast<const float* const*>(p + i * E);
      }
    }
    return t;
  }

  void grow_convert(int64_t n) const {
    if (int64_t(convert_.size()) < n) convert_.resize(size_t(n));
  }
  static void grow_bytes(Buf<uint8_t>& b, size_t n) {
    if (b.size() < n) b.resize(n);
  }

  std::unique_ptr<CudaDevice> dev_;
  cublasHandle_t blas_ = nullptr;
  mutable std::mutex mu_;                  // the workspaces and tables (one stream: ops are serial anyway)
  mutable Buf<uint16_t> convert_;          // bf16 copies of activations for cuBLAS
  mutable Buf<uint8_t> moe_ws_, attn_ws_, argmax_ws_;  // kernel workspaces
  mutable std::unordered_map<const void*, Tables> tables_;
};

}  // namespace

std::shared_ptr<const Ops> make_cuda_ops(int index) { return std::make_shared<CudaOps>(index); }

CudaDevice* cuda_device_of(const Ops& ops) {
  const auto* c = dynamic_cast<const CudaOps*>(&ops);
  return c ? c->cuda() : nullptr;
}

}  // namespace k3::cuda
