// The backend seam (kernels/ops.h, K3Model::to_backend): the same model moved to the emulated
// device backend (tests/common/emulated_backend.h: device pointers the host cannot dereference,
// the CPU kernels behind them) computes bit for bit the logits the CPU backend computes, for
// every way the engine calls the model: a prefill, chunked prefills with the latent MLA path,
// decode steps, several-token decode calls, batched decode over sequences at different
// positions, with f32 or MXFP4 experts and f32 or bf16 dense weights. A wiring step that read
// or wrote device memory directly would fault; one that skipped an op would differ.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/emulated_backend.h"
#include "common/fixture.h"
#include "common/random_model.h"
#include "core/error.h"
#include "model/checkpoint.h"

using namespace k3;

namespace {

// The logits of every call of one script of calls (prefill, chunked prefill, decode steps).
std::vector<std::vector<float>> run_script(const K3Model& m, const std::vector<int32_t>& ids) {
  const int64_t V = m.dims().V;
  std::vector<std::vector<float>> out;
  ForwardScratch s;
  auto call = [&](DecodeState& st, int64_t from, int64_t n, MixerMode mode, bool last_only) {
    ForwardOptions fo;
    fo.mode = mode;
    fo.last_only = last_only;
    std::vector<float> l(size_t((last_only ? 1 : n) * V));
    m.forward(l.data(), ids.data() + from, n, st, s, fo);
    out.push_back(std::move(l));
  };
  DecodeState a = m.new_state();
  call(a, 0, 40, MixerMode::Prefill, false);     // a whole prefill, every row
  for (int64_t t = 40; t < 44; ++t) call(a, t, 1, MixerMode::Decode, true);  // decode steps
  call(a, 44, 3, MixerMode::Decode, false);      // a several-token decode call (speculative verify)
  DecodeState b = m.new_state();
  call(b, 0, 16, MixerMode::PrefillLatent, true);  // chunked prefill over the latent cache
  call(b, 16, 16, MixerMode::PrefillLatent, true);
  call(b, 32, 2, MixerMode::Decode, true);
  DecodeState c = b;  // a copied state (the engine's snapshots) carries on alike
  call(c, 34, 1, MixerMode::Decode, true);
  return out;
}

// Batched decode of three sequences at different positions (K3Model::forward_batch).
std::vector<float> run_batch(const K3Model& m, const std::vector<int32_t>& ids) {
  const int64_t V = m.dims().V;
  ForwardScratch s;
  std::vector<DecodeState> st;
  const int64_t len[3] = {7, 19, 2};
  for (int64_t j = 0; j < 3; ++j) {
    st.push_back(m.new_state());
    std::vector<float> l(static_cast<size_t>(V));
    ForwardOptions fo;
    fo.last_only = true;
    m.forward(l.data(), ids.data() + j * 3, len[j], st.back(), s, fo);
  }
  std::vector<DecodeState*> ptr = {&st[0], &st[1], &st[2]};
  const int64_t seg[4] = {0, 1, 3, 4};  // one, two and one tokens
  const int32_t step[4] = {ids[50], ids[51], ids[52], ids[53]};
  std::vector<float> l(size_t(4 * V));
  m.forward_batch(l.data(), step, seg, 3, ptr.data(), s);
  return l;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int64_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  EXPECT_EQ(diff, 0) << what << ": " << diff << " of " << a.size() << " logits differ";
}

void check_model_pair(const K3Model& cpu, const K3Model& dev, const std::string& tag) {
  ASSERT_EQ(dev.device(), test::emulated_device());
  const std::vector<int32_t> ids = test::make_ids(64, cpu.dims().V, 7);
  const auto a = run_script(cpu, ids), b = run_script(dev, ids);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) expect_bitwise(a[i], b[i], tag + " call " + std::to_string(i));
  expect_bitwise(run_batch(cpu, ids), run_batch(dev, ids), tag + " batched decode");
}

}  // namespace

TEST(BackendSeam, RandomModelPlainExpertsMatchesCpuBitwise) {
  const K3Config c = test::four_layer_config();
  const K3Model cpu = test::random_model(c, 11);
  K3Model dev = test::random_model(c, 11);
  dev.to_backend(test::emulated_ops());
  check_model_pair(cpu, dev, "plain experts");
}

TEST(BackendSeam, RandomModelMxfp4ExpertsMatchesCpuBitwise) {
  const K3Config c = test::four_layer_config();
  const K3Model cpu = test::random_model(c, 12, ExpertStorage::Mxfp4);
  K3Model dev = test::random_model(c, 12, ExpertStorage::Mxfp4);
  dev.to_backend(test::emulated_ops());
  check_model_pair(cpu, dev, "MXFP4 experts");
}

TEST(BackendSeam, ReleasedLayoutBf16DenseMxfp4ExpertsMatchesCpuBitwise) {
  LoadOptions lo;
  lo.dense_as_stored = true;
  const K3Model cpu = load_model(test::kReleaseTiny, lo);
  K3Model dev = load_model(test::kReleaseTiny, lo);
  ASSERT_TRUE(dev.weights().layout().any_bf16()) << "the fixture should hold bf16 dense weights";
  dev.to_backend(test::emulated_ops());
  check_model_pair(cpu, dev, "release fixture");
}

TEST(BackendSeam, StatesAndScratchLiveOnTheDevice) {
  K3Model dev = test::random_model(test::four_layer_config(), 13);
  dev.to_backend(test::emulated_ops());
  DecodeState st = dev.new_state();
  for (const LayerState& l : st.layers) {
    EXPECT_EQ(l.kda.S.device(), test::emulated_device());
    EXPECT_EQ(l.mla.c_kv.device(), test::emulated_device());
  }
  // A state made for the host moves to the device on its first call.
  DecodeState host;
  host.reset(dev.dims());
  ForwardScratch s;
  const std::vector<int32_t> ids = test::make_ids(5, dev.dims().V, 3);
  std::vector<float> l(size_t(dev.dims().V));
  ForwardOptions fo;
  fo.last_only = true;
  dev.forward(l.data(), ids.data(), 5, host, s, fo);
  EXPECT_EQ(host.layers[1].kda.S.device(), test::emulated_device());
  EXPECT_EQ(s.bs.partial.device(), test::emulated_device());
}

TEST(BackendSeam, TrainingAndStreamingStayOnTheCpu) {
  K3Model dev = test::random_model(test::four_layer_config(), 14);
  dev.to_backend(test::emulated_ops());
  DecodeState st = dev.new_state();
  ForwardScratch s;
  ForwardRecord rec;
  const std::vector<int32_t> ids = test::make_ids(4, dev.dims().V, 3);
  std::vector<float> l(size_t(4 * dev.dims().V));
  EXPECT_DEATH(dev.forward(l.data(), ids.data(), 4, st, s, {}, &rec), "training runs on the CPU backend");
}
