// Helpers shared by the safetensors tests: a self-removing temporary directory, whole-file
// byte I/O, building a safetensors file from a literal header, and checking that a call
// throws k3::Error whose message names the expected file (and tensor/field).
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "core/error.h"

namespace k3::sttest {

using Bytes = std::vector<uint8_t>;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "k3st-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> listing() const {  // sorted file names
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

inline Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
// Replaces the file by a new inode (unlink first): truncating in place makes ext4 flush
// on close (auto_da_alloc), which would make the thousands of rewrites here slow.
inline void write_bytes(const std::string& path, const Bytes& b) {
  std::remove(path.c_str());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}
inline void put_le64(Bytes& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = uint8_t(v >> (8 * i));
}

// 8-byte length + header text (unpadded, as given) + `data_size` bytes of a fixed pattern.
inline Bytes make_st(const std::string& header, size_t data_size) {
  Bytes b(8);
  put_le64(b, 0, header.size());
  b.insert(b.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_size; ++i) b.push_back(uint8_t(i * 37 + 11));
  return b;
}

inline std::string st_fixture_dir() { return test::fixture_path("st"); }
inline std::string st_shard1() { return st_fixture_dir() + "/model-00001-of-00002.safetensors"; }
inline std::string st_shard2() { return st_fixture_dir() + "/model-00002-of-00002.safetensors"; }

// Expects fn() to throw k3::Error whose message contains every string in `needles`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles,
                         const std::string& what) {
  try {
    fn();
  } catch (const k3::Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << what << ": message lacks '" << n << "': " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw a non-k3 exception: " << e.what();
    return;
  }
  ADD_FAILURE() << what << ": no exception";
}

}  // namespace k3::sttest
