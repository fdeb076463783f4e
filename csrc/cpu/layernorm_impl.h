// rms_norm and fused_add_rms_norm: explicit vectors (cpu_types.h: x86 and
// NEON), portable `omp simd` loops on the generic path.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_types.h"
#include "scalar.h"
#include "scratch.h"

namespace engine::cpu {
namespace {

// 1 / rms of a row whose squares sum to acc.
inline float rms_inv(float acc, int64_t hidden, float eps) {
  return 1.0f / sqrtf(acc / static_cast<float>(hidden) + eps);
}

#ifdef ENGINE_VEC_WIDTH
// Sum of squares of x[0, n); with `copy`, the floats are also written there (a
// bfloat16 row is converted once and both passes of the norm read floats).
template <typename T>
inline float sum_squares(const T* x, int64_t n, float* copy) {
  VecF a0 = vset1(0.f), a1 = vset1(0.f);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {  // the copy in pair order
    VecF v0, v1;
    vload_pair(x + i, v0, v1);
    if (copy) vstore_pair(copy + i, v0, v1);
    a0 = vfma(v0, v0, a0);
    a1 = vfma(v1, v1, a1);
  }
  for (; i + W <= n; i += W) {
    VecF v = vload(x + i);
    if (copy) vstore(copy + i, v);
    a0 = vfma(v, v, a0);
  }
  float acc = vsum(vadd(a0, a1));
  for (; i < n; ++i) {
    float v = Elem<T>::load(x[i]);
    if (copy) copy[i] = v;
    acc += v * v;
  }
  return acc;
}

// y = x * inv * w, x and w already floats, in pair order (vload_pair).
template <typename T>
inline void scale_row(T* y, const float* x, const float* w, int64_t n, float inv) {
  const VecF vi = vset1(inv);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    vstore_pair(y + i, vmul(vmul(vload(x + i), vi), vload(w + i)),
                vmul(vmul(vload(x + i + W), vi), vload(w + i + W)));
  }
  for (; i + W <= n; i += W) vstore(y + i, vmul(vmul(vload(x + i), vi), vload(w + i)));
  for (; i < n; ++i) y[i] = Elem<T>::store(x[i] * inv * w[i]);
}

// Per-thread float copies of the weight and of one row, for bfloat16 only:
// converting the weight once per thread instead of once per row, and the row
// once instead of once per pass, is most of a bfloat16 norm's arithmetic.
// failed(): the bytes a thread could not allocate (it then skips its rows).
template <typename T>
struct NormScratch {
  float* buf = nullptr;
  const float* wf = nullptr;
  float* row = nullptr;
  int64_t failed_bytes = 0;
  NormScratch(const T* w, int64_t hidden) {
    if constexpr (IsBf16<T>::value) {
      // plain malloc: aligned_alloc measured slower here (avx512_bf16, 64 x 4096)
      buf = static_cast<float*>(malloc(sizeof(float) * 2 * hidden));
      if (buf == nullptr) {
        failed_bytes = static_cast<int64_t>(sizeof(float) * 2 * hidden);
        return;
      }
      to_float_pairs(buf, w, hidden);  // in pair order, as the rows are read
      wf = buf;
      row = buf + hidden;
    } else {
      wf = reinterpret_cast<const float*>(w);
    }
  }
  NormScratch(const NormScratch&) = delete;
  NormScratch& operator=(const NormScratch&) = delete;
  ~NormScratch() { free(buf); }
  int64_t failed() const { return failed_bytes; }
};

// z = x + z stored in T; returns the sum of squares of what was stored, which
// `copy` (when given) also receives as floats, in pair order.
template <typename T>
inline float add_sum_squares(const T* x, T* z, int64_t n, float* copy) {
  VecF a0 = vset1(0.f), a1 = vset1(0.f);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {  // pair order (the row and the weight too)
    VecF x0, x1, z0, z1;
    vload_pair(x + i, x0, x1);
    vload_pair(z + i, z0, z1);
    VecF s0 = vadd(x0, z0), s1 = vadd(x1, z1);
    vstore_pair_rounded(z + i, s0, s1);
    if (copy) vstore_pair(copy + i, s0, s1);
    a0 = vfma(s0, s0, a0);
    a1 = vfma(s1, s1, a1);
  }
  for (; i + W <= n; i += W) {
    VecF s0 = vround(vadd(vload(x + i), vload(z + i)), z);
    vstore(z + i, s0);
    if (copy) vstore(copy + i, s0);
    a0 = vfma(s0, s0, a0);
  }
  float acc = vsum(vadd(a0, a1));
  for (; i < n; ++i) {
    T s = Elem<T>::store(Elem<T>::load(x[i]) + Elem<T>::load(z[i]));
    z[i] = s;
    float v = Elem<T>::load(s);
    if (copy) copy[i] = v;
    acc += v * v;
  }
  return acc;
}

// Both norms' rows in one parallel region. Fused: res += in (stored in T),
// then in = norm(res): the next layer sees exactly the residual we normalized.
// Otherwise out = norm(in), and res is unused. `stride` is out's or res's.
template <bool Fused, typename T>
int64_t norm_rows_vec(T* out, T* in, T* res, const T* w, int64_t rows, int64_t hidden,
                      int64_t in_stride, int64_t stride, float eps) {
  int64_t failed = 0;
#pragma omp parallel if (worth_threads(rows * hidden))
  {
    NormScratch<T> sc(w, hidden);
    if (sc.failed()) note_failed(failed, sc.failed());
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      if (sc.failed()) continue;
      T* x = in + r * in_stride;
      T* z = Fused ? res + r * stride : x;  // the row normalized
      const float acc = Fused ? add_sum_squares(x, z, hidden, sc.row) : sum_squares(x, hidden, sc.row);
      const float* zf = sc.row ? sc.row : reinterpret_cast<const float*>(z);
      scale_row(Fused ? x : out + r * stride, zf, sc.wf, hidden, rms_inv(acc, hidden, eps));
    }
  }
  return failed;
}

template <typename T>
int64_t rms_norm_vec(T* out, const T* in, const T* w, int64_t rows, int64_t hidden,
                     int64_t in_stride, int64_t out_stride, float eps) {
  // in is only read (Fused false)
  return norm_rows_vec<false, T>(out, const_cast<T*>(in), nullptr, w, rows, hidden, in_stride,
                                 out_stride, eps);
}

template <typename T>
int64_t fused_add_rms_norm_vec(T* in, T* res, const T* w, int64_t rows, int64_t hidden,
                               int64_t in_stride, int64_t res_stride, float eps) {
  return norm_rows_vec<true, T>(nullptr, in, res, w, rows, hidden, in_stride, res_stride, eps);
}

#endif  // ENGINE_VEC_WIDTH

// ---- portable ----------------------------------------------------------------

// y = x * inv * w, the norms' second pass.
template <typename T>
inline void scale_row_t(T* y, const T* x, const T* w, int64_t n, float inv) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = Elem<T>::store(Elem<T>::load(x[i]) * inv * Elem<T>::load(w[i]));
}

template <typename T>
int64_t rms_norm_t(T* out, const T* in, const T* w, int64_t rows, int64_t hidden,
                int64_t in_stride, int64_t out_stride, float eps) {
#pragma omp parallel for schedule(static) if (worth_threads(rows * hidden))
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * in_stride;
    T* y = out + r * out_stride;
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < hidden; ++i) {
      float v = Elem<T>::load(x[i]);
      acc += v * v;
    }
    scale_row_t(y, x, w, hidden, rms_inv(acc, hidden, eps));
  }
  return 0;
}

template <typename T>
int64_t fused_add_rms_norm_t(T* in, T* res, const T* w, int64_t rows,
                          int64_t hidden, int64_t in_stride, int64_t res_stride,
                          float eps) {
#pragma omp parallel for schedule(static) if (worth_threads(rows * hidden))
  for (int64_t r = 0; r < rows; ++r) {
    T* x = in + r * in_stride;
    T* z = res + r * res_stride;
    float acc = 0.f;
    // The residual is stored in T and the norm is taken of what was stored,
    // so that the next layer sees exactly the residual we normalized.
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < hidden; ++i) {
      T s = Elem<T>::store(Elem<T>::load(x[i]) + Elem<T>::load(z[i]));
      z[i] = s;
      float v = Elem<T>::load(s);
      acc += v * v;
    }
    scale_row_t(x, z, w, hidden, rms_inv(acc, hidden, eps));
  }
  return 0;
}

}  // namespace
}  // namespace engine::cpu
