// Checkpoints in the released layout (docs/model.md sections 1, 5, 8; names from
// model/param_specs.h): a directory with config.json (Hugging Face nested form), the weights
// as safetensors shards (model.safetensors, or model-0000i-of-0000N.safetensors + index) under
// the `language_model.model.` names, and optionally tokenizer.json (io/tokenizer.h).
//
// Loading: dense tensors bf16, f16 or f32, converted to f32 into the WeightStore (or, with
// LoadOptions::dense_as_stored, bf16 matrices kept as zero-copy bf16 views); routed
// experts either MXFP4 (`weight_packed` + `weight_scale`), kept quantised as zero-copy views of
// the mmap'ed file (default) or dequantised, or plain `.weight` in a float dtype. Every missing
// tensor, wrong shape, wrong dtype, and every `language_model.*` tensor the config does not
// have, is a k3::Error naming the tensor, the expected and found value and the file.
// The release's other forms (model/release_layout.h) are read too: a zero-padded 1-D A_log
// (non-zero padding is an error), the pre-release k3cpp names of the output AttnRes read
// (one notice line), and `vision_tower.*` / `mm_projector.*` tensors, checked against
// vision_config when there is one and skipped with one line. Other tensors outside
// `language_model.` (a training checkpoint's train_state) are ignored.
//
// Saving writes the released names (so k3cpp checkpoints and the release are one format):
// dense tensors f32 (exact training resume; default) or bf16 (the release's), routed experts
// plain or MXFP4, config.json and tokenizer.json. The directory is written whole into a
// temporary directory beside the target and then swapped into place (renameat2
// RENAME_EXCHANGE, or two renames where the filesystem lacks it), so an interrupted write never
// destroys a previous checkpoint; the target directory is replaced as a whole.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "io/config.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "kernels/ops.h"
#include "model/k3_model.h"
#include "model/weights.h"

namespace k3 {

struct LoadOptions {
  // The backend the loaded model runs on (kernels/ops.h; null: the CPU): a device backend gets
  // a copy of every weight (K3Model::to_backend; a k3::Error when they do not fit its memory,
  // or when the weights stream from disk, which only the CPU does).
  std::shared_ptr<const Ops> backend;
  // MXFP4 routed experts become f32 (training, or a check against a plain reference). By
  // default they stay MXFP4 when every routed expert is stored so; a checkpoint with any plain
  // expert loads all experts as f32.
  bool dequantize_experts = false;
  // Inference: dense matrices stored as bf16 stay bf16 (zero-copy views of the mapped file,
  // read by the kernels as stored); otherwise every dense tensor is widened into the f32
  // buffer (training keeps f32 master weights).
  bool dense_as_stored = false;
  // Memory-limited inference: the budget in bytes for what the engine holds (0: resident, the
  // default). The loading path for a budget is infer/weight_stream.h load_inference_model
  // (CLI forward / generate / chat --ram-budget; a server sets this field and calls it):
  // there load_weights validates every MXFP4 routed expert (names, dtypes, shapes) but takes
  // no view of it (WeightStore::experts_external), and an expert cache reads them on demand.
  uint64_t ram_budget_bytes = 0;
  // Memory-limited inference with the trunk streamed (set by load_inference_model when the
  // trunk does not fit the budget): every decoder layer's dense matrices are validated but not
  // held (ParamLayout::streamed); a trunk ring reads them layer by layer (infer/trunk_ring.h).
  bool stream_trunk = false;
  int64_t pinned_layers = 0;  // with stream_trunk: layers [0, pinned_layers) held all the same (a pinned prefix)
  // Memory-limited inference with the embedding and lm_head streamed (load_inference_model
  // when they do not fit): both validated but not held; a HeadProvider reads embedding rows
  // and lm_head blocks on demand (infer/head_stream.h).
  bool stream_head = false;
  // Expert-parallel inference: the routed experts this process computes (by index); set, the
  // others are validated but not converted, and their f32 memory (plain experts) is given back
  // after the load (WeightStore::release_routed_experts); MXFP4 experts stay views of the
  // mapped file, whose pages only the kept experts touch. Unset: every expert.
  std::function<bool(int64_t expert)> keep_expert;
  // Receives the load's one-line notices (legacy names, skipped vision tensors); unset: stderr.
  std::function<void(const std::string&)> log;
};

// The weights of `cfg` from an open checkpoint (see the contract above).
WeightStore load_weights(const CheckpointReader& ck, const K3Config& cfg, const LoadOptions& opt = {});

// A model directory: <dir>/config.json required, <dir>/tokenizer.json optional.
struct ModelDir {
  std::string dir;
  std::string config_path;
  std::string tokenizer_path;  // "" if the directory has no tokenizer.json
  K3Config config;
};
// k3::Error if `dir` is not a directory or has no readable, valid config.json.
ModelDir open_model_dir(const std::string& dir);
K3Model load_model(const ModelDir& md, const LoadOptions& opt = {});
K3Model load_model(const std::string& dir, const LoadOptions& opt = {});
// The directory's byte tokenizer; k3::Error when it has none or one of an unsupported type.
ByteTokenizer load_model_tokenizer(const ModelDir& md);

struct SaveOptions {
  DType dense_dtype = DType::F32;                // F32 or BF16 (F16 accepted too)
  ExpertStorage experts = ExpertStorage::Plain;  // Mxfp4: widths must be multiples of 32
  uint64_t max_shard_bytes = uint64_t(4) << 30;  // per safetensors shard
  std::string tokenizer_json;                    // written as tokenizer.json when non-empty
  // Called with the complete temporary directory just before it is swapped into place
  // (tests use it to interrupt a save).
  std::function<void(const std::string& tmp_dir)> before_commit;
};

// Writes `w` (and its config) as a checkpoint directory `dir`, replacing any previous one
// atomically (see above). Returns the safetensors files written (final paths).
std::vector<std::string> save_checkpoint(const std::string& dir, const WeightStore& w, const SaveOptions& opt = {});

}  // namespace k3
