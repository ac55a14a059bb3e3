// Element types and scalar conversions. bf16/f16 conversions round to nearest even;
// MXFP4 (OCP microscaling: E2M1 nibbles, one E8M0 scale per 32 values) decodes per
// docs/model.md section 8 and fixture mxfp4.json (low nibble = even element).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace k3 {

enum class DType : uint8_t { F32, F64, BF16, F16, U8, I8, I32, I64, BOOL };

size_t dtype_size(DType t);
const char* dtype_name(DType t);           // "f32", "bf16", ...
const char* dtype_safetensors_name(DType t);  // "F32", "BF16", ...
// Parses a safetensors dtype string ("F32", "BF16", "U8", ...); false if unknown.
bool dtype_from_safetensors(const std::string& s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Bulk conversions (vectorisable loops).
void bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void f16_to_f32(const uint16_t* src, float* dst, size_t n);
void f32_to_f16(const float* src, uint16_t* dst, size_t n);

// MXFP4: E2M1 value table indexed by a 4-bit code.
extern const float kE2M1[16];
inline float e8m0_to_f32(uint8_t s) {
  // 2^(s-127); s = 255 is NaN in the OCP spec.
  if (s == 255) return __builtin_nanf("");
  uint32_t u = s == 0 ? 0x00400000u : uint32_t(s) << 23;  // s=0: 2^-127 is subnormal
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Decodes one row of `cols` values (cols % 32 == 0) from cols/2 packed bytes and cols/32
// scales. Byte j holds element 2j in its low nibble and 2j+1 in its high nibble.
void mxfp4_decode_row(const uint8_t* packed, const uint8_t* scales, float* dst, size_t cols);
// Encodes one row (round to nearest representable E2M1 after choosing the per-group
// scale so the group's max magnitude fits in 6); inverse of mxfp4_decode_row up to rounding.
void mxfp4_encode_row(const float* src, uint8_t* packed, uint8_t* scales, size_t cols);

}  // namespace k3
