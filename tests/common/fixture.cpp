#include "common/fixture.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace k3::test {

std::string data_path(const std::string& rel) { return std::string(K3_TEST_DATA_DIR) + "/" + rel; }
std::string fixture_path(const std::string& rel) { return data_path("k3-fixtures/" + rel); }

std::string scratch_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

std::string write_text(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string p = (std::filesystem::path(dir) / name).string();
  std::ofstream(p) << text;
  return p;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Fixture::Fixture(const std::string& rel_path) : path_(fixture_path(rel_path)) {
  std::ifstream f(path_);
  if (!f) throw std::runtime_error("cannot open fixture " + path_);
  j_ = nlohmann::json::parse(f);
}

FixTensor Fixture::tensor(const std::string& key) const {
  if (!j_.contains(key)) throw std::runtime_error(path_ + ": no key " + key);
  const auto& t = j_.at(key);
  FixTensor r;
  r.shape = t.at("shape").get<std::vector<int64_t>>();
  const auto& d = t.at("data");
  r.data.reserve(d.size());
  for (const auto& v : d) r.data.push_back(v.get<float>());
  int64_t n = 1;
  for (auto s : r.shape) n *= s;
  if (n != int64_t(r.data.size())) throw std::runtime_error(path_ + ": " + key + ": shape/data size mismatch");
  return r;
}

Tensor Fixture::as_tensor(const std::string& key) const {
  FixTensor t = tensor(key);
  return Tensor::from_f32(t.shape, t.data.data());
}

template <typename E>
static void expect_close_t(const float* a, const E* e, int64_t n, double abs_tol, double rel_tol,
                           const std::string& what) {
  int64_t bad = -1, nbad = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) {
      ADD_FAILURE() << what << ": non-finite value " << a[i] << " at index " << i;
      return;
    }
    double err = std::fabs(double(a[i]) - double(e[i]));
    double lim = abs_tol + rel_tol * std::fabs(double(e[i]));
    if (err > lim) {
      ++nbad;
      if (err - lim > worst) { worst = err - lim; bad = i; }
    }
  }
  if (nbad)
    ADD_FAILURE() << what << ": " << nbad << " of " << n << " values out of tolerance; worst at index " << bad
                  << ": got " << a[bad] << ", expected " << e[bad];
}
void expect_close(const float* a, const float* e, int64_t n, double abs_tol, double rel_tol, const std::string& what) {
  expect_close_t(a, e, n, abs_tol, rel_tol, what);
}
void expect_close(const float* a, const double* e, int64_t n, double abs_tol, double rel_tol, const std::string& what) {
  expect_close_t(a, e, n, abs_tol, rel_tol, what);
}

template <typename T>
static double rel_rms_t(const T* a, const T* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1e-300));
}
double rel_rms(const float* a, const float* b, int64_t n) { return rel_rms_t(a, b, n); }
double rel_rms(const double* a, const double* b, int64_t n) { return rel_rms_t(a, b, n); }

}  // namespace k3::test
