// Scalar pieces every kernel file shares (kernels_impl.cpp, arm/kernels_neon.cpp):
// bfloat16 conversion and the macros that name a file's table getter.
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

}  // namespace
}  // namespace engine::cpu
