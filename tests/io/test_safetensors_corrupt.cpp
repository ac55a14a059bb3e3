// Safetensors reader robustness: every truncation of the fixture shards, bad header lengths,
// a table of malformed headers (each must be refused with a k3::Error naming the file and
// the tensor or field), edge cases that must still open, and a seeded random-mutation fuzz
// run (each mutant either opens with every tensor inside the mapped file, or is refused).
// Run once under -fsanitize=address,undefined to catch out-of-bounds reads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "io/safetensors.h"
#include "test_safetensors_util.h"

using namespace k3;
using namespace k3::sttest;

namespace {

// After a successful open: every tensor lies in the data section, matches its shape, does
// not overlap the next one, and get() returns either a view at exactly that place or an
// aligned copy of exactly those bytes.
void check_opened(const SafetensorsFile& f) {
  const uint64_t size = f.mapped_size();
  const uint64_t data_start = 8 + f.header_size();
  ASSERT_LE(data_start, size);
  uint64_t prev_end = data_start;
  for (const TensorInfo& ti : f.tensors()) {
    ASSERT_GE(ti.offset, data_start) << ti.name;
    ASSERT_LE(ti.nbytes, size - ti.offset) << ti.name;
    ASSERT_EQ(ti.nbytes, uint64_t(shape_numel(ti.shape)) * dtype_size(ti.dtype)) << ti.name;
    if (ti.nbytes) {
      ASSERT_GE(ti.offset, prev_end) << ti.name << " overlaps its predecessor";
      prev_end = ti.offset + ti.nbytes;
    }
    Tensor t = f.get(ti.name);
    ASSERT_EQ(t.nbytes(), ti.nbytes);
    const uint8_t* at = f.mapped_data() + ti.offset;
    if (t.raw() != at && ti.nbytes) {
      ASSERT_EQ(std::memcmp(t.raw(), at, ti.nbytes), 0) << ti.name;
    }
  }
}

// What opening `path` with `parse` gives: the tensor table and metadata, or the error.
std::string outcome(const std::string& path, HeaderParse parse) {
  try {
    auto f = SafetensorsFile::open(path, parse);
    std::string s = "opened";
    for (const TensorInfo& t : f->tensors())
      s += "\n" + t.name + " " + dtype_name(t.dtype) + " " + shape_str(t.shape) + " " + std::to_string(t.offset) + " " +
           std::to_string(t.nbytes) + " " + t.file;
    for (const auto& [k, v] : f->metadata()) s += "\nmeta " + k + "=" + v;
    return s;
  } catch (const k3::Error& e) {
    return std::string("error ") + e.what();
  }
}

// Opens `path`; true if it opened (and passed check_opened), false on k3::Error naming the
// file; any other outcome fails the test. The header walk and the JSON tree must agree.
bool open_or_refuse(const std::string& path, const std::string& what) {
  EXPECT_EQ(outcome(path, HeaderParse::Walk), outcome(path, HeaderParse::Tree)) << what;
  try {
    auto f = SafetensorsFile::open(path);
    check_opened(*f);
    return true;
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << what << ": " << e.what();
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": non-k3 exception: " << e.what();
    return false;
  }
}

const std::string kEntryA = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";

}  // namespace

TEST(SafetensorsCorrupt, EveryTruncationOfBothFixtureShardsIsRefused) {
  TempDir tmp;
  const std::string path = tmp.file("cut.safetensors");
  for (const std::string& src : {st_shard1(), st_shard2()}) {
    const Bytes full = read_bytes(src);
    for (size_t len = 0; len < full.size(); ++len) {
      write_bytes(path, Bytes(full.begin(), full.begin() + long(len)));
      EXPECT_FALSE(open_or_refuse(path, src + " cut at " + std::to_string(len))) << len;
    }
    write_bytes(path, full);
    EXPECT_TRUE(open_or_refuse(path, src + " uncut"));
  }
}

TEST(SafetensorsCorrupt, BadHeaderLengths) {
  TempDir tmp;
  const std::string path = tmp.file("len.safetensors");
  const Bytes good = read_bytes(st_shard1());
  const uint64_t n = 1022, size = good.size();
  const std::vector<std::pair<uint64_t, std::string>> cases = {
      {0, "header"},          {1, "header"},
      {7, "header"},          {n - 1, "JSON"},
      {n + 1, "JSON"},        {size - 8, "JSON"},
      {size - 7, "header length"}, {size, "header length"},
      {kSafetensorsMaxHeader + 1, "header length"}, {uint64_t(1) << 40, "header length"},
      {~uint64_t(0), "header length"},
  };
  for (const auto& [len, needle] : cases) {
    Bytes b = good;
    put_le64(b, 0, len);
    write_bytes(path, b);
    expect_error([&] { SafetensorsFile::open(path); }, {path, needle}, "header length " + std::to_string(len));
  }
}

TEST(SafetensorsCorrupt, MalformedHeadersNameFileAndField) {
  TempDir tmp;
  const std::string path = tmp.file("bad.safetensors");
  struct Case { std::string header; size_t data; std::vector<std::string> needles; };
  const std::string f32 = R"("dtype": "F32", )";
  const std::vector<Case> cases = {
      {"not json at all", 8, {"header", "JSON"}},
      {"[1, 2]", 8, {"header", "array"}},
      {"\"a string\"", 8, {"header", "string"}},
      {"{" + kEntryA + "} trailing", 8, {"JSON"}},
      {std::string("{\0}", 3), 8, {"JSON"}},
      {"{\"bad\xff\": {}}", 8, {"JSON"}},
      {"{" + kEntryA + ", " + kEntryA + "}", 8, {"tensor \"a\"", "appears twice"}},
      {R"({"__metadata__": {}, "x": {}, "__metadata__": {}})", 8, {"__metadata__", "appears twice"}},
      {R"({"a": {"dtype": "F32", "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8, {"\"a\"", "duplicate"}},
      {R"({"__metadata__": {"k": "1", "k": "2"}})", 0, {"__metadata__", "duplicate"}},
      {R"({"__metadata__": [1]})", 0, {"__metadata__", "array"}},
      {R"({"__metadata__": {"k": 1}})", 0, {"__metadata__", "\"k\"", "string"}},
      {R"({"a": 5})", 8, {"\"a\"", "object"}},
      {R"({"a": {"shape": [2], "data_offsets": [0, 8]}})", 8, {"\"a\"", "dtype"}},
      {R"({"a": {"dtype": "F32", "data_offsets": [0, 8]}})", 8, {"\"a\"", "shape"}},
      {R"({"a": {"dtype": "F32", "shape": [2]}})", 8, {"\"a\"", "data_offsets"}},
      {R"({"a": {"dtype": 5, "shape": [2], "data_offsets": [0, 8]}})", 8, {"\"a\"", "dtype"}},
      {R"({"a": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", 8, {"\"a\"", "F8_E4M3", "supported"}},
      {R"({"a": {"dtype": "f32", "shape": [2], "data_offsets": [0, 8]}})", 8, {"\"a\"", "dtype"}},
      {"{\"a\": {" + f32 + R"("shape": "2", "data_offsets": [0, 8]}})", 8, {"\"a\"", "shape"}},
      {"{\"a\": {" + f32 + R"("shape": [2.0], "data_offsets": [0, 8]}})", 8, {"\"a\"", "shape"}},
      {"{\"a\": {" + f32 + R"("shape": [-2], "data_offsets": [0, 8]}})", 8, {"\"a\"", "shape"}},
      {"{\"a\": {" + f32 + R"("shape": [1e30], "data_offsets": [0, 8]}})", 8, {"\"a\"", "shape"}},
      {"{\"a\": {" + f32 + R"("shape": [null], "data_offsets": [0, 8]}})", 8, {"\"a\"", "shape"}},
      {"{\"a\": {" + f32 + R"("shape": [18446744073709551615], "data_offsets": [0, 8]}})", 8, {"\"a\"", "shape"}},
      {"{\"a\": {" + f32 + R"("shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 8]}})", 8, {"\"a\"", "shape"}},
      {"{\"a\": {" + f32 + R"("shape": [4611686018427387904], "data_offsets": [0, 8]}})", 8, {"\"a\"", "shape"}},
      {R"({"a": {"dtype": "F64", "shape": [2305843009213693952], "data_offsets": [0, 8]}})", 8, {"\"a\"", "shape"}},
      {"{\"a\": {" + f32 + R"("shape": [2], "data_offsets": [0]}})", 8, {"\"a\"", "data_offsets"}},
      {"{\"a\": {" + f32 + R"("shape": [2], "data_offsets": [0, 8, 8]}})", 8, {"\"a\"", "data_offsets"}},
      {"{\"a\": {" + f32 + R"("shape": [2], "data_offsets": "0-8"}})", 8, {"\"a\"", "data_offsets"}},
      {"{\"a\": {" + f32 + R"("shape": [2], "data_offsets": [-1, 7]}})", 8, {"\"a\"", "data_offsets"}},
      {"{\"a\": {" + f32 + R"("shape": [2], "data_offsets": [0.0, 8]}})", 8, {"\"a\"", "data_offsets"}},
      {"{\"a\": {" + f32 + R"("shape": [2], "data_offsets": [8, 0]}})", 8, {"\"a\"", "begin > end"}},
      {"{\"a\": {" + f32 + R"("shape": [2], "data_offsets": [4, 12]}})", 8, {"\"a\"", "beyond the data section"}},
      {"{\"a\": {" + f32 + R"("shape": [2], "data_offsets": [0, 18446744073709551615]}})", 8, {"\"a\"", "beyond"}},
      {"{\"a\": {" + f32 + R"("shape": [3], "data_offsets": [0, 8]}})", 16, {"\"a\"", "needs 12"}},
      {"{\"a\": {" + f32 + R"("shape": [], "data_offsets": [0, 0]}})", 16, {"\"a\"", "needs 4"}},
      {"{\"a\": {" + f32 + R"("shape": [0], "data_offsets": [0, 4]}})", 16, {"\"a\"", "needs 0"}},
      {"{" + kEntryA + R"(, "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}})", 16, {"\"b\"", "overlap", "\"a\""}},
      {"{" + kEntryA + R"(, "b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", 16, {"overlap", "\"a\"", "\"b\""}},
      {"{" + kEntryA + R"(, "b": {"dtype": "U8", "shape": [1], "data_offsets": [7, 8]}})", 16, {"\"b\"", "overlap"}},
      {R"({"q\"uo\\te": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8, {R"("q\"uo\\te")", "needs 12"}},
      {"{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}", 8, {"deeper"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    write_bytes(path, make_st(cases[i].header, cases[i].data));
    std::vector<std::string> needles = cases[i].needles;
    needles.push_back(path);
    expect_error([&] { SafetensorsFile::open(path); }, needles, "case " + std::to_string(i) + ": " + cases[i].header);
    EXPECT_EQ(outcome(path, HeaderParse::Walk), outcome(path, HeaderParse::Tree)) << "case " << i;
  }
  // The same refusals reach CheckpointReader callers.
  write_bytes(path, make_st("{" + kEntryA + ", " + kEntryA + "}", 8));
  expect_error([&] { CheckpointReader::open(tmp.path()); }, {path, "twice"}, "reader on a directory");
}

TEST(SafetensorsCorrupt, ValidEdgeCasesOpen) {
  TempDir tmp;
  const std::string path = tmp.file("edge.safetensors");
  auto open = [&](const std::string& header, size_t data) {
    write_bytes(path, make_st(header, data));
    EXPECT_EQ(outcome(path, HeaderParse::Walk), outcome(path, HeaderParse::Tree)) << header;
    return SafetensorsFile::open(path);
  };
  EXPECT_TRUE(open("{}", 0)->tensors().empty());
  EXPECT_TRUE(open("{}      ", 5)->tensors().empty());  // padding and unused data bytes
  EXPECT_TRUE(open(" \n{\"__metadata__\": {}}\t ", 0)->metadata().empty());
  // A hole before the tensor and bytes after it are tolerated (never read).
  auto f = open(R"({"a": {"dtype": "U8", "shape": [2, 4], "data_offsets": [8, 16], "extra": [1]}})", 32);
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->tensors()[0].offset, f->header_size() + 8 + 8);
  check_opened(*f);
  // Empty tensors at the very end of the data, inside another tensor's range, and at 0
  // with no data at all; an empty name; a rank-0 tensor.
  f = open(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
               "e1": {"dtype": "F32", "shape": [0], "data_offsets": [16, 16]},
               "e2": {"dtype": "I64", "shape": [3, 0], "data_offsets": [8, 8]},
               "": {"dtype": "F64", "shape": [], "data_offsets": [16, 24]}})",
           24);
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->tensors()[0].name, "a");
  EXPECT_EQ(f->tensors()[1].name, "e2");
  EXPECT_EQ(f->tensors()[2].name, "e1");  // same begin: the shorter range first
  EXPECT_EQ(f->tensors()[3].name, "");
  check_opened(*f);
  f = open(R"({"z": {"dtype": "BF16", "shape": [0, 8], "data_offsets": [0, 0]}})", 0);
  EXPECT_EQ(f->get("z").numel(), 0);
}

// Seeded random mutations, mostly in the header. Two bases: the fixture shard (unpadded,
// misaligned data) and a writer-made file with many small tensors of every dtype.
TEST(SafetensorsFuzz, RandomMutationsOpenOrThrow) {
  TempDir tmp;
  const std::string path = tmp.file("fuzz.safetensors");
  std::vector<Bytes> bases = {read_bytes(st_shard1())};
  {
    SafetensorsWriter w;
    const DType dts[] = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::U8, DType::I8, DType::I32, DType::I64, DType::BOOL};
    for (int i = 0; i < 24; ++i) {
      Shape s = i % 5 == 0 ? Shape{} : i % 7 == 0 ? Shape{0, 3} : Shape{1 + i % 3, 2 + i % 4};
      w.add("w." + std::to_string(i), Tensor::zeros(dts[i % 9], s));
    }
    w.set_metadata("format", "pt");
    w.write(tmp.file("base.safetensors"));
    bases.push_back(read_bytes(tmp.file("base.safetensors")));
  }
  // K3_FUZZ_ITERS / K3_FUZZ_SEED allow longer local runs; the defaults keep this ~0.5 s.
  const char* env_iters = std::getenv("K3_FUZZ_ITERS");
  const char* env_seed = std::getenv("K3_FUZZ_SEED");
  std::mt19937_64 rng(env_seed ? std::strtoull(env_seed, nullptr, 10) : 0x5eed5afe);
  auto pick = [&](uint64_t n) { return n ? rng() % n : 0; };
  const std::string json_chars = "{}[]\",:0123456789-.eE \\";
  int opened = 0, refused = 0;
  const int kIters = env_iters ? std::atoi(env_iters) : 3000;
  for (int it = 0; it < kIters; ++it) {
    Bytes b = bases[it % bases.size()];
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
    const int muts = 1 + int(pick(3));
    for (int m = 0; m < muts; ++m) {
      const uint64_t hdr_end = std::min<uint64_t>(8 + n, b.size());
      const uint64_t hpos = hdr_end > 8 ? 8 + pick(hdr_end - 8) : 0;  // a header byte
      switch (pick(9)) {
        case 0: if (hpos < b.size()) b[hpos] ^= uint8_t(1u << pick(8)); break;
        case 1: if (hpos < b.size()) b[hpos] = uint8_t(json_chars[pick(json_chars.size())]); break;
        case 2:  // a digit replaced by another digit: offsets and shapes change, JSON stays valid
        case 3: {
          for (int tries = 0; tries < 64; ++tries) {
            uint64_t p = 8 + pick(hdr_end > 8 ? hdr_end - 8 : 1);
            if (p < b.size() && b[p] >= '0' && b[p] <= '9') { b[p] = uint8_t('0' + pick(10)); break; }
          }
          break;
        }
        case 4:  // insert a byte, keeping the length prefix consistent half the time
          b.insert(b.begin() + long(hpos), uint8_t(json_chars[pick(json_chars.size())]));
          if (pick(2)) { ++n; put_le64(b, 0, n); }
          break;
        case 5:
          if (b.size() > 8 && hpos < b.size()) {
            b.erase(b.begin() + long(hpos));
            if (pick(2) && n > 0) { --n; put_le64(b, 0, n); }
          }
          break;
        case 6: b.resize(pick(b.size() + 1)); break;
        case 7:
          if (b.size() >= 8) { n = pick(4) == 0 ? rng() : n + pick(17) - 8; put_le64(b, 0, n); }
          break;
        case 8: if (!b.empty()) b[pick(b.size())] = uint8_t(rng()); break;
      }
    }
    write_bytes(path, b);
    if (open_or_refuse(path, "mutant " + std::to_string(it))) ++opened; else ++refused;
    if (HasFatalFailure()) return;
  }
  // Both outcomes must be well represented, or the mutations are not exercising the reader.
  EXPECT_GT(opened, kIters / 20);
  EXPECT_GT(refused, kIters / 2);
  std::printf("fuzz: %d mutants opened, %d refused\n", opened, refused);
}
