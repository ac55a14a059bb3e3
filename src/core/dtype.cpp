#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace k3 {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::U8: return 1;
    case DType::I8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::BOOL: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::U8: return "u8";
    case DType::I8: return "i8";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::BOOL: return "bool";
  }
  return "?";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

bool dtype_from_safetensors(const std::string& s, DType* out) {
  static const struct { const char* n; DType t; } table[] = {
      {"F32", DType::F32}, {"F64", DType::F64}, {"BF16", DType::BF16}, {"F16", DType::F16},
      {"U8", DType::U8},   {"I8", DType::I8},   {"I32", DType::I32},   {"I64", DType::I64},
      {"BOOL", DType::BOOL}};
  for (auto& e : table)
    if (s == e.n) { *out = e.t; return true; }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; man <<= 1; } while (!(man & 0x400));
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;  // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                      // result is subnormal or zero
    // value = a as float; f16 subnormal unit is 2^-24.
    float af;
    std::memcpy(&af, &a, 4);
    float scaled = af * 16777216.0f;  // 2^24, exact
    uint32_t m = uint32_t(std::nearbyint(scaled));  // default rounding mode: nearest even
    return sign | uint16_t(m);
  }
  uint32_t exp = ((a >> 23) - 112) << 10;
  uint32_t man = a & 0x7fffff;
  uint32_t r = exp | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;  // nearest even; may carry into exp
  return sign | uint16_t(r);
}

void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
void f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
void f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

const float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

void mxfp4_decode_row(const uint8_t* packed, const uint8_t* scales, float* dst, size_t cols) {
  K3_ASSERT(cols % 32 == 0);
  for (size_t g = 0; g < cols / 32; ++g) {
    const float s = e8m0_to_f32(scales[g]);
    const uint8_t* p = packed + g * 16;
    float* d = dst + g * 32;
    for (int j = 0; j < 16; ++j) {
      d[2 * j] = kE2M1[p[j] & 0xf] * s;
      d[2 * j + 1] = kE2M1[p[j] >> 4] * s;
    }
  }
}

static uint8_t e2m1_nearest(float x) {
  // Nearest E2M1 code to x (x already divided by the group scale), ties to even code.
  const float mag = std::fabs(x);
  int best = 0;
  float bestd = INFINITY;
  for (int c = 0; c < 8; ++c) {
    float d = std::fabs(mag - kE2M1[c]);
    if (d < bestd) { bestd = d; best = c; }
  }
  return uint8_t(best | ((std::signbit(x) && best != 0) ? 8 : 0));
}

void mxfp4_encode_row(const float* src, uint8_t* packed, uint8_t* scales, size_t cols) {
  K3_ASSERT(cols % 32 == 0);
  for (size_t g = 0; g < cols / 32; ++g) {
    const float* s = src + g * 32;
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(s[j]));
    // OCP MX: shared exponent = floor(log2(amax)) - emax(E2M1)=2, so amax/scale < 8.
    int e = amax > 0.f ? int(std::floor(std::log2(amax))) - 2 : -127;
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    scales[g] = uint8_t(e + 127);
    const float inv = 1.0f / e8m0_to_f32(scales[g]);
    for (int j = 0; j < 16; ++j) {
      uint8_t lo = e2m1_nearest(s[2 * j] * inv), hi = e2m1_nearest(s[2 * j + 1] * inv);
      packed[g * 16 + j] = uint8_t(lo | (hi << 4));
    }
  }
}

}  // namespace k3
