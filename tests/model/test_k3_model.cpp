// The weight store, init recipes and the whole-model forward (model/weights.h, init.h,
// k3_model.h) on configs/tiny.json (13 layers, 9 KDA + 4 MLA, block size 3) and variants:
//  - the store is carved by the parameter table in table order, 64-byte aligned, one lookup;
//  - init is deterministic per (seed, name) and follows its recipes;
//  - the stack equals a plain test-local wiring of docs/model.md section 2 (block list as a
//    std::vector of blocks, AttnRes in double), so the [nblocks, T, d] bookkeeping, the output
//    read, final norm and lm_head are checked independently of decoder.cpp;
//  - KDA chunked == recurrent == fast at the model level for T around the chunk length 64;
//  - causality (a prefix's logits do not depend on later tokens), last-only logits, bad ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "io/config.h"
#include "kernels/gemm.h"
#include "model/dense_ffn.h"
#include "model/init.h"
#include "model/k3_model.h"

using namespace k3;

namespace {

K3Config tiny(int64_t block_size = 0) {
  K3Config c = load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  if (block_size > 0) c.attn_res_block_size = block_size;
  return c;
}

// A random model whose every part matters: the init recipe plus random AttnRes pseudo-queries,
// norm gains and router biases (the recipe starts them at 0 / 1). Their scale 0.1 keeps the
// AttnRes softmax smooth: much larger pseudo-queries make it so peaked that float rounding
// differences between kernels grow far beyond 1e-4 over 13 layers.
WeightStore random_store(const K3Config& c, uint64_t seed, ExpertStorage ex = ExpertStorage::Plain) {
  WeightStore w = init_weights(c, {seed, ex, 0.02});
  for (size_t i = 0; i < w.layout().size(); ++i) {
    const ParamSpec& s = w.layout().spec(i);
    const InitRule r = init_rule(s);
    if (r == InitRule::Zeros || r == InitRule::Ones) {
      ParamSpec alt = s;
      alt.name += "#test";
      init_tensor(w.param(i), s.numel(), alt, InitRule::Normal, seed, 0.1, 1);
      if (r == InitRule::Ones)
        for (int64_t j = 0; j < s.numel(); ++j) w.param(i)[j] += 1.f;
    }
  }
  return w;
}

std::vector<int32_t> make_ids(int64_t T, int64_t V, uint32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(T));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& id : ids) {
    x = x * 1664525u + 1013904223u;
    id = int32_t((x >> 8) % uint32_t(V));
  }
  return ids;
}

std::vector<float> full_forward(const K3Model& m, const std::vector<int32_t>& ids, KDAPath path) {
  std::vector<float> logits(ids.size() * size_t(m.dims().V));
  DecodeState st = m.new_state();
  ForwardScratch s;
  ForwardOptions fo;
  fo.kda_path = path;
  m.forward(logits.data(), ids.data(), int64_t(ids.size()), st, s, fo);
  return logits;
}

// ---- plain test-local wiring of docs/model.md section 2 ----

// AttnRes over the sources, in double: score_s = sum_c wp_c wn_c src_s,c * rstd_s.
std::vector<float> ref_attn_res(const std::vector<const std::vector<float>*>& src, const float* wn, const float* wp,
                                int64_t T, int64_t d, double eps) {
  std::vector<float> out(size_t(T * d));
  const size_t S = src.size();
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> sc(S);
    double mx = -1e300;
    for (size_t s = 0; s < S; ++s) {
      const float* x = src[s]->data() + t * d;
      double ss = 0, dot = 0;
      for (int64_t c = 0; c < d; ++c) ss += double(x[c]) * x[c];
      const double r = 1.0 / std::sqrt(ss / double(d) + eps);
      for (int64_t c = 0; c < d; ++c) dot += double(wp[c]) * wn[c] * x[c] * r;
      sc[s] = dot;
      mx = std::max(mx, dot);
    }
    double z = 0;
    for (double& v : sc) z += (v = std::exp(v - mx));
    for (int64_t c = 0; c < d; ++c) {
      double acc = 0;
      for (size_t s = 0; s < S; ++s) acc += sc[s] / z * (*src[s])[size_t(t * d + c)];
      out[size_t(t * d + c)] = float(acc);
    }
  }
  return out;
}

std::vector<float> ref_rmsnorm(const std::vector<float>& x, const float* w, int64_t T, int64_t d, double eps) {
  std::vector<float> y(x.size());
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += double(x[size_t(t * d + c)]) * x[size_t(t * d + c)];
    const double r = 1.0 / std::sqrt(ss / double(d) + eps);
    for (int64_t c = 0; c < d; ++c) y[size_t(t * d + c)] = float(x[size_t(t * d + c)] * r * w[c]);
  }
  return y;
}

std::vector<float> reference_logits(const K3Model& m, const std::vector<int32_t>& ids) {
  const K3Config& c = m.config();
  const ModelDims& dm = m.dims();
  const int64_t T = int64_t(ids.size()), d = dm.d, V = dm.V;
  const WeightStore& w = m.weights();
  const float* embed = w.param(kModelPrefix + "embed_tokens.weight");
  std::vector<std::vector<float>> blocks;
  std::vector<float> partial(size_t(T * d));
  for (int64_t t = 0; t < T; ++t) std::copy_n(embed + ids[size_t(t)] * d, d, partial.data() + t * d);
  auto sources = [&](const std::vector<float>& p) {
    std::vector<const std::vector<float>*> s;
    for (auto& b : blocks) s.push_back(&b);
    s.push_back(&p);
    return s;
  };
  for (int64_t i = 0; i < dm.L; ++i) {
    const LayerWeights& L = m.layer(i);
    std::vector<float> x = blocks.empty() ? partial : ref_attn_res(sources(partial), L.attn_res_norm, L.attn_res_proj, T, d, dm.eps);
    if (i % c.attn_res_block_size == 0) {
      blocks.push_back(partial);
      partial.clear();
    }
    std::vector<float> h = ref_rmsnorm(x, L.input_norm, T, d, dm.eps), a(size_t(T * d));
    if (L.is_mla) {
      MLACache cache;
      MLAScratch s;
      mla_mixer_forward(a.data(), cache, h.data(), L.mla, dm.mla_dims, T, s);
    } else {
      KDAState st;
      st.reset(dm.kda);
      KDAScratch s;
      kda_mixer_forward<float>(a.data(), st, h.data(), L.kda, dm.kda, T, KDAPath::Recurrent, s);
    }
    if (partial.empty()) partial = a;
    else for (size_t j = 0; j < a.size(); ++j) partial[j] += a[j];
    x = ref_attn_res(sources(partial), L.mlp_res_norm, L.mlp_res_proj, T, d, dm.eps);
    h = ref_rmsnorm(x, L.post_norm, T, d, dm.eps);
    std::vector<float> f(size_t(T * d));
    if (L.is_moe) {
      MoEScratch s;
      latent_moe_forward_dense_reference(f.data(), h.data(), L.moe, dm.moe, T, s);
    } else {
      std::vector<float> gu(size_t(T * 2 * dm.dense_I)), act(size_t(T * dm.dense_I));
      dense_ffn_forward<float>(f.data(), gu.data(), act.data(), h.data(), L.dense_gate, L.dense_up, L.dense_down, T, d,
                               dm.dense_I, dm.situ_b1, dm.situ_b2);
    }
    for (size_t j = 0; j < f.size(); ++j) partial[j] += f[j];
  }
  std::vector<float> hout = ref_attn_res(sources(partial), w.param(kOutputAttnResNormName),
                                         w.param(kOutputAttnResProjName), T, d, dm.eps);
  std::vector<float> hn = ref_rmsnorm(hout, w.param(kModelPrefix + "norm.weight"), T, d, dm.eps);
  const float* head = c.tie_word_embeddings ? embed : w.param(kLmHeadName);
  std::vector<float> logits(size_t(T * V));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t j = 0; j < d; ++j) acc += double(hn[size_t(t * d + j)]) * head[v * d + j];
      logits[size_t(t * V + v)] = float(acc);
    }
  return logits;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

}  // namespace

TEST(WeightStore, CarvedByTheTableInOrderAligned) {
  const K3Config c = tiny();
  const std::vector<ParamSpec> specs = k3_param_specs(c);
  WeightStore w(c, ExpertStorage::Plain);
  const ParamLayout& lay = w.layout();
  ASSERT_EQ(lay.size(), specs.size());
  int64_t prev_end = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(lay.spec(i).name, specs[i].name);
    EXPECT_EQ(lay.offset(i) % ParamLayout::kParamAlign, 0) << specs[i].name;
    EXPECT_GE(lay.offset(i), prev_end) << specs[i].name;  // table order, no overlap
    EXPECT_LT(lay.offset(i) - prev_end, ParamLayout::kParamAlign);  // no gap beyond padding
    prev_end = lay.offset(i) + specs[i].numel();
    EXPECT_EQ(lay.find(specs[i].name), int64_t(i));
    EXPECT_EQ(w.param(specs[i].name), w.data() + lay.offset(i));
  }
  EXPECT_LE(prev_end, lay.total_floats());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data()) % 64, 0u);
  EXPECT_EQ(lay.find("language_model.model.layers.99.input_layernorm.weight"), -1);
  EXPECT_THROW(lay.index("nope"), Error);
  // A tensor view shares the buffer.
  const size_t i = lay.index(kLmHeadName);
  Tensor t = w.tensor(i);
  EXPECT_EQ(t.shape(), specs[i].shape);
  EXPECT_EQ(t.data<float>(), w.param(i));
  // Views over a mirror buffer (a gradient buffer) sit at the same offsets.
  std::vector<float> grads(size_t(lay.total_floats()));
  for (int64_t l : {0, 1, 3}) {
    const LayerWeights a = layer_weights(w, l), g = layer_views(lay, c, grads.data(), l);
    EXPECT_EQ(g.input_norm - grads.data(), a.input_norm - w.data());
    EXPECT_EQ(g.mlp_res_proj - grads.data(), a.mlp_res_proj - w.data());
    if (a.is_mla) {
      EXPECT_EQ(g.mla.kv_b_proj - grads.data(), a.mla.kv_b_proj - w.data());
    } else {
      EXPECT_EQ(g.kda.dt_bias - grads.data(), a.kda.dt_bias - w.data());
    }
    if (a.is_moe) {
      EXPECT_EQ(g.moe.w2[7].f32 - grads.data(), a.moe.w2[7].f32 - w.data());
    } else {
      EXPECT_EQ(g.dense_down - grads.data(), a.dense_down - w.data());
    }
  }
}

TEST(WeightStore, Mxfp4ExpertsHaveNoBufferSlot) {
  K3Config c = tiny();
  c.moe_intermediate_size = 64;
  WeightStore plain(c, ExpertStorage::Plain), mx(c, ExpertStorage::Mxfp4);
  int64_t expert_floats = 0;
  for (size_t i = 0; i < mx.layout().size(); ++i) {
    const ParamSpec& s = mx.layout().spec(i);
    const bool routed = s.component == Component::RoutedExperts;
    EXPECT_EQ(mx.layout().in_buffer(i), !routed) << s.name;
    if (routed) expert_floats += s.numel();
  }
  EXPECT_GT(expert_floats, 0);
  EXPECT_EQ(plain.size() - mx.size(), expert_floats);  // expert sizes are multiples of 16
}

TEST(Init, DeterministicPerSeedAndName) {
  const K3Config c = tiny();
  WeightStore a = init_weights(c, {7}), b = init_weights(c, {7}), z = init_weights(c, {8});
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.size()) * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a.data(), z.data(), size_t(a.size()) * sizeof(float)));
  // A tensor's values depend only on (seed, name, shape, rule): drawn alone they are the same.
  for (size_t i = 0; i < a.layout().size(); i += 7) {
    const ParamSpec& s = a.layout().spec(i);
    std::vector<float> alone(size_t(s.numel()));
    init_tensor(alone.data(), s.numel(), s, init_rule(s), 7, 0.02, c.num_hidden_layers);
    ASSERT_EQ(0, std::memcmp(alone.data(), a.param(i), alone.size() * sizeof(float))) << s.name;
  }
}

TEST(Init, FollowsTheRecipes) {
  const K3Config c = tiny();
  WeightStore w = init_weights(c, {3});
  const double sd = 0.02, scaled = 0.02 / std::sqrt(2.0 * double(c.num_hidden_layers));
  double n_sum2 = 0, s_sum2 = 0;
  int64_t n_cnt = 0, s_cnt = 0;
  std::map<InitRule, int> seen;
  for (size_t i = 0; i < w.layout().size(); ++i) {
    const ParamSpec& s = w.layout().spec(i);
    const float* p = w.param(i);
    const InitRule r = init_rule(s);
    ++seen[r];
    for (int64_t j = 0; j < s.numel(); ++j) {
      const double v = p[j];
      ASSERT_TRUE(std::isfinite(v)) << s.name;
      switch (r) {
        case InitRule::Zeros: ASSERT_EQ(v, 0.0) << s.name; break;
        case InitRule::Ones: ASSERT_EQ(v, 1.0) << s.name; break;
        case InitRule::ALog: ASSERT_TRUE(v >= 0 && v <= std::log(16.0) + 1e-6) << s.name; break;
        case InitRule::DtBias: {
          const double dt = std::log1p(std::exp(v));  // softplus(dt_bias) = dt
          ASSERT_TRUE(dt >= 1e-3 * 0.999 && dt <= 0.1 * 1.001) << s.name << " " << dt;
          break;
        }
        case InitRule::ConvUniform: ASSERT_LE(std::fabs(v), 1.0 / std::sqrt(double(s.shape[2]))) << s.name; break;
        case InitRule::Normal: n_sum2 += v * v, ++n_cnt; break;
        case InitRule::ScaledNormal: s_sum2 += v * v, ++s_cnt; break;
      }
    }
  }
  for (InitRule r : {InitRule::Zeros, InitRule::Ones, InitRule::ALog, InitRule::DtBias, InitRule::ConvUniform,
                     InitRule::Normal, InitRule::ScaledNormal})
    EXPECT_GT(seen[r], 0) << init_rule_name(r);
  EXPECT_NEAR(std::sqrt(n_sum2 / double(n_cnt)), sd, 0.02 * sd);
  EXPECT_NEAR(std::sqrt(s_sum2 / double(s_cnt)), scaled, 0.02 * scaled);
  // The rules by name.
  auto rule = [&](const std::string& n) { return init_rule(w.layout().spec(w.layout().index(n))); };
  EXPECT_EQ(rule(layer_prefix(1) + "self_attention_res_proj.weight"), InitRule::Zeros);
  EXPECT_EQ(rule(layer_prefix(1) + "mlp_res_norm.weight"), InitRule::Ones);
  EXPECT_EQ(rule(kOutputAttnResProjName), InitRule::Zeros);
  EXPECT_EQ(rule(layer_prefix(1) + "block_sparse_moe.gate.e_score_correction_bias"), InitRule::Zeros);
  EXPECT_EQ(rule(layer_prefix(1) + "self_attn.A_log"), InitRule::ALog);
  EXPECT_EQ(rule(layer_prefix(3) + "self_attn.o_proj.weight"), InitRule::ScaledNormal);
  EXPECT_EQ(rule(layer_prefix(0) + "mlp.down_proj.weight"), InitRule::ScaledNormal);
  EXPECT_EQ(rule(layer_prefix(1) + "block_sparse_moe.experts.2.w2.weight"), InitRule::ScaledNormal);
  EXPECT_EQ(rule(layer_prefix(1) + "block_sparse_moe.experts.2.w1.weight"), InitRule::Normal);
  EXPECT_EQ(rule(layer_prefix(1) + "block_sparse_moe.routed_expert_up_proj.weight"), InitRule::ScaledNormal);
  EXPECT_EQ(rule(layer_prefix(1) + "block_sparse_moe.shared_experts.down_proj.weight"), InitRule::ScaledNormal);
  EXPECT_EQ(rule(kModelPrefix + "embed_tokens.weight"), InitRule::Normal);
}

TEST(Init, Mxfp4ExpertsAreTheQuantisedF32Draw) {
  K3Config c = tiny();
  c.moe_intermediate_size = 64;
  WeightStore f = init_weights(c, {5}), q = init_weights(c, {5, ExpertStorage::Mxfp4});
  int checked = 0;
  for (size_t i = 0; i < f.layout().size(); ++i) {
    const ParamSpec& s = f.layout().spec(i);
    if (s.component != Component::RoutedExperts) {
      ASSERT_EQ(0, std::memcmp(f.param(i), q.param(s.name), size_t(s.numel()) * sizeof(float))) << s.name;
      continue;
    }
    Mxfp4Matrix want = Mxfp4Matrix::quantize(f.tensor(i));
    const Mxfp4Matrix& got = q.mxfp4(i);
    ASSERT_EQ(0, std::memcmp(want.packed.raw(), got.packed.raw(), want.packed.nbytes())) << s.name;
    ASSERT_EQ(0, std::memcmp(want.scales.raw(), got.scales.raw(), want.scales.nbytes())) << s.name;
    ++checked;
  }
  EXPECT_EQ(checked, 3 * 12 * 8);
  c.moe_intermediate_size = 48;  // w2 [64, 48]: 48 is not a multiple of 32
  try {
    init_weights(c, {5, ExpertStorage::Mxfp4});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w2.weight"), std::string::npos) << e.what();
  }
}

TEST(K3Model, MatchesPlainWiringOfTheReference) {
  for (int64_t S : {3, 2, 1, 13}) {
    const K3Model m(random_store(tiny(S), 11 + uint64_t(S)));
    const std::vector<int32_t> ids = make_ids(9, m.dims().V, 1);
    const std::vector<float> got = full_forward(m, ids, KDAPath::Recurrent);
    const std::vector<float> want = reference_logits(m, ids);
    ASSERT_GT(max_abs(want), 0.5) << "logits too small to test anything";
    test::expect_close(got.data(), want.data(), int64_t(want.size()), 2e-5, 2e-4,
                       "block size " + std::to_string(S));
  }
}

TEST(K3Model, TiedEmbeddingsUseTheEmbeddingAsHead) {
  K3Config c = tiny();
  c.tie_word_embeddings = true;
  c.num_hidden_layers = 4;
  c.full_attn_layers = {4};
  c.kda_layers = {1, 2, 3};
  const K3Model m(random_store(c, 2));
  EXPECT_EQ(m.weights().layout().find(kLmHeadName), -1);
  const std::vector<int32_t> ids = make_ids(6, m.dims().V, 2);
  const std::vector<float> got = full_forward(m, ids, KDAPath::Recurrent), want = reference_logits(m, ids);
  test::expect_close(got.data(), want.data(), int64_t(want.size()), 2e-5, 2e-4, "tied");
}

namespace {

// A forward with the record (the training forward: the same KDA path choice, and the routing
// it took is kept): the logits and each MoE layer's experts and scores.
struct RoutedForward {
  std::vector<float> logits;
  std::vector<std::vector<int32_t>> idx;    // per MoE layer [T, k]
  std::vector<std::vector<float>> scores;  // per MoE layer [T, E]
};

RoutedForward routed_forward(const K3Model& m, const std::vector<int32_t>& ids, KDAPath path) {
  RoutedForward out;
  out.logits.resize(ids.size() * size_t(m.dims().V));
  DecodeState st = m.new_state();
  ForwardScratch s;
  ForwardOptions fo;
  fo.kda_path = path;
  ForwardRecord rec;
  m.forward(out.logits.data(), ids.data(), int64_t(ids.size()), st, s, fo, &rec);
  for (const LayerRecord& l : rec.layers)
    if (!l.moe.routing.idx.empty()) {
      out.idx.push_back(l.moe.routing.idx);
      out.scores.push_back(l.moe.routing.scores);
    }
  return out;
}

// got equals want within (atol, rtol) at every position before the first token whose top-k
// experts differ. Two paths that agree to rounding can still pick a different expert where two
// biased scores tie to within that rounding (seen on AVX-512 at T = 127: one token, 5e-4 in its
// logits); past that token the outputs legitimately differ. Such a flip passes only if the
// router scores of that token agree to 1e-5 (a tie, not a wrong input), and at most one token
// of the sequence may flip.
void expect_close_up_to_routing_ties(const RoutedForward& got, const RoutedForward& want, int64_t T, int64_t V,
                                     double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.idx.size(), want.idx.size()) << what;
  int64_t first_flip = T, flips = 0;
  for (size_t l = 0; l < want.idx.size(); ++l) {
    const int64_t k = int64_t(want.idx[l].size()) / T, E = int64_t(want.scores[l].size()) / T;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> a(want.idx[l].begin() + t * k, want.idx[l].begin() + (t + 1) * k);
      std::vector<int32_t> b(got.idx[l].begin() + t * k, got.idx[l].begin() + (t + 1) * k);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a == b) continue;
      ++flips;
      first_flip = std::min(first_flip, t);
      double worst = 0;
      for (int64_t e = 0; e < E; ++e)
        worst = std::max(worst, double(std::abs(got.scores[l][t * E + e] - want.scores[l][t * E + e])));
      EXPECT_LT(worst, 1e-5) << what << ": MoE layer " << l << " token " << t
                             << " routed differently with router scores that differ by " << worst;
    }
  }
  EXPECT_LE(flips, 1) << what << ": routing differs at " << flips << " (layer, token) pairs";
  ASSERT_GT(first_flip, 0) << what << ": nothing left to compare";
  test::expect_close(got.logits.data(), want.logits.data(), first_flip * V, atol, rtol,
                     what + " (first " + std::to_string(first_flip) + " positions)");
}

}  // namespace

// Chunked == recurrent == fast for remainders around the 16-token tiles and the chunk length 64.
TEST(K3Model, ChunkedEqualsRecurrentAtModelLevel) {
  const K3Model m(random_store(tiny(2), 4));
  const int64_t V = m.dims().V;
  for (int64_t T : {1, 2, 3, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129}) {
    const std::vector<int32_t> ids = make_ids(T, V, uint32_t(T));
    const RoutedForward rec = routed_forward(m, ids, KDAPath::Recurrent);
    const RoutedForward chk = routed_forward(m, ids, KDAPath::Chunked);
    const RoutedForward fst = routed_forward(m, ids, KDAPath::Fast);
    ASSERT_FALSE(rec.idx.empty()) << "the model has no MoE layer: nothing routes";
    expect_close_up_to_routing_ties(chk, rec, T, V, 1e-4, 1e-4, "chunked T=" + std::to_string(T));
    expect_close_up_to_routing_ties(fst, rec, T, V, 1e-4, 1e-4, "fast T=" + std::to_string(T));
  }
}

TEST(K3Model, CausalAndLastOnly) {
  const K3Model m(random_store(tiny(), 6));
  const int64_t V = m.dims().V;
  const std::vector<int32_t> ids = make_ids(70, V, 3);
  const std::vector<float> all = full_forward(m, ids, KDAPath::Fast);
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + 40);
  const std::vector<float> pre = full_forward(m, prefix, KDAPath::Fast);
  test::expect_close(pre.data(), all.data(), int64_t(pre.size()), 1e-5, 1e-4, "prefix");
  std::vector<float> last(static_cast<size_t>(V));
  DecodeState st = m.new_state();
  ForwardScratch s;
  ForwardOptions fo;
  fo.last_only = true;
  m.forward(last.data(), ids.data(), int64_t(ids.size()), st, s, fo);
  EXPECT_EQ(st.n_tokens, 70);
  test::expect_close(last.data(), all.data() + (ids.size() - 1) * size_t(V), V, 1e-6, 1e-6, "last only");
}

TEST(K3Model, RecordHoldsEveryLayer) {
  const K3Model m(random_store(tiny(), 8));
  const std::vector<int32_t> ids = make_ids(5, m.dims().V, 4);
  std::vector<float> logits(ids.size() * size_t(m.dims().V));
  DecodeState st = m.new_state();
  ForwardScratch s;
  ForwardRecord rec;
  m.forward(logits.data(), ids.data(), 5, st, s, {}, &rec);
  EXPECT_EQ(logits, full_forward(m, ids, KDAPath::Fast));
  ASSERT_EQ(int64_t(rec.layers.size()), m.dims().L);
  EXPECT_EQ(rec.n_blocks, m.dims().max_blocks());
  EXPECT_EQ(int64_t(rec.blocks.size()), rec.n_blocks * 5 * m.dims().d);
  EXPECT_EQ(int64_t(rec.alpha_out.size()), 5 * (rec.n_blocks + 1));
  for (int64_t i = 0; i < m.dims().L; ++i) {
    EXPECT_EQ(rec.layers[size_t(i)].appended, i % 3 == 0);
    EXPECT_EQ(int64_t(rec.layers[size_t(i)].partial_mid.size()), 5 * m.dims().d);
  }
  // The layer-0 mixer input is RMSNorm of the embedding (no block yet).
  EXPECT_EQ(rec.layers[0].n_src_attn, 1);
}

TEST(K3Model, TokenOutsideVocabularyIsAnError) {
  const K3Model m(random_store(tiny(), 9));
  std::vector<int32_t> ids = {1, 2, int32_t(m.dims().V)};
  std::vector<float> logits(3 * size_t(m.dims().V));
  DecodeState st = m.new_state();
  ForwardScratch s;
  try {
    m.forward(logits.data(), ids.data(), 3, st, s);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(st.n_tokens, 0);  // refused before any state changed
}
