// Checkpoint loading and saving in the released layout (see checkpoint.h).
#include "model/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "model/release_layout.h"

namespace k3 {

namespace fs = std::filesystem;

namespace {

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }


// Checks dtype class and shape of one stored tensor; the message names the tensor, the file,
// the expected and the found value.
void check_stored(const CheckpointReader& ck, const std::string& name, const Shape& shape, bool want_u8,
                  const std::string& what) {
  const TensorInfo& ti = ck.info(name);
  if (want_u8 ? ti.dtype != DType::U8 : !is_float(ti.dtype))
    fail_input(ti.file, name,
               std::string("dtype ") + dtype_name(ti.dtype) + ", expected " + (want_u8 ? "u8" : "f32, bf16 or f16") + what);
  if (ti.shape != shape)
    fail_input(ti.file, name, "shape " + shape_str(ti.shape) + ", expected " + shape_str(shape) + what);
}

// dst [n] f32 from a float tensor of any supported dtype.
void to_f32(float* dst, const Tensor& t) {
  const size_t n = size_t(t.numel());
  switch (t.dtype()) {
    case DType::F32: std::memcpy(dst, t.data<float>(), n * sizeof(float)); break;
    case DType::BF16: bf16_to_f32(t.data<uint16_t>(), dst, n); break;
    case DType::F16: f16_to_f32(t.data<uint16_t>(), dst, n); break;
    default: K3_ASSERT(false, std::string("to_f32: not a float dtype: ") + dtype_name(t.dtype()));
  }
}

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail_system("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail_system("cannot fsync directory", dir);
}

// Puts the complete directory `tmp` at `dir`: a plain rename when `dir` does not exist, else an
// atomic exchange (the old checkpoint lands at `tmp` and is then removed).
void commit_dir(const std::string& tmp, const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) fail_system("cannot stat", dir);
    if (::rename(tmp.c_str(), dir.c_str()) != 0) fail_system("cannot rename checkpoint into place", dir);
    return;
  }
  if (!S_ISDIR(st.st_mode)) fail_input(dir, "", "exists and is not a directory");
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // the old checkpoint; a leftover is harmless
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    fail_system("cannot swap checkpoint into place", dir);
  // No RENAME_EXCHANGE here: move the old one aside first; it stays recoverable at `old`.
  const std::string old = tmp + ".old";
  if (::rename(dir.c_str(), old.c_str()) != 0) fail_system("cannot move the previous checkpoint aside", dir);
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    const int e = errno;
    (void)::rename(old.c_str(), dir.c_str());
    errno = e;
    fail_system("cannot rename checkpoint into place", dir);
  }
  std::error_code ec;
  fs::remove_all(old, ec);
}

}  // namespace

WeightStore load_weights(const CheckpointReader& ck, const K3Config& cfg, const LoadOptions& opt) {
  const std::vector<ParamSpec> specs = k3_param_specs(cfg);
  // Expert storage: MXFP4 kept only when every routed expert is stored MXFP4.
  bool any_mx = false, all_mx = true;
  for (const ParamSpec& s : specs) {
    if (s.component != Component::RoutedExperts) continue;
    const bool pk = ck.has(mxfp4_packed_name(s.name)), sc = ck.has(mxfp4_scale_name(s.name));
    if (ck.has(s.name) && (pk || sc))
      fail_input(ck.info(s.name).file, s.name, "stored both plain and as MXFP4 (weight_packed / weight_scale)");
    if (pk || sc) any_mx = true;
    else all_mx = false;
  }
  const ExpertStorage storage =
      any_mx && all_mx && !opt.dequantize_experts ? ExpertStorage::Mxfp4 : ExpertStorage::Plain;
  const bool external = opt.ram_budget_bytes > 0;
  if (external && storage != ExpertStorage::Mxfp4)
    fail_input(ck.path(), "--ram-budget",
               "memory-limited inference streams MXFP4 routed experts (weight_packed + weight_scale); this checkpoint's "
               "experts are not all MXFP4" + std::string(opt.dequantize_experts ? " or --dequantize was given" : ""));
  // Dense matrices kept as stored (bf16) for inference: those a checkpoint holds as bf16 under
  // their released name with the spec's shape (anything else is validated and converted below).
  // With stream_trunk the layers' matrices are validated only (a trunk ring reads them).
  std::vector<bool> bf16_held(specs.size(), false), streamed(specs.size(), false);
  for (size_t i = 0; i < specs.size(); ++i)
    streamed[i] = (opt.stream_trunk && is_streamable_layer_matrix(specs[i]) && specs[i].layer >= opt.pinned_layers) ||
                  (opt.stream_head && is_streamable_head_matrix(specs[i]));
  const bool any_streamed = opt.stream_trunk || opt.stream_head;
  if (opt.dense_as_stored)
    for (size_t i = 0; i < specs.size(); ++i) {
      const ParamSpec& s = specs[i];
      if (streamed[i] || s.component == Component::RoutedExperts || s.shape.size() != 2 || s.shape[0] < 2 ||
          s.shape[1] < 2 || !ck.has(s.name))
        continue;
      const auto& info = ck.info(s.name);
      bf16_held[i] = info.dtype == DType::BF16 && info.shape == s.shape;
    }
  WeightStore w(cfg, storage, bf16_held, any_streamed ? streamed : std::vector<bool>{});
  if (external) w.set_experts_external();
  const ParamLayout& lay = w.layout();

  // Validate everything and take the views (serially), then convert (in parallel).
  enum class Kind { Dense, Bf16Keep, MxKeep, MxDequant };
  struct Job {
    size_t i;
    Kind kind;
    Tensor a, b;  // dense tensor, or packed + scales
  };
  std::vector<Job> jobs;
  jobs.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& s = specs[i];
    const bool routed = s.component == Component::RoutedExperts;
    const std::string pk = mxfp4_packed_name(s.name), sc = mxfp4_scale_name(s.name);
    if (routed && (ck.has(pk) || ck.has(sc))) {
      if (!ck.has(pk) || !ck.has(sc))
        fail_input(ck.path(), ck.has(pk) ? sc : pk,
                   "missing (MXFP4 needs both weight_packed and weight_scale of " + s.name + ")");
      const std::vector<StoredTensor> st = stored_tensors(s, ExpertStorage::Mxfp4);  // throws on cols % 32
      const std::string what = " (MXFP4 of " + s.name + " " + shape_str(s.shape) + ")";
      check_stored(ck, pk, st[0].shape, true, what);
      check_stored(ck, sc, st[1].shape, true, what);
      if (external) continue;  // read on demand by the expert cache (infer/weight_stream.h)
      if (storage != ExpertStorage::Mxfp4 && opt.keep_expert && !opt.keep_expert(s.expert)) continue;
      jobs.push_back({i, storage == ExpertStorage::Mxfp4 ? Kind::MxKeep : Kind::MxDequant, ck.get(pk), ck.get(sc)});
      continue;
    }
    const std::string name = stored_param_name(ck, s.name);  // the released or a legacy name
    if (!ck.has(name))
      fail_input(ck.path(), s.name,
                 "missing from the checkpoint (expected shape " + shape_str(s.shape) +
                     (routed ? ", plain or as MXFP4 weight_packed + weight_scale)" : ")"));
    if (is_padded_a_log(s, ck.info(name).shape)) {  // the release's zero-padded A_log
      jobs.push_back({i, Kind::Dense, unpad_a_log(ck, name, s), Tensor()});
      continue;
    }
    check_stored(ck, name, s.shape, false, "");
    if (streamed[i]) continue;  // read by the trunk ring / head streamer (infer/trunk_ring.h, head_stream.h)
    if (routed && opt.keep_expert && !opt.keep_expert(s.expert)) continue;  // another rank's expert
    jobs.push_back({i, bf16_held[i] ? Kind::Bf16Keep : Kind::Dense, ck.get(name), Tensor()});
  }
  // A language-model tensor that the config does not have means checkpoint and config disagree.
  for (const std::string& n : ck.names()) {
    if (!n.starts_with("language_model.")) continue;
    std::string base = mxfp4_weight_name(n);
    if (base.empty()) base = n;
    if (const std::string rel = released_param_name(base); !rel.empty()) {
      if (ck.has(rel)) fail_input(ck.info(n).file, n, "stored both under this pre-release name and as " + rel);
      continue;
    }
    if (lay.find(base) < 0)
      fail_input(ck.info(n).file, n, "not a tensor of the config (" + std::to_string(cfg.num_hidden_layers) +
                                         " layers, " + std::to_string(cfg.num_experts) + " experts)");
  }
  // Notices, one line each: legacy names read, vision tensors skipped (after their check).
  const std::string vision = check_vision_tensors(ck, cfg).summary;
  for (const std::string& line : {legacy_names_notice(ck, specs), vision})
    if (!line.empty()) {
      if (opt.log) opt.log(line);
      else std::fprintf(stderr, "%s\n", line.c_str());
    }

#pragma omp parallel for schedule(dynamic)
  for (size_t j = 0; j < jobs.size(); ++j) {
    Job& jb = jobs[j];
    const ParamSpec& s = specs[jb.i];
    switch (jb.kind) {
      case Kind::Dense: to_f32(w.param(jb.i), jb.a); break;
      case Kind::Bf16Keep: w.set_bf16(jb.i, std::move(jb.a)); break;
      case Kind::MxKeep: {
        Mxfp4Matrix m;
        m.rows = s.shape[0], m.cols = s.shape[1];
        m.packed = std::move(jb.a), m.scales = std::move(jb.b);
        w.set_mxfp4(jb.i, std::move(m));
        break;
      }
      case Kind::MxDequant: {
        const int64_t rows = s.shape[0], cols = s.shape[1];
        const uint8_t* p = jb.a.data<uint8_t>();
        const uint8_t* sc = jb.b.data<uint8_t>();
        float* dst = w.param(jb.i);
        for (int64_t r = 0; r < rows; ++r)
          mxfp4_decode_row(p + r * (cols / 2), sc + r * (cols / 32), dst + r * cols, size_t(cols));
        break;
      }
    }
  }
  if (opt.keep_expert && storage == ExpertStorage::Plain) {
    const int64_t released = w.release_routed_experts(opt.keep_expert);
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.1f", double(released) / double(1 << 20));
    const std::string line =
        "released " + std::to_string(released) + " bytes (" + mib + " MiB) of the routed experts other ranks compute";
    if (opt.log) opt.log(line);
    else std::fprintf(stderr, "%s\n", line.c_str());
  }
  return w;
}

ModelDir open_model_dir(const std::string& dir) {
  if (!is_dir(dir)) {
    if (::access(dir.c_str(), F_OK) != 0) fail_input(dir, "", "no such model directory");
    fail_input(dir, "", "not a directory (a model directory holds config.json and *.safetensors)");
  }
  ModelDir md;
  md.dir = dir;
  md.config_path = (fs::path(dir) / "config.json").string();
  if (!is_file(md.config_path))
    fail_input(md.config_path, "", "missing (a model directory holds config.json and *.safetensors)");
  md.config = load_config(md.config_path);
  const std::string tok = (fs::path(dir) / "tokenizer.json").string();
  if (is_file(tok)) md.tokenizer_path = tok;
  return md;
}

K3Model load_model(const ModelDir& md, const LoadOptions& opt) {
  const CheckpointReader ck = CheckpointReader::open(md.dir);
  if (ck.size() == 0) fail_input(md.dir, "", "no safetensors files in the model directory");
  K3Model m(load_weights(ck, md.config, opt));
  if (opt.backend) m.to_backend(opt.backend);
  return m;
}

K3Model load_model(const std::string& dir, const LoadOptions& opt) { return load_model(open_model_dir(dir), opt); }

ByteTokenizer load_model_tokenizer(const ModelDir& md) {
  if (md.tokenizer_path.empty())
    fail_input(md.dir, "tokenizer.json",
               "missing: text needs the k3cpp byte tokenizer (use --ids, and --ids-out for output)");
  return ByteTokenizer::load(md.tokenizer_path);
}

std::vector<std::string> save_checkpoint(const std::string& dir_in, const WeightStore& w, const SaveOptions& opt) {
  if (!is_float(opt.dense_dtype))
    fail(std::string("checkpoint dense dtype must be f32, bf16 or f16, not ") + dtype_name(opt.dense_dtype));
  fs::path dirp = fs::path(dir_in).lexically_normal();
  if (dirp.filename().empty()) dirp = dirp.parent_path();
  if (dirp.empty()) fail_input(dir_in, "", "not a usable checkpoint directory name");
  const std::string dir = dirp.string();
  const fs::path parent = dirp.has_parent_path() ? dirp.parent_path() : fs::path(".");
  const ParamLayout& lay = w.layout();
  const std::vector<ParamSpec>& specs = lay.specs();

  // Every stored tensor, in table order; quantisation and dtype conversion in parallel.
  // Widths that MXFP4 cannot hold are refused here, before anything is written.
  struct Slot {
    Tensor a, b;
  };
  std::vector<Slot> slots(specs.size());
  std::vector<bool> mx(specs.size(), false);
  for (size_t i = 0; i < specs.size(); ++i)
    if (opt.experts == ExpertStorage::Mxfp4 && specs[i].component == Component::RoutedExperts) {
      stored_tensors(specs[i], ExpertStorage::Mxfp4);
      mx[i] = true;
    }
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < specs.size(); ++i) {
    if (mx[i]) {
      Mxfp4Matrix m = w.has_mxfp4(i) ? w.mxfp4(i) : Mxfp4Matrix::quantize(w.tensor(i));
      slots[i] = {m.packed, m.scales};
    } else {
      Tensor t = lay.in_buffer(i) ? w.tensor(i) : lay.bf16_held(i) ? w.bf16(i) : w.mxfp4(i).dequantize();
      slots[i].a = t.dtype() == opt.dense_dtype ? t : t.to(opt.dense_dtype);
    }
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.reserve(specs.size() + 8);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (mx[i]) {
      tensors.emplace_back(mxfp4_packed_name(specs[i].name), slots[i].a);
      tensors.emplace_back(mxfp4_scale_name(specs[i].name), slots[i].b);
    } else {
      tensors.emplace_back(specs[i].name, slots[i].a);
    }
  }

  if (::access(dir.c_str(), F_OK) == 0 && !is_dir(dir)) fail_input(dir, "", "exists and is not a directory");
  make_directories(parent.string());
  std::string tmp_name = ".";  // hidden, beside the target: same filesystem, so rename works
  tmp_name += dirp.filename().string();
  tmp_name += ".tmp.";
  tmp_name += std::to_string(::getpid());
  const std::string tmp = (parent / tmp_name).string();
  std::error_code ec;
  fs::remove_all(tmp, ec);
  std::vector<std::string> written;
  try {
    if (::mkdir(tmp.c_str(), 0777) != 0) fail_system("cannot create temporary checkpoint directory", tmp);
    written = write_checkpoint_shards(tmp, tensors, opt.max_shard_bytes, {{"format", "pt"}});
    // config.json states what the directory holds: the text model only (no vision_config),
    // quantization_config exactly when the routed experts are MXFP4.
    K3Config out = w.config();
    out.vision = {};
    out.quantization = opt.experts == ExpertStorage::Mxfp4 ? release_mxfp4_quantization() : K3Config::Quantization{};
    write_text_file_atomic((fs::path(tmp) / "config.json").string(), config_to_hf_json(out));
    if (!opt.tokenizer_json.empty())
      write_text_file_atomic((fs::path(tmp) / "tokenizer.json").string(), opt.tokenizer_json);
    fsync_dir(tmp);
    if (opt.before_commit) opt.before_commit(tmp);
    commit_dir(tmp, dir);
    fsync_dir(parent.string());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  for (std::string& p : written) p = (dirp / fs::path(p).filename()).string();
  return written;
}

}  // namespace k3
