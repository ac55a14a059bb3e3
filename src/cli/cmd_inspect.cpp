// `k3cpp inspect <checkpoint dir or .safetensors/.index.json> [--config file] [--no-config]
//                 [--summary]`
// Lists a checkpoint's tensors grouped by layer and component (dtype, shape, bytes, totals
// per group). With a config (--config, else config.json beside the checkpoint if present)
// it checks the checkpoint against the parameter table (model/param_specs.h): every
// missing tensor, every unexpected one, every shape or dtype mismatch is reported by name
// with the expected and the found value, and the exit status is 1 if there is any.
// Routed experts are accepted either plain (`.weight`, a float dtype) or as MXFP4
// (`.weight_packed` U8 [rows, cols/2] + `.weight_scale` U8 [rows, cols/32]). The release's
// other forms are accepted as the loader accepts them (model/release_layout.h): a zero-padded
// A_log, the pre-release k3cpp names of the output AttnRes read (a note, not a problem), and
// vision tensors, checked against vision_config and listed as skipped.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/param_specs.h"
#include "model/release_layout.h"

namespace k3::cli {
namespace {

const char* kInspectUsage =
    "usage: k3cpp inspect <checkpoint dir | file.safetensors | index.json> [--config config.json]\n"
    "                     [--no-config] [--summary]\n"
    "  --config     check every tensor against this config's parameter table\n"
    "               (default: config.json beside the checkpoint, if there is one)\n"
    "  --no-config  list only, even if a config.json is present\n"
    "  --summary    print per-group totals without the per-tensor lines\n";

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dir_of(const std::string& p) {
  auto slash = p.find_last_of('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

std::string tensor_bytes_text(double v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (v >= 1024 && u < 5) { v /= 1024; ++u; }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", v);
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

// Layer index from "...layers.<i>....", -1 if the name has none.
int64_t layer_of_name(const std::string& name) {
  static const std::string key = "layers.";
  auto pos = name.find(key);
  if (pos == std::string::npos) return -1;
  size_t i = pos + key.size(), j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j - i > 9 || j >= name.size() || name[j] != '.') return -1;
  return std::stoll(name.substr(i, j - i));
}

bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

constexpr int64_t kUnmatched = INT64_MAX;  // unexpected/other tensors sort last in a layer

struct Row {
  const TensorInfo* info;
  int64_t layer;
  int64_t group_rank;  // sort key of the group within the layer
  std::string group;   // component name, or "unexpected" (with a config) / "other" (without)
  size_t order;        // table position (matched) or a large value
};

struct Problems {
  std::vector<std::string> lines, notes;
  int missing = 0, unexpected = 0, mismatch = 0;
};

// Checks the checkpoint against the table. Every checkpoint name that belongs to a spec gets
// that spec in `spec_of` and its table position in `order_of`; all others are unexpected.
void check(const CheckpointReader& ck, const K3Config& cfg, const std::vector<ParamSpec>& specs, Problems& pr,
           std::map<std::string, size_t>& order_of, std::map<std::string, const ParamSpec*>& spec_of) {
  auto expect_float = [&](const std::string& name, const ParamSpec& s) {
    const TensorInfo& ti = ck.info(name);
    if (!is_float_dtype(ti.dtype)) {
      pr.lines.push_back("dtype      " + name + ": expected a float dtype (f32, bf16, f16), found " +
                         dtype_name(ti.dtype));
      ++pr.mismatch;
    } else if (is_padded_a_log(s, ti.shape)) {
      try {
        unpad_a_log(ck, name, s);
      } catch (const Error& e) {
        pr.lines.push_back(std::string("padding    ") + e.what());
        ++pr.mismatch;
      }
      return;
    }
    if (ti.shape != s.shape) {
      pr.lines.push_back("shape      " + name + ": expected " + shape_str(s.shape) + ", found " + shape_str(ti.shape));
      ++pr.mismatch;
    }
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& s = specs[i];
    const std::string stored = stored_param_name(ck, s.name);  // the released or a legacy name
    const bool plain = ck.has(stored);
    if (plain) {
      order_of[stored] = i;
      spec_of[stored] = &s;
      expect_float(stored, s);
    }
    if (s.component != Component::RoutedExperts) {
      if (!plain) {
        pr.lines.push_back("missing    " + s.name + ": expected " + shape_str(s.shape));
        ++pr.missing;
      }
      continue;
    }
    const std::string pk = mxfp4_packed_name(s.name), sc = mxfp4_scale_name(s.name);
    const bool has_pk = ck.has(pk), has_sc = ck.has(sc);
    if (!has_pk && !has_sc) {
      if (!plain) {
        pr.lines.push_back("missing    " + s.name + ": expected " + shape_str(s.shape) +
                           " (or its MXFP4 weight_packed + weight_scale)");
        ++pr.missing;
      }
      continue;
    }
    for (const std::string* n : {&pk, &sc}) {
      if (ck.has(*n)) {
        order_of[*n] = i;
        spec_of[*n] = &s;
      }
    }
    if (plain) {
      pr.lines.push_back("unexpected " + s.name + ": stored both plain and as MXFP4");
      ++pr.unexpected;
      continue;
    }
    if (!has_pk || !has_sc) {
      pr.lines.push_back("missing    " + (has_pk ? sc : pk) + ": MXFP4 needs both weight_packed and weight_scale");
      ++pr.missing;
      continue;
    }
    if (s.shape[1] % 32 != 0) {
      pr.lines.push_back("shape      " + pk + ": MXFP4 needs the input width of " + shape_str(s.shape) +
                         " to be a multiple of 32");
      ++pr.mismatch;
      continue;
    }
    for (const StoredTensor& st : stored_tensors(s, ExpertStorage::Mxfp4)) {
      const TensorInfo& ti = ck.info(st.name);
      if (ti.dtype != st.dtype) {
        pr.lines.push_back("dtype      " + st.name + ": expected " + dtype_name(st.dtype) + ", found " +
                           dtype_name(ti.dtype));
        ++pr.mismatch;
      }
      if (ti.shape != st.shape) {
        pr.lines.push_back("shape      " + st.name + ": expected " + shape_str(st.shape) + " (MXFP4 of " +
                           shape_str(s.shape) + "), found " + shape_str(ti.shape));
        ++pr.mismatch;
      }
    }
  }
  if (const std::string note = legacy_names_notice(ck, specs); !note.empty()) pr.notes.push_back(note);
  try {
    if (const std::string v = check_vision_tensors(ck, cfg).summary; !v.empty()) pr.notes.push_back(v);
  } catch (const Error& e) {
    pr.lines.push_back(std::string("vision     ") + e.what());
    ++pr.mismatch;
  }
  for (const std::string& n : ck.names()) {
    if (order_of.count(n) || is_vision_tensor_name(n)) continue;
    const TensorInfo& ti = ck.info(n);
    pr.lines.push_back("unexpected " + n + ": " + dtype_name(ti.dtype) + " " + shape_str(ti.shape));
    ++pr.unexpected;
  }
}

}  // namespace

int cmd_inspect(const std::vector<std::string>& args) {
  Args a(args, {"config"}, {"no-config", "summary", "help"}, "inspect");
  if (a.flag("help")) {
    std::fputs(kInspectUsage, stdout);
    return 0;
  }
  if (a.positional().size() > 1)
    fail("expected one checkpoint path, got " + std::to_string(a.positional().size()));
  const std::string path = a.positional_at(0, "checkpoint");
  if (a.flag("no-config") && a.get("config")) fail("--config and --no-config exclude each other");

  std::string config_path = a.get_or("config", "");
  if (config_path.empty() && !a.flag("no-config")) {
    const std::string guess = (is_dir(path) ? path : dir_of(path)) + "/config.json";
    if (is_file(guess)) config_path = guess;
  }
  // Parse the config first: a bad config is reported before any checkpoint I/O.
  K3Config cfg;
  if (!config_path.empty()) cfg = load_config(config_path);
  const CheckpointReader ck = CheckpointReader::open(path);

  Problems pr;
  std::map<std::string, size_t> order_of;
  std::map<std::string, const ParamSpec*> spec_of;
  std::vector<ParamSpec> specs;
  if (!config_path.empty()) {
    specs = k3_param_specs(cfg);
    check(ck, cfg, specs, pr, order_of, spec_of);
  }

  // Group rows by layer, then component. With a config the groups of a layer appear in
  // table order (norms, AttnRes, mixer, FFN parts); without one in enum order.
  std::map<std::pair<int64_t, Component>, int64_t> group_first;  // table position of a group's first spec
  for (size_t i = 0; i < specs.size(); ++i) group_first.try_emplace({specs[i].layer, specs[i].component}, int64_t(i));
  // Without a config, a layer is MLA if one of its tensors has an MLA-only name.
  std::set<int64_t> mla_layers;
  if (config_path.empty())
    for (const std::string& n : ck.names()) {
      Component comp;
      if (const int64_t l = layer_of_name(n); l >= 0 && !component_of_name(n, false, &comp) &&
                                              component_of_name(n, true, &comp) && comp == Component::MLA)
        mla_layers.insert(l);
    }
  std::vector<Row> rows;
  rows.reserve(ck.size());
  uint64_t total_bytes = 0;
  for (const std::string& n : ck.names()) {
    const TensorInfo& ti = ck.info(n);
    total_bytes += ti.nbytes;
    Row r{&ti, layer_of_name(n), kUnmatched, config_path.empty() ? "other" : "unexpected", size_t(-1)};
    if (is_vision_tensor_name(n)) r.layer = -1, r.group = "vision (skipped)";
    if (auto it = spec_of.find(n); it != spec_of.end()) {
      const ParamSpec& sp = *it->second;
      r.layer = sp.layer;
      r.group_rank = group_first.at({sp.layer, sp.component});
      r.group = component_name(sp.component);
      r.order = order_of.at(n);
    } else if (Component comp; config_path.empty() && component_of_name(n, mla_layers.count(r.layer) > 0, &comp)) {
      r.group_rank = int64_t(comp);
      r.group = component_name(comp);
    }
    rows.push_back(r);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) {
    if (x.layer != y.layer) return x.layer < y.layer;
    if (x.group_rank != y.group_rank) return x.group_rank < y.group_rank;
    if (x.group != y.group) return x.group < y.group;
    return x.order < y.order;  // names are already sorted for equal orders
  });

  std::printf("checkpoint %s: %zu tensors in %zu file(s), %s (%llu bytes)\n", path.c_str(), ck.size(),
              ck.files().size(), tensor_bytes_text(double(total_bytes)).c_str(), (unsigned long long)total_bytes);
  for (size_t i = 0; i < rows.size();) {
    const int64_t layer = rows[i].layer;
    if (layer < 0) std::printf("\nglobal\n");
    else std::printf("\nlayer %lld\n", (long long)layer);
    while (i < rows.size() && rows[i].layer == layer) {
      size_t j = i;
      uint64_t bytes = 0;
      while (j < rows.size() && rows[j].layer == layer && rows[j].group == rows[i].group) bytes += rows[j++].info->nbytes;
      std::printf("  %-16s %6zu tensor(s) %12s\n", rows[i].group.c_str(), j - i, tensor_bytes_text(double(bytes)).c_str());
      if (!a.flag("summary"))
        for (size_t k = i; k < j; ++k) {
          const TensorInfo& ti = *rows[k].info;
          std::printf("    %-72s %-5s %-16s %10s\n", ti.name.c_str(), dtype_name(ti.dtype), shape_str(ti.shape).c_str(),
                      tensor_bytes_text(double(ti.nbytes)).c_str());
        }
      i = j;
    }
  }

  if (config_path.empty()) {
    std::printf("\nno config: tensors listed, not checked (pass --config to check them)\n");
    return 0;
  }
  std::printf("\ncheck against %s (%zu tensors in the table)\n", config_path.c_str(), specs.size());
  for (const std::string& l : pr.notes) std::printf("  %s\n", l.c_str());
  for (const std::string& l : pr.lines) std::printf("  %s\n", l.c_str());
  const int n = pr.missing + pr.unexpected + pr.mismatch;
  if (n == 0) {
    std::printf("OK: every tensor present with the expected shape and dtype\n");
    return 0;
  }
  std::printf("FAILED: %d problem(s): %d missing, %d unexpected, %d shape/dtype mismatch(es)\n", n, pr.missing,
              pr.unexpected, pr.mismatch);
  std::fprintf(stderr, "k3cpp inspect: %s does not match %s: %d problem(s)\n", path.c_str(), config_path.c_str(), n);
  return 1;
}

}  // namespace k3::cli
