// Scoring of long-context samples (train/long_tasks.h) and loss by position, through chunked
// prefill with memory bounded by the decode state: the prompt goes through
// MixerMode::PrefillLatent in chunks (KDA state constant per layer; MLA only its latent cache),
// each answer is teacher-forced through decode steps and scored exactly: a query is right when
// the model's argmax equals every answer token.
#pragma once
#include <cstdint>
#include <vector>

#include "model/k3_model.h"
#include "train/long_tasks.h"

namespace k3 {

struct LongScore {
  int64_t queries = 0, correct = 0;  // queries answered exactly
  double answer_nll = 0;             // summed over answer tokens (nats)
  int64_t answer_tokens = 0;
  double prefill_seconds = 0;        // wall time of the prompt chunks
  int64_t prefill_tokens = 0;
  int64_t state_bytes = 0;           // the decode state after the sample (KDA/conv + MLA cache)
  int64_t state_tokens = 0;          // tokens that state holds
};

LongScore score_long_sample(const K3Model& m, const LongSample& s, int64_t chunk = 512);

// Mean next-token loss (nats) of ids per bucket of `bucket` positions: bucket b covers the
// predictions of tokens (b * bucket, (b + 1) * bucket]. Chunked like the scoring.
std::vector<double> loss_by_position(const K3Model& m, const std::vector<int32_t>& ids, int64_t bucket,
                                     int64_t chunk = 512);

// Bytes of a decode state as held, and the formula for a state after n tokens:
// per KDA layer H*D*D + 3*H*D*(K-1) floats, per MLA layer n * (kv_lora + rope) floats.
int64_t decode_state_bytes(const DecodeState& st);
int64_t decode_state_formula_bytes(const ModelDims& d, int64_t n_tokens);

}  // namespace k3
