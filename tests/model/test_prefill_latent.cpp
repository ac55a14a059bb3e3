// MixerMode::PrefillLatent (MLA absorbed over the latent cache during prefill, the long-context
// path): chunked prefills give the logits of one full forward (within 1e-4), with chunks that
// cross the KDA chunk length, and hold no expanded K/V beyond the chunk.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/fixture.h"
#include "common/random_model.h"

using namespace k3;

TEST(PrefillLatent, ChunkedEqualsTheFullForward) {
  const K3Model m = test::random_model(test::tiny_config(), 61);
  const int64_t V = m.dims().V, T = 200;
  const std::vector<int32_t> ids = test::make_ids(T, V, 62);
  std::vector<float> full(size_t(T * V));
  {
    DecodeState st = m.new_state();
    ForwardScratch s;
    m.forward(full.data(), ids.data(), T, st, s);
  }
  for (int64_t chunk : {37, 128, 200}) {
    DecodeState st = m.new_state();
    ForwardScratch s;
    ForwardOptions fo;
    fo.mode = MixerMode::PrefillLatent;
    std::vector<float> logits(size_t(chunk * V));
    for (int64_t p = 0; p < T; p += chunk) {
      const int64_t n = std::min(chunk, T - p);
      m.forward(logits.data(), ids.data() + p, n, st, s, fo);
      test::expect_close(logits.data(), full.data() + p * V, n * V, 1e-4, 0,
                         "chunk " + std::to_string(chunk) + " at " + std::to_string(p));
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_EQ(st.n_tokens, T);
    // The MLA scratch never held K/V expanded over the prefix: only the chunk-sized buffers.
    EXPECT_LE(s.layer.mla.kv.size(), size_t(0)) << "chunk " << chunk;
  }
}
