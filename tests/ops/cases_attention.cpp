// Op cases: causal attention (kernels/attention.h; docs/model.md section 4): the expanded MLA
// prefill (a head's own keys and values beside the shared k_rope part), with and without a
// cached prefix, and the absorbed decode (one kv head shared by every query head: the latent
// cache), over prefixes longer than one key split. Reference: the plain loop in double.
#include <cmath>
#include <memory>
#include <string>

#include "kernels/attention.h"
#include "ops/op_harness.h"

namespace k3::test {

namespace {

OpCase attention_case(int64_t Tq, int64_t P, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dr, int64_t Dv,
                      bool perf_only = false) {
  OpCase c;
  c.op = "attention";
  c.name = (Hkv == 1 && H > 1 ? std::string("absorbed decode") : std::string("prefill")) + " Tq=" + std::to_string(Tq) +
           " P=" + std::to_string(P) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) + " Dk=" +
           std::to_string(Dk) + "+" + std::to_string(Dr) + " Dv=" + std::to_string(Dv);
  c.perf_only = perf_only;
  const double pairs = double(Tq) * double(P) + double(Tq) * double(Tq + 1) / 2;
  c.flops = 2.0 * pairs * double(H) * double(Dk + Dr + Dv);
  c.bytes = 4.0 * double((P + Tq) * (Hkv * (Dk + Dv) + Dr) + Tq * H * (Dk + Dr + Dv));
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool reference) {
    std::mt19937_64 rng(seed);
    const int64_t Tk = P + Tq;
    std::vector<float> q = rand_f(rng, size_t(Tq * H * (Dk + Dr))), k = rand_f(rng, size_t(Tk * Hkv * Dk));
    std::vector<float> kr = rand_f(rng, size_t(Tk * std::max<int64_t>(Dr, 1))), v = rand_f(rng, size_t(Tk * Hkv * Dv));
    AttentionDims ad;
    ad.Tq = Tq;
    ad.P = P;
    ad.H = H;
    ad.Hkv = Hkv;
    ad.Dk = Dk;
    ad.Dr = Dr;
    ad.Dv = Dv;
    ad.scale = 1.0 / std::sqrt(double(Dk + Dr));
    auto o = std::make_shared<std::vector<double>>(), lse = std::make_shared<std::vector<double>>();
    if (reference) {
      o->resize(size_t(Tq * H * Dv));
      lse->resize(size_t(Tq * H));
      std::vector<double> qd = widen(q), kd = widen(k), krd = widen(kr), vd = widen(v);
      attention_forward_ref<double>(o->data(), qd.data(), kd.data(), Dr ? krd.data() : nullptr, vd.data(), ad,
                                    lse->data());
    }
    const size_t no = size_t(Tq * H * Dv), nl = size_t(Tq * H);
    float* od = b.out(no);
    float* ld = b.out(nl);
    auto scratch = std::make_shared<AttentionScratch>();
    const float *qd = b.f(q), *kd = b.f(k), *krd = Dr ? b.f(kr) : nullptr, *vd = b.f(v);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->attention(od, qd, kd, krd, vd, ad, *scratch, ld); };
    po.outputs = [=, &b] {
      return std::vector<OpOutput>{{"o", widen(b.read(od, no)), *o, 1e-5}, {"lse", widen(b.read(ld, nl)), *lse, 1e-6}};
    };
    return po;
  };
  return c;
}

}  // namespace

void add_attention_cases(std::vector<OpCase>& t) {
  t.push_back(attention_case(9, 0, 3, 3, 16, 8, 16));     // prefill from an empty cache
  t.push_back(attention_case(40, 25, 2, 2, 24, 8, 20));   // a chunk after a cached prefix
  t.push_back(attention_case(5, 0, 4, 2, 16, 0, 16));     // grouped kv heads, no shared part
  t.push_back(attention_case(1, 700, 6, 1, 64, 16, 64));  // absorbed decode past one key split
  t.push_back(attention_case(3, 1100, 4, 1, 32, 8, 32));  // several decode tokens, three splits
  // K3's widths (performance mode): an 8K-token MLA prefill and a decode step at 8K.
  t.push_back(attention_case(8192, 0, 96, 96, 128, 64, 128, true));
  t.push_back(attention_case(1, 8192, 96, 1, 512, 64, 512, true));
}

}  // namespace k3::test
