// See safetensors.h. Validation order in SafetensorsFile::open: header length, JSON (with
// duplicate-key detection, since nlohmann::json silently keeps the last duplicate), then
// every entry, then overlaps; views are only created afterwards, from checked offsets.
#include "io/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "io/atomic_file.h"

namespace k3 {

using nlohmann::json;

namespace {

constexpr int kMaxJsonDepth = 64;  // safetensors headers nest 3 deep; refuse pathological input

// A name as a JSON string literal: unambiguous in messages even with quotes or control bytes.
std::string json_quoted(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}
std::string tensor_field(const std::string& name) { return "tensor " + json_quoted(name); }

// The parts of a header or index that a key-checking walk can capture on the way, so that the
// common, well-formed file needs no JSON tree (a tree of the full K3's 494k-tensor index and
// headers costs far more memory than the tensor table it yields: docs/memory-limited.md).
// `plain` stays true while everything seen has the expected types; the first surprise (a
// wrong type, an unknown key inside an entry, a negative or fractional number) clears it and
// the caller builds the tree instead, which then reports the error with its usual message.
struct RawEntry {
  std::string name, dtype;
  Shape shape;  // each dimension checked <= INT64_MAX
  uint64_t begin = 0, end = 0;
};
struct CapturedJson {
  bool plain = true;
  // header: the entry being read, handed to on_entry when it ends (false: it failed a check)
  RawEntry entry;
  std::function<bool(RawEntry&)> on_entry;
  std::vector<std::pair<std::string, std::string>> metadata;
  // index: weight_map as (tensor, position in files)
  std::vector<std::pair<std::string, uint32_t>> weight_map;
  std::vector<std::string> files;
  bool has_weight_map = false;
};

// Parses JSON from [begin, end), refusing duplicate keys in any object and nesting deeper
// than kMaxJsonDepth. `what` names the part of the file in messages ("header", "index").
// With `capture`, also fills it (the header's entries, or the index's weight_map); returns
// a null json when the capture is complete (plain and no syntax error): no tree is built.
json parse_json_strict(const std::string& path, const std::string& what, const char* begin, const char* end,
                       CapturedJson* capture = nullptr) {
  // Pass 1: a SAX walk that tracks keys (duplicates, depth) and captures. nlohmann's parse
  // callback would check the keys too but its DOM builder rescans the parent object at every
  // object end, which is quadratic in the number of tensors (37k-tensor headers took ~10 s).
  struct KeyCheck : json::json_sax_t {
    const std::string& path;
    const std::string& what;
    CapturedJson* cap;
    const bool header;
    std::vector<std::set<std::string>> keys;  // one set per open object
    std::vector<bool> is_object;              // open containers
    std::string top_key, inner_key;           // the current keys of the two outer objects
    std::unordered_map<std::string, uint32_t> file_ix;
    bool seen_dtype = false, seen_shape = false, seen_offsets = false;
    KeyCheck(const std::string& p, const std::string& w, CapturedJson* c)
        : path(p), what(w), cap(c), header(w == "header") {}
    size_t depth() const { return is_object.size(); }
    void surprise() {
      if (cap) cap->plain = false;
    }
    bool in_entry() const { return header && top_key != "__metadata__"; }
    // An index's values outside weight_map ("metadata") are not used: any JSON is plain there.
    bool index_other() const { return !header && depth() >= 1 && top_key != "weight_map"; }
    void scalar() {  // null, true / false, a negative or fractional number, binary
      if (!index_other()) surprise();
    }
    // A number at the current position (only unsigned ones are plain in a header).
    void number(uint64_t v) {
      if (!cap || !cap->plain || index_other()) return;
      if (!header || !in_entry() || depth() != 3 || is_object.back()) return surprise();
      RawEntry& e = cap->entry;
      if (inner_key == "shape") {
        if (v > uint64_t(INT64_MAX)) return surprise();
        e.shape.push_back(int64_t(v));
      } else if (inner_key == "data_offsets" && n_offsets < 2) {
        (n_offsets++ == 0 ? e.begin : e.end) = v;
      } else {
        surprise();
      }
    }
    int n_offsets = 0;
    bool null() override { scalar(); return true; }
    bool boolean(bool) override { scalar(); return true; }
    bool number_integer(number_integer_t) override { scalar(); return true; }
    bool number_unsigned(number_unsigned_t v) override { number(uint64_t(v)); return true; }
    bool number_float(number_float_t, const string_t&) override { scalar(); return true; }
    bool string(string_t& s) override {
      if (!cap || !cap->plain || index_other()) return true;
      if (header && depth() == 2 && top_key == "__metadata__") {
        cap->metadata.emplace_back(inner_key, s);
      } else if (header && depth() == 2 && inner_key == "dtype") {
        cap->entry.dtype = s;
      } else if (!header && depth() == 2 && top_key == "weight_map") {
        auto it = file_ix.emplace(s, uint32_t(cap->files.size())).first;
        if (it->second == cap->files.size()) cap->files.push_back(s);
        cap->weight_map.emplace_back(inner_key, it->second);
      } else {
        surprise();  // a string where the header has none, or a top-level / weight_map oddity
      }
      return true;
    }
    bool binary(binary_t&) override { scalar(); return true; }
    void open(bool obj) {
      if (int64_t(is_object.size()) >= kMaxJsonDepth)
        fail_input(path, what, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      if (cap && cap->plain) {
        const size_t d = depth();  // the new container's depth is d + 1
        if (d == 0) {
          if (!obj) surprise();
        } else if (header) {
          if (d == 1 && !obj) surprise();  // an entry or __metadata__ that is an array
          if (d == 1 && obj && top_key != "__metadata__") {
            cap->entry = RawEntry{};
            cap->entry.name = top_key;
            seen_dtype = seen_shape = seen_offsets = false;
          }
          if (d == 2 && (obj || top_key == "__metadata__" || (inner_key != "shape" && inner_key != "data_offsets")))
            surprise();
          if (d == 2 && inner_key == "data_offsets") n_offsets = 0;
          if (d >= 3) surprise();
        } else if (d == 1 && top_key == "weight_map") {
          if (!obj) surprise();
          cap->has_weight_map = true;
        } else if (d >= 2 && top_key == "weight_map") {
          surprise();
        }
      }
      is_object.push_back(obj);
      if (obj) keys.emplace_back();
    }
    bool start_object(std::size_t) override { open(true); return true; }
    bool start_array(std::size_t) override { open(false); return true; }
    bool end_object() override {
      if (cap && cap->plain && header && depth() == 2 && top_key != "__metadata__") {
        if (!(seen_dtype && seen_shape && seen_offsets)) surprise();  // an entry without one of its three fields
        else if (!cap->on_entry(cap->entry)) surprise();
      }
      keys.pop_back();
      is_object.pop_back();
      return true;
    }
    bool end_array() override {
      if (cap && cap->plain && header && depth() == 3 && inner_key == "data_offsets" && n_offsets != 2) surprise();
      is_object.pop_back();
      return true;
    }
    bool key(string_t& k) override {
      if (keys.size() == 1) top_key = k;
      if (keys.size() == 2) inner_key = k;
      if (!keys.back().insert(k).second) {
        auto entry = [&](const std::string& key) { return key == "__metadata__" ? key : tensor_field(key); };
        if (keys.size() == 1 && header) fail_input(path, entry(k), "appears twice in the header");
        std::string field = keys.size() == 1 ? what : keys.size() == 2 ? (header ? entry(top_key) : what + ": " + top_key) : what;
        fail_input(path, field, "duplicate key " + json_quoted(k));
      }
      if (cap && cap->plain && header && keys.size() == 2 && top_key != "__metadata__") {
        if (k == "dtype") seen_dtype = true;
        else if (k == "shape") seen_shape = true;
        else if (k == "data_offsets") seen_offsets = true;
        else surprise();  // an extra field: valid, left to the tree
      }
      return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
  };
  KeyCheck check(path, what, capture);
  // A syntax error stops the SAX walk; pass 2 then reports it with the parser's message.
  const bool well_formed = json::sax_parse(begin, end, &check);
  if (capture && well_formed && capture->plain && check.is_object.empty()) return json();
  if (capture) {
    capture->plain = false;
    capture->metadata.clear();
    capture->weight_map.clear();
    capture->files.clear();
  }
  try {
    return json::parse(begin, end);
  } catch (const json::exception& e) {
    fail_input(path, what, std::string("not valid JSON (") + e.what() + ")");
  }
}

// A JSON value that must be a non-negative integer not above `max`.
bool get_uint(const json& v, uint64_t max, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = uint64_t(i);
  } else {
    return false;
  }
  return *out <= max;
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool is_regular_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool is_directory(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
}  // namespace

// ---------------------------------------------------------------------------------------
// SafetensorsFile

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path, HeaderParse parse) {
  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->map_ = MappedFile::open(path);
  const uint8_t* base = f->map_->data();
  const uint64_t size = f->map_->size();
  if (size < 8)
    fail_input(path, "header length", "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  const uint64_t n = read_le64(base);
  if (n > kSafetensorsMaxHeader)
    fail_input(path, "header length", std::to_string(n) + " exceeds the limit of " + std::to_string(kSafetensorsMaxHeader) + " bytes");
  if (n > size - 8)
    fail_input(path, "header length", std::to_string(n) + " exceeds the " + std::to_string(size - 8) + " bytes after the length field");
  if (n < 2) fail_input(path, "header", "is " + std::to_string(n) + " bytes, too short for a JSON object");
  f->header_size_ = n;
  const char* hb = reinterpret_cast<const char*>(base + 8);
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;
  std::vector<TensorInfo> infos;
  // The checks that need no JSON: shape, dtype and offsets against the data section. "" if
  // the entry is good (then *info is filled), else the message.
  auto check_entry = [&](RawEntry& e, TensorInfo* info) -> std::string {
    info->name = std::move(e.name);
    info->file = path;
    if (!dtype_from_safetensors(e.dtype, &info->dtype))
      return "unsupported dtype " + json_quoted(e.dtype) + " (supported: F32, F64, BF16, F16, U8, I8, I32, I64, BOOL)";
    uint64_t numel = 1;
    bool overflow = false;
    for (int64_t v : e.shape) overflow |= __builtin_mul_overflow(numel, uint64_t(v), &numel);
    uint64_t expect = 0;
    overflow |= numel > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, uint64_t(dtype_size(info->dtype)), &expect);
    if (overflow) return "shape " + json(e.shape).dump() + " has more bytes than can be addressed";
    if (e.begin > e.end) return "data_offsets " + json({e.begin, e.end}).dump() + " has begin > end";
    if (e.end > data_size)
      return "data_offsets end " + std::to_string(e.end) + " is beyond the data section (" + std::to_string(data_size) + " bytes)";
    if (e.end - e.begin != expect)
      return "data_offsets span " + std::to_string(e.end - e.begin) + " bytes but " + e.dtype + " " + shape_str(e.shape) +
             " needs " + std::to_string(expect);
    info->shape = std::move(e.shape);
    info->offset = data_start + e.begin;
    info->nbytes = expect;
    return "";
  };
  // The walk hands over each entry as it ends; one that fails a check stops the capture (the
  // tree then reports it). Released and k3cpp headers take about 140 bytes a tensor.
  CapturedJson cap;
  cap.plain = parse == HeaderParse::Walk;
  if (cap.plain) infos.reserve(n / 128);
  cap.on_entry = [&](RawEntry& e) {
    TensorInfo info;
    if (!check_entry(e, &info).empty()) return false;
    infos.push_back(std::move(info));
    return true;
  };
  const json header = parse_json_strict(path, "header", hb, hb + n, cap.plain ? &cap : nullptr);
  const bool captured = cap.plain;
  if (captured)
    for (auto& [k, v] : cap.metadata) f->metadata_[k] = std::move(v);
  // Not captured: the walk built the tree (header) and it reports what was wrong.
  const json& h = header;
  if (!captured) {
    infos.clear();
    if (!h.is_object()) fail_input(path, "header", std::string("is a JSON ") + h.type_name() + ", not an object");
    for (const auto& [name, e] : h.items()) {
      if (name == "__metadata__") {
        if (!e.is_object()) fail_input(path, "__metadata__", std::string("is a JSON ") + e.type_name() + ", not an object");
        for (const auto& [k, v] : e.items()) {
          if (!v.is_string()) fail_input(path, "__metadata__ " + json_quoted(k), std::string("is a JSON ") + v.type_name() + ", not a string");
          f->metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      const std::string field = tensor_field(name);
      if (!e.is_object()) fail_input(path, field, std::string("entry is a JSON ") + e.type_name() + ", not an object");
      for (const char* k : {"dtype", "shape", "data_offsets"})
        if (!e.contains(k)) fail_input(path, field, std::string("entry has no \"") + k + "\"");
      RawEntry raw;
      raw.name = name;
      const json& dt = e["dtype"];
      if (!dt.is_string()) fail_input(path, field, std::string("dtype is a JSON ") + dt.type_name() + ", not a string");
      raw.dtype = dt.get<std::string>();
      const json& sh = e["shape"];
      if (!sh.is_array()) fail_input(path, field, std::string("shape is a JSON ") + sh.type_name() + ", not an array");
      for (const json& d : sh) {
        uint64_t v;
        if (!get_uint(d, uint64_t(INT64_MAX), &v))
          fail_input(path, field, "shape " + sh.dump() + " has a dimension that is not a non-negative integer");
        raw.shape.push_back(v);
      }
      const json& off = e["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !get_uint(off[0], UINT64_MAX, &raw.begin) || !get_uint(off[1], UINT64_MAX, &raw.end))
        fail_input(path, field, "data_offsets " + off.dump() + " is not [begin, end] with non-negative integers");
      TensorInfo info;
      const std::string err = check_entry(raw, &info);
      if (!err.empty()) fail_input(path, field, err);
      infos.push_back(std::move(info));
    }
  }
  // File order (offset, then length, then name: the same order as by the header's
  // data_offsets, shifted by data_start); empty tensors occupy no bytes and overlap nothing.
  std::sort(infos.begin(), infos.end(), [](const TensorInfo& x, const TensorInfo& y) {
    if (x.offset != y.offset) return x.offset < y.offset;
    if (x.nbytes != y.nbytes) return x.nbytes < y.nbytes;
    return x.name < y.name;
  });
  uint64_t max_end = 0;
  const TensorInfo* owner = nullptr;
  for (const TensorInfo& t : infos) {
    if (t.nbytes == 0) continue;
    if (owner && t.offset < max_end)
      fail_input(path, tensor_field(t.name), "data_offsets [" + std::to_string(t.offset - data_start) + ", " +
                                                 std::to_string(t.offset - data_start + t.nbytes) + "] overlap those of tensor " +
                                                 json_quoted(owner->name));
    max_end = t.offset + t.nbytes;
    owner = &t;
  }
  f->tensors_ = std::move(infos);
  // The name index: positions sorted by name (4 bytes a tensor, no copy of the names).
  f->by_name_.resize(f->tensors_.size());
  for (size_t i = 0; i < f->by_name_.size(); ++i) f->by_name_[i] = uint32_t(i);
  std::sort(f->by_name_.begin(), f->by_name_.end(),
            [&](uint32_t a, uint32_t b) { return f->tensors_[a].name < f->tensors_[b].name; });
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](uint32_t i, const std::string& n) { return tensors_[i].name < n; });
  return it != by_name_.end() && tensors_[*it].name == name ? &tensors_[*it] : nullptr;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (!info) fail_input(path(), tensor_field(name), "not in this file");
  return get(*info);
}

Tensor SafetensorsFile::get(const TensorInfo& info) const {
  K3_ASSERT(info.file == path() && info.offset + info.nbytes <= map_->size(), "TensorInfo from another file");
  const uint8_t* p = map_->data() + info.offset;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(info.dtype) == 0)
    return Tensor::view_of(info.dtype, info.shape, const_cast<uint8_t*>(p), map_);
  Tensor t = Tensor::empty(info.dtype, info.shape);  // misaligned in the file: aligned copy
  std::memcpy(t.raw(), p, info.nbytes);
  return t;
}

// ---------------------------------------------------------------------------------------
// CheckpointReader

CheckpointReader CheckpointReader::open(const std::string& path, HeaderParse parse) {
  CheckpointReader r;
  r.path_ = path;
  std::string dir, index;
  std::vector<std::string> shard_names;  // relative to dir (or the path itself)
  if (is_directory(path)) {
    dir = path;
    if (is_regular_file(join_path(dir, "model.safetensors.index.json"))) index = join_path(dir, "model.safetensors.index.json");
  } else if (path.ends_with(".json") && is_regular_file(path)) {
    index = path;
    size_t slash = path.find_last_of('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  } else {
    r.files_.push_back(SafetensorsFile::open(path, parse));  // also reports a missing path
  }

  // weight_map (index only): tensor -> position in map_files, in name order.
  std::vector<std::pair<std::string, uint32_t>> weight_map;
  std::vector<std::string> map_files;
  if (!index.empty()) {
    auto m = MappedFile::open(index);
    const char* b = reinterpret_cast<const char*>(m->data());
    CapturedJson cap;
    cap.plain = parse == HeaderParse::Walk;
    const json j = parse_json_strict(index, "index", b, b + m->size(), cap.plain ? &cap : nullptr);
    if (cap.plain) {  // no tree was built
      if (!cap.has_weight_map) fail_input(index, "weight_map", "missing or not an object");
      weight_map = std::move(cap.weight_map);
      map_files = std::move(cap.files);
      std::sort(weight_map.begin(), weight_map.end());
    } else {
      if (!j.is_object()) fail_input(index, "index", std::string("is a JSON ") + j.type_name() + ", not an object");
      if (!j.contains("weight_map") || !j["weight_map"].is_object()) fail_input(index, "weight_map", "missing or not an object");
      std::map<std::string, uint32_t> file_ix;
      for (const auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string()) fail_input(index, "weight_map " + tensor_field(name), "file name is not a string");
        auto it = file_ix.emplace(file.get<std::string>(), uint32_t(map_files.size())).first;
        if (it->second == map_files.size()) map_files.push_back(it->first);
        weight_map.emplace_back(name, it->second);
      }
    }
    // Each file is checked once, at the first tensor (in name order) that names it.
    std::vector<bool> checked(map_files.size(), false);
    for (const auto& [name, ix] : weight_map) {
      if (checked[ix]) continue;
      checked[ix] = true;
      const std::string& fn = map_files[ix];
      if (fn.empty() || fn[0] == '/' || fn == ".." || fn.rfind("../", 0) == 0 || fn.find("/../") != std::string::npos ||
          fn.ends_with("/.."))
        fail_input(index, "weight_map " + tensor_field(name), "file name " + json_quoted(fn) + " is not a path inside the checkpoint directory");
      if (!is_regular_file(join_path(dir, fn)))
        fail_input(index, "weight_map " + tensor_field(name), "file " + json_quoted(fn) + " does not exist in " + dir);
      shard_names.push_back(fn);
    }
  } else if (!dir.empty()) {
    std::error_code ec;
    for (const auto& de : std::filesystem::directory_iterator(dir, ec)) {
      const std::string fn = de.path().filename().string();
      if (fn.ends_with(".safetensors") && is_regular_file(join_path(dir, fn))) shard_names.push_back(fn);
    }
    if (ec) fail(std::string("cannot list directory '") + dir + "': " + ec.message());
    if (shard_names.empty()) fail_input(dir, "", "contains neither model.safetensors.index.json nor any *.safetensors file");
    std::sort(shard_names.begin(), shard_names.end());
  }
  for (const std::string& fn : shard_names) r.files_.push_back(SafetensorsFile::open(join_path(dir, fn), parse));

  // Every tensor of every opened file; a name in two files is ambiguous.
  size_t total = 0;
  for (const auto& f : r.files_) total += f->tensors().size();
  r.entries_.reserve(total);
  for (const auto& f : r.files_)
    for (const TensorInfo& t : f->tensors()) r.entries_.push_back(Entry{f.get(), &t});
  // Stable: of two equal names the earlier file (in opening order) comes first, as it was found first.
  std::stable_sort(r.entries_.begin(), r.entries_.end(), [](const Entry& a, const Entry& b) { return a.info->name < b.info->name; });
  for (size_t i = 1; i < r.entries_.size(); ++i)
    if (r.entries_[i].info->name == r.entries_[i - 1].info->name)
      fail_input(r.entries_[i].file->path(), tensor_field(r.entries_[i].info->name),
                 "also present in " + r.entries_[i - 1].file->path() + " (duplicate name across shards)");
  std::vector<std::string> full_paths;
  for (const std::string& fn : map_files) full_paths.push_back(join_path(dir, fn));
  for (const auto& [name, ix] : weight_map) {
    const Entry* e = r.find(name);
    if (!e || e->file->path() != full_paths[ix])
      fail_input(index, "weight_map " + tensor_field(name), "maps to " + json_quoted(map_files[ix]) + " but that file has no such tensor");
  }
  return r;
}

const CheckpointReader::Entry* CheckpointReader::find(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const Entry& e, const std::string& n) { return e.info->name < n; });
  return it != entries_.end() && it->info->name == name ? &*it : nullptr;
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) out.push_back(e.info->name);
  return out;  // entries_ is sorted by name
}

const TensorInfo& CheckpointReader::info(const std::string& name) const {
  const Entry* e = find(name);
  if (!e) fail_input(path_, tensor_field(name), "not in the checkpoint");
  return *e->info;
}

Tensor CheckpointReader::get(const std::string& name) const {
  const Entry* e = find(name);
  if (!e) fail_input(path_, tensor_field(name), "not in the checkpoint");
  return e->file->get(*e->info);
}

// ---------------------------------------------------------------------------------------
// SafetensorsWriter

void SafetensorsWriter::add(const std::string& name, const Tensor& t) {
  if (name == "__metadata__") fail_input(name, "tensor name", "\"__metadata__\" is reserved by the safetensors format");
  try {
    (void)json(name).dump();  // strict UTF-8 check
  } catch (const json::exception&) {
    fail_input(json_quoted(name), "tensor name", "is not valid UTF-8");
  }
  if (names_.count(name)) fail_input(json_quoted(name), "tensor name", "added twice to one safetensors file");
  if (!t.defined()) fail_input(json_quoted(name), "tensor", "has no data");
  if (!t.is_contiguous()) fail_input(json_quoted(name), "tensor", "is not contiguous");
  names_[name] = tensors_.size();
  tensors_.emplace_back(name, t);
  data_bytes_ += t.nbytes();
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  try {
    (void)json(key).dump();
    (void)json(value).dump();
  } catch (const json::exception&) {
    fail_input(json_quoted(key), "metadata", "key or value is not valid UTF-8");
  }
  for (auto& kv : metadata_)
    if (kv.first == key) { kv.second = value; return; }
  metadata_.emplace_back(key, value);
}

std::vector<size_t> SafetensorsWriter::data_order() const {
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors_[a].second.dtype()) > dtype_size(tensors_[b].second.dtype());
  });
  return order;
}

std::string SafetensorsWriter::header_bytes() const {
  std::vector<uint64_t> begin(tensors_.size());
  uint64_t pos = 0;
  for (size_t i : data_order()) {
    begin[i] = pos;
    pos += tensors_[i].second.nbytes();
  }
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i].second;
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = dtype_safetensors_name(t.dtype());
    e["shape"] = t.shape();
    e["data_offsets"] = {begin[i], begin[i] + t.nbytes()};
    h[tensors_[i].first] = std::move(e);
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
  if (text.size() > kSafetensorsMaxHeader)
    fail("safetensors header of " + std::to_string(text.size()) + " bytes exceeds the " + std::to_string(kSafetensorsMaxHeader) + "-byte limit");
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  return out + text;
}

void SafetensorsWriter::write(const std::string& path) const {
  const std::string head = header_bytes();
  const std::vector<size_t> order = data_order();
  write_file_atomic(path, [&](std::FILE* f) {
    std::fwrite(head.data(), 1, head.size(), f);
    for (size_t i : order) {
      const Tensor& t = tensors_[i].second;
      if (t.nbytes() > 0) std::fwrite(t.raw(), 1, t.nbytes(), f);
    }
  });
}

// ---------------------------------------------------------------------------------------
// Sharded checkpoints

namespace {

// model-XXXXX-of-YYYYY.safetensors, the sharded naming write_checkpoint_shards uses.
bool is_shard_name(const std::string& fn) {
  static const std::string pat = "model-#####-of-#####.safetensors";
  if (fn.size() != pat.size()) return false;
  for (size_t i = 0; i < pat.size(); ++i)
    if (pat[i] == '#' ? !(fn[i] >= '0' && fn[i] <= '9') : fn[i] != pat[i]) return false;
  return true;
}

void remove_if_exists(const std::string& p) {
  if (::unlink(p.c_str()) != 0 && errno != ENOENT) fail_system("cannot remove stale checkpoint file", p);
}

}  // namespace

std::vector<std::string> write_checkpoint_shards(const std::string& dir,
                                                 const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                 uint64_t max_shard_bytes,
                                                 const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors)
    if (!seen.insert(name).second) fail_input(dir, tensor_field(name), "given twice to write_checkpoint_shards");
  // Greedy in insertion order: a shard closes when the next tensor would overflow it.
  std::vector<std::vector<size_t>> shards;
  uint64_t cur = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t nb = tensors[i].second.nbytes();
    if (shards.empty() || (!shards.back().empty() && cur + nb > max_shard_bytes)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += nb;
  }
  if (shards.empty()) shards.emplace_back();
  make_directories(dir);

  auto write_shard = [&](const std::vector<size_t>& idx, const std::string& path) {
    SafetensorsWriter w;
    for (const auto& [k, v] : metadata) w.set_metadata(k, v);
    for (size_t i : idx) w.add(tensors[i].first, tensors[i].second);
    w.write(path);
  };
  std::vector<std::string> written;
  std::set<std::string> keep;
  const std::string index_path = join_path(dir, "model.safetensors.index.json");
  if (shards.size() == 1) {
    written.push_back(join_path(dir, "model.safetensors"));
    write_shard(shards[0], written[0]);
    remove_if_exists(index_path);  // a stale index would shadow the new file
    keep.insert("model.safetensors");
  } else {
    json weight_map = json::object();
    uint64_t total = 0;
    const size_t n = shards.size();
    for (size_t s = 0; s < n; ++s) {
      char fn[64];
      std::snprintf(fn, sizeof fn, "model-%05zu-of-%05zu.safetensors", s + 1, n);
      written.push_back(join_path(dir, fn));
      write_shard(shards[s], written.back());
      keep.insert(fn);
      for (size_t i : shards[s]) {
        weight_map[tensors[i].first] = fn;
        total += tensors[i].second.nbytes();
      }
    }
    json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
    write_text_file_atomic(index_path, idx.dump(2) + "\n");
    written.push_back(index_path);
    remove_if_exists(join_path(dir, "model.safetensors"));
  }
  std::vector<std::string> stale;  // collected first: no unlinking while the directory is read
  std::error_code ec;
  for (const auto& de : std::filesystem::directory_iterator(dir, ec)) {
    const std::string fn = de.path().filename().string();
    if (is_shard_name(fn) && !keep.count(fn)) stale.push_back(join_path(dir, fn));
  }
  if (ec) fail(std::string("cannot list directory '") + dir + "': " + ec.message());
  for (const std::string& p : stale) remove_if_exists(p);
  return written;
}

}  // namespace k3
