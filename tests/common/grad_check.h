// Central finite-difference gradient checks in double, shared by the *_grad tests of the
// router, AttnRes, attention, MoE, dense FFN and MLA backwards. The loss is L = sum(r * y)
// for fixed random r (so dL/dy = r) plus whatever a test adds.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace k3::test {

inline std::vector<double> randn(int64_t n, unsigned seed, double sd = 1.0, double mean = 0.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(mean, sd);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& e : v) e = d(rng);
  return v;
}

inline double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  return dot(a.data(), b.data(), int64_t(std::min(a.size(), b.size())));
}

// Compares grad[0, n) with central differences (step h) of loss() w.r.t. p[0, n): every
// entry when n <= max_entries, else a fixed random sample of max_entries. Passes when
// max |fd - grad| / max |fd| < tol over the checked entries; an all-zero reference fails
// (the check would be vacuous) unless allow_zero.
inline void check_fd(double* p, const double* grad, int64_t n, const std::function<double()>& loss,
                     const std::string& what, double tol = 1e-6, int64_t max_entries = 64, double h = 1e-5,
                     bool allow_zero = false) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), int64_t(0));
  if (n > max_entries) {
    std::mt19937 rng(unsigned(n * 7919 + 17));
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(static_cast<size_t>(max_entries));
  }
  double err = 0, scale = 0;
  int64_t worst = -1;
  for (int64_t i : idx) {
    ASSERT_TRUE(std::isfinite(grad[i])) << what << " [" << i << "] is not finite";
    const double keep = p[i];
    p[i] = keep + h;
    const double lp = loss();
    p[i] = keep - h;
    const double lm = loss();
    p[i] = keep;
    const double fd = (lp - lm) / (2 * h);
    if (std::fabs(fd - grad[i]) > err) err = std::fabs(fd - grad[i]), worst = i;
    scale = std::max(scale, std::fabs(fd));
  }
  if (!allow_zero) {
    ASSERT_GT(scale, 1e-8) << what << ": the gradient is all zero, the check would be vacuous";
  }
  EXPECT_LE(err, tol * std::max(scale, 1e-300)) << what << ": max abs err " << err << " at [" << worst << "], scale "
                                                 << scale << " (" << idx.size() << " of " << n << " entries)";
}
inline void check_fd(std::vector<double>& p, const std::vector<double>& grad, const std::function<double()>& loss,
                     const std::string& what, double tol = 1e-6, int64_t max_entries = 64) {
  ASSERT_EQ(p.size(), grad.size()) << what;
  check_fd(p.data(), grad.data(), int64_t(p.size()), loss, what, tol, max_entries);
}

// Relative RMS ||a - b|| / ||b|| over n entries of two differently typed arrays.
template <typename A, typename B>
double rel_rms_mixed(const A* a, const B* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

template <typename T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

}  // namespace k3::test
