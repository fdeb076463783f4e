// The vector types of the ISA a kernel translation unit is compiled for:
// cpu_types_x86.h (AVX2, AVX-512), arm/cpu_types_arm.h (NEON, for
// arm/kernels_neon.cpp), none for the portable "generic" table, where
// ENGINE_VEC_WIDTH stays unset and the kernels take their `omp simd` loops.
// Below, what is written once over either.
#pragma once

#include <stdint.h>

#if defined(ENGINE_NEON_KERNELS)
#include "arm/cpu_types_arm.h"
#else
#include "cpu_types_x86.h"
#endif
#include "scalar.h"

namespace engine::cpu {
namespace {

#ifdef ENGINE_VEC_WIDTH
// dst[0, n) = src as floats, full pairs in pair order and the rest natural:
// the scratch copy (a weight, cos/sin) of an operand read with vload_pair.
template <typename T>
inline void to_float_pairs(float* dst, const T* src, int64_t n) {
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    VecF a, b;
    vload_pair(src + i, a, b);
    vstore_pair(dst + i, a, b);
  }
  for (; i < n; ++i) dst[i] = Elem<T>::load(src[i]);
}
#endif  // ENGINE_VEC_WIDTH

}  // namespace
}  // namespace engine::cpu
