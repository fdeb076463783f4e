// Scalar pieces every kernel file shares (kernels_impl.cpp and its *_impl.h,
// wna16_impl.cpp, arm/kernels_neon.cpp): bfloat16 conversion, the element
// types' loads and stores, the scalar math, and the macros that name a
// file's table getter.
//
// Include it only from a kernel translation unit, where it is compiled for that
// unit's ISA: everything here has internal linkage (anonymous namespace), so no
// copy of it can be shared with code compiled for another ISA (see kernels.h).
#pragma once

#include <stdint.h>

#define ENGINE_CAT2(a, b) a##b
#define ENGINE_CAT(a, b) ENGINE_CAT2(a, b)
#define ENGINE_STR2(a) #a
#define ENGINE_STR(a) ENGINE_STR2(a)

namespace engine::cpu {
namespace {

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  return __builtin_bit_cast(float, u);
}

// Round to nearest even, NaN kept quiet: the same rule as c10::BFloat16.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (f != f) ? static_cast<uint16_t>(0x7fc0) : static_cast<uint16_t>(rounded);
}

// Elements as the kernels store them: float32, or bfloat16 bits (uint16_t).
template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static inline float load(float x) { return x; }
  static inline float store(float x) { return x; }
};
template <>
struct Elem<uint16_t> {
  static inline float load(uint16_t x) { return bf16_to_float(x); }
  static inline uint16_t store(float x) { return float_to_bf16(x); }
};

// Every code path, the portable one too (the prefill attention reads it).
template <typename T>
struct IsBf16 { static constexpr bool value = false; };
template <>
struct IsBf16<uint16_t> { static constexpr bool value = true; };


// exp(x) for float, branch-free so that it vectorizes (libm's expf would pull
// in libmvec, a dependency torch does not provide). Cephes' expf polynomial,
// relative error about 1e-7 over the clamped range.
inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: rounds to an integer
  float kn = x * 1.44269504088896341f + shifter;
  int32_t n = static_cast<int32_t>(__builtin_bit_cast(uint32_t, kn) -
                                   __builtin_bit_cast(uint32_t, shifter));
  float k = kn - shifter;
  float r = x - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  uint32_t scale_bits = static_cast<uint32_t>(n + 127) << 23;
  return y * __builtin_bit_cast(float, scale_bits);
}

// 1/d for d in [1, 1e30]: a bit-trick seed and three Newton steps (relative
// error ~1e-7). Cheaper than a vector division, which dominates silu otherwise.
inline float recip_ge1(float d) {
  float r = __builtin_bit_cast(float, 0x7EF311C7u - __builtin_bit_cast(uint32_t, d));
  r = r * (2.0f - d * r);
  r = r * (2.0f - d * r);
  return r * (2.0f - d * r);
}

// silu(x) = x / (1 + exp(-x)). Below x = -69 the result is below 1e-28 in
// magnitude; clamping there keeps the denominator in recip_ge1's range.
inline float silu(float x) {
  float nx = -x > 69.0f ? 69.0f : -x;
  return x * recip_ge1(1.0f + fast_exp(nx));
}

inline bool worth_threads(int64_t elements) { return elements >= 16384; }

}  // namespace
}  // namespace engine::cpu
