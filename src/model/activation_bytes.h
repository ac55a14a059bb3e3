// Bytes a training forward keeps for its backward (the ForwardRecord: the decoder layers'
// records, the mixers' and MoE blocks' saved activations, the block stack), by role, counted
// from the buffers' capacities: the figure issue 32's activation-memory work is measured by
// (bench_train_step's act_KB_per_token; docs/benchmarks.md, "Training memory").
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "model/k3_model.h"

namespace k3 {

// role ("layer.partial_in", "kda.q_lin", "moe.slot_gu", "kda.chunk_states", ...) -> bytes.
template <typename R>
std::map<std::string, int64_t> activation_bytes(const ForwardRecordT<R>& rec);
template <typename R>
int64_t activation_bytes_total(const ForwardRecordT<R>& rec);

}  // namespace k3
