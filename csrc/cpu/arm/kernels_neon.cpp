// AArch64 kernels: NEON for every op, float32 and bfloat16 (bf16 storage,
// fp32 math). CMake compiles this file twice, like kernels_impl.cpp on x86:
//   ENGINE_ISA=neon       baseline armv8-a (every AArch64 CPU has NEON);
//   ENGINE_ISA=neon_bf16  +bf16: BFCVTN for rounding to bf16; csrc/cpu/isa.cpp
//                         picks it at run time when HWCAP2_BF16 says the CPU
//                         has it.
// Same rules as kernels_impl.cpp (see kernels.h): only C headers, everything
// but the table getter has internal linkage, so no +bf16 instruction can leak
// into code the baseline build shares. Kernels written once for every ISA
// (attention_impl.h, layernorm_impl.h) take NEON's vector types, arm/cpu_types_arm.h, which
// cpu_types.h picks for this file by ENGINE_NEON_KERNELS.
#define ENGINE_NEON_KERNELS 1

#include "../kernels.h"
#include "../scalar.h"
#include "../attention_impl.h"
#include "../layernorm_impl.h"
#include "cpu_types_arm.h"

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

namespace engine::cpu {
namespace {

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


// ---- rms_norm / fused_add_rms_norm -----------------------------------------------
// layernorm_impl.h's explicit-vector kernels, written once for x86 and NEON.

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
// attention_impl.h's paged_attention_t, written once for x86 and NEON.

// ---- type dispatch (the table's entry points) ---------------------------------------

// The norms allocate nothing here: 0 (kernels.h).
int64_t rms_norm(DType dt, void* out, const void* in, const void* w, int64_t rows,
                 int64_t hidden, int64_t is, int64_t os, float eps) {
  if (dt == DType::kFloat32)
    return rms_norm_vec(static_cast<float*>(out), static_cast<const float*>(in),
                        static_cast<const float*>(w), rows, hidden, is, os, eps);
  return rms_norm_vec(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(in),
                      static_cast<const uint16_t*>(w), rows, hidden, is, os, eps);
}

int64_t fused_add_rms_norm(DType dt, void* in, void* res, const void* w, int64_t rows,
                           int64_t hidden, int64_t is, int64_t rs, float eps) {
  if (dt == DType::kFloat32)
    return fused_add_rms_norm_vec(static_cast<float*>(in), static_cast<float*>(res),
                                  static_cast<const float*>(w), rows, hidden, is, rs, eps);
  return fused_add_rms_norm_vec(static_cast<uint16_t*>(in), static_cast<uint16_t*>(res),
                                static_cast<const uint16_t*>(w), rows, hidden, is, rs, eps);
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
