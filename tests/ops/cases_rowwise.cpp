// Op cases: the row-wise and elementwise ops (norms, short conv with carried state, KDA gate,
// SiTU-GLU at its caps, AttnRes reads, embedding rows, the elementwise helpers). Reference:
// the kernels' plain templates in double on the same inputs.
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "kernels/activations.h"
#include "kernels/attn_res.h"
#include "kernels/kda_gate.h"
#include "kernels/norm.h"
#include "kernels/shortconv.h"
#include "ops/op_harness.h"

namespace k3::test {

namespace {

OpOutput out(const std::string& name, std::vector<double> got, std::vector<double> want, double tol) {
  OpOutput o;
  o.name = name;
  o.got = std::move(got);
  o.want = std::move(want);
  o.tol = tol;
  return o;
}

// f32 arithmetic of a few operations per element: about 1e-7 relative.
constexpr double kElemTol = 2e-6;

// The input rows strided by dim + pad (the MLA cache append reads c_kv out of [c_kv | k_rope]
// rows), the output rows packed.
OpCase rmsnorm_case(int64_t rows, int64_t dim, int64_t pad, bool with_rstd, double scale) {
  OpCase c;
  c.op = "rmsnorm";
  c.name = "rows=" + std::to_string(rows) + " dim=" + std::to_string(dim) + (pad ? " strided input" : "") +
           (with_rstd ? " rstd" : "") + (scale != 1 ? " scale=" + std::to_string(scale) : "");
  c.bytes = 8.0 * double(rows * dim);
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool) {
    std::mt19937_64 rng(seed);
    const int64_t ldx = dim + pad;
    std::vector<float> x = rand_f(rng, size_t(rows * ldx), scale), w = rand_f(rng, static_cast<size_t>(dim), 1.0, 1.0);
    std::vector<double> want(size_t(rows * dim)), rstd(static_cast<size_t>(rows));
    std::vector<double> xd = widen(x), wd = widen(w);
    for (int64_t r = 0; r < rows; ++r)
      rmsnorm_forward<double>(want.data() + r * dim, rstd.data() + r, xd.data() + r * ldx, wd.data(), 1, dim, 1e-5);
    float* y = b.out(want.size());
    float* rs = with_rstd ? b.out(static_cast<size_t>(rows)) : nullptr;
    const float *xd_ = b.f(x), *wd_ = b.f(w);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->rmsnorm(y, dim, rs, xd_, ldx, wd_, rows, dim, 1e-5); };
    po.outputs = [=, &b] {
      std::vector<OpOutput> o = {out("y", widen(b.read(y, want.size())), want, kElemTol)};
      if (with_rstd) o.push_back(out("rstd", widen(b.read(rs, static_cast<size_t>(rows))), rstd, kElemTol));
      return o;
    };
    return po;
  };
  return c;
}

OpCase l2norm_case(int64_t rows, int64_t dim) {
  OpCase c;
  c.op = "l2norm";
  c.name = "rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
  c.bytes = 8.0 * double(rows * dim);
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool) {
    std::mt19937_64 rng(seed);
    std::vector<float> x = rand_f(rng, size_t(rows * dim));
    std::vector<double> want(x.size()), inv(static_cast<size_t>(rows)), xd = widen(x);
    l2norm_forward<double>(want.data(), inv.data(), xd.data(), rows, dim, 1e-6);
    float* y = b.out(x.size());
    float* iv = b.out(static_cast<size_t>(rows));
    const float* xd_ = b.f(x);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->l2norm(y, iv, xd_, rows, dim, 1e-6); };
    const size_t n = x.size();
    po.outputs = [=, &b] {
      return std::vector<OpOutput>{out("y", widen(b.read(y, n)), want, kElemTol),
                                   out("inv", widen(b.read(iv, size_t(rows))), inv, kElemTol)};
    };
    return po;
  };
  return c;
}

OpCase shortconv_case(int64_t T, int64_t C, int64_t K) {
  OpCase c;
  c.op = "shortconv_silu";
  c.name = "T=" + std::to_string(T) + " C=" + std::to_string(C) + " K=" + std::to_string(K) + " carried state";
  c.bytes = 8.0 * double(T * C);
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool) {
    std::mt19937_64 rng(seed);
    std::vector<float> x = rand_f(rng, size_t(T * C)), w = rand_f(rng, size_t(C * K), 0.5);
    std::vector<float> st = rand_f(rng, size_t(C * (K - 1)));
    std::vector<double> y(x.size()), pre(x.size()), xd = widen(x), wd = widen(w), sd = widen(st);
    shortconv_silu_forward<double>(y.data(), pre.data(), sd.data(), xd.data(), wd.data(), T, C, K);
    float* yo = b.out(x.size());
    float* pr = b.out(x.size());
    float* so = b.f(st);
    const float *xd_ = b.f(x), *wd_ = b.f(w);
    const Ops* ops = be.ops.get();
    PreparedOp p;
    p.run = [=] { ops->shortconv_silu(yo, pr, so, xd_, wd_, T, C, K); };
    const size_t n = x.size(), ns = st.size();
    p.outputs = [=, &b] {
      return std::vector<OpOutput>{out("y", widen(b.read(yo, n)), y, kElemTol), out("pre", widen(b.read(pr, n)), pre, kElemTol),
                                   out("state", widen(b.read(so, ns)), sd, 0)};
    };
    return p;
  };
  return c;
}

OpCase kda_gate_case(int64_t T, int64_t H, int64_t D, bool bounded, bool saturate) {
  OpCase c;
  c.op = "kda_gate";
  c.name = std::string(bounded ? "bounded" : "unbounded") + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " D=" + std::to_string(D) + (saturate ? " saturating" : "");
  c.bytes = 8.0 * double(T * H * D);
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool) {
    std::mt19937_64 rng(seed);
    // Saturating: logits of +-30 put the bounded gate at its floor -5 and at 0.
    std::vector<float> z = rand_f(rng, size_t(T * H * D), saturate ? 30.0 : 1.0);
    std::vector<float> A = rand_f(rng, size_t(H), 0.5), dt = rand_f(rng, size_t(H * D), 0.5);
    std::vector<double> want(z.size()), zd = widen(z), Ad = widen(A), dd = widen(dt);
    kda_gate_forward<double>(want.data(), zd.data(), Ad.data(), dd.data(), T, H, D, bounded, -5.0);
    float* g = b.out(z.size());
    const float *zd_ = b.f(z), *Ad_ = b.f(A), *dd_ = b.f(dt);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->kda_gate(g, zd_, Ad_, dd_, T, H, D, bounded, -5.0); };
    const size_t n = z.size();
    po.outputs = [=, &b] { return std::vector<OpOutput>{out("g", widen(b.read(g, n)), want, 1e-5)}; };
    return po;
  };
  return c;
}

OpCase situ_case(int64_t rows, int64_t F, double scale) {
  OpCase c;
  c.op = "situ_glu";
  c.name = "rows=" + std::to_string(rows) + " F=" + std::to_string(F) + (scale > 10 ? " beyond the caps" : "");
  c.bytes = 12.0 * double(rows * F);
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool) {
    std::mt19937_64 rng(seed);
    std::vector<float> gu = rand_f(rng, size_t(rows * 2 * F), scale);
    std::vector<double> want(size_t(rows * F)), gd = widen(gu);
    situ_glu_forward<double>(want.data(), gd.data(), rows, F, 4.0, 25.0);
    float* a = b.out(want.size());
    const float* gud = b.f(gu);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->situ_glu(a, gud, rows, F, 4.0, 25.0); };
    po.outputs = [=, &b] { return std::vector<OpOutput>{out("act", widen(b.read(a, want.size())), want, 1e-5)}; };
    return po;
  };
  return c;
}

OpCase attn_res_case(int64_t T, int64_t d, int64_t S) {
  OpCase c;
  c.op = "attn_res";
  c.name = "T=" + std::to_string(T) + " d=" + std::to_string(d) + " sources=" + std::to_string(S);
  c.bytes = 4.0 * double((S + 1) * T * d);
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<float>> src;
    std::vector<std::vector<double>> srcd;
    std::vector<const double*> sp;
    std::vector<const float*> dp;
    for (int64_t s = 0; s < S; ++s) {
      src.push_back(rand_f(rng, size_t(T * d), 1.0 + double(s)));
      srcd.push_back(widen(src.back()));
    }
    for (int64_t s = 0; s < S; ++s) sp.push_back(srcd[size_t(s)].data()), dp.push_back(b.f(src[size_t(s)]));
    std::vector<float> wn = rand_f(rng, size_t(d), 0.3, 1.0), wp = rand_f(rng, size_t(d), 0.3);
    std::vector<double> want(size_t(T * d)), alpha(size_t(T * S)), wnd = widen(wn), wpd = widen(wp);
    attn_res_forward<double>(want.data(), alpha.data(), sp.data(), S, wnd.data(), wpd.data(), T, d, 1e-5);
    float* o = b.out(want.size());
    float* a = b.out(alpha.size());
    const float *wnd_ = b.f(wn), *wpd_ = b.f(wp);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->attn_res(o, a, dp.data(), S, wnd_, wpd_, T, d, 1e-5); };
    po.outputs = [=, &b] {
      return std::vector<OpOutput>{out("out", widen(b.read(o, want.size())), want, 1e-5),
                                   out("alpha", widen(b.read(a, alpha.size())), alpha, 1e-5)};
    };
    return po;
  };
  return c;
}

OpCase embed_case(int64_t V, int64_t d, int64_t T, bool bf16) {
  OpCase c;
  c.op = "embed_rows";
  c.name = "V=" + std::to_string(V) + " d=" + std::to_string(d) + " T=" + std::to_string(T) + (bf16 ? " bf16" : " f32");
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool) {
    std::mt19937_64 rng(seed);
    std::vector<float> W = rand_f(rng, size_t(V * d));
    std::vector<uint16_t> Wh;
    if (bf16) Wh = to_bf16(W), W = from_bf16(Wh);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (auto& i : ids) i = int32_t(rng() % uint64_t(V));
    ids[0] = int32_t(V - 1);  // the last row
    std::vector<double> want(size_t(T * d));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < d; ++i) want[size_t(t * d + i)] = W[size_t(ids[size_t(t)] * d + i)];
    float* dst = b.out(want.size());
    const Mat Wd = bf16 ? Mat::from_bf16(b.u16(Wh)) : Mat(b.f(W));
    const int32_t* idd = b.i(ids);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->embed_rows(dst, Wd, idd, T, d); };
    po.outputs = [=, &b] { return std::vector<OpOutput>{out("rows", widen(b.read(dst, want.size())), want, 0)}; };
    return po;
  };
  return c;
}

// The elementwise helpers in one case each.
OpCase elementwise_case(const std::string& op, int64_t n) {
  OpCase c;
  c.op = op;
  c.name = "n=" + std::to_string(n);
  c.bytes = 12.0 * double(n);
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool) {
    std::mt19937_64 rng(seed);
    std::vector<float> x = rand_f(rng, size_t(n), 3.0), y = rand_f(rng, size_t(n));
    std::vector<double> want(static_cast<size_t>(n));
    float* yo = b.f(y);
    const float* xd_ = b.f(x);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    if (op == "add") {
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] = double(y[size_t(i)]) + x[size_t(i)];
      po.run = [=] { ops->add(yo, xd_, n); };
    } else if (op == "sigmoid") {
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] = sigmoid(double(x[size_t(i)]));
      po.run = [=] { ops->sigmoid(yo, xd_, n); };
    } else if (op == "mul_sigmoid") {
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] = double(y[size_t(i)]) * sigmoid(double(x[size_t(i)]));
      po.run = [=] { ops->mul_sigmoid(yo, yo, xd_, n); };  // in place, as the MLA gate runs it
    } else if (op == "scale") {
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] = double(y[size_t(i)]) * 0.37;
      po.run = [=] { ops->scale(yo, 0.37, n); };
    } else if (op == "copy") {
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] = x[size_t(i)];
      po.run = [=] { ops->copy(yo, xd_, n); };
    } else if (op == "fill") {
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] = 1.0;
      po.run = [=] { ops->fill(yo, 1.0, n); };
    } else {  // copy_rows: the rope columns of a [rows, 10] block into a [rows, 7] one
      const int64_t rows = n / 10;
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] = y[size_t(i)];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < 3; ++j) want[size_t(r * 7 + 2 + j)] = x[size_t(r * 10 + 5 + j)];
      po.run = [=] { ops->copy_rows(yo + 2, 7, xd_ + 5, 10, rows, 3); };
    }
    po.outputs = [=, &b] { return std::vector<OpOutput>{out(op, widen(b.read(yo, size_t(n))), want, 1e-6)}; };
    return po;
  };
  return c;
}

// Greedy decoding (argmax_rows) over a subset of rows: a row with two equal maxima (the lower
// index wins), a row with a NaN and one with an infinity (flagged), a row of K3's vocabulary.
OpCase argmax_case(int64_t V) {
  OpCase c;
  c.op = "argmax_rows";
  c.name = "V=" + std::to_string(V) + " ties, NaN and infinity rows";
  c.bytes = 4.0 * 5 * double(V);
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool) {
    std::mt19937_64 rng(seed);
    const int64_t R = 6, ld = V + 3;
    std::vector<float> l = rand_f(rng, size_t(R * ld), 2.0);
    l[size_t(1 * ld + 17)] = l[size_t(1 * ld + V - 5)] = 50.f;       // row 1: a tie, index 17 wins
    l[size_t(2 * ld + 3)] = std::numeric_limits<float>::quiet_NaN();  // row 2: flagged
    l[size_t(4 * ld + V - 1)] = std::numeric_limits<float>::infinity();  // row 4: flagged
    const std::vector<int64_t> rows = {5, 1, 2, 0, 4};
    std::vector<double> want_id, want_bad;
    for (int64_t r : rows) {
      int64_t best = 0;
      bool bad = false;
      for (int64_t v = 0; v < V; ++v) {
        bad |= !std::isfinite(l[size_t(r * ld + v)]);
        if (l[size_t(r * ld + v)] > l[size_t(r * ld + best)]) best = v;
      }
      want_id.push_back(bad ? -1.0 : double(best));
      want_bad.push_back(bad);
    }
    const float* ld_ = b.f(l);
    auto ids = std::make_shared<std::vector<int32_t>>(rows.size(), -7);
    auto bad = std::make_shared<std::vector<uint8_t>>(rows.size(), 9);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->argmax_rows(ids->data(), bad->data(), ld_, ld, V, rows.data(), int64_t(rows.size())); };
    po.outputs = [=] {
      std::vector<double> got_id, got_bad;
      for (size_t i = 0; i < rows.size(); ++i) {
        got_id.push_back((*bad)[i] ? -1.0 : double((*ids)[i]));  // a flagged row's id is unspecified
        got_bad.push_back(double((*bad)[i]));
      }
      return std::vector<OpOutput>{out("ids", got_id, want_id, 0), out("nonfinite", got_bad, want_bad, 0)};
    };
    return po;
  };
  return c;
}

}  // namespace

void add_rowwise_cases(std::vector<OpCase>& t) {
  t.push_back(argmax_case(1000));
  t.push_back(argmax_case(163840));
  t.push_back(rmsnorm_case(7, 96, 0, true, 1.0));
  t.push_back(rmsnorm_case(5, 160, 32, false, 1.0));  // the MLA cache append: strided input
  t.push_back(rmsnorm_case(3, 1000, 0, true, 1e4));   // large values
  t.push_back(rmsnorm_case(4, 64, 0, true, 1e-3));    // small values: eps matters
  t.push_back(l2norm_case(48, 32));
  t.push_back(shortconv_case(1, 96, 4));   // a decode step reads the carried state only
  t.push_back(shortconv_case(2, 64, 4));   // fewer tokens than the state: the state shifts
  t.push_back(shortconv_case(37, 80, 4));
  for (bool bounded : {true, false})
    for (bool sat : {false, true}) t.push_back(kda_gate_case(9, 3, 16, bounded, sat));
  t.push_back(situ_case(9, 40, 1.0));
  t.push_back(situ_case(5, 64, 60.0));  // |g|, |u| far beyond the caps 4 and 25
  t.push_back(attn_res_case(6, 80, 1));
  t.push_back(attn_res_case(5, 96, 3));
  t.push_back(attn_res_case(4, 64, 9));  // K3 has 8 blocks + the partial sum at the output read
  t.push_back(embed_case(50, 48, 9, false));
  t.push_back(embed_case(50, 48, 9, true));
  for (const char* op : {"add", "sigmoid", "mul_sigmoid", "scale", "copy", "fill", "copy_rows"})
    t.push_back(elementwise_case(op, 1000));
  // K3's widths (performance mode).
  OpCase big = rmsnorm_case(4096, 7168, 0, true, 1.0);
  big.perf_only = true;
  t.push_back(big);
}

}  // namespace k3::test
