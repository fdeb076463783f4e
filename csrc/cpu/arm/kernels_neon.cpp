// AArch64 kernels: NEON for every op, float32 and bfloat16 (bf16 storage,
// fp32 math). CMake compiles this file twice, like kernels_impl.cpp on x86:
//   ENGINE_ISA=neon       baseline armv8-a (every AArch64 CPU has NEON);
//   ENGINE_ISA=neon_bf16  +bf16: BFCVTN for rounding to bf16 and BFMLALB/T for
//                         the attention dot products; csrc/cpu/isa.cpp picks it
//                         at run time when HWCAP2_BF16 says the CPU has it.
// Same rules as kernels_impl.cpp (see kernels.h): only C headers, everything
// but the table getter has internal linkage, so no +bf16 instruction can leak
// into code the baseline build shares.
#include "../kernels.h"
#include "../scalar.h"

#include <arm_neon.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef ENGINE_ISA
#error "ENGINE_ISA must be defined (neon or neon_bf16)"
#endif
#if !defined(__aarch64__)
#error "kernels_neon.cpp is AArch64 only"
#endif

#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC) || defined(__ARM_FEATURE_BF16)
#define ENGINE_NEON_BF16 1
#else
#define ENGINE_NEON_BF16 0
#endif

namespace engine::cpu {
namespace {

// ---- vector conversion ----------------------------------------------------------

inline float32x4_t bf16x4_to_f32(uint16x4_t h) {
  return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

inline uint16x4_t f32_to_bf16x4(float32x4_t f) {
#if ENGINE_NEON_BF16
  return vreinterpret_u16_bf16(vcvt_bf16_f32(f));  // BFCVTN: round to nearest even
#else
  uint32x4_t u = vreinterpretq_u32_f32(f);
  uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
  uint32x4_t r = vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fffu)), lsb);
  uint32x4_t isnum = vceqq_f32(f, f);
  r = vbslq_u32(isnum, r, vdupq_n_u32(0x7fc00000u));
  return vshrn_n_u32(r, 16);
#endif
}

// Four floats from T storage, and back.
template <typename T>
struct V;
template <>
struct V<float> {
  static inline float32x4_t load(const float* p) { return vld1q_f32(p); }
  static inline void store(float* p, float32x4_t v) { vst1q_f32(p, v); }
  static inline float load1(float x) { return x; }
  static inline float store1(float x) { return x; }
};
template <>
struct V<uint16_t> {
  static inline float32x4_t load(const uint16_t* p) { return bf16x4_to_f32(vld1_u16(p)); }
  static inline void store(uint16_t* p, float32x4_t v) { vst1_u16(p, f32_to_bf16x4(v)); }
  static inline float load1(uint16_t x) { return bf16_to_float(x); }
  static inline uint16_t store1(float x) { return float_to_bf16(x); }
};

// ---- math -----------------------------------------------------------------------

// exp(x), Cephes' expf polynomial (the same as kernels_impl.cpp's fast_exp),
// relative error about 1e-7 over the clamped range; no libm vector call.
inline float32x4_t vexp(float32x4_t x) {
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.3f));
  const float32x4_t shifter = vdupq_n_f32(12582912.0f);
  float32x4_t kn = vfmaq_f32(shifter, x, vdupq_n_f32(1.44269504088896341f));
  int32x4_t n = vreinterpretq_s32_u32(
      vsubq_u32(vreinterpretq_u32_f32(kn), vreinterpretq_u32_f32(shifter)));
  float32x4_t k = vsubq_f32(kn, shifter);
  float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693359375f));
  r = vfmaq_f32(r, k, vdupq_n_f32(2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  float32x4_t y = vaddq_f32(vfmaq_f32(r, vmulq_f32(p, r), r), vdupq_n_f32(1.0f));
  int32x4_t scale = vshlq_n_s32(vaddq_s32(n, vdupq_n_s32(127)), 23);
  return vmulq_f32(y, vreinterpretq_f32_s32(scale));
}

inline float sexp(float x) {
  return vgetq_lane_f32(vexp(vdupq_n_f32(x)), 0);
}

// silu(x) = x / (1 + exp(-x)); -x clamped at 69 (the result is ~0 there).
inline float32x4_t vsilu(float32x4_t x) {
  float32x4_t nx = vminq_f32(vnegq_f32(x), vdupq_n_f32(69.0f));
  return vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), vexp(nx)));
}

inline float ssilu(float x) { return vgetq_lane_f32(vsilu(vdupq_n_f32(x)), 0); }


// sum of squares of x[0:n) in fp32
template <typename T>
inline float sum_squares(const T* x, int64_t n) {
  float32x4_t a0 = vdupq_n_f32(0.f), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    float32x4_t v0 = V<T>::load(x + i), v1 = V<T>::load(x + i + 4);
    float32x4_t v2 = V<T>::load(x + i + 8), v3 = V<T>::load(x + i + 12);
    a0 = vfmaq_f32(a0, v0, v0);
    a1 = vfmaq_f32(a1, v1, v1);
    a2 = vfmaq_f32(a2, v2, v2);
    a3 = vfmaq_f32(a3, v3, v3);
  }
  for (; i + 4 <= n; i += 4) {
    float32x4_t v = V<T>::load(x + i);
    a0 = vfmaq_f32(a0, v, v);
  }
  float acc = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
  for (; i < n; ++i) {
    float v = V<T>::load1(x[i]);
    acc += v * v;
  }
  return acc;
}

// y[i] = x[i] * inv * w[i]
template <typename T>
inline void scale_by(T* y, const T* x, const T* w, int64_t n, float inv) {
  const float32x4_t vi = vdupq_n_f32(inv);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    V<T>::store(y + i, vmulq_f32(vmulq_f32(V<T>::load(x + i), vi), V<T>::load(w + i)));
  for (; i < n; ++i) y[i] = V<T>::store1(V<T>::load1(x[i]) * inv * V<T>::load1(w[i]));
}

// ---- rms_norm / fused_add_rms_norm -----------------------------------------------

template <typename T>
void rms_norm_t(T* out, const T* in, const T* w, int64_t rows, int64_t hidden,
                int64_t in_stride, int64_t out_stride, float eps) {
#pragma omp parallel for schedule(static) if (worth_threads(rows * hidden))
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * in_stride;
    const float inv = 1.0f / sqrtf(sum_squares(x, hidden) / static_cast<float>(hidden) + eps);
    scale_by(out + r * out_stride, x, w, hidden, inv);
  }
}

template <typename T>
void fused_add_rms_norm_t(T* in, T* res, const T* w, int64_t rows,
                          int64_t hidden, int64_t in_stride, int64_t res_stride,
                          float eps) {
#pragma omp parallel for schedule(static) if (worth_threads(rows * hidden))
  for (int64_t r = 0; r < rows; ++r) {
    T* x = in + r * in_stride;
    T* z = res + r * res_stride;
    // The residual is stored in T first and the norm taken of what was
    // stored, so the next layer sees exactly the residual we normalized.
    int64_t i = 0;
    for (; i + 4 <= hidden; i += 4)
      V<T>::store(z + i, vaddq_f32(V<T>::load(x + i), V<T>::load(z + i)));
    for (; i < hidden; ++i) z[i] = V<T>::store1(V<T>::load1(x[i]) + V<T>::load1(z[i]));
    const float inv = 1.0f / sqrtf(sum_squares(z, hidden) / static_cast<float>(hidden) + eps);
    scale_by(x, z, w, hidden, inv);
  }
}

// ---- silu_and_mul -----------------------------------------------------------------

template <typename T>
void silu_and_mul_t(T* out, const T* in, int64_t rows, int64_t d,
                    int64_t in_stride, int64_t out_stride) {
#pragma omp parallel for schedule(static) if (worth_threads(rows * d))
  for (int64_t r = 0; r < rows; ++r) {
    const T* a = in + r * in_stride;
    const T* b = a + d;
    T* y = out + r * out_stride;
    int64_t i = 0;
    for (; i + 4 <= d; i += 4)
      V<T>::store(y + i, vmulq_f32(vsilu(V<T>::load(a + i)), V<T>::load(b + i)));
    for (; i < d; ++i) y[i] = V<T>::store1(ssilu(V<T>::load1(a[i])) * V<T>::load1(b[i]));
  }
}

// ---- rotary_embedding -------------------------------------------------------------

// Interleaved (GPT-J) pairs: four pairs from T storage, split into x1 and x2.
inline float32x4x2_t load_pairs(const float* p) { return vld2q_f32(p); }
inline void store_pairs(float* p, float32x4x2_t v) { vst2q_f32(p, v); }
inline float32x4x2_t load_pairs(const uint16_t* p) {
  uint16x4x2_t h = vld2_u16(p);
  return {{bf16x4_to_f32(h.val[0]), bf16x4_to_f32(h.val[1])}};
}
inline void store_pairs(uint16_t* p, float32x4x2_t v) {
  uint16x4x2_t h = {{f32_to_bf16x4(v.val[0]), f32_to_bf16x4(v.val[1])}};
  vst2_u16(p, h);
}

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
      int64_t i = 0;
      if (neox) {
        for (; i + 4 <= half; i += 4) {
          float32x4_t c = V<T>::load(cos_p + i), s = V<T>::load(sin_p + i);
          float32x4_t x1 = V<T>::load(v + i), x2 = V<T>::load(v + i + half);
          V<T>::store(v + i, vfmsq_f32(vmulq_f32(x1, c), x2, s));
          V<T>::store(v + i + half, vfmaq_f32(vmulq_f32(x2, c), x1, s));
        }
        for (; i < half; ++i) {
          float c = V<T>::load1(cos_p[i]), s = V<T>::load1(sin_p[i]);
          float x1 = V<T>::load1(v[i]), x2 = V<T>::load1(v[i + half]);
          v[i] = V<T>::store1(x1 * c - x2 * s);
          v[i + half] = V<T>::store1(x2 * c + x1 * s);
        }
      } else {
        for (; i + 4 <= half; i += 4) {
          float32x4_t c = V<T>::load(cos_p + i), s = V<T>::load(sin_p + i);
          float32x4x2_t p = load_pairs(v + 2 * i);
          float32x4x2_t o = {{vfmsq_f32(vmulq_f32(p.val[0], c), p.val[1], s),
                              vfmaq_f32(vmulq_f32(p.val[1], c), p.val[0], s)}};
          store_pairs(v + 2 * i, o);
        }
        for (; i < half; ++i) {
          float c = V<T>::load1(cos_p[i]), s = V<T>::load1(sin_p[i]);
          float x1 = V<T>::load1(v[2 * i]), x2 = V<T>::load1(v[2 * i + 1]);
          v[2 * i] = V<T>::store1(x1 * c - x2 * s);
          v[2 * i + 1] = V<T>::store1(x2 * c + x1 * s);
        }
      }
    }
  }
}

// ---- reshape_and_cache ------------------------------------------------------------

// n bytes, 64 then 16 at a time with NEON, then the rest.
inline void copy_bytes(uint8_t* dst, const uint8_t* src, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) vst1q_u8_x4(dst + i, vld1q_u8_x4(src + i));
  for (; i + 16 <= n; i += 16) vst1q_u8(dst + i, vld1q_u8(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

void reshape_and_cache(int64_t elem_size, const void* key, const void* value,
                       void* key_cache, void* value_cache, const int64_t* slots,
                       int64_t tokens, int64_t kv_heads, int64_t head_size,
                       int64_t block_size, int64_t kts, int64_t khs, int64_t vts,
                       int64_t vhs) {
  const uint8_t* k = static_cast<const uint8_t*>(key);
  const uint8_t* v = static_cast<const uint8_t*>(value);
  uint8_t* kc = static_cast<uint8_t*>(key_cache);
  uint8_t* vc = static_cast<uint8_t*>(value_cache);
  const int64_t row = head_size * elem_size;
#pragma omp parallel for schedule(static) if (worth_threads(tokens * kv_heads * head_size))
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t dst = ((block * kv_heads + h) * block_size + offset) * row;
      copy_bytes(kc + dst, k + (t * kts + h * khs) * elem_size, row);
      copy_bytes(vc + dst, v + (t * vts + h * vhs) * elem_size, row);
    }
  }
}

// ---- paged_attention --------------------------------------------------------------

// q . k over n elements, q already in fp32 (scaled), k in T storage.
template <typename T>
inline float dot_qk(const float* q, const T* k, int64_t n) {
  float32x4_t a0 = vdupq_n_f32(0.f), a1 = a0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    a0 = vfmaq_f32(a0, vld1q_f32(q + i), V<T>::load(k + i));
    a1 = vfmaq_f32(a1, vld1q_f32(q + i + 4), V<T>::load(k + i + 4));
  }
  for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, vld1q_f32(q + i), V<T>::load(k + i));
  float dot = vaddvq_f32(vaddq_f32(a0, a1));
  for (; i < n; ++i) dot += q[i] * V<T>::load1(k[i]);
  return dot;
}

#if ENGINE_NEON_BF16
// q . k with both in bf16: BFMLALB/BFMLALT widen the even/odd lanes and
// accumulate in fp32 with fused multiply-adds (exact products, no bf16
// rounding of the sums). The caller scales the result.
inline float dot_bf16(const uint16_t* q, const uint16_t* k, int64_t n) {
  float32x4_t a0 = vdupq_n_f32(0.f), a1 = a0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    bfloat16x8_t qv = vreinterpretq_bf16_u16(vld1q_u16(q + i));
    bfloat16x8_t kv = vreinterpretq_bf16_u16(vld1q_u16(k + i));
    a0 = vbfmlalbq_f32(a0, qv, kv);
    a1 = vbfmlaltq_f32(a1, qv, kv);
  }
  float dot = vaddvq_f32(vaddq_f32(a0, a1));
  for (; i < n; ++i) dot += bf16_to_float(q[i]) * bf16_to_float(k[i]);
  return dot;
}
#endif

// acc[i] += p * v[i]
template <typename T>
inline void axpy(float* acc, float p, const T* v, int64_t n) {
  const float32x4_t vp = vdupq_n_f32(p);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    vst1q_f32(acc + i, vfmaq_f32(vld1q_f32(acc + i), vp, V<T>::load(v + i)));
  for (; i < n; ++i) acc[i] += p * V<T>::load1(v[i]);
}

// Work item: one (sequence, kv head) pair covering the `group` query heads
// that share it, so each key/value row is read once per group.
template <typename T>
int64_t paged_attention_t(T* out, const T* query, const T* key_cache,
                       const T* value_cache, const int32_t* block_tables,
                       const int32_t* seq_lens, int64_t seqs, int64_t heads,
                       int64_t kv_heads, int64_t head_size, int64_t block_size,
                       int64_t max_blocks, float scale) {
  const int64_t group = heads / kv_heads;
  const int64_t items = seqs * kv_heads;
  const int64_t head_stride = block_size * head_size;
  const int64_t block_stride = kv_heads * head_stride;
  int64_t max_len = 1;
  for (int64_t s = 0; s < seqs; ++s) max_len = seq_lens[s] > max_len ? seq_lens[s] : max_len;
  const int64_t scratch = sizeof(float) * (group * max_len + 2 * group * head_size);
  int64_t failed = 0;

#pragma omp parallel
  {
    float* logits = static_cast<float*>(malloc(sizeof(float) * group * max_len));
    float* q = static_cast<float*>(malloc(sizeof(float) * group * head_size));
    float* acc = static_cast<float*>(malloc(sizeof(float) * group * head_size));
    // an exception cannot leave a parallel region: note it, skip the work, report after
    const bool ok = logits && q && acc;
    if (!ok) {
#pragma omp atomic write
      failed = scratch;
    }

#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      if (!ok) continue;
      const int64_t s = item / kv_heads;
      const int64_t kh = item % kv_heads;
      const int64_t len = seq_lens[s];
      const int32_t* table = block_tables + s * max_blocks;
      T* out_s = out + (s * heads + kh * group) * head_size;
      if (len <= 0) {
        for (int64_t i = 0; i < group * head_size; ++i) out_s[i] = V<T>::store1(0.f);
        continue;
      }
      const T* q_s = query + (s * heads + kh * group) * head_size;
      for (int64_t i = 0; i < group * head_size; ++i) q[i] = V<T>::load1(q_s[i]) * scale;

      // logits[g, t] = q_g . k_t
      for (int64_t t = 0; t < len; ++t) {
        const T* k = key_cache + table[t / block_size] * block_stride + kh * head_stride +
                     (t % block_size) * head_size;
        for (int64_t g = 0; g < group; ++g) {
#if ENGINE_NEON_BF16
          if constexpr (sizeof(T) == 2) {
            logits[g * len + t] = dot_bf16(q_s + g * head_size, k, head_size) * scale;
            continue;
          }
#endif
          logits[g * len + t] = dot_qk(q + g * head_size, k, head_size);
        }
      }

      // softmax over t, per query head
      for (int64_t g = 0; g < group; ++g) {
        float* lg = logits + g * len;
        int64_t t = 0;
        float32x4_t vm = vdupq_n_f32(lg[0]);
        for (; t + 4 <= len; t += 4) vm = vmaxq_f32(vm, vld1q_f32(lg + t));
        float mx = vmaxvq_f32(vm);
        for (; t < len; ++t) mx = lg[t] > mx ? lg[t] : mx;
        const float32x4_t vmx = vdupq_n_f32(mx);
        float32x4_t vs = vdupq_n_f32(0.f);
        for (t = 0; t + 4 <= len; t += 4) {
          float32x4_t e = vexp(vsubq_f32(vld1q_f32(lg + t), vmx));
          vst1q_f32(lg + t, e);
          vs = vaddq_f32(vs, e);
        }
        float sum = vaddvq_f32(vs);
        for (; t < len; ++t) {
          float e = sexp(lg[t] - mx);
          lg[t] = e;
          sum += e;
        }
        const float32x4_t vinv = vdupq_n_f32(1.0f / sum);
        for (t = 0; t + 4 <= len; t += 4) vst1q_f32(lg + t, vmulq_f32(vld1q_f32(lg + t), vinv));
        for (; t < len; ++t) lg[t] *= 1.0f / sum;
      }

      // acc[g] = sum_t p[g, t] * v_t
      for (int64_t i = 0; i < group * head_size; ++i) acc[i] = 0.f;
      for (int64_t t = 0; t < len; ++t) {
        const T* v = value_cache + table[t / block_size] * block_stride + kh * head_stride +
                     (t % block_size) * head_size;
        for (int64_t g = 0; g < group; ++g)
          axpy(acc + g * head_size, logits[g * len + t], v, head_size);
      }
      int64_t i = 0;
      for (; i + 4 <= group * head_size; i += 4) V<T>::store(out_s + i, vld1q_f32(acc + i));
      for (; i < group * head_size; ++i) out_s[i] = V<T>::store1(acc[i]);
    }
    free(logits);
    free(q);
    free(acc);
  }
  return failed;
}

// ---- type dispatch (the table's entry points) ---------------------------------------

// The norms allocate nothing here: 0 (kernels.h).
int64_t rms_norm(DType dt, void* out, const void* in, const void* w, int64_t rows,
                 int64_t hidden, int64_t is, int64_t os, float eps) {
  if (dt == DType::kFloat32)
    rms_norm_t(static_cast<float*>(out), static_cast<const float*>(in),
               static_cast<const float*>(w), rows, hidden, is, os, eps);
  else
    rms_norm_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(in),
               static_cast<const uint16_t*>(w), rows, hidden, is, os, eps);
  return 0;
}

int64_t fused_add_rms_norm(DType dt, void* in, void* res, const void* w, int64_t rows,
                           int64_t hidden, int64_t is, int64_t rs, float eps) {
  if (dt == DType::kFloat32)
    fused_add_rms_norm_t(static_cast<float*>(in), static_cast<float*>(res),
                         static_cast<const float*>(w), rows, hidden, is, rs, eps);
  else
    fused_add_rms_norm_t(static_cast<uint16_t*>(in), static_cast<uint16_t*>(res),
                         static_cast<const uint16_t*>(w), rows, hidden, is, rs, eps);
  return 0;
}

void silu_and_mul(DType dt, void* out, const void* in, int64_t rows, int64_t d,
                  int64_t is, int64_t os) {
  if (dt == DType::kFloat32)
    silu_and_mul_t(static_cast<float*>(out), static_cast<const float*>(in), rows, d, is, os);
  else
    silu_and_mul_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(in), rows, d, is, os);
}

void rotary_embedding(DType dt, const int64_t* pos, void* x, const void* cache,
                      int64_t tokens, int64_t heads, int64_t ts, int64_t hs,
                      int64_t rot_dim, int64_t cs, bool neox) {
  if (dt == DType::kFloat32)
    rotary_t(pos, static_cast<float*>(x), static_cast<const float*>(cache), tokens, heads, ts,
             hs, rot_dim, cs, neox);
  else
    rotary_t(pos, static_cast<uint16_t*>(x), static_cast<const uint16_t*>(cache), tokens,
             heads, ts, hs, rot_dim, cs, neox);
}

int64_t paged_attention(DType dt, void* out, const void* query, const void* kc,
                        const void* vc, const int32_t* bt, const int32_t* sl,
                        int64_t seqs, int64_t heads, int64_t kv_heads,
                        int64_t head_size, int64_t block_size, int64_t max_blocks,
                        float scale) {
  if (dt == DType::kFloat32)
    return paged_attention_t(static_cast<float*>(out), static_cast<const float*>(query),
                             static_cast<const float*>(kc), static_cast<const float*>(vc), bt,
                             sl, seqs, heads, kv_heads, head_size, block_size, max_blocks, scale);
  return paged_attention_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(query),
                           static_cast<const uint16_t*>(kc), static_cast<const uint16_t*>(vc), bt,
                           sl, seqs, heads, kv_heads, head_size, block_size, max_blocks, scale);
}

const KernelTable table = {
    ENGINE_STR(ENGINE_ISA), rms_norm, fused_add_rms_norm, silu_and_mul,
    rotary_embedding,       reshape_and_cache, paged_attention,
    nullptr,  // linear: no NEON panel kernel yet, torch's linear runs
    nullptr,  // linear_bf16_pairs (x86 AVX512_BF16 only)
    nullptr,  // paged_prefill_attention: not yet on NEON, the torch reference runs
};

}  // namespace

const KernelTable* ENGINE_CAT(kernels_, ENGINE_ISA)() { return &table; }

}  // namespace engine::cpu
