// Backward of one decoder layer with its Block AttnRes state (model/decoder_backward.cpp), in
// double against central finite differences, below the whole-model check
// (tests/train/test_model_grad.cpp): a layer runs on a random incoming block stack and partial
// sum, the loss is a random linear function of every block and the partial sum after the
// layer, and the gradients w.r.t. the incoming blocks, the incoming partial sum and every
// parameter of the layer are checked. Layers: 0 (dense FFN, KDA, starts block 1 from the
// embedding alone), 3 (MLA, MoE, inside a block), 4 (KDA, MoE, starts a block over 2 blocks).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/threads.h"
#include "io/config.h"
#include "model/init.h"
#include "model/k3_model.h"

using namespace k3;

namespace {

K3Config layer_config() {
  K3Config c = load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  c.hidden_size = 32;
  c.num_hidden_layers = 5;
  c.vocab_size = 40;
  c.kda_num_heads = 2;
  c.kda_head_dim = 8;
  c.full_attn_layers = {4};
  c.kda_layers = {1, 2, 3, 5};
  c.num_attention_heads = 2;
  c.q_lora_rank = 16;
  c.kv_lora_rank = 8;
  c.qk_nope_head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 8;
  c.num_experts = 8;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 1;
  c.routed_expert_hidden_size = 16;
  c.moe_intermediate_size = 8;
  c.intermediate_size = 16;
  c.attn_res_block_size = 2;
  validate_config(c, "layer_config");
  return c;
}

WeightStore layer_store(const K3Config& c, uint64_t seed) {
  WeightStore w = init_weights(c, {seed, ExpertStorage::Plain, 0.2});
  for (size_t i = 0; i < w.layout().size(); ++i) {
    const ParamSpec& s = w.layout().spec(i);
    const InitRule r = init_rule(s);
    if (r == InitRule::Zeros || r == InitRule::Ones) {
      ParamSpec alt = s;
      alt.name += "#layer";
      init_tensor(w.param(i), s.numel(), alt, InitRule::Normal, seed, 0.3, 1);
      if (r == InitRule::Ones)
        for (int64_t j = 0; j < s.numel(); ++j) w.param(i)[j] += 1.f;
    }
  }
  return w;
}

struct OneThread {
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(0); }
};

// One layer of the double model on a fixed incoming state; loss = sum Wb . blocks_out +
// Wp . partial_out.
struct LayerProblem {
  K3ModelT<double>& m;
  int64_t layer, T, nb_in;
  std::vector<double> blocks_in, partial_in, wb, wp;  // [nb_in, T, d], [T, d], [nb_out, T, d], [T, d]
  BlockStateT<double> bs;
  LayerStateT<double> st;
  LayerScratchT<double> s;
  LayerRecordT<double> rec;
  std::vector<std::vector<int32_t>> routing;

  LayerProblem(K3ModelT<double>& m_, int64_t layer_, int64_t T_, int64_t nb_in_, uint32_t seed)
      : m(m_), layer(layer_), T(T_), nb_in(nb_in_) {
    const int64_t d = m.dims().d, nb_out = nb_in + (layer % m.dims().block_size == 0 ? 1 : 0);
    std::mt19937 rng(seed);
    std::normal_distribution<double> N(0.0, 1.0);
    auto fill = [&](std::vector<double>& v, int64_t n) {
      v.resize(size_t(n));
      for (auto& x : v) x = N(rng);
    };
    fill(blocks_in, nb_in * T * d);
    fill(partial_in, T * d);
    fill(wb, nb_out * T * d);
    fill(wp, T * d);
  }

  double loss(bool record) {
    const ModelDims& dm = m.dims();
    const int64_t d = dm.d, n = T * d;
    bs.begin(T, d, dm.max_blocks());
    std::copy(blocks_in.begin(), blocks_in.end(), bs.blocks.begin());
    std::copy(partial_in.begin(), partial_in.end(), bs.partial.begin());
    bs.n = nb_in;
    if (dm.mla[size_t(layer)]) st.mla.clear();
    else st.kda.reset(dm.kda);
    decoder_layer_forward<double>(bs, st, m.layer(layer), dm, layer, T, MixerMode::Prefill, KDAPath::Fast, s,
                                  &rec);
    if (!record) {
      if (m.layer(layer).is_moe && rec.moe.routing.idx != routing[0]) ++routing_changes;
    } else {
      routing = {rec.moe.routing.idx};
    }
    double L = 0;
    for (int64_t i = 0; i < bs.n * n; ++i) L += wb[size_t(i)] * bs.blocks[size_t(i)];
    for (int64_t i = 0; i < n; ++i) L += wp[size_t(i)] * bs.partial[size_t(i)];
    return L;
  }
  int routing_changes = 0;

  // Fourth-order central difference of the loss in the value *p.
  double fd(double* p) {
    const double h = 3e-5, p0 = *p;
    auto at = [&](double v) {
      *p = v;
      return loss(false);
    };
    const double d1 = at(p0 + h) - at(p0 - h), d2 = at(p0 + 2 * h) - at(p0 - 2 * h);
    *p = p0;
    return (8 * d1 - d2) / (12 * h);
  }
};

void check_layer(int64_t layer, int64_t nb_in) {
  const OneThread one;
  const K3Config c = layer_config();
  K3ModelT<double> m(layer_store(c, 21));
  const ModelDims& dm = m.dims();
  const int64_t T = 7, d = dm.d, n = T * d;
  LayerProblem P(m, layer, T, nb_in, 100 + uint32_t(layer));
  P.loss(true);
  const int64_t nb_out = P.bs.n;
  // Backward: the incoming gradient of the state after the layer is (wb, wp).
  BlockGradT<double> bg;
  bg.begin(T, d, dm.max_blocks(), nb_out);
  std::copy(P.wb.begin(), P.wb.end(), bg.dblocks.begin());
  std::copy(P.wp.begin(), P.wp.end(), bg.dpartial.begin());
  const ParamLayout& lay = m.weights().layout();
  std::vector<double> grads(size_t(lay.total_floats()), 0.0);
  LayerGradsT<double> g;
  rebase_grads<double>(g, m.layer(layer), m.params(), grads.data());
  const std::vector<double> blocks_after(P.bs.blocks.begin(), P.bs.blocks.begin() + nb_out * n);
  decoder_layer_backward<double>(bg, P.rec, blocks_after.data(), m.layer(layer), g, dm, layer, P.s);
  ASSERT_EQ(bg.n, nb_in);

  std::mt19937 rng(5);
  double worst = 0;
  int64_t checked = 0;
  auto check = [&](double got, double want, const std::string& what) {
    worst = std::max(worst, std::fabs(got - want) / (1e-3 + std::fabs(want)));
    EXPECT_LE(std::fabs(got - want), 1e-7 + 2e-6 * std::fabs(want)) << what << ": backward " << got << " vs FD " << want;
    ++checked;
  };
  // Incoming state: blocks and partial sum.
  for (int64_t b = 0; b <= nb_in; ++b) {
    double* base = b < nb_in ? P.blocks_in.data() + b * n : P.partial_in.data();
    const double* gb = b < nb_in ? bg.dblock(b) : bg.dpartial.data();
    for (int k = 0; k < 12; ++k) {
      const int64_t j = int64_t(rng() % uint64_t(n));
      check(gb[j], P.fd(base + j), (b < nb_in ? "block " + std::to_string(b) : std::string("partial")) + "[" +
                                       std::to_string(j) + "]");
    }
  }
  // Every parameter tensor of the layer: all entries of vectors, 3 of matrices (and the largest).
  int64_t tensors = 0;
  for (size_t i = 0; i < lay.size(); ++i) {
    const ParamSpec& sp = lay.spec(i);
    if (sp.layer != layer) continue;
    const int64_t off = lay.offset(i), ne = sp.numel();
    const double* gt = grads.data() + off;
    if (sp.name.find("e_score_correction_bias") != std::string::npos) {
      for (int64_t j = 0; j < ne; ++j) ASSERT_EQ(gt[j], 0.0) << sp.name;
      continue;
    }
    ++tensors;
    std::vector<int64_t> idx;
    if (sp.shape.size() == 1 || sp.shape[0] == 1) {
      for (int64_t j = 0; j < ne; ++j) idx.push_back(j);
    } else {
      int64_t jmax = 0;
      for (int64_t j = 1; j < ne; ++j)
        if (std::fabs(gt[j]) > std::fabs(gt[jmax])) jmax = j;
      idx = {jmax, int64_t(rng() % uint64_t(ne)), int64_t(rng() % uint64_t(ne)), int64_t(rng() % uint64_t(ne))};
    }
    for (int64_t j : idx) check(gt[j], P.fd(m.params() + off + j), sp.name + "[" + std::to_string(j) + "]");
  }
  EXPECT_GT(tensors, 10);
  EXPECT_EQ(P.routing_changes, 0) << "a finite-difference step changed the expert selection";
  std::printf("[ layer %lld ] %lld entries over %lld tensors, worst rel err %.3g\n", (long long)layer,
              (long long)checked, (long long)tensors, worst);
}

}  // namespace

TEST(DecoderLayerGrad, DenseKdaLayerStartingTheFirstBlock) { check_layer(0, 0); }
TEST(DecoderLayerGrad, MlaMoeLayerInsideABlock) { check_layer(3, 2); }
TEST(DecoderLayerGrad, KdaMoeLayerStartingABlockOverTwo) { check_layer(4, 2); }
