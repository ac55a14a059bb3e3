// Checkpoint load/save in the released layout (model/checkpoint.h): exact f32 round trip,
// bf16 rounding, MXFP4 experts kept quantised as zero-copy views of the mapped file or
// dequantised, plain experts, mixed storage, sharding; every bad checkpoint refused with the
// tensor, the expected and found value and the file named; an interrupted save leaves the
// previous checkpoint intact; model directories (config.json, tokenizer.json) and a model
// loaded from disk computing the same logits as the one it was saved from.
#include <gtest/gtest.h>

#include "common/cli_run.h"
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "common/random_model.h"
#include "io/atomic_file.h"
#include "kernels/gemm.h"
#include "model/checkpoint.h"
#include "model/init.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

K3Config small_config() { return k3::test::four_layer_config(); }

// Expects `f` to throw k3::Error whose message contains every piece.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& pieces) {
  try {
    f();
    ADD_FAILURE() << "expected a k3::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const std::string& p : pieces) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

// The tensors save_checkpoint would write, as (name, tensor) in table order (plain f32).
std::vector<std::pair<std::string, Tensor>> plain_tensors(const WeightStore& w) {
  std::vector<std::pair<std::string, Tensor>> t;
  for (size_t i = 0; i < w.layout().size(); ++i) t.emplace_back(w.layout().spec(i).name, w.tensor(i));
  return t;
}

bool same_buffer(const WeightStore& a, const WeightStore& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), size_t(a.size()) * sizeof(float)) == 0;
}

}  // namespace

TEST(Checkpoint, F32RoundTripIsExactWithReleasedNames) {
  TempDir t;
  const K3Config c = small_config();
  WeightStore w = init_weights(c, {1});
  const std::string dir = t.sub("ck");
  save_checkpoint(dir, w);
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"config.json", "model.safetensors"}));
  const CheckpointReader ck = CheckpointReader::open(dir);
  EXPECT_EQ(ck.size(), w.layout().size());
  for (const ParamSpec& s : w.layout().specs()) {
    ASSERT_TRUE(ck.has(s.name)) << s.name;
    EXPECT_EQ(ck.info(s.name).dtype, DType::F32);
    EXPECT_EQ(ck.info(s.name).shape, s.shape);
  }
  WeightStore r = load_weights(ck, c);
  EXPECT_EQ(r.expert_storage(), ExpertStorage::Plain);
  EXPECT_TRUE(same_buffer(w, r));
  // config.json is the HF form of the same config.
  EXPECT_EQ(config_to_hf_json(load_config(dir + "/config.json")), config_to_hf_json(c));
}

TEST(Checkpoint, Bf16DenseIsRoundedOnce) {
  TempDir t;
  const K3Config c = small_config();
  WeightStore w = init_weights(c, {2});
  SaveOptions so;
  so.dense_dtype = DType::BF16;
  save_checkpoint(t.sub("ck"), w, so);
  const CheckpointReader ck = CheckpointReader::open(t.sub("ck"));
  EXPECT_EQ(ck.info(kLmHeadName).dtype, DType::BF16);
  WeightStore r = load_weights(ck, c);
  for (int64_t i = 0; i < w.size(); ++i) ASSERT_EQ(r.data()[i], bf16_to_f32(f32_to_bf16(w.data()[i]))) << i;
}

TEST(Checkpoint, Mxfp4ExpertsKeptAsViewsOrDequantised) {
  TempDir t;
  const K3Config c = small_config();
  WeightStore w = init_weights(c, {3});
  SaveOptions so;
  so.experts = ExpertStorage::Mxfp4;
  save_checkpoint(t.sub("ck"), w, so);
  const CheckpointReader ck = CheckpointReader::open(t.sub("ck"));
  const std::string e0 = layer_prefix(1) + "block_sparse_moe.experts.0.w2.weight";
  EXPECT_FALSE(ck.has(e0));
  EXPECT_EQ(ck.info(mxfp4_packed_name(e0)).shape, (Shape{64, 32}));
  EXPECT_EQ(ck.info(mxfp4_scale_name(e0)).shape, (Shape{64, 2}));

  WeightStore q = load_weights(ck, c);
  ASSERT_EQ(q.expert_storage(), ExpertStorage::Mxfp4);
  LoadOptions deq;
  deq.dequantize_experts = true;
  WeightStore f = load_weights(ck, c, deq);
  ASSERT_EQ(f.expert_storage(), ExpertStorage::Plain);
  const SafetensorsFile& file = *ck.files().at(0);
  int n = 0;
  for (size_t i = 0; i < w.layout().size(); ++i) {
    const ParamSpec& s = w.layout().spec(i);
    if (s.component != Component::RoutedExperts) {
      ASSERT_EQ(0, std::memcmp(q.param(s.name), w.param(i), size_t(s.numel()) * 4)) << s.name;
      ASSERT_EQ(0, std::memcmp(f.param(s.name), w.param(i), size_t(s.numel()) * 4)) << s.name;
      continue;
    }
    const Mxfp4Matrix want = Mxfp4Matrix::quantize(w.tensor(i));
    const Mxfp4Matrix& got = q.mxfp4(i);
    ASSERT_EQ(0, std::memcmp(want.packed.raw(), got.packed.raw(), want.packed.nbytes())) << s.name;
    ASSERT_EQ(0, std::memcmp(want.scales.raw(), got.scales.raw(), want.scales.nbytes())) << s.name;
    // Zero-copy: the packed bytes lie inside the mapped file.
    const uint8_t* p = static_cast<const uint8_t*>(got.packed.raw());
    EXPECT_TRUE(p >= file.mapped_data() && p < file.mapped_data() + file.mapped_size()) << s.name;
    const Tensor deq = want.dequantize();
    ASSERT_EQ(0, std::memcmp(f.param(s.name), deq.raw(), deq.nbytes())) << s.name;
    ++n;
  }
  EXPECT_EQ(n, 3 * 3 * 8);
  // Saving an MXFP4-held store again writes the same bytes (no requantisation drift).
  save_checkpoint(t.sub("ck2"), q, so);
  const CheckpointReader ck2 = CheckpointReader::open(t.sub("ck2"));
  const Tensor a = ck.get(mxfp4_packed_name(e0)), b = ck2.get(mxfp4_packed_name(e0));
  EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes()));
}

TEST(Checkpoint, MixedExpertStorageLoadsAsF32) {
  TempDir t;
  const K3Config c = small_config();
  WeightStore w = init_weights(c, {4});
  std::vector<std::pair<std::string, Tensor>> ts;
  const std::string mx_name = layer_prefix(2) + "block_sparse_moe.experts.5.w1.weight";
  for (auto& [n, tensor] : plain_tensors(w)) {
    if (n == mx_name) {
      Mxfp4Matrix m = Mxfp4Matrix::quantize(tensor);
      ts.emplace_back(mxfp4_packed_name(n), m.packed);
      ts.emplace_back(mxfp4_scale_name(n), m.scales);
    } else {
      ts.emplace_back(n, tensor.to(DType::F16));
    }
  }
  write_checkpoint_shards(t.path, ts, 1 << 20);  // several shards + index
  const CheckpointReader ck = CheckpointReader::open(t.path);
  EXPECT_GT(ck.files().size(), 1u);
  WeightStore r = load_weights(ck, c);
  EXPECT_EQ(r.expert_storage(), ExpertStorage::Plain);
  const size_t i = w.layout().index(mx_name);
  const Tensor deq = Mxfp4Matrix::quantize(w.tensor(i)).dequantize();
  EXPECT_EQ(0, std::memcmp(r.param(i), deq.raw(), deq.nbytes()));
  const size_t j = w.layout().index(kLmHeadName);
  EXPECT_EQ(r.param(j)[3], f16_to_f32(f32_to_f16(w.param(j)[3])));
}

TEST(Checkpoint, BadCheckpointsNameTheTensor) {
  TempDir t;
  const K3Config c = small_config();
  WeightStore w = init_weights(c, {5});
  const std::string victim = layer_prefix(2) + "self_attn.k_proj.weight";
  int case_no = 0;
  // Writes the plain tensors with one edit and returns the load error's expectations.
  auto check = [&](const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit,
                   const std::vector<std::string>& pieces) {
    const std::string dir = t.sub("case" + std::to_string(case_no++));
    auto ts = plain_tensors(w);
    edit(ts);
    write_checkpoint_shards(dir, ts, uint64_t(1) << 40);
    const CheckpointReader ck = CheckpointReader::open(dir);
    expect_error([&] { load_weights(ck, c); }, pieces);
  };
  auto find = [&](std::vector<std::pair<std::string, Tensor>>& ts, const std::string& n) -> Tensor& {
    for (auto& p : ts)
      if (p.first == n) return p.second;
    throw std::runtime_error("no " + n);
  };
  check([&](auto& ts) { ts.erase(std::find_if(ts.begin(), ts.end(), [&](auto& p) { return p.first == victim; })); },
        {victim, "missing", "[64, 128]"});
  check([&](auto& ts) { find(ts, victim) = Tensor::zeros(DType::F32, {64, 127}); },
        {victim, "shape [64, 127]", "expected [64, 128]", "model.safetensors"});
  check([&](auto& ts) { find(ts, victim) = Tensor::zeros(DType::I32, {64, 128}); },
        {victim, "dtype i32", "model.safetensors"});
  check([&](auto& ts) { ts.emplace_back(layer_prefix(4) + "input_layernorm.weight", Tensor::zeros(DType::F32, {128})); },
        {layer_prefix(4) + "input_layernorm.weight", "not a tensor of the config"});
  const std::string ex = layer_prefix(1) + "block_sparse_moe.experts.1.w3.weight";
  check([&](auto& ts) {  // MXFP4 with its scales missing
    Tensor& e = find(ts, ex);
    Mxfp4Matrix m = Mxfp4Matrix::quantize(e);
    ts.erase(std::find_if(ts.begin(), ts.end(), [&](auto& p) { return p.first == ex; }));
    ts.emplace_back(mxfp4_packed_name(ex), m.packed);
  }, {mxfp4_scale_name(ex), "missing"});
  check([&](auto& ts) {  // MXFP4 packed with the wrong width
    Tensor& e = find(ts, ex);
    Mxfp4Matrix m = Mxfp4Matrix::quantize(e);
    ts.erase(std::find_if(ts.begin(), ts.end(), [&](auto& p) { return p.first == ex; }));
    ts.emplace_back(mxfp4_packed_name(ex), Tensor::zeros(DType::U8, {64, 31}));
    ts.emplace_back(mxfp4_scale_name(ex), m.scales);
  }, {mxfp4_packed_name(ex), "shape [64, 31]", "expected [64, 32]"});
  check([&](auto& ts) {  // both plain and MXFP4
    Mxfp4Matrix m = Mxfp4Matrix::quantize(find(ts, ex));
    ts.emplace_back(mxfp4_packed_name(ex), m.packed);
    ts.emplace_back(mxfp4_scale_name(ex), m.scales);
  }, {ex, "both plain and as MXFP4"});
  // Tensors outside language_model. (e.g. a vision tower) are ignored.
  const std::string dir = t.sub("vision");
  auto ts = plain_tensors(w);
  ts.emplace_back("vision_tower.patch_embed.weight", Tensor::zeros(DType::F32, {4, 4}));
  write_checkpoint_shards(dir, ts, uint64_t(1) << 40);
  EXPECT_TRUE(same_buffer(load_weights(CheckpointReader::open(dir), c), w));
}

TEST(Checkpoint, InterruptedSaveKeepsThePreviousCheckpoint) {
  TempDir t;
  const K3Config c = small_config();
  WeightStore a = init_weights(c, {6}), b = init_weights(c, {7});
  const std::string dir = t.sub("ck");
  save_checkpoint(dir, a);
  SaveOptions so;
  so.before_commit = [](const std::string& tmp) {
    EXPECT_TRUE(fs::exists(tmp + "/model.safetensors"));
    EXPECT_TRUE(fs::exists(tmp + "/config.json"));
    throw Error("simulated crash");
  };
  expect_error([&] { save_checkpoint(dir, b, so); }, {"simulated crash"});
  EXPECT_EQ(listing(t.path), (std::vector<std::string>{"ck"}));  // no temporary left behind
  EXPECT_TRUE(same_buffer(load_weights(CheckpointReader::open(dir), c), a));
  // A completed save replaces the directory as a whole (the old shard layout is gone).
  SaveOptions sharded;
  sharded.max_shard_bytes = 1 << 20;
  save_checkpoint(dir, b, sharded);
  EXPECT_EQ(listing(t.path), (std::vector<std::string>{"ck"}));
  const std::vector<std::string> files = listing(dir);
  EXPECT_EQ(std::count(files.begin(), files.end(), "model.safetensors"), 0);
  EXPECT_EQ(std::count(files.begin(), files.end(), "model.safetensors.index.json"), 1);
  EXPECT_TRUE(same_buffer(load_weights(CheckpointReader::open(dir), c), b));
  save_checkpoint(dir, a);  // back to one shard
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"config.json", "model.safetensors"}));
  // A file where the directory should be is refused before anything is written.
  write_text_file_atomic(t.sub("file"), "x");
  expect_error([&] { save_checkpoint(t.sub("file"), a); }, {t.sub("file"), "not a directory"});
}

TEST(Checkpoint, ModelDirectoryAndTokenizer) {
  TempDir t;
  expect_error([&] { open_model_dir(t.sub("absent")); }, {t.sub("absent"), "no such model directory"});
  fs::create_directory(t.sub("empty"));
  expect_error([&] { open_model_dir(t.sub("empty")); }, {"config.json", "missing"});
  const K3Config c = small_config();
  WeightStore w = init_weights(c, {8});
  SaveOptions so;
  so.tokenizer_json = ByteTokenizer().to_json();
  save_checkpoint(t.sub("m"), w, so);
  const ModelDir md = open_model_dir(t.sub("m"));
  EXPECT_EQ(md.config.num_hidden_layers, 4);
  EXPECT_EQ(load_model_tokenizer(md).eos(), 257);
  // An unsupported tokenizer type is refused with its type named.
  write_text_file_atomic(t.sub("m") + "/tokenizer.json", R"({"type": "tiktoken", "special_tokens": {}})");
  expect_error([&] { load_model_tokenizer(open_model_dir(t.sub("m"))); }, {"tokenizer.json", "tiktoken", "not supported"});
  fs::remove(t.sub("m") + "/tokenizer.json");
  expect_error([&] { load_model_tokenizer(open_model_dir(t.sub("m"))); }, {"tokenizer.json", "missing"});
}

TEST(Checkpoint, LoadedModelComputesTheSameLogits) {
  TempDir t;
  const K3Config c = small_config();
  SaveOptions so;
  so.experts = ExpertStorage::Mxfp4;
  save_checkpoint(t.sub("m"), init_weights(c, {9, ExpertStorage::Mxfp4, 0.1}), so);
  const K3Model m = load_model(t.sub("m"));
  ASSERT_EQ(m.weights().expert_storage(), ExpertStorage::Mxfp4);
  LoadOptions deq;
  deq.dequantize_experts = true;
  const K3Model f = load_model(t.sub("m"), deq);
  const std::vector<int32_t> ids = {5, 9, 200, 31, 7, 7, 100};
  std::vector<float> a(ids.size() * 256), b(ids.size() * 256);
  DecodeState sa = m.new_state(), sb = f.new_state();
  ForwardScratch s;
  m.forward(a.data(), ids.data(), int64_t(ids.size()), sa, s);
  f.forward(b.data(), ids.data(), int64_t(ids.size()), sb, s);
  double mx = 0;
  for (size_t i = 0; i < a.size(); ++i) mx = std::max(mx, double(std::fabs(a[i] - b[i])));
  EXPECT_LT(mx, 1e-4);  // MXFP4 experts (dequantised per use) == the dequantised f32 copy
}

// bf16 dense matrices kept as stored (what generate / forward / eval load): every dense matrix
// of a bf16 checkpoint is a zero-copy bf16 view, the f32 buffer holds only the vectors, and
// the logits equal those of the same checkpoint widened to f32: bitwise for decode-sized calls
// (the few-row tiles widen in registers, in the f32 order), within float rounding for a
// prefill (panels widened for sgemm).
TEST(Checkpoint, Bf16DenseWeightsKeptAsStoredGiveTheWidenedLogits) {
  TempDir t;
  const K3Config c = small_config();
  SaveOptions so;
  so.experts = ExpertStorage::Mxfp4;
  so.dense_dtype = DType::BF16;
  save_checkpoint(t.sub("m"), init_weights(c, {9, ExpertStorage::Mxfp4, 0.1}), so);
  LoadOptions as_stored;
  as_stored.dense_as_stored = true;
  const K3Model m = load_model(t.sub("m"), as_stored);
  const K3Model f = load_model(t.sub("m"));
  const ParamLayout& lay = m.weights().layout();
  int64_t held = 0, f32_floats = 0;
  for (size_t i = 0; i < lay.size(); ++i) {
    const ParamSpec& sp = lay.spec(i);
    const bool matrix = sp.shape.size() == 2 && sp.shape[0] > 1 && sp.shape[1] > 1 &&
                        sp.component != Component::RoutedExperts;
    EXPECT_EQ(lay.bf16_held(i), matrix) << sp.name;
    if (lay.bf16_held(i)) ++held;
    else if (lay.in_buffer(i)) f32_floats += sp.numel();
  }
  EXPECT_GT(held, 10);
  EXPECT_LE(m.weights().size(), f32_floats + 16 * int64_t(lay.size()));  // vectors only (plus alignment)
  EXPECT_LT(m.weights().size() * 4, m.weights().bf16_bytes());
  const std::vector<int32_t> ids = {5, 9, 200, 31, 7, 7, 100, 3, 64};
  const int64_t V = c.vocab_size, T = int64_t(ids.size());
  // Decode: token by token, bitwise.
  DecodeState sa = m.new_state(), sb = f.new_state();
  ForwardScratch s;
  std::vector<float> a(V), b(V);
  for (int64_t i = 0; i < T; ++i) {
    m.forward(a.data(), &ids[size_t(i)], 1, sa, s);
    f.forward(b.data(), &ids[size_t(i)], 1, sb, s);
    ASSERT_EQ(a, b) << "decode step " << i;
  }
  // A prefill longer than the few-row threshold: the sgemm path on widened panels.
  std::vector<int32_t> long_ids(size_t(kGemvMaxRows + 9));
  for (size_t i = 0; i < long_ids.size(); ++i) long_ids[i] = int32_t((i * 37 + 11) % uint64_t(V));
  const int64_t TL = int64_t(long_ids.size());
  std::vector<float> pa(size_t(TL * V)), pb(size_t(TL * V));
  DecodeState qa = m.new_state(), qb = f.new_state();
  m.forward(pa.data(), long_ids.data(), TL, qa, s);
  f.forward(pb.data(), long_ids.data(), TL, qb, s);
  test::expect_close(pa.data(), pb.data(), TL * V, 1e-5, 1e-5, "prefill, bf16 as stored vs widened");
}

// Expert-parallel loading (LoadOptions::keep_expert): every tensor but the rejected routed
// experts equals the whole load bitwise; the rejected ones are not converted (zeros) and their
// pages are given back: at least their bytes less two pages per MoE layer (a run's unaligned
// ends), at most their bytes plus the alignment padding inside the run.
TEST(Checkpoint, KeptExpertsLoadAsTheWholeCheckpointAndTheOthersAreReleased) {
  TempDir t;
  K3Config c = small_config();
  c.moe_intermediate_size = 256;  // experts of several pages each
  const WeightStore w = init_weights(c, {3});
  save_checkpoint(t.sub("ck"), w);
  const CheckpointReader ck = CheckpointReader::open(t.sub("ck"));
  const WeightStore full = load_weights(ck, c);
  LoadOptions lo;
  lo.keep_expert = [&](int64_t e) { return e >= c.num_experts / 2; };  // the second rank's half
  std::string line;
  lo.log = [&](const std::string& l) { line += l; };
  const WeightStore part = load_weights(ck, c, lo);
  const ParamLayout& lay = full.layout();
  int64_t rejected = 0, moe_layers = 0, last_layer = -1;
  for (size_t i = 0; i < lay.size(); ++i) {
    const ParamSpec& s = lay.spec(i);
    const float *a = full.param(i), *b = part.param(i);
    if (s.component == Component::RoutedExperts && !lo.keep_expert(s.expert)) {
      rejected += s.numel() * 4;
      if (s.layer != last_layer) ++moe_layers, last_layer = s.layer;
      EXPECT_TRUE(std::all_of(b, b + s.numel(), [](float v) { return v == 0.f; })) << s.name;
      continue;
    }
    EXPECT_EQ(std::memcmp(a, b, size_t(s.numel()) * 4), 0) << s.name;
  }
  ASSERT_GT(moe_layers, 0);
  const size_t p = line.find("released "), q = line.find(" bytes");
  ASSERT_NE(p, std::string::npos) << line;
  const int64_t released = std::stoll(line.substr(p + 9, q - p - 9));
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  EXPECT_GE(released, rejected - 2 * page * moe_layers) << line;
  EXPECT_LE(released, rejected + 3 * 64 * (c.num_experts / 2) * moe_layers) << line;
  EXPECT_NE(line.find("routed experts other ranks compute"), std::string::npos) << line;
}
