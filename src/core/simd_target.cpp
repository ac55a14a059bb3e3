// SIMD target selection (see simd_target.h).
#include "core/simd_target.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <atomic>
#include <cstdio>

#include "core/error.h"
#include "hwy/highway.h"
#include "hwy/targets.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace k3 {

namespace {

// hwy::SupportedTargets() re-detects the CPU and, as a side effect, points the dispatcher at
// every detected target (Highway 1.0.3 targets.cc: it calls GetChosenTarget().Update() with the
// unmasked set before applying DisableTargets' mask). Every query here goes through this
// wrapper, which points the dispatcher back at the masked set, so a forced target stays forced.
int64_t supported_mask() {
  const int64_t t = hwy::SupportedTargets();
  hwy::GetChosenTarget().Update(t);
  return t;
}

// Whether the dispatched target may use AVX-512 (read by the bf16 tile kernel on every call,
// so cached; refreshed whenever the target set changes).
std::atomic<int> g_avx512_allowed{-1};
void refresh_avx512_allowed() { g_avx512_allowed = (supported_mask() & (HWY_AVX3 | HWY_AVX3_DL)) != 0; }

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Highway target bit for a user-facing name; 0 if unknown.
int64_t target_from_name(const std::string& raw) {
  const std::string n = lower(raw);
  if (n == "avx512") return HWY_AVX3;
  if (n == "baseline" || n == "portable") {  // the worst compiled target (EMU128, or SCALAR)
    int64_t worst = 0;
    for (int64_t t = HWY_TARGETS; t != 0; t &= t - 1) worst = t & -t;
    return worst;
  }
  for (int64_t t = HWY_TARGETS; t != 0; t &= t - 1) {
    const int64_t bit = t & -t;
    if (lower(hwy::TargetName(bit)) == n) return bit;
  }
  return 0;
}

// K3_SIMD_TARGET takes effect before main(), so no kernel ever runs on another target; a bad
// value is one line on stderr and exit status 2 (there is no caller to report it to yet).
struct ApplyEnvAtStartup {
  ApplyEnvAtStartup() {
    try {
      apply_simd_target_from_env();
    } catch (const Error& e) {
      std::fprintf(stderr, "k3cpp: error: %s\n", e.what());
      std::exit(2);
    }
  }
} apply_env_at_startup;

}  // namespace

std::vector<SimdTarget> simd_targets_supported() {
  std::vector<SimdTarget> out;
  const int64_t avail = supported_mask() & HWY_TARGETS;
  for (int64_t t = avail; t != 0; t &= t - 1) out.push_back({t & -t, hwy::TargetName(t & -t)});
  std::sort(out.begin(), out.end(), [](const SimdTarget& a, const SimdTarget& b) { return a.bits < b.bits; });
  return out;  // lower bit = better target
}

SimdTarget simd_target() {
  // The chosen target is the best of SupportedTargets() that was compiled (HWY_TARGETS).
  const int64_t avail = supported_mask() & HWY_TARGETS;
  const int64_t bit = avail & -avail;
  return {bit, bit ? hwy::TargetName(bit) : "none"};
}

void force_simd_target(const std::string& name, const std::string& source) {
  const int64_t bit = target_from_name(name);
  std::string choices;
  for (const auto& t : simd_targets_supported()) choices += (choices.empty() ? "" : ", ") + lower(t.name);
  if (bit == 0 || !(HWY_TARGETS & bit))
    throw Error(source + ": unknown SIMD target '" + name + "' (this CPU and build: " + choices + ")");
  if (!(supported_mask() & bit))
    throw Error(source + ": this CPU cannot run SIMD target '" + name + "' (it can run: " + choices + ")");
  // Every better target (lower bit) is disabled; Highway then dispatches to `bit`.
  hwy::DisableTargets(bit - 1);
  refresh_avx512_allowed();
}

void apply_simd_target_from_env() {
  const char* env = std::getenv("K3_SIMD_TARGET");
  if (env && *env) force_simd_target(env, "K3_SIMD_TARGET");
}

void set_simd_target_for_test(int64_t bits) {
  hwy::SetSupportedTargetsForTest(bits);
  refresh_avx512_allowed();
}

bool simd_avx512_allowed() {
  if (g_avx512_allowed < 0) refresh_avx512_allowed();
  return g_avx512_allowed > 0;
}

std::string cpu_model_name() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned regs[12] = {};
  unsigned max_ext = __get_cpuid_max(0x80000000u, nullptr);
  if (max_ext >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    char brand[49] = {};
    std::memcpy(brand, regs, 48);
    std::string s(brand);
    s.erase(0, s.find_first_not_of(' '));
    s.erase(s.find_last_not_of(' ') + 1);
    if (!s.empty()) return s;
  }
#endif
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    for (const char* key : {"model name", "Model", "CPU part"})
      if (line.rfind(key, 0) == 0) {
        const auto c = line.find(':');
        if (c != std::string::npos) return line.substr(line.find_first_not_of(" \t", c + 1));
      }
  return "unknown CPU";
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  // CPUID.(EAX=7, ECX=1):EAX bit 5 = AVX512_BF16; the OS must also save the zmm state, which
  // Highway's AVX3 detection checks (XGETBV), so require that as well.
  if (!(supported_mask() & (HWY_AVX3 | HWY_AVX3_DL))) return false;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a >> 5) & 1u;
#else
  return false;
#endif
}

std::string cpu_simd_features() {
  std::string s;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const std::pair<const char*, bool> f[] = {
      {"sse4.2", __builtin_cpu_supports("sse4.2")}, {"avx2", __builtin_cpu_supports("avx2")},
      {"fma", __builtin_cpu_supports("fma")},       {"avx512f", __builtin_cpu_supports("avx512f")},
      {"avx512bw", __builtin_cpu_supports("avx512bw")}, {"avx512vnni", __builtin_cpu_supports("avx512vnni")},
      {"avx512bf16", cpu_has_avx512_bf16()}};
  for (const auto& [name, on] : f)
    if (on) s += (s.empty() ? "" : " ") + std::string(name);
#elif defined(__aarch64__)
  s = "neon";
#endif
  return s;
}

std::string machine_summary() {
  std::string sup;
  for (const auto& t : simd_targets_supported()) sup += (sup.empty() ? "" : " ") + t.name;
  return "CPU " + cpu_model_name() + " [" + cpu_simd_features() + "]; kernels " + simd_target().name +
         " (supported: " + sup + ")";
}

}  // namespace k3
