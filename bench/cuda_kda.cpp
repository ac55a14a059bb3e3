// Benchmark of the chunked KDA forward on the GPU (cuda/kernels.h launch_kda_chunk;
// docs/cuda-kda.md, docs/benchmarks.md "CUDA"): K3's KDA shape B = 1, T = 8192, H = 96,
// K = V = 128, f32 inputs and outputs (the launcher's contract), bf16 tensor-core products.
// Prints, in one table: the two ceilings measured in the same run (device-to-device copy
// bandwidth, counting bytes read plus written; cuBLAS bf16 GEMM 8192^3), then per variant
// (dense diagonal = the bounded-gate claim; safe diagonal = the separate per-pair path) the
// median / min / max time over many launches timed with CUDA events after warm-up, TFLOP/s from
// the nominal FLOP count of kernels/kda_fast.h kda_chunk_fast_flops (the CPU kernel's products,
// the same count for both variants), the achieved bandwidth over the fewest bytes the call must
// move, and the error against the double recurrence on a smaller shape (T = 1024, H = 4).
// A plain main (not Google Benchmark): device work is timed with events, not host clocks.
// Without a GPU it prints why and exits 0 (skipped).
//   bench_cuda_kda [T] [H] [repeats]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_device.h"
#include "cuda/kernels.h"
#include "kernels/kda.h"
#include "kernels/kda_fast.h"

using namespace k3;

namespace {

constexpr int64_t kD = 128;

struct Rng {  // splitmix64: fast enough for 10^9 values
  uint64_t s;
  float uni() {  // [0, 1)
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return float((z ^ (z >> 31)) >> 40) * 0x1p-24f;
  }
  float sym() { return 2.f * uni() - 1.f; }
};

struct Host {
  int64_t T, H;
  std::vector<float> q, k, v, g, beta;
};

// q, k unit rows, v ~ U(-1.7, 1.7) (unit variance), beta ~ U(0, 1); g from K3's bounded gate
// (-5 sigmoid(z), most channels slow, every 8th channel at the floor -5), or for `unbounded`
// -softplus(z) with every 4th channel in [-50, -20].
Host make(int64_t T, int64_t H, bool unbounded, uint64_t seed) {
  Rng r{seed};
  Host h{T, H, {}, {}, {}, {}, {}};
  const int64_t n = T * H * kD;
  h.q.resize(n), h.k.resize(n), h.v.resize(n), h.g.resize(n), h.beta.resize(T * H);
  for (auto* x : {&h.q, &h.k})
    for (int64_t row = 0; row < T * H; ++row) {
      float* p = x->data() + row * kD;
      double ss = 0;
      for (int64_t c = 0; c < kD; ++c) {
        p[c] = r.sym();
        ss += double(p[c]) * p[c];
      }
      const float inv = float(1 / std::sqrt(ss));
      for (int64_t c = 0; c < kD; ++c) p[c] *= inv;
    }
  for (auto& e : h.v) e = 1.7f * r.sym();
  for (auto& e : h.beta) e = r.uni();
  for (int64_t i = 0; i < n; ++i) {
    const float z = 6.f * r.sym() - 3.f;
    if (unbounded)
      h.g[i] = i % 4 == 0 ? -20.f - 30.f * r.uni() : -std::log1p(std::exp(z));
    else
      h.g[i] = i % 8 == 0 ? -5.f : -5.f / (1.f + std::exp(-z));
  }
  return h;
}

struct Dev {
  float *q, *k, *v, *g, *beta, *o, *s;
};

Dev upload(cuda::CudaDevice& dev, const Host& h) {
  Dev d{};
  const int64_t n = h.T * h.H * kD;
  float** bufs[] = {&d.q, &d.k, &d.v, &d.g, &d.o};
  for (float** b : bufs) *b = static_cast<float*>(dev.alloc(size_t(n) * 4));
  d.beta = static_cast<float*>(dev.alloc(size_t(h.T * h.H) * 4));
  d.s = static_cast<float*>(dev.alloc(size_t(h.H * kD * kD) * 4));
  dev.to_device(d.q, h.q.data(), size_t(n) * 4);
  dev.to_device(d.k, h.k.data(), size_t(n) * 4);
  dev.to_device(d.v, h.v.data(), size_t(n) * 4);
  dev.to_device(d.g, h.g.data(), size_t(n) * 4);
  dev.to_device(d.beta, h.beta.data(), size_t(h.T * h.H) * 4);
  return d;
}
void release(cuda::CudaDevice& dev, Dev& d) {
  for (float* p : {d.q, d.k, d.v, d.g, d.beta, d.o, d.s}) dev.release(p);
}

void launch(cudaStream_t st, const Dev& d, int64_t T, int64_t H, bool dense) {
  cuda::launch_kda_chunk(st, d.o, d.s, d.q, d.k, d.v, d.g, d.beta, T, H, kD, kD, float(1 / std::sqrt(double(kD))),
                         dense);
}

struct Stats {
  double median, min, max;
};
template <class F>
Stats time_ms(cudaStream_t st, int warmup, int reps, F f) {
  cudaEvent_t a, b;
  K3_CUDA_CHECK(cudaEventCreate(&a));
  K3_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f();
  K3_CUDA_CHECK(cudaStreamSynchronize(st));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    K3_CUDA_CHECK(cudaEventRecord(a, st));
    f();
    K3_CUDA_CHECK(cudaEventRecord(b, st));
    K3_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    K3_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  K3_CUDA_CHECK(cudaEventDestroy(a));
  K3_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back()};
}

// Ceilings measured in this run: copy bandwidth (bytes read + written per second) and the cuBLAS
// bf16 GEMM rate (random data).
double copy_tbs(cuda::CudaDevice& dev) {
  const size_t n = size_t(1) << 31;  // 2 GiB
  void* a = dev.alloc(n);
  void* b = dev.alloc(n);
  K3_CUDA_CHECK(cudaMemsetAsync(a, 0x3c, n, dev.stream()));
  const Stats s = time_ms(dev.stream(), 2, 10, [&] { K3_CUDA_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, dev.stream())); });
  dev.release(a);
  dev.release(b);
  return 2.0 * double(n) / (s.median * 1e-3) / 1e12;
}
double gemm_tflops(cuda::CudaDevice& dev) {
  const int n = 8192;
  const size_t e = size_t(n) * n;
  std::vector<__nv_bfloat16> h(e);
  Rng r{7};
  for (auto& x : h) x = __float2bfloat16(r.sym());
  auto* A = static_cast<__nv_bfloat16*>(dev.alloc(e * 2));
  auto* B = static_cast<__nv_bfloat16*>(dev.alloc(e * 2));
  auto* C = static_cast<__nv_bfloat16*>(dev.alloc(e * 2));
  dev.to_device(A, h.data(), e * 2);
  dev.to_device(B, h.data(), e * 2);
  cublasHandle_t hd;
  K3_CUBLAS_CHECK(cublasCreate(&hd));
  K3_CUBLAS_CHECK(cublasSetStream(hd, dev.stream()));
  const float one = 1.f, zero = 0.f;
  const Stats s = time_ms(dev.stream(), 3, 10, [&] {
    K3_CUBLAS_CHECK(cublasGemmEx(hd, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n,
                                 &zero, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  K3_CUBLAS_CHECK(cublasDestroy(hd));
  for (void* p : {static_cast<void*>(A), static_cast<void*>(B), static_cast<void*>(C)}) dev.release(p);
  return 2.0 * double(n) * n * n / (s.median * 1e-3) / 1e12;
}

// Relative RMS error of o and of the final state against the double recurrence (zero initial
// state), T = 1024, H = 4.
void error_vs_reference(cuda::CudaDevice& dev, bool dense, bool unbounded, double* eo, double* es) {
  const int64_t T = 1024, H = 4;
  const Host h = make(T, H, unbounded, unbounded ? 11 : 12);
  Dev d = upload(dev, h);
  K3_CUDA_CHECK(cudaMemsetAsync(d.s, 0, size_t(H * kD * kD) * 4, dev.stream()));
  K3_CUDA_CHECK(cudaMemsetAsync(d.o, 0xff, size_t(T * H * kD) * 4, dev.stream()));  // NaN poison
  launch(dev.stream(), d, T, H, dense);
  std::vector<float> o(T * H * kD), s(H * kD * kD);
  dev.to_host(o.data(), d.o, o.size() * 4);
  dev.to_host(s.data(), d.s, s.size() * 4);
  release(dev, d);
  auto dbl = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const auto q = dbl(h.q), k = dbl(h.k), v = dbl(h.v), g = dbl(h.g), b = dbl(h.beta);
  std::vector<double> oref(o.size()), sref(s.size(), 0.0);
  kda_recurrent_forward<double>(oref.data(), sref.data(), q.data(), k.data(), v.data(), g.data(), b.data(), T, H, kD,
                                kD, 1 / std::sqrt(double(kD)));
  auto rel = [](const std::vector<float>& a, const std::vector<double>& r) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!std::isfinite(a[i])) return double(NAN);
      num += (a[i] - r[i]) * (a[i] - r[i]);
      den += r[i] * r[i];
    }
    return std::sqrt(num / den);
  };
  *eo = rel(o, oref);
  *es = rel(s, sref);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 8192, H = argc > 2 ? std::atoll(argv[2]) : 96;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 50;
  if (!cuda::cuda_available()) {
    std::printf("bench_cuda_kda: skipped: %s\n", cuda::describe_cuda().c_str());
    return 0;
  }
  try {
    cuda::CudaDevice dev(0);
    std::printf("%s\n", cuda::describe_cuda().c_str());
    const double bw = copy_tbs(dev), peak = gemm_tflops(dev);
    std::printf("ceilings measured now: copy %.2f TB/s (read + write), cuBLAS bf16 GEMM 8192^3 %.0f TFLOP/s\n", bw,
                peak);

    const double flops = kda_chunk_fast_flops(T, H, kD, kD, 64, false);
    // Fewest bytes: q, k, g, v read, o written (f32), beta, the state read and written.
    const double bytes = 4.0 * (double(T) * H * (4 * kD + kD + 1) + 2.0 * H * kD * kD);
    std::printf("shape B = 1, T = %lld, H = %lld, K = V = 128: nominal %.1f GFLOP (kda_chunk_fast_flops), %.2f GB "
                "moved at least\n",
                (long long)T, (long long)H, flops * 1e-9, bytes * 1e-9);
    std::printf("floors: matrix %.3f ms at the GEMM rate, memory %.3f ms at the copy bandwidth\n",
                flops / (peak * 1e12) * 1e3, bytes / (bw * 1e12) * 1e3);

    const Host h = make(T, H, false, 1);
    Dev d = upload(dev, h);
    struct Row {
      const char* name;
      bool dense;
      Stats t;
    };
    std::vector<Row> rows = {{"dense diagonal (bounded gate)", true, {}},
                             {"safe diagonal (any g <= 0)", false, {}},
                             {"dense diagonal, timed again", true, {}}};
    for (auto& r : rows) {
      K3_CUDA_CHECK(cudaMemsetAsync(d.s, 0, size_t(H * kD * kD) * 4, dev.stream()));
      r.t = time_ms(dev.stream(), 3, reps, [&] { launch(dev.stream(), d, T, H, r.dense); });
    }
    release(dev, d);

    double eo[3], es[3];
    error_vs_reference(dev, true, false, &eo[0], &es[0]);
    error_vs_reference(dev, false, false, &eo[1], &es[1]);
    error_vs_reference(dev, false, true, &eo[2], &es[2]);

    std::printf("\nKDA chunked forward on %s, %d launches after 3 warm-up, CUDA events\n", dev.name().c_str(), reps);
    std::printf("%-32s %9s %9s %9s %10s %8s %8s\n", "variant", "median ms", "min ms", "max ms", "TFLOP/s", "TB/s",
                "vs fla");
    for (const auto& r : rows)
      std::printf("%-32s %9.3f %9.3f %9.3f %10.1f %8.2f %7.2fx\n", r.name, r.t.median, r.t.min, r.t.max,
                  flops / (r.t.median * 1e-3) / 1e12, bytes / (r.t.median * 1e-3) / 1e12, 2.72 / r.t.median);
    std::printf("(fla chunk_kda safe_gate, same shape, bf16 inputs, H200: 2.72 ms; target <= 1.8 ms)\n");
    std::printf("\nerror vs the double recurrence, T = 1024, H = 4 (relative RMS; tolerance 1e-2)\n");
    std::printf("%-44s %10s %10s\n", "variant / gate", "o", "state");
    std::printf("%-44s %10.2e %10.2e\n", "dense, bounded gate (floor-pinned channels)", eo[0], es[0]);
    std::printf("%-44s %10.2e %10.2e\n", "safe, bounded gate", eo[1], es[1]);
    std::printf("%-44s %10.2e %10.2e\n", "safe, unbounded gate (g down to -50)", eo[2], es[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kda: %s\n", e.what());
    return 1;
  }
  return 0;
}
