// The wna16 kernels' vectors (wna16_impl.cpp and the headers it includes):
// cpu_types_x86.h's float side, plus what only the dequantisation needs, on
// 32-bit integer lanes, per ISA. Layout and math: wna16.h.
#pragma once

#include <stdint.h>

#include "cpu_types.h"
#include "kernels.h"
#include "scalar.h"

namespace engine::cpu {
namespace {

constexpr int64_t NR = kPanel;  // columns a panel

// The float side is cpu_types_x86.h's (VecF, vload, vfma, vstore_bits, ...);
// what only the dequantisation needs, on 32-bit integer lanes, is here per ISA.
#if defined(__AVX512F__) && defined(__AVX512BW__)
inline VecI iset1(int x) { return _mm512_set1_epi32(x); }
inline VecI iload(const uint32_t* p) { return _mm512_loadu_si512(p); }
inline VecI izeros(const uint8_t* z) {  // W zero points, widened
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(z)));
}
// (v >> sh) & mask, minus z, as float: exact for 4- and 8-bit values
inline VecF decode(VecI v, int sh, VecI mask, VecI z) {
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, sh), mask), z));
}
// (v & mask) | magic as float, magic = 2^23: 2^23 + (v & mask) exactly (below 2^23)
inline VecF magic_or(VecI v, VecI mask, VecI magic) {
  return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(v, mask, magic, 0xEA));
}
inline VecI isrl16(VecI v) { return _mm512_srli_epi32(v, 16); }
inline VecF icvt(VecI v) { return _mm512_cvtepi32_ps(v); }
// lo's bfloat16 bits in the low half of each lane, hi's in the high half
inline void store_pair(uint32_t* p, VecF lo, VecF hi) {
  _mm512_storeu_si512(p, _mm512_or_si512(vbf16_bits(lo), _mm512_slli_epi32(vbf16_bits(hi), 16)));
}
constexpr int MR_MAX = 16;  // rows a tile: 16 accumulators (more with k sets) of 32 registers
#else
inline VecI iset1(int x) { return _mm256_set1_epi32(x); }
inline VecI iload(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline VecI izeros(const uint8_t* z) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(z)));
}
inline VecF decode(VecI v, int sh, VecI mask, VecI z) {
  return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(v, sh), mask), z));
}
inline VecF magic_or(VecI v, VecI mask, VecI magic) {
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(v, mask), magic));
}
inline VecI isrl16(VecI v) { return _mm256_srli_epi32(v, 16); }
inline VecF icvt(VecI v) { return _mm256_cvtepi32_ps(v); }
inline void store_pair(uint32_t* p, VecF lo, VecF hi) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm256_or_si256(vbf16_bits(lo), _mm256_slli_epi32(vbf16_bits(hi), 16)));
}
constexpr int MR_MAX = 4;  // 16 registers: 8 accumulators, the weight, zero points, mask
#endif
// W dequantised weights as T; bfloat16 rounded to nearest even by the
// integer rounding (the weights are finite).
inline void store_w(float* p, VecF v) { vstore(p, v); }
inline void store_w(uint16_t* p, VecF v) { vstore_bits(p, vbf16_bits(v)); }
constexpr int CH = NR / W;  // vectors a panel row

}  // namespace
}  // namespace engine::cpu
