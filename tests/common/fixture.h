// Test helpers: loading the JSON reference fixtures (tests/data/k3-fixtures) and comparing
// tensors with NaN/Inf checks first, then abs+rel tolerance (MANIFEST: 1e-5 abs, 1e-4 rel).
#pragma once
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace k3::test {

std::string data_path(const std::string& rel);  // tests/data/<rel>
// The released-layout fixture (tests/data/k3-release-tiny), which many test files open.
inline const std::string kReleaseTiny = std::string(K3_TEST_DATA_DIR) + "/k3-release-tiny";
std::string fixture_path(const std::string& rel);  // tests/data/k3-fixtures/<rel>

// Scratch files: a fresh empty directory <tmp>/<name>_<pid>; a text file written into a
// directory (its path returned); a whole file's bytes ("" if it cannot be read).
std::string scratch_dir(const std::string& name);
std::string write_text(const std::string& dir, const std::string& name, const std::string& text);
std::string file_bytes(const std::string& path);

struct FixTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  int64_t numel() const { return int64_t(data.size()); }
};

class Fixture {
 public:
  explicit Fixture(const std::string& rel_path);  // relative to k3-fixtures/
  const nlohmann::json& json() const { return j_; }
  bool has(const std::string& key) const { return j_.contains(key); }
  FixTensor tensor(const std::string& key) const;  // {"shape", "data"}
  Tensor as_tensor(const std::string& key) const;  // f32 Tensor
  double num(const std::string& key) const { return j_.at(key).get<double>(); }

 private:
  nlohmann::json j_;
  std::string path_;
};

// Fails the test (with the worst index) if any value is NaN/Inf or differs beyond
// |a - e| <= abs_tol + rel_tol * |e|.
void expect_close(const float* actual, const float* expected, int64_t n, double abs_tol = 1e-5,
                  double rel_tol = 1e-4, const std::string& what = "");
// The same against float64 reference values (tests/data/k3-f64).
void expect_close(const float* actual, const double* expected, int64_t n, double abs_tol = 1e-5,
                  double rel_tol = 1e-4, const std::string& what = "");
inline void expect_close(const std::vector<float>& actual, const FixTensor& expected, double abs_tol = 1e-5,
                         double rel_tol = 1e-4, const std::string& what = "") {
  ASSERT_EQ(int64_t(actual.size()), expected.numel()) << what;
  expect_close(actual.data(), expected.data.data(), expected.numel(), abs_tol, rel_tol, what);
}
// Relative RMS error ||a - b|| / ||b|| (fla-style), for looser comparisons.
double rel_rms(const float* a, const float* b, int64_t n);
double rel_rms(const double* a, const double* b, int64_t n);

}  // namespace k3::test
