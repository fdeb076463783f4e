// Weight-only quantized linear layers (W4A16, W8A16) for the x86 vector ISAs:
// compiled once per ISA as kernels_impl.cpp is (ENGINE_ISA, the same -m
// flags), only C headers, internal linkage but for the entry points (wna16.h),
// which sit in a namespace of their ISA and fill its KernelTable.
// Layout and math: wna16.h.
//
// Decode (few rows) is memory-bound: a thread streams its panels of packed
// weights once a call, 4 KiB prefetched ahead, and dequantises in registers:
// each 32-bit lane of a step holds PF values of one column, so one vector
// load gives 16 columns by PF k, and a shift, a mask, the zero point's
// subtraction and no conversion make 16 float weights for MR fused
// multiply-adds (wna16_tile says how). Sums run per group and are scaled once a group:
// out[m, n] = sum_g scale[n, g] * sum_{k in g} x[m, k] * (q[n, k] - zero[n, g]).
// With few accumulators each gets several sets (k mod U) so that the FMA
// latency does not bound the stream.
// The kernels, by job: wna16_decode.h (few rows; 4-bit bfloat16 below
// PAIRS_MIN_M rows on AVX512_BF16: wna16_decode_bias.h), wna16_dequant.h (the weight
// for a large-M GEMM), wna16_amx.h (AMX tiles); here their entry points.
#include "wna16.h"
#include "wna16_amx.h"
#include "wna16_decode.h"
#include "wna16_decode_bias.h"
#include "wna16_dequant.h"

#include <stdint.h>

#ifndef ENGINE_ISA
#error "ENGINE_ISA must be defined (avx2, avx512 or avx512_bf16)"
#endif

namespace engine::cpu {

// The entry points (wna16.h), one set a compiled ISA.
namespace ENGINE_CAT(wna16_, ENGINE_ISA) {

void dequant_panels(DType dt, int bits, int k_pack, void* wp, const uint32_t* packed,
                    const float* scales, const uint8_t* zeros, int64_t N, int64_t K, int64_t G) {
  if (dt == DType::kFloat32) {
    auto* w = static_cast<float*>(wp);
    if (bits == 4) dequant_panels_t<4>(w, 1, packed, scales, zeros, N, K, G);
    else dequant_panels_t<8>(w, 1, packed, scales, zeros, N, K, G);
  } else {
    auto* w = static_cast<uint16_t*>(wp);
    if (bits == 4) dequant_panels_t<4>(w, k_pack, packed, scales, zeros, N, K, G);
    else dequant_panels_t<8>(w, k_pack, packed, scales, zeros, N, K, G);
  }
}

int64_t linear(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
               const float* scales, const uint8_t* zeros, int64_t M, int64_t N, int64_t K,
               int64_t G, int64_t ldx, int64_t ldo) {
  if (dt == DType::kFloat32) {
    auto* o = static_cast<float*>(out);
    auto* xi = static_cast<const float*>(x);
    if (bits == 4) return linear_t<4, float, FloatA<4, float>>(
        o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
    return linear_t<8, float, FloatA<8, float>>(
        o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
  } else {
    auto* o = static_cast<uint16_t*>(out);
    auto* xi = static_cast<const uint16_t*>(x);
#ifdef __AVX512BF16__
    if (bits == 4 && M < PAIRS_MIN_M)  // one request's decode: wna16_decode_bias.h
      return linear_q4_bias(o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
    if (M >= PAIRS_MIN_M) {
      if (bits == 4) return linear_t<4, uint16_t, PairA<4>>(
          o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
      return linear_t<8, uint16_t, PairA<8>>(
          o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
    }
#endif
    if (bits == 4) return linear_t<4, uint16_t, FloatA<4, uint16_t>>(
        o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
    return linear_t<8, uint16_t, FloatA<8, uint16_t>>(
        o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
  }
}

void dequant(DType dt, int bits, void* wt, const uint32_t* packed, const float* scales,
             const uint8_t* zeros, int64_t N, int64_t K, int64_t G) {
  if (dt == DType::kFloat32) {
    auto* w = static_cast<float*>(wt);
    if (bits == 4) dequant_t<4>(w, packed, scales, zeros, N, K, G);
    else dequant_t<8>(w, packed, scales, zeros, N, K, G);
  } else {
    auto* w = static_cast<uint16_t*>(wt);
    if (bits == 4) dequant_t<4>(w, packed, scales, zeros, N, K, G);
    else dequant_t<8>(w, packed, scales, zeros, N, K, G);
  }
}

#if defined(__AVX512BF16__) && defined(ENGINE_HAS_AMX)
bool linear_amx(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
                const float* scales, const uint8_t* zeros, int64_t M, int64_t N, int64_t K,
                int64_t G, int64_t ldx, int64_t ldo) {
  if (dt != DType::kBFloat16) return false;
  auto* o = static_cast<uint16_t*>(out);
  auto* xi = static_cast<const uint16_t*>(x);
  return bits == 4 ? linear_amx_t<4>(o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo)
                   : linear_amx_t<8>(o, xi, packed, scales, zeros, M, N, K, G, ldx, ldo);
}
#endif

}  // namespace ENGINE_CAT(wna16_, ENGINE_ISA)
}  // namespace engine::cpu
