// The op harness's backends, buffers, comparison and table (see op_harness.h).
#include "ops/op_harness.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "common/emulated_backend.h"
#include "core/dtype.h"
#ifdef K3_HAVE_CUDA
#include "cuda/cuda_device.h"
#include "cuda/cuda_ops.h"
#endif

namespace k3::test {

const std::vector<HarnessBackend>& harness_backends() {
  static const std::vector<HarnessBackend> b = [] {
    std::vector<HarnessBackend> v;
    v.push_back({"cpu", std::shared_ptr<const Ops>(&cpu_ops<float>(), [](const Ops*) {}), "", false});
    v.push_back({"emulated", emulated_ops(), "", false});
#ifdef K3_HAVE_CUDA
    if (cuda::cuda_available())
      v.push_back({"cuda", cuda::make_cuda_ops(0), "", true});
    else
      v.push_back({"cuda", nullptr, "no usable GPU: " + cuda::describe_cuda(), true});
#else
    v.push_back({"cuda", nullptr, "this build has no CUDA backend (no nvcc at configure time)", true});
#endif
    return v;
  }();
  return b;
}

float* OpBuffers::f(const std::vector<float>& h) {
  auto b = std::make_shared<Buf<float>>();
  b->place(dev_);
  b->append(h.data(), h.size());
  f_.push_back(b);
  return b->data();
}

int32_t* OpBuffers::i(const std::vector<int32_t>& h) {
  auto b = std::make_shared<Buf<int32_t>>();
  b->place(dev_);
  b->append(h.data(), h.size());
  i_.push_back(b);
  return b->data();
}

const uint16_t* OpBuffers::u16(const std::vector<uint16_t>& h) {
  auto b = std::make_shared<Buf<uint16_t>>();
  b->place(dev_);
  b->append(h.data(), h.size());
  u_.push_back(b);
  return b->data();
}

float* OpBuffers::out(size_t n) { return f(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN())); }

int32_t* OpBuffers::out_i(size_t n) { return i(std::vector<int32_t>(n, -1)); }

std::vector<float> OpBuffers::read(const float* p, size_t n) const {
  std::vector<float> h(n);
  copy_between(nullptr, h.data(), dev_, p, n * sizeof(float));
  return h;
}

std::vector<int32_t> OpBuffers::read_i(const int32_t* p, size_t n) const {
  std::vector<int32_t> h(n);
  copy_between(nullptr, h.data(), dev_, p, n * sizeof(int32_t));
  return h;
}

const ExpertMatrix* OpBuffers::experts_mx(const std::vector<Mxfp4Matrix>& host) {
  std::vector<Mxfp4Matrix> dev(host.size());
  for (size_t e = 0; e < host.size(); ++e) {
    for (int part = 0; part < 2; ++part) {
      const Tensor& t = part == 0 ? host[e].packed : host[e].scales;
      auto b = std::make_shared<Buf<uint8_t>>();
      b->place(dev_);
      b->append(static_cast<const uint8_t*>(t.raw()), t.nbytes());
      b_.push_back(b);
      (part == 0 ? dev[e].packed : dev[e].scales) = Tensor::view_of(t.dtype(), t.shape(), b->data(), b);
    }
    dev[e].rows = host[e].rows;
    dev[e].cols = host[e].cols;
  }
  mx_.push_back(std::move(dev));
  std::vector<ExpertMatrix> m(host.size());
  for (size_t e = 0; e < host.size(); ++e) m[e] = {nullptr, &mx_.back()[e], host[e].rows, host[e].cols};
  em_.push_back(std::move(m));
  return em_.back().data();
}

const ExpertMatrix* OpBuffers::experts_f32(const std::vector<std::vector<float>>& host, int64_t rows, int64_t cols) {
  std::vector<ExpertMatrix> m(host.size());
  for (size_t e = 0; e < host.size(); ++e) m[e] = {f(host[e]), nullptr, rows, cols};
  em_.push_back(std::move(m));
  return em_.back().data();
}

std::vector<float> rand_f(std::mt19937_64& rng, size_t n, double sd, double mean) {
  std::normal_distribution<double> d(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = float(d(rng));
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = f32_to_bf16(v[i]);
  return r;
}

std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_to_f32(v[i]);
  return r;
}

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

Comparison compare(const OpOutput& o) {
  std::ostringstream os;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (o.got.size() != o.want.size()) {
    os << o.name << ": " << o.got.size() << " values, the reference has " << o.want.size();
    return {os.str(), nan};
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < o.got.size(); ++i) {
    if (std::isnan(o.want[i])) {  // a NaN the reference propagates (a NaN input): the same here
      if (!std::isnan(o.got[i])) {
        os << o.name << "[" << i << "] = " << o.got[i] << ", the reference propagates a NaN there";
        return {os.str(), nan};
      }
      continue;
    }
    if (std::isfinite(o.want[i]) && !std::isfinite(o.got[i])) {
      os << o.name << "[" << i << "] = " << o.got[i] << " (reference " << o.want[i]
         << "): not finite (an element never written reads as the poison NaN)";
      return {os.str(), nan};
    }
    const double e = o.got[i] - o.want[i];
    num += e * e;
    den += o.want[i] * o.want[i];
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (!(rel <= o.tol)) {
    os << o.name << ": relative RMS error " << rel << " > tolerance " << o.tol;
    return {os.str(), rel};
  }
  return {"", rel};
}

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> t = [] {
    std::vector<OpCase> v;
    add_product_cases(v);
    add_rowwise_cases(v);
    add_kda_cases(v);
    add_attention_cases(v);
    add_moe_cases(v);
    return v;
  }();
  return t;
}

}  // namespace k3::test
