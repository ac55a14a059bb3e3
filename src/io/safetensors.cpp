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
#include <nlohmann/json.hpp>
#include <set>

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

// Parses JSON from [begin, end), refusing duplicate keys in any object and nesting deeper
// than kMaxJsonDepth. `what` names the part of the file in messages ("header", "index").
json parse_json_strict(const std::string& path, const std::string& what, const char* begin, const char* end) {
  // Pass 1: a SAX walk that only tracks keys (duplicates, depth). nlohmann's parse callback
  // would do the same but its DOM builder rescans the parent object at every object end,
  // which is quadratic in the number of tensors (37k-tensor headers took ~10 s).
  struct KeyCheck : json::json_sax_t {
    const std::string& path;
    const std::string& what;
    std::vector<std::set<std::string>> keys;  // one set per open object
    std::vector<bool> is_object;              // open containers
    std::string top_key;                      // the current key of the outermost object
    KeyCheck(const std::string& p, const std::string& w) : path(p), what(w) {}
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    void open(bool obj) {
      if (int64_t(is_object.size()) >= kMaxJsonDepth)
        fail_input(path, what, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      is_object.push_back(obj);
      if (obj) keys.emplace_back();
    }
    bool start_object(std::size_t) override { open(true); return true; }
    bool start_array(std::size_t) override { open(false); return true; }
    bool end_object() override { keys.pop_back(); is_object.pop_back(); return true; }
    bool end_array() override { is_object.pop_back(); return true; }
    bool key(string_t& k) override {
      if (keys.size() == 1) top_key = k;
      if (!keys.back().insert(k).second) {
        const bool header = what == "header";
        auto entry = [&](const std::string& key) { return key == "__metadata__" ? key : tensor_field(key); };
        if (keys.size() == 1 && header) fail_input(path, entry(k), "appears twice in the header");
        std::string field = keys.size() == 1 ? what : keys.size() == 2 ? (header ? entry(top_key) : what + ": " + top_key) : what;
        fail_input(path, field, "duplicate key " + json_quoted(k));
      }
      return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
  };
  KeyCheck check(path, what);
  // A syntax error stops the SAX walk; pass 2 then reports it with the parser's message.
  json::sax_parse(begin, end, &check);
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
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// SafetensorsFile

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
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
  const json header = parse_json_strict(path, "header", hb, hb + n);
  if (!header.is_object()) fail_input(path, "header", std::string("is a JSON ") + header.type_name() + ", not an object");

  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;
  struct Range { uint64_t begin, end; size_t idx; };
  std::vector<Range> ranges;
  std::vector<TensorInfo> infos;
  for (const auto& [name, e] : header.items()) {
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
    TensorInfo info;
    info.name = name;
    info.file = path;
    const json& dt = e["dtype"];
    if (!dt.is_string()) fail_input(path, field, std::string("dtype is a JSON ") + dt.type_name() + ", not a string");
    if (!dtype_from_safetensors(dt.get<std::string>(), &info.dtype))
      fail_input(path, field, "unsupported dtype " + json_quoted(dt.get<std::string>()) +
                                  " (supported: F32, F64, BF16, F16, U8, I8, I32, I64, BOOL)");
    const json& sh = e["shape"];
    if (!sh.is_array()) fail_input(path, field, std::string("shape is a JSON ") + sh.type_name() + ", not an array");
    uint64_t numel = 1;
    bool overflow = false;
    for (const json& d : sh) {
      uint64_t v;
      if (!get_uint(d, uint64_t(INT64_MAX), &v))
        fail_input(path, field, "shape " + sh.dump() + " has a dimension that is not a non-negative integer");
      info.shape.push_back(int64_t(v));
      overflow |= __builtin_mul_overflow(numel, v, &numel);
    }
    const size_t esz = dtype_size(info.dtype);
    uint64_t expect = 0;
    overflow |= numel > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, uint64_t(esz), &expect);
    if (overflow) fail_input(path, field, "shape " + sh.dump() + " has more bytes than can be addressed");
    const json& off = e["data_offsets"];
    uint64_t b = 0, en = 0;
    if (!off.is_array() || off.size() != 2 || !get_uint(off[0], UINT64_MAX, &b) || !get_uint(off[1], UINT64_MAX, &en))
      fail_input(path, field, "data_offsets " + off.dump() + " is not [begin, end] with non-negative integers");
    if (b > en) fail_input(path, field, "data_offsets " + off.dump() + " has begin > end");
    if (en > data_size)
      fail_input(path, field, "data_offsets end " + std::to_string(en) + " is beyond the data section (" + std::to_string(data_size) + " bytes)");
    if (en - b != expect)
      fail_input(path, field, "data_offsets span " + std::to_string(en - b) + " bytes but " + dt.get<std::string>() + " " +
                                  shape_str(info.shape) + " needs " + std::to_string(expect));
    info.offset = data_start + b;
    info.nbytes = expect;
    ranges.push_back({b, en, infos.size()});
    infos.push_back(std::move(info));
  }
  // File order; empty tensors occupy no bytes and overlap nothing.
  std::sort(ranges.begin(), ranges.end(), [&](const Range& x, const Range& y) {
    if (x.begin != y.begin) return x.begin < y.begin;
    if (x.end != y.end) return x.end < y.end;
    return infos[x.idx].name < infos[y.idx].name;
  });
  uint64_t max_end = 0;
  const Range* owner = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (owner && r.begin < max_end)
      fail_input(path, tensor_field(infos[r.idx].name), "data_offsets [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                                                            "] overlap those of tensor " + json_quoted(infos[owner->idx].name));
    max_end = r.end;
    owner = &r;
  }
  f->tensors_.reserve(ranges.size());
  for (const Range& r : ranges) {
    f->index_[infos[r.idx].name] = f->tensors_.size();
    f->tensors_.push_back(std::move(infos[r.idx]));
  }
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
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

CheckpointReader CheckpointReader::open(const std::string& path) {
  CheckpointReader r;
  r.path_ = path;
  std::string dir, index;
  std::vector<std::string> shard_names;  // relative to dir (or the path itself)
  if (is_directory(path)) {
    dir = path;
    if (is_regular_file(join_path(dir, "model.safetensors.index.json"))) index = join_path(dir, "model.safetensors.index.json");
  } else if (ends_with(path, ".json") && is_regular_file(path)) {
    index = path;
    size_t slash = path.find_last_of('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  } else {
    r.files_.push_back(SafetensorsFile::open(path));  // also reports a missing path
  }

  std::vector<std::pair<std::string, std::string>> weight_map;  // name -> file (index only)
  if (!index.empty()) {
    auto m = MappedFile::open(index);
    const char* b = reinterpret_cast<const char*>(m->data());
    const json j = parse_json_strict(index, "index", b, b + m->size());
    if (!j.is_object()) fail_input(index, "index", std::string("is a JSON ") + j.type_name() + ", not an object");
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) fail_input(index, "weight_map", "missing or not an object");
    std::set<std::string> seen;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail_input(index, "weight_map " + tensor_field(name), "file name is not a string");
      const std::string fn = file.get<std::string>();
      if (fn.empty() || fn[0] == '/' || fn == ".." || fn.rfind("../", 0) == 0 || fn.find("/../") != std::string::npos ||
          ends_with(fn, "/.."))
        fail_input(index, "weight_map " + tensor_field(name), "file name " + json_quoted(fn) + " is not a path inside the checkpoint directory");
      if (!is_regular_file(join_path(dir, fn)))
        fail_input(index, "weight_map " + tensor_field(name), "file " + json_quoted(fn) + " does not exist in " + dir);
      weight_map.emplace_back(name, fn);
      if (seen.insert(fn).second) shard_names.push_back(fn);
    }
  } else if (!dir.empty()) {
    std::error_code ec;
    for (const auto& de : std::filesystem::directory_iterator(dir, ec)) {
      const std::string fn = de.path().filename().string();
      if (ends_with(fn, ".safetensors") && is_regular_file(join_path(dir, fn))) shard_names.push_back(fn);
    }
    if (ec) fail(std::string("cannot list directory '") + dir + "': " + ec.message());
    if (shard_names.empty()) fail_input(dir, "", "contains neither model.safetensors.index.json nor any *.safetensors file");
    std::sort(shard_names.begin(), shard_names.end());
  }
  for (const std::string& fn : shard_names) r.files_.push_back(SafetensorsFile::open(join_path(dir, fn)));

  // Every tensor of every opened file; a name in two files is ambiguous.
  for (size_t i = 0; i < r.files_.size(); ++i) {
    for (const TensorInfo& t : r.files_[i]->tensors()) {
      auto [it, fresh] = r.entries_.emplace(t.name, Entry{r.files_[i].get(), &t});
      if (!fresh)
        fail_input(r.files_[i]->path(), tensor_field(t.name), "also present in " + it->second.file->path() + " (duplicate name across shards)");
    }
  }
  for (size_t k = 0; k < weight_map.size(); ++k) {
    const auto& [name, fn] = weight_map[k];
    auto it = r.entries_.find(name);
    const std::string full = join_path(dir, fn);
    if (it == r.entries_.end() || it->second.file->path() != full)
      fail_input(index, "weight_map " + tensor_field(name), "maps to " + json_quoted(fn) + " but that file has no such tensor");
  }
  return r;
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& kv : entries_) out.push_back(kv.first);
  return out;  // std::map iterates in sorted order
}

const TensorInfo& CheckpointReader::info(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail_input(path_, tensor_field(name), "not in the checkpoint");
  return *it->second.info;
}

Tensor CheckpointReader::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail_input(path_, tensor_field(name), "not in the checkpoint");
  return it->second.file->get(*it->second.info);
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
