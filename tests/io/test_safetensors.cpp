// Safetensors reader on the fixture set (tests/data/k3-fixtures/st, two shards, no index),
// the writer's layout and round trips, sharded checkpoints with an index, and atomic
// replacement. Expected fixture values were read from the files' bytes with a hand-written
// Python header parser (no safetensors library involved).
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "test_safetensors_util.h"

using namespace k3;
using namespace k3::sttest;

namespace {

uint32_t f32_bits(const Tensor& t, int64_t i) {
  uint32_t u;
  std::memcpy(&u, static_cast<const uint8_t*>(t.raw()) + 4 * i, 4);
  return u;
}
uint16_t u16_at(const Tensor& t, int64_t i) {
  uint16_t u;
  std::memcpy(&u, static_cast<const uint8_t*>(t.raw()) + 2 * i, 2);
  return u;
}
uint8_t u8_at(const Tensor& t, int64_t i) { return static_cast<const uint8_t*>(t.raw())[i]; }

const std::string kQuoted = "weird\\name.\"with\"quotes";
const std::string kExpert0 = "language_model.model.layers.0.block_sparse_moe.experts.0.w1.weight_packed";
const std::string kExpert1 = "language_model.model.layers.0.block_sparse_moe.experts.1.w1.weight_packed";

// A tensor of dtype/shape whose bytes are a deterministic function of (seed, position).
Tensor patterned(DType dt, const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(dt, shape);
  auto* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t((i * 2654435761u + seed * 97u) >> 7);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The fixture, read exactly.

TEST(Safetensors, FixtureShard1Exact) {
  auto f = SafetensorsFile::open(st_shard1());
  EXPECT_EQ(f->path(), st_shard1());
  EXPECT_EQ(f->header_size(), 1022u);
  EXPECT_EQ(f->mapped_size(), 2906u);
  struct Want { std::string name; DType dt; Shape shape; uint64_t begin, end; };
  const std::vector<Want> want = {
      {"plain.f32.2d", DType::F32, {16, 16}, 0, 1024},
      {"plain.bf16.1d", DType::BF16, {128}, 1024, 1280},
      {"tricky.f16.1d", DType::F16, {64}, 1280, 1408},
      {"packed.u8.2d", DType::U8, {7, 32}, 1408, 1632},
      {"scalar.f32", DType::F32, {}, 1632, 1636},
      {"empty.f32", DType::F32, {0, 8}, 1636, 1636},
      {kExpert0, DType::U8, {2, 32}, 1636, 1700},
      {kExpert1, DType::U8, {2, 32}, 1700, 1764},
      {"rank3.f32", DType::F32, {2, 3, 4}, 1764, 1860},
      {"rank4.u8", DType::U8, {2, 2, 2, 2}, 1860, 1876},
  };
  ASSERT_EQ(f->tensors().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const TensorInfo& t = f->tensors()[i];
    EXPECT_EQ(t.name, want[i].name) << i;
    EXPECT_EQ(t.dtype, want[i].dt) << t.name;
    EXPECT_EQ(t.shape, want[i].shape) << t.name;
    EXPECT_EQ(t.offset, 8 + 1022 + want[i].begin) << t.name;
    EXPECT_EQ(t.nbytes, want[i].end - want[i].begin) << t.name;
    EXPECT_EQ(t.file, st_shard1());
    EXPECT_EQ(f->find(t.name), &t);
  }
  EXPECT_EQ(f->find("__metadata__"), nullptr);
  EXPECT_EQ(f->find("second.shard.f32"), nullptr);
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"note", "__metadata__ must be skipped, not indexed as a tensor"}};
  EXPECT_EQ(f->metadata(), meta);

  Tensor f32 = f->get("plain.f32.2d");
  EXPECT_EQ(f32_bits(f32, 0), 0x3b71dba5u);
  EXPECT_EQ(f32_bits(f32, 1), 0x3f656fc3u);
  EXPECT_EQ(f32_bits(f32, 17), 0xbfafb976u);
  EXPECT_EQ(f32_bits(f32, 255), 0xc0349d48u);
  Tensor bf = f->get("plain.bf16.1d");
  const uint16_t bf_head[8] = {0x7f80, 0xff80, 0x7fc0, 0x0000, 0x8000, 0x0080, 0xd3ab, 0xc35f};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(u16_at(bf, i), bf_head[i]) << i;
  EXPECT_EQ(u16_at(bf, 127), 0x2f2c);
  EXPECT_EQ(bf16_to_f32(u16_at(bf, 7)), -223.0f);
  Tensor h = f->get("tricky.f16.1d");
  const uint16_t f16_head[8] = {0x7c00, 0xfc00, 0x7e00, 0x0000, 0x8000, 0x0001, 0x03ff, 0x0400};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(u16_at(h, i), f16_head[i]) << i;
  EXPECT_EQ(u16_at(h, 63), 0xb24c);
  EXPECT_EQ(f16_to_f32(u16_at(h, 8)), -0.55517578125f);
  Tensor u8 = f->get("packed.u8.2d");
  EXPECT_EQ(u8_at(u8, 0), 23);
  EXPECT_EQ(u8_at(u8, 1), 157);
  EXPECT_EQ(u8_at(u8, 32), 123);
  EXPECT_EQ(u8_at(u8, 223), 129);
  Tensor sc = f->get("scalar.f32");
  EXPECT_EQ(sc.ndim(), 0);
  EXPECT_EQ(sc.numel(), 1);
  EXPECT_EQ(sc.data<float>()[0], 3.5f);
  Tensor em = f->get("empty.f32");
  EXPECT_EQ(em.shape(), (Shape{0, 8}));
  EXPECT_EQ(em.numel(), 0);
  EXPECT_TRUE(em.defined());
  Tensor e0 = f->get(kExpert0), e1 = f->get(kExpert1);
  EXPECT_EQ(u8_at(e0, 0), 158);
  EXPECT_EQ(u8_at(e0, 63), 119);
  EXPECT_EQ(u8_at(e1, 0), 78);
  EXPECT_EQ(u8_at(e1, 63), 188);
  Tensor r3 = f->get("rank3.f32");
  EXPECT_EQ(f32_bits(r3, 0), 0xbef2b6beu);
  EXPECT_EQ(f32_bits(r3, 23), 0x3fac81d6u);
  Tensor r4 = f->get("rank4.u8");
  const uint8_t r4_want[16] = {148, 180, 49, 116, 13, 165, 110, 171, 189, 60, 189, 106, 190, 121, 131, 53};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(u8_at(r4, i), r4_want[i]) << i;
  expect_error([&] { f->get("second.shard.f32"); }, {st_shard1(), "second.shard.f32"}, "absent tensor");
}

// The fixture's data section starts at byte 1030, so its F32 tensors are misaligned: those
// come back as aligned copies; aligned ones are zero-copy views into the mapping.
TEST(Safetensors, ViewsAreZeroCopyWhenAlignedElseAlignedCopies) {
  auto f = SafetensorsFile::open(st_shard1());
  int views = 0, copies = 0;
  for (const TensorInfo& ti : f->tensors()) {
    Tensor t = f->get(ti.name);
    const uint8_t* at = f->mapped_data() + ti.offset;
    const size_t esz = dtype_size(ti.dtype);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % esz, 0u) << ti.name;
    if (ti.nbytes == 0) continue;
    if (ti.offset % esz == 0) {
      EXPECT_EQ(t.raw(), at) << ti.name;
      ++views;
    } else {
      EXPECT_NE(t.raw(), at) << ti.name;
      ++copies;
    }
    EXPECT_EQ(std::memcmp(t.raw(), at, ti.nbytes), 0) << ti.name;
  }
  EXPECT_GT(views, 0);
  EXPECT_GT(copies, 0);
}

TEST(Safetensors, ViewOutlivesFileAndReader) {
  Tensor v;
  {
    auto r = CheckpointReader::open(st_fixture_dir());
    v = r.get("plain.bf16.1d");
  }
  EXPECT_EQ(u16_at(v, 6), 0xd3ab);
}

TEST(Safetensors, FixtureDirectoryWithoutIndex) {
  auto r = CheckpointReader::open(st_fixture_dir());
  const std::vector<std::string> want = {kQuoted, kExpert0, kExpert1, "empty.f32", "packed.u8.2d", "plain.bf16.1d",
                                         "plain.f32.2d", "rank3.f32", "rank4.u8", "scalar.f32",
                                         "second.shard.f32", "second.shard.u8", "tricky.f16.1d"};
  std::vector<std::string> sorted = want;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(r.names(), sorted);
  EXPECT_EQ(r.size(), 13u);
  EXPECT_EQ(r.files().size(), 2u);
  EXPECT_TRUE(r.has(kQuoted));
  EXPECT_FALSE(r.has("__metadata__"));
  EXPECT_EQ(r.info("second.shard.u8").file, st_shard2());
  EXPECT_EQ(r.info("second.shard.u8").shape, (Shape{300}));
  EXPECT_EQ(r.info("plain.f32.2d").file, st_shard1());
  Tensor q = r.get(kQuoted);
  EXPECT_EQ(q.shape(), (Shape{3}));
  const float qv[3] = {1.0f, 2.0f, 3.0f};
  for (int i = 0; i < 3; ++i) {
    float x;
    std::memcpy(&x, static_cast<const uint8_t*>(q.raw()) + 4 * i, 4);
    EXPECT_EQ(x, qv[i]);
  }
  Tensor s = r.get("second.shard.f32");
  EXPECT_EQ(s.shape(), (Shape{10, 10}));
  EXPECT_EQ(f32_bits(s, 0), 0xbec47471u);
  EXPECT_EQ(f32_bits(s, 99), 0xbf8f9775u);
  Tensor u = r.get("second.shard.u8");
  EXPECT_EQ(u8_at(u, 0), 3);
  EXPECT_EQ(u8_at(u, 2), 193);
  EXPECT_EQ(u8_at(u, 299), 217);
  expect_error([&] { r.info("model.nope"); }, {"model.nope", st_fixture_dir()}, "absent info");
  expect_error([&] { r.get("model.nope"); }, {"model.nope"}, "absent get");
  // A single file opens the same way.
  auto one = CheckpointReader::open(st_shard2());
  EXPECT_EQ(one.size(), 3u);
  EXPECT_TRUE(one.has(kQuoted));
}

// ---------------------------------------------------------------------------------------
// Writer.

namespace {
const std::vector<DType> kAllDtypes = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::U8,
                                       DType::I8,  DType::I32, DType::I64,  DType::BOOL};

std::vector<std::pair<std::string, Tensor>> varied_tensors() {
  std::vector<std::pair<std::string, Tensor>> v;
  uint32_t seed = 1;
  // Deliberately interleave sizes so the writer has to reorder for alignment.
  for (DType dt : kAllDtypes) {
    v.emplace_back(std::string("t.") + dtype_name(dt) + ".odd", patterned(dt, {3, 5}, seed++));
    v.emplace_back(std::string("t.") + dtype_name(dt) + ".rank0", patterned(dt, {}, seed++));
    v.emplace_back(std::string("t.") + dtype_name(dt) + ".empty", Tensor::empty(dt, {0, 8}));
  }
  v.emplace_back("u8.rank4", patterned(DType::U8, {1, 3, 1, 7}, seed++));
  v.emplace_back("zero.middle", Tensor::empty(DType::F32, {4, 0, 2}));
  v.emplace_back(kQuoted, patterned(DType::F32, {3}, seed++));
  v.emplace_back("", patterned(DType::I8, {2}, seed++));
  v.emplace_back("line\nbreak\ttab \x01 ctl", patterned(DType::BF16, {5}, seed++));
  v.emplace_back("utf8.\xc3\xbc\xe2\x82\xac", patterned(DType::F16, {2, 2}, seed++));
  v.emplace_back(kExpert0, patterned(DType::U8, {2, 32}, seed++));
  return v;
}
}  // namespace

TEST(SafetensorsWriter, RoundTripEveryDtypeRankAndName) {
  TempDir tmp;
  const auto tensors = varied_tensors();
  SafetensorsWriter w;
  for (const auto& [n, t] : tensors) w.add(n, t);
  w.set_metadata("format", "pt");
  w.set_metadata("quote\"key", "back\\slash \"value\"");
  w.set_metadata("format", "k3");  // overwrite keeps one entry
  uint64_t total = 0;
  for (const auto& [n, t] : tensors) total += t.nbytes();
  EXPECT_EQ(w.data_bytes(), total);
  EXPECT_EQ(w.size(), tensors.size());
  const std::string path = tmp.file("rt.safetensors");
  w.write(path);
  EXPECT_EQ(tmp.listing(), std::vector<std::string>{"rt.safetensors"});  // no temp file left

  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (const auto& [n, t] : tensors) {
    const TensorInfo* ti = f->find(n);
    ASSERT_NE(ti, nullptr) << n;
    Tensor back = f->get(n);
    EXPECT_TRUE(same_bytes(back, t)) << n;
    // Every tensor we write is naturally aligned, so every read is zero-copy.
    if (ti->nbytes) {
      EXPECT_EQ(back.raw(), f->mapped_data() + ti->offset) << n;
    }
  }
  const std::map<std::string, std::string> meta = {{"format", "k3"}, {"quote\"key", "back\\slash \"value\""}};
  EXPECT_EQ(f->metadata(), meta);
}

TEST(SafetensorsWriter, LayoutFollowsTheSpec) {
  TempDir tmp;
  const auto tensors = varied_tensors();
  SafetensorsWriter w;
  for (const auto& [n, t] : tensors) w.add(n, t);
  w.set_metadata("format", "pt");
  const std::string path = tmp.file("layout.safetensors");
  w.write(path);
  const Bytes b = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  EXPECT_EQ(n % 8, 0u);
  ASSERT_LE(8 + n, b.size());
  EXPECT_EQ(b.size(), 8 + n + w.data_bytes());
  const std::string head = w.header_bytes();
  ASSERT_EQ(head.size(), 8 + n);
  EXPECT_EQ(std::memcmp(head.data(), b.data(), head.size()), 0);
  std::string text(b.begin() + 8, b.begin() + 8 + long(n));
  EXPECT_EQ(text[0], '{');
  size_t last = text.find_last_not_of(' ');
  EXPECT_EQ(text[last], '}');
  EXPECT_LT(text.size() - 1 - last, 8u);  // at most 7 spaces of padding
  // Header keys in insertion order, __metadata__ first.
  auto oj = nlohmann::ordered_json::parse(text);
  auto it = oj.begin();
  EXPECT_EQ(it.key(), "__metadata__");
  for (const auto& [name, t] : tensors) {
    ++it;
    ASSERT_NE(it, oj.end());
    EXPECT_EQ(it.key(), name);
    EXPECT_EQ(it.value()["dtype"], dtype_safetensors_name(t.dtype()));
    EXPECT_EQ(it.value()["shape"].get<Shape>(), t.shape());
  }
  // Data: tight, no holes, insertion order stably sorted by dtype size (largest first).
  const std::vector<size_t> order = w.data_order();
  uint64_t pos = 0;
  size_t prev_size = 8;
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& [name, t] = tensors[order[k]];
    const size_t esz = dtype_size(t.dtype());
    EXPECT_LE(esz, prev_size);
    if (k > 0 && esz == prev_size) {
      EXPECT_LT(order[k - 1], order[k]);
    }
    prev_size = esz;
    const auto off = oj[name]["data_offsets"].get<std::vector<uint64_t>>();
    EXPECT_EQ(off[0], pos) << name;
    EXPECT_EQ(off[1], pos + t.nbytes()) << name;
    EXPECT_EQ((8 + n + pos) % esz, 0u) << name;
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(b.data() + 8 + n + pos, t.raw(), t.nbytes()), 0) << name;
    }
    pos += t.nbytes();
  }
  EXPECT_EQ(pos, w.data_bytes());
}

TEST(SafetensorsWriter, EmptyFileAndRefusals) {
  TempDir tmp;
  SafetensorsWriter w;
  w.write(tmp.file("empty.safetensors"));
  const Bytes b = read_bytes(tmp.file("empty.safetensors"));
  EXPECT_EQ(b.size(), 16u);  // 8 + "{}" padded to 8
  auto f = SafetensorsFile::open(tmp.file("empty.safetensors"));
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->metadata().empty());

  Tensor t = patterned(DType::F32, {2}, 3);
  w.add("a", t);
  expect_error([&] { w.add("a", t); }, {"a", "twice"}, "duplicate add");
  expect_error([&] { w.add("__metadata__", t); }, {"__metadata__"}, "reserved name");
  expect_error([&] { w.add(std::string("bad\xff"), t); }, {"UTF-8"}, "invalid UTF-8");
  expect_error([&] { w.add("undef", Tensor()); }, {"undef"}, "undefined tensor");
  expect_error([&] { w.write(tmp.file("no/such/dir/x.safetensors")); }, {tmp.file("no/such/dir/x.safetensors")},
               "missing directory");
}

// ---------------------------------------------------------------------------------------
// Sharded checkpoints.

TEST(SafetensorsShards, SeveralShardsWithIndexRoundTrip) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  std::vector<std::pair<std::string, Tensor>> ts;
  const std::vector<std::pair<std::string, Shape>> spec = {
      {"a", {10}}, {"b", {20}}, {"c", {5}}, {"big", {100}}, {"d", {1}}, {"e", {0}}, {"f", {24}}, {"g", {}}};
  for (size_t i = 0; i < spec.size(); ++i) ts.emplace_back(spec[i].first, patterned(DType::F32, spec[i].second, uint32_t(i)));
  // 128 bytes per shard: [a b] (120) [c] ... greedy in insertion order:
  // a(40)+b(80)=120; +c(20)=140>128 -> [a,b] [c] ; c+big(400)>128 -> [big] alone;
  // d(4)+e(0)+f(96)+g(4)=104 -> [d,e,f,g].
  const auto files = write_checkpoint_shards(dir, ts, 128, {{"format", "pt"}});
  const std::vector<std::string> want_files = {
      dir + "/model-00001-of-00004.safetensors", dir + "/model-00002-of-00004.safetensors",
      dir + "/model-00003-of-00004.safetensors", dir + "/model-00004-of-00004.safetensors",
      dir + "/model.safetensors.index.json"};
  EXPECT_EQ(files, want_files);
  const std::vector<std::vector<std::string>> groups = {{"a", "b"}, {"c"}, {"big"}, {"d", "e", "f", "g"}};
  for (size_t s = 0; s < groups.size(); ++s) {
    auto f = SafetensorsFile::open(files[s]);
    std::vector<std::string> got;
    for (const auto& t : f->tensors()) got.push_back(t.name);
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, groups[s]) << files[s];
    EXPECT_EQ(f->metadata().at("format"), "pt");
  }
  const auto idx = nlohmann::json::parse(read_bytes(dir + "/model.safetensors.index.json"));
  uint64_t total = 0;
  for (const auto& [n, t] : ts) total += t.nbytes();
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(idx["weight_map"].size(), ts.size());
  EXPECT_EQ(idx["weight_map"]["big"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(idx["weight_map"]["g"], "model-00004-of-00004.safetensors");

  auto r = CheckpointReader::open(dir);
  EXPECT_EQ(r.size(), ts.size());
  for (const auto& [n, t] : ts) EXPECT_TRUE(same_bytes(r.get(n), t)) << n;
  // The index file itself is accepted as the checkpoint path.
  auto r2 = CheckpointReader::open(dir + "/model.safetensors.index.json");
  EXPECT_EQ(r2.names(), r.names());
  // max_shard_bytes 0: every tensor is oversized, so each gets a shard of its own.
  auto many = write_checkpoint_shards(tmp.file("many"), ts, 0);
  EXPECT_EQ(many.size(), ts.size() + 1);
  EXPECT_EQ(many[0], tmp.file("many") + "/model-00001-of-00008.safetensors");
  EXPECT_EQ(CheckpointReader::open(tmp.file("many")).size(), ts.size());
}

TEST(SafetensorsShards, SingleShardAndStaleFilesRemoved) {
  TempDir tmp;
  const std::string dir = tmp.path();
  std::vector<std::pair<std::string, Tensor>> ts = {{"x", patterned(DType::BF16, {64}, 1)},
                                                    {"y", patterned(DType::U8, {33}, 2)},
                                                    {"z", patterned(DType::F32, {16}, 3)}};
  auto files = write_checkpoint_shards(dir, ts, 64);  // 128 | 33 | 64 -> three shards
  EXPECT_EQ(files.size(), 4u);
  write_bytes(dir + "/notes.txt", Bytes{'h', 'i'});  // unrelated files survive
  // Now one shard: model.safetensors, and the old index and shards disappear.
  files = write_checkpoint_shards(dir, ts, 1 << 20);
  EXPECT_EQ(files, std::vector<std::string>{dir + "/model.safetensors"});
  EXPECT_EQ(tmp.listing(), (std::vector<std::string>{"model.safetensors", "notes.txt"}));
  auto r = CheckpointReader::open(dir);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"x", "y", "z"}));
  for (const auto& [n, t] : ts) EXPECT_TRUE(same_bytes(r.get(n), t)) << n;
  // Back to two shards: model.safetensors goes away.
  files = write_checkpoint_shards(dir, ts, 161);
  EXPECT_EQ(tmp.listing(), (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                                     "model.safetensors.index.json", "notes.txt"}));
  EXPECT_EQ(CheckpointReader::open(dir).size(), 3u);
  expect_error([&] { write_checkpoint_shards(dir, {ts[0], ts[0]}, 64); }, {"\"x\""}, "duplicate names");
}

TEST(SafetensorsShards, BadDirectoriesAndIndexes) {
  TempDir tmp;
  const std::string dir = tmp.path();
  std::vector<std::pair<std::string, Tensor>> ts = {{"p", patterned(DType::F32, {8}, 1)},
                                                    {"q", patterned(DType::F32, {8}, 2)}};
  write_checkpoint_shards(dir, ts, 32);
  const std::string index = dir + "/model.safetensors.index.json";
  const Bytes good_index = read_bytes(index);
  auto set_index = [&](const std::string& s) { write_bytes(index, Bytes(s.begin(), s.end())); };

  set_index(R"({"weight_map": {"p": "model-00001-of-00002.safetensors", "q": "missing.safetensors"}})");
  expect_error([&] { CheckpointReader::open(dir); }, {index, "\"q\"", "missing.safetensors"}, "missing shard");
  set_index(R"({"weight_map": {"p": "model-00002-of-00002.safetensors", "q": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { CheckpointReader::open(dir); }, {index, "\"p\""}, "tensor not in its file");
  set_index(R"({"weight_map": {"p": "model-00001-of-00002.safetensors", "ghost": "model-00001-of-00002.safetensors"}})");
  expect_error([&] { CheckpointReader::open(dir); }, {index, "\"ghost\""}, "ghost tensor");
  set_index(R"({"weight_map": {"p": "../model-00001-of-00002.safetensors"}})");
  expect_error([&] { CheckpointReader::open(dir); }, {index, "\"p\""}, "path escape");
  set_index(R"({"weight_map": {"p": "model-00001-of-00002.safetensors", "p": "model-00001-of-00002.safetensors"}})");
  expect_error([&] { CheckpointReader::open(dir); }, {index, "duplicate"}, "duplicate index key");
  set_index(R"({"metadata": {}})");
  expect_error([&] { CheckpointReader::open(dir); }, {index, "weight_map"}, "no weight_map");
  set_index("[1, 2]");
  expect_error([&] { CheckpointReader::open(dir); }, {index}, "index array");
  set_index("{not json");
  expect_error([&] { CheckpointReader::open(dir); }, {index, "JSON"}, "index not JSON");
  write_bytes(index, good_index);
  EXPECT_EQ(CheckpointReader::open(dir).size(), 2u);

  // The index walk (no JSON tree) and the tree give the same tensors or the same error.
  auto reader_outcome = [&](HeaderParse parse) {
    try {
      CheckpointReader r = CheckpointReader::open(dir, parse);
      std::string s = "opened";
      for (const std::string& n : r.names()) s += " " + n + "@" + r.info(n).file;
      return s;
    } catch (const k3::Error& e) {
      return std::string("error ") + e.what();
    }
  };
  const std::string f1 = "\"model-00001-of-00002.safetensors\"", f2 = "\"model-00002-of-00002.safetensors\"";
  const std::vector<std::string> indexes = {
      "{\"weight_map\": {\"q\": " + f2 + ", \"p\": " + f1 + "}}",
      "{\"metadata\": {\"total_size\": 64, \"x\": [1, -2, 3.5, null, true, {\"y\": []}]}, \"weight_map\": {\"p\": " + f1 +
          ", \"q\": " + f2 + "}, \"extra\": \"s\"}",
      "{\"weight_map\": {\"p\": " + f1 + ", \"q\": 5}}",
      "{\"weight_map\": {\"p\": " + f1 + ", \"q\": [" + f2 + "]}}",
      "{\"weight_map\": \"model.safetensors\"}",
      "{\"weight_map\": [" + f1 + "]}",
      "{\"weight_map\": {}}",
      "{\"weight_map\": {\"p\": " + f1 + "}, \"metadata\": {\"a\": 1, \"a\": 2}}",
      "{\"weight_map\": {\"p\": \"/etc/passwd\", \"q\": " + f2 + "}}",
      "5", "null", "{\"weight_map\": {\"p\": " + f1 + "}} x",
  };
  for (const std::string& text : indexes) {
    set_index(text);
    EXPECT_EQ(reader_outcome(HeaderParse::Walk), reader_outcome(HeaderParse::Tree)) << text;
  }
  set_index(indexes[1]);
  EXPECT_EQ(reader_outcome(HeaderParse::Walk).rfind("opened p@", 0), 0u) << reader_outcome(HeaderParse::Walk);
  write_bytes(index, good_index);

  // Without an index, a tensor name in two shards is ambiguous.
  std::filesystem::remove(index);
  std::filesystem::copy_file(dir + "/model-00001-of-00002.safetensors", dir + "/copy.safetensors");
  expect_error([&] { CheckpointReader::open(dir); }, {"\"p\"", "copy.safetensors", "model-00001-of-00002.safetensors"},
               "duplicate across shards");
  // An empty directory, a missing path.
  TempDir empty;
  expect_error([&] { CheckpointReader::open(empty.path()); }, {empty.path()}, "empty dir");
  expect_error([&] { CheckpointReader::open(dir + "/nope.safetensors"); }, {dir + "/nope.safetensors"}, "missing file");
}

// ---------------------------------------------------------------------------------------
// Atomic replacement.

TEST(AtomicFile, FailedWriteLeavesOldFileAndNoTemp) {
  TempDir tmp;
  const std::string path = tmp.file("state.bin");
  write_text_file_atomic(path, "old contents");
  EXPECT_EQ(tmp.listing(), std::vector<std::string>{"state.bin"});
  expect_error(
      [&] {
        write_file_atomic(path, [](std::FILE* f) {
          std::fputs("new partial data that must never be seen", f);
          std::fflush(f);
          throw k3::Error("simulated failure midway");
        });
      },
      {path, "simulated failure midway"}, "throwing body");
  const Bytes after = read_bytes(path);
  EXPECT_EQ(std::string(after.begin(), after.end()), "old contents");
  EXPECT_EQ(tmp.listing(), std::vector<std::string>{"state.bin"});
  // A non-k3 exception is reported the same way.
  expect_error([&] { write_file_atomic(path, [](std::FILE*) { throw std::runtime_error("boom"); }); }, {path, "boom"},
               "std exception");
  EXPECT_EQ(tmp.listing(), std::vector<std::string>{"state.bin"});

  // A safetensors file replaced by a failing write stays readable and unchanged.
  SafetensorsWriter w;
  Tensor t = patterned(DType::F32, {4}, 9);
  w.add("t", t);
  const std::string st = tmp.file("m.safetensors");
  w.write(st);
  const Bytes before = read_bytes(st);
  expect_error([&] { write_file_atomic(st, [](std::FILE* f) { std::fputs("garbage", f); throw k3::Error("disk gone"); }); },
               {st}, "safetensors overwrite");
  EXPECT_EQ(read_bytes(st), before);
  EXPECT_TRUE(same_bytes(SafetensorsFile::open(st)->get("t"), t));

  // rename onto a directory fails after the data was written: the temp file is removed.
  std::filesystem::create_directory(tmp.file("adir"));
  std::filesystem::create_directory(tmp.file("adir/inner"));
  expect_error([&] { write_text_file_atomic(tmp.file("adir"), "x"); }, {tmp.file("adir")}, "rename onto dir");
  EXPECT_EQ(tmp.listing(), (std::vector<std::string>{"adir", "m.safetensors", "state.bin"}));

  // Success replaces the contents.
  write_text_file_atomic(path, "new");
  const Bytes now = read_bytes(path);
  EXPECT_EQ(std::string(now.begin(), now.end()), "new");
}
