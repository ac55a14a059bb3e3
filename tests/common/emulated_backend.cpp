// The emulated device backend (see emulated_backend.h).
#include "common/emulated_backend.h"

#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace k3::test {

namespace {

// Added to every host address: the result has bits 48-62 set, non-canonical on x86-64.
constexpr uintptr_t kTag = uintptr_t(0x5a5a) << 48;

uintptr_t untag_bits(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  K3_ASSERT(u >= kTag, "emulated backend: a host pointer was passed where a device pointer belongs");
  return u - kTag;
}

class EmulatedDevice final : public Device {
 public:
  std::string name() const override { return "emulated device (host memory behind tagged pointers)"; }
  void* alloc(size_t bytes) override {
    void* p = aligned_alloc64(std::max<size_t>(bytes, 64));
    std::lock_guard<std::mutex> lock(mu_);
    used_ += bytes;
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + kTag);
  }
  void release(void* p) noexcept override {
    if (p) aligned_free64(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) - kTag));
  }
  void to_device(void* dst, const void* src, size_t n) override {
    std::memcpy(reinterpret_cast<void*>(untag_bits(dst)), src, n);
  }
  void to_host(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, reinterpret_cast<const void*>(untag_bits(src)), n);
  }
  void copy(void* dst, const void* src, size_t n) override {
    std::memmove(reinterpret_cast<void*>(untag_bits(dst)), reinterpret_cast<const void*>(untag_bits(src)), n);
  }
  void zero(void* dst, size_t n) override { std::memset(reinterpret_cast<void*>(untag_bits(dst)), 0, n); }
  void synchronize() override {}
  int64_t free_bytes() const override { return int64_t(1) << 40; }
  int64_t total_bytes() const override { return int64_t(1) << 40; }

 private:
  std::mutex mu_;
  size_t used_ = 0;
};

template <typename T>
T* h(T* p) {
  return emulated_host(p);
}

Mat h(const Mat& m) {
  Mat r;
  r.f = h(m.f);
  r.bf16 = h(m.bf16);
  return r;
}

// Host views of E expert matrices (an MXFP4 one through a Mxfp4Matrix of host views).
struct HostExperts {
  std::vector<ExpertMatrix> m;
  std::vector<Mxfp4Matrix> mx;
  const ExpertMatrix* of(const ExpertMatrix* w, int64_t E) {
    m.assign(w, w + E);
    mx.resize(size_t(E));
    for (int64_t e = 0; e < E; ++e) {
      ExpertMatrix& x = m[size_t(e)];
      x.f32 = h(x.f32);
      if (x.mx) {
        Mxfp4Matrix& c = mx[size_t(e)];
        c.rows = x.mx->rows;
        c.cols = x.mx->cols;
        c.packed = Tensor::view_of(x.mx->packed.dtype(), x.mx->packed.shape(),
                                   h(const_cast<void*>(x.mx->packed.raw())), nullptr);
        c.scales = Tensor::view_of(x.mx->scales.dtype(), x.mx->scales.shape(),
                                   h(const_cast<void*>(x.mx->scales.raw())), nullptr);
        x.mx = &c;
      }
    }
    return m.data();
  }
};

class EmulatedOps final : public Ops {
 public:
  const char* name() const override { return "emulated"; }
  Device* device() const override { return emulated_device(); }

  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const Mat& B, int64_t ldb, float beta, float* C, int64_t ldc) const override {
    cpu().gemm(ta, tb, M, N, K, alpha, h(A), lda, h(B), ldb, beta, h(C), ldc);
  }
  void gemm_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    int64_t sA, const Mat& B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc, int64_t sC,
                    int64_t count) const override {
    cpu().gemm_batched(ta, tb, M, N, K, alpha, h(A), lda, sA, h(B), ldb, sB, beta, h(C), ldc, sC, count);
  }
  void rmsnorm(float* y, int64_t ldy, float* rstd, const float* x, int64_t ldx, const float* w, int64_t rows,
               int64_t dim, double eps) const override {
    cpu().rmsnorm(h(y), ldy, h(rstd), h(x), ldx, h(w), rows, dim, eps);
  }
  void l2norm(float* y, float* inv, const float* x, int64_t rows, int64_t dim, double eps) const override {
    cpu().l2norm(h(y), h(inv), h(x), rows, dim, eps);
  }
  void shortconv_silu(float* y, float* pre, float* state, const float* x, const float* w, int64_t T, int64_t C,
                      int64_t K) const override {
    cpu().shortconv_silu(h(y), h(pre), h(state), h(x), h(w), T, C, K);
  }
  void kda_gate(float* g, const float* z, const float* A_log, const float* dt_bias, int64_t T, int64_t H, int64_t D,
                bool bounded, double lb) const override {
    cpu().kda_gate(h(g), h(z), h(A_log), h(dt_bias), T, H, D, bounded, lb);
  }
  void kda(KDACore core, float* o, float* S, const float* q, const float* k, const float* v, const float* g,
           const float* beta, int64_t T, int64_t H, int64_t Dk, int64_t Dv, double scale, const KDAFastOptions& opt,
           KDAWorkspace& ws) const override {
    cpu().kda(core, h(o), h(S), h(q), h(k), h(v), h(g), h(beta), T, H, Dk, Dv, scale, opt, ws);
  }
  void attention(float* o, const float* q, const float* k, const float* kr, const float* v, const AttentionDims& dims,
                 AttentionScratch& scratch, float* lse) const override {
    cpu().attention(h(o), h(q), h(k), h(kr), h(v), dims, scratch, h(lse));
  }
  void router(int32_t* idx, float* w, float* scores, const float* x, const Mat& W_r, const float* bias, int64_t T,
              int64_t d, int64_t E, int64_t k, bool renorm, double scale) const override {
    cpu().router(h(idx), h(w), h(scores), h(x), h(W_r), h(bias), T, d, E, k, renorm, scale);
  }
  void moe_experts(float* u, const float* z, const int32_t* idx, const float* w, const ExpertMatrix* w1,
                   const ExpertMatrix* w3, const ExpertMatrix* w2, int64_t T, int64_t n_in, int64_t F, int64_t E,
                   int64_t k, double b1, double b2, MoEExpertScratch& scratch,
                   const MoEExpertsExtras& extras) const override {
    K3_ASSERT(!extras.gu_saved && !extras.y_saved && !extras.provider, "emulated backend: CPU-only extras");
    std::lock_guard<std::mutex> lock(mu_);
    cpu().moe_experts(h(u), h(z), h(idx), h(w), x1_.of(w1, E), x3_.of(w3, E), x2_.of(w2, E), T, n_in, F, E, k, b1,
                      b2, scratch, extras);
  }
  void situ_glu(float* act, const float* gu, int64_t rows, int64_t F, double b1, double b2) const override {
    cpu().situ_glu(h(act), h(gu), rows, F, b1, b2);
  }
  void attn_res(float* out, float* alpha, const float* const* sources, int64_t S, const float* w_norm,
                const float* w_proj, int64_t T, int64_t d, double eps) const override {
    std::vector<const float*> src(sources, sources + S);
    for (const float*& p : src) p = h(p);
    cpu().attn_res(h(out), h(alpha), src.data(), S, h(w_norm), h(w_proj), T, d, eps);
  }
  void embed_rows(float* dst, const Mat& W, const int32_t* ids, int64_t T, int64_t d) const override {
    cpu().embed_rows(h(dst), h(W), h(ids), T, d);
  }
  void add(float* y, const float* x, int64_t n) const override { cpu().add(h(y), h(x), n); }
  void sigmoid(float* y, const float* x, int64_t n) const override { cpu().sigmoid(h(y), h(x), n); }
  void mul_sigmoid(float* y, const float* a, const float* gate, int64_t n) const override {
    cpu().mul_sigmoid(h(y), h(a), h(gate), n);
  }
  void scale(float* x, double f, int64_t n) const override { cpu().scale(h(x), f, n); }
  void copy(float* dst, const float* src, int64_t n) const override { cpu().copy(h(dst), h(src), n); }
  void fill(float* dst, double v, int64_t n) const override { cpu().fill(h(dst), v, n); }
  void copy_rows(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) const override {
    cpu().copy_rows(h(dst), ldd, h(src), lds, rows, cols);
  }
  void argmax_rows(int32_t* ids, uint8_t* nonfinite, const float* logits, int64_t ld, int64_t V, const int64_t* rows,
                   int64_t n) const override {
    cpu().argmax_rows(ids, nonfinite, h(logits), ld, V, rows, n);  // ids, nonfinite and rows are host arrays
  }

 private:
  static const Ops& cpu() { return cpu_ops<float>(); }
  mutable std::mutex mu_;
  mutable HostExperts x1_, x3_, x2_;
};

}  // namespace

template <typename T>
T* emulated_host(T* p) {
  if (!p) return p;
  return reinterpret_cast<T*>(untag_bits(p));
}

template float* emulated_host(float*);
template const float* emulated_host(const float*);
template int32_t* emulated_host(int32_t*);
template const int32_t* emulated_host(const int32_t*);
template const uint16_t* emulated_host(const uint16_t*);
template void* emulated_host(void*);

Device* emulated_device() {
  static EmulatedDevice dev;
  return &dev;
}

std::shared_ptr<const Ops> emulated_ops() {
  static const auto ops = std::make_shared<EmulatedOps>();
  return ops;
}

}  // namespace k3::test
