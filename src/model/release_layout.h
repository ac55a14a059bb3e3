// The released K3 checkpoint layout beside k3cpp's own (docs/architecture.md "Tensor names"),
// shared by the loader (model/checkpoint.cpp) and `k3cpp inspect`:
//  - tensors k3cpp once wrote under other names (param_specs.h legacy_param_name) are read
//    under those names too, with one notice line;
//  - KDA `A_log` is stored [H] (k3cpp) or 1-D zero-padded to a longer length (the release:
//    F32 [128] holding K3's 96 per-head values, then zeros; public K3 loaders slice [:H]);
//  - `vision_tower.*` / `mm_projector.*` tensors are skipped by a text-only load, after a
//    check against `vision_config` when the config has one, and named in one line.
#pragma once
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "model/param_specs.h"

namespace k3 {

// The name under which the table tensor `spec_name` is stored in `ck`: the released name if
// present, else its legacy name if that is present, else `spec_name` (i.e. missing).
std::string stored_param_name(const CheckpointReader& ck, const std::string& spec_name);

// One line naming the legacy names `ck` stores table tensors under, "" if none.
std::string legacy_names_notice(const CheckpointReader& ck, const std::vector<ParamSpec>& specs);

// True when `spec` is a KDA A_log stored padded: 1-D with more entries than the spec's H.
bool is_padded_a_log(const ParamSpec& spec, const Shape& stored);

// The first H entries of the padded A_log `stored_name` (a zero-copy view). k3::Error naming
// the file and the tensor if the tensor is not a float dtype or any padding entry is not 0.
Tensor unpad_a_log(const CheckpointReader& ck, const std::string& stored_name, const ParamSpec& spec);

struct VisionTensors {
  int64_t tower = 0, projector = 0;  // vision_tower.* / mm_projector.* tensor counts
  std::string summary;               // one line for the log; "" when there are none
};
// Counts the vision tensors of `ck`; when `cfg.vision.present`, checks each against it
// (block index < vt_num_hidden_layers, norm widths vt_hidden_size, projector output width
// hidden_size) and throws k3::Error naming the file and the tensor on a mismatch.
VisionTensors check_vision_tensors(const CheckpointReader& ck, const K3Config& cfg);

}  // namespace k3
