// silu_and_mul, and reshape_and_cache (a copy into the paged cache): portable
// `omp simd` loops, which vectorize well for every ISA; NEON's silu takes its
// explicit vectors (ENGINE_VEC_SILU, arm/cpu_types_arm.h).
#pragma once

#include <stdint.h>

#include "cpu_types.h"
#include "scalar.h"

namespace engine::cpu {
namespace {

// silu of one element: the vector silu's lane where the ISA has one, so that
// a row's tail gets the same math as its vectors; else scalar.h's.
inline float silu_elem(float x) {
#ifdef ENGINE_VEC_SILU
  return vfirst(vsilu(vset1(x)));
#else
  return silu(x);
#endif
}

template <typename T>
void silu_and_mul_t(T* out, const T* in, int64_t rows, int64_t d,
                    int64_t in_stride, int64_t out_stride) {
#pragma omp parallel for schedule(static) if (worth_threads(rows * d))
  for (int64_t r = 0; r < rows; ++r) {
    const T* a = in + r * in_stride;
    const T* b = a + d;
    T* y = out + r * out_stride;
    int64_t i0 = 0;
#ifdef ENGINE_VEC_SILU
    for (; i0 + W <= d; i0 += W) vstore(y + i0, vmul(vsilu(vload(a + i0)), vload(b + i0)));
#endif
#pragma omp simd
    for (int64_t i = i0; i < d; ++i) {
      y[i] = Elem<T>::store(silu_elem(Elem<T>::load(a[i])) * Elem<T>::load(b[i]));
    }
  }
}


// ---- reshape_and_cache ------------------------------------------------------


template <typename U>  // U: an unsigned integer of the element's size
void reshape_and_cache_t(const U* key, const U* value, U* key_cache,
                         U* value_cache, const int64_t* slots, int64_t tokens,
                         int64_t kv_heads, int64_t head_size,
                         int64_t block_size, int64_t kts, int64_t khs,
                         int64_t vts, int64_t vhs) {
#pragma omp parallel for schedule(static) if (worth_threads(tokens * kv_heads * head_size))
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t dst = ((block * kv_heads + h) * block_size + offset) * head_size;
      const U* ks = key + t * kts + h * khs;
      const U* vs = value + t * vts + h * vhs;
#pragma omp simd
      for (int64_t i = 0; i < head_size; ++i) {
        key_cache[dst + i] = ks[i];
        value_cache[dst + i] = vs[i];
      }
    }
  }
}

}  // namespace
}  // namespace engine::cpu
