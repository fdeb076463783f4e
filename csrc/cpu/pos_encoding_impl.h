// rotary_embedding: neox style with explicit vectors (cpu_types_x86.h,
// arm/cpu_types_arm.h), the rest (GPT-J style, the generic path) as portable
// `omp simd` loops, GPT-J's led by vectors where the ISA deinterleaves pairs.
#pragma once

#include <stdint.h>

#include "cpu_types.h"
#include "scalar.h"

namespace engine::cpu {
namespace {

#ifdef ENGINE_VEC_WIDTH
// neox rotary of one head: v[i], v[i + half] rotated by (cos[i], sin[i]).
template <typename T, typename C>
inline void rotate_neox(T* v, const C* cos_p, const C* sin_p, int64_t half) {
  int64_t i = 0;
  for (; i + 2 * W <= half; i += 2 * W) {  // pair order (cos and sin alike)
    VecF c0, c1, s0, s1, a0, a1, b0, b1;
    vload_pair(cos_p + i, c0, c1);
    vload_pair(sin_p + i, s0, s1);
    vload_pair(v + i, a0, a1);
    vload_pair(v + i + half, b0, b1);
    vstore_pair(v + i, vfnma(b0, s0, vmul(a0, c0)), vfnma(b1, s1, vmul(a1, c1)));
    vstore_pair(v + i + half, vfma(a0, s0, vmul(b0, c0)), vfma(a1, s1, vmul(b1, c1)));
  }
  for (; i + W <= half; i += W) {
    VecF c = vload(cos_p + i), s = vload(sin_p + i);
    VecF x1 = vload(v + i), x2 = vload(v + i + half);
    vstore_split(v + i, v + i + half, vfnma(x2, s, vmul(x1, c)), vfma(x1, s, vmul(x2, c)));
  }
  for (; i < half; ++i) {
    float c = Elem<C>::load(cos_p[i]), s = Elem<C>::load(sin_p[i]);
    float x1 = Elem<T>::load(v[i]), x2 = Elem<T>::load(v[i + half]);
    v[i] = Elem<T>::store(x1 * c - x2 * s);
    v[i + half] = Elem<T>::store(x2 * c + x1 * s);
  }
}

// A bfloat16 token's cos/sin row is converted to floats once and reused by
// every head (40 heads for Llama-8B-shaped layers).
constexpr int64_t kMaxHalfOnStack = 256;

template <typename T>
void rotary_vec(const int64_t* positions, T* x, const T* cache, int64_t tokens,
                int64_t heads, int64_t token_stride, int64_t head_stride,
                int64_t rot_dim, int64_t cache_stride) {
  const int64_t half = rot_dim / 2;
#pragma omp parallel for schedule(static) if (worth_threads(tokens * heads * rot_dim))
  for (int64_t t = 0; t < tokens; ++t) {
    const T* cos_p = cache + positions[t] * cache_stride;
    const T* sin_p = cos_p + half;
    T* xt = x + t * token_stride;
    if constexpr (IsBf16<T>::value) {
      if (half <= kMaxHalfOnStack) {
        float cf[kMaxHalfOnStack], sf[kMaxHalfOnStack];
        to_float_pairs(cf, cos_p, half);  // in pair order, as rotate_neox reads them
        to_float_pairs(sf, sin_p, half);
        for (int64_t h = 0; h < heads; ++h) rotate_neox(xt + h * head_stride, cf, sf, half);
        continue;
      }
    }
    for (int64_t h = 0; h < heads; ++h) rotate_neox(xt + h * head_stride, cos_p, sin_p, half);
  }
}
#endif  // ENGINE_VEC_WIDTH


template <typename T>
void rotary_t(const int64_t* positions, T* x, const T* cache, int64_t tokens,
              int64_t heads, int64_t token_stride, int64_t head_stride,
              int64_t rot_dim, int64_t cache_stride, bool neox) {
  const int64_t half = rot_dim / 2;
#pragma omp parallel for schedule(static) if (worth_threads(tokens * heads * rot_dim))
  for (int64_t t = 0; t < tokens; ++t) {
    const T* cos_p = cache + positions[t] * cache_stride;
    const T* sin_p = cos_p + half;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + t * token_stride + h * head_stride;
      if (neox) {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          float c = Elem<T>::load(cos_p[i]);
          float s = Elem<T>::load(sin_p[i]);
          float x1 = Elem<T>::load(v[i]);
          float x2 = Elem<T>::load(v[i + half]);
          v[i] = Elem<T>::store(x1 * c - x2 * s);
          v[i + half] = Elem<T>::store(x2 * c + x1 * s);
        }
      } else {
        int64_t i0 = 0;
#ifdef ENGINE_VEC_DEINTERLEAVE  // NEON: W pairs at a time with LD2/ST2
        for (; i0 + W <= half; i0 += W) {
          VecF c = vload(cos_p + i0), s = vload(sin_p + i0), x1, x2;
          vload_deinterleave(v + 2 * i0, x1, x2);
          vstore_interleave(v + 2 * i0, vfnma(x2, s, vmul(x1, c)), vfma(x1, s, vmul(x2, c)));
        }
#endif
#pragma omp simd
        for (int64_t i = i0; i < half; ++i) {
          float c = Elem<T>::load(cos_p[i]);
          float s = Elem<T>::load(sin_p[i]);
          float x1 = Elem<T>::load(v[2 * i]);
          float x2 = Elem<T>::load(v[2 * i + 1]);
          v[2 * i] = Elem<T>::store(x1 * c - x2 * s);
          v[2 * i + 1] = Elem<T>::store(x2 * c + x1 * s);
        }
      }
    }
  }
}

}  // namespace
}  // namespace engine::cpu
