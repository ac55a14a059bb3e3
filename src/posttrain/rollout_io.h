// Partial rollouts saved with an RL checkpoint, so that --resume with lambda < 1 continues
// exactly (bitwise) where the uninterrupted run would: every trajectory still in the buffer
// with its tokens, loss mask, per-token behaviour logprobs and the policy version that drew
// each token, its effort, budget, tool counters, the conversation so far (the prompt the tool
// results are rendered against) and, for a trajectory that is mid-decode, its DecodeState
// itself (KDA recurrent and conv states, MLA latent cache). The state is saved rather than
// re-prefilled: a re-prefill by the checkpoint's weights would not reproduce a state that
// older policies built, and the issue asks for the saved state to be reused.
//
// Files (inside the checkpoint directory, which policy_update.h writes and renames as a
// whole): rollouts.json (format "k3cpp.rollouts" version 1: the metadata, integer arrays,
// the conversation) and rollouts.bin (raw f32: each trajectory's behav_logp, then its state
// arrays in the order and sizes rollouts.json lists), with the .bin's content hash in the
// .json. A missing, truncated or altered file is a k3::Error naming it and the field.
#pragma once
#include <string>
#include <vector>

#include "model/k3_model.h"
#include "posttrain/rollout.h"

namespace k3 {

// Writes DIR/rollouts.json and DIR/rollouts.bin (each atomically; DIR is the checkpoint's
// temporary directory).
void save_rollouts(const std::string& dir, const std::vector<Trajectory>& buffer);

// Reads them back; the states must fit `model` (the checkpoint's model). A checkpoint written
// without rollouts.json (an empty buffer) gives an empty vector.
std::vector<Trajectory> load_rollouts(const std::string& dir, const K3Model& model);

}  // namespace k3
