// Small MXFP4 models saved to temp directories and the runs the memory-limited inference
// tests compare bit for bit against the resident model (tests/infer/test_trunk_ring.cpp,
// test_head_stream.cpp): a session's prefill (in chunks) and decode steps, a batched decode.
#pragma once
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/cli_run.h"
#include "common/random_model.h"
#include "infer/session.h"
#include "model/checkpoint.h"

namespace k3::test {

struct Saved {
  std::unique_ptr<TempDir> dir;
  std::string path;
};

// 128-wide, 5 layers (a dense first one, MLA at the fourth; `full`: the 13 of configs/tiny.json),
// MXFP4 experts of width 256 (E experts), dense weights in `dense`.
inline const Saved& saved_model(DType dense, int64_t E = 0, bool full = false) {
  static std::map<std::tuple<int, int64_t, bool>, Saved> cache;
  Saved& s = cache[{int(dense), E, full}];
  if (!s.dir) {
    s.dir = std::make_unique<TempDir>("k3_ring");
    s.path = s.dir->sub("m");
    K3Config c = tiny_config(0, 256);
    if (!full) {
      c.num_hidden_layers = 5;
      c.full_attn_layers = {4};
      c.kda_layers = {1, 2, 3, 5};
    }
    if (E > 0) c.num_experts = E;
    const K3Model m = random_model(c, 17, ExpertStorage::Mxfp4);
    SaveOptions so;
    so.experts = ExpertStorage::Mxfp4;
    so.dense_dtype = dense;
    save_checkpoint(s.path, m.weights(), so);
  }
  return s;
}

// Prefill (in chunks of `chunk` tokens), decode steps; every returned logit row concatenated.
inline std::vector<float> run_session(const K3Model& m, const std::vector<int32_t>& ids, int64_t prefill, int64_t chunk = 0) {
  Session s(m);
  const int64_t V = m.dims().V;
  std::vector<float> out;
  if (chunk <= 0) chunk = prefill;
  for (int64_t p = 0; p < prefill; p += chunk) {
    const float* l = s.prefill(ids.data() + p, std::min(chunk, prefill - p));
    out.insert(out.end(), l, l + V);
  }
  for (size_t i = size_t(prefill); i < ids.size(); ++i) {
    const float* l = s.step(ids[i]);
    out.insert(out.end(), l, l + V);
  }
  return out;
}

inline std::vector<float> run_batch(const K3Model& m, int steps) {
  const std::vector<int32_t> pa = {1, 2, 3}, pb = {4, 5};
  DecodeState a = m.new_state(), b = m.new_state();
  ForwardScratch s;
  const int64_t V = m.dims().V;
  std::vector<float> la(pa.size() * size_t(V)), lb(pb.size() * size_t(V));
  m.forward(la.data(), pa.data(), int64_t(pa.size()), a, s);
  m.forward(lb.data(), pb.data(), int64_t(pb.size()), b, s);
  std::vector<float> out(la), logits(size_t(2 * V));
  out.insert(out.end(), lb.begin(), lb.end());
  std::vector<int32_t> ids = {3, 7};
  const int64_t seg[3] = {0, 1, 2};
  DecodeState* st[2] = {&a, &b};
  for (int i = 0; i < steps; ++i) {
    m.forward_batch(logits.data(), ids.data(), seg, 2, st, s);
    out.insert(out.end(), logits.begin(), logits.end());
    ids = {int32_t((ids[0] * 5 + 1) % V), int32_t((ids[1] * 3 + 2) % V)};
  }
  return out;
}

// A budget so large that the stream's slot counts, not the budget, decide (StreamOptions::cache_slots).
inline constexpr uint64_t kBigBudget = uint64_t(1) << 40;

inline LoadOptions load_opts(uint64_t budget, bool as_stored) {
  LoadOptions lo;
  lo.dense_as_stored = as_stored;
  lo.ram_budget_bytes = budget;
  return lo;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace k3::test
