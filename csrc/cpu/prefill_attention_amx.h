// Prefill attention for bfloat16 with AMX tiles (tdpbf16ps), on CPUs that
// have them: the flash loop of prefill_attention_impl.h, with the two matmuls
// (Q K^T and P V) as 16 x 16 x 32 tile products and the online softmax in
// AVX-512 between them. On the avx512_bf16 path where int8_linear_amx.h has
// AMX (ENGINE_HAS_AMX_INT8: a compiler with the tile intrinsics).
//
// A tile's B operand pairs its k dimension ("VNNI" layout), so each (sequence,
// kv head)'s keys and values are first repacked once from the paged cache:
//   kt: per 16 keys and 32 head dims, 16 rows (dim pairs) x 16 keys x 2;
//   vt: per 32 keys and 16 head dims, 16 rows (key pairs) x 16 dims x 2;
// zero past the sequence. Then one work item is (sequence, kv head, 16 query
// rows): rows are tokens x the group's heads (GQA without copies), keys go by
// 64 (four score tiles), causal and window masks are applied to the scores.
// P is rounded to bfloat16 for the second product, as upstream's does.
#pragma once

#include <stdint.h>

#include "amx.h"
#include "int8_linear_amx.h"
#include "prefill_attention_impl.h"
#include "scalar.h"
#include "scratch.h"

namespace engine::cpu {
namespace {

#if defined(ENGINE_HAS_AMX_INT8) && defined(__AVX512BF16__)
#define ENGINE_HAS_AMX_ATTENTION 1

constexpr int64_t kAmxKeys = 64;  // keys a block: four score tiles, two P tiles

// One configuration, every tile 16 rows x 64 bytes. Q K^T: 0-3 the scores
// (16 x 16 fp32 each), 4 Q (16 x 32 bf16), 5 K^T. Then P V: 4, 5 P (16 x 32
// keys each), 2, 3 V, 0, 1 a 32-wide chunk of the product.
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_attention_configure() {
  AmxConfig c{};
  c.palette = 1;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  _tile_loadconfig(&c);
}

// One (sequence, kv head)'s keys [0, n) (n a multiple of kAmxKeys) repacked.
inline void amx_pack_kv(uint32_t* kt, uint16_t* vt, const uint16_t* kc, const uint16_t* vc,
                        const int32_t* table, int64_t len, int64_t n, int64_t D,
                        int64_t block_size, int64_t block_stride, int64_t head_off) {
  const int64_t pairs = D / 2, chunks = D / 32;
  for (int64_t t = 0; t < n; ++t) {
    const bool in = t < len;
    const uint16_t* kr = in ? cache_row(kc, table, t, block_size, block_stride, head_off, D) : nullptr;
    const uint16_t* vr = in ? cache_row(vc, table, t, block_size, block_stride, head_off, D) : nullptr;
    const uint32_t* k32 = reinterpret_cast<const uint32_t*>(kr);
    uint32_t* kdst = kt + (t / 16) * chunks * 256 + (t % 16);
    for (int64_t p = 0; p < pairs; ++p)
      kdst[(p / 16) * 256 + (p % 16) * 16] = in ? k32[p] : 0u;
    uint16_t* vdst = vt + (t / 32) * (D / 16) * 512 + ((t % 32) / 2) * 32 + (t % 2);
    for (int64_t x = 0; x < D; ++x) vdst[(x / 16) * 512 + (x % 16) * 2] = in ? vr[x] : 0;
  }
}

// s[16, 64] = Q K^T for the 64 keys whose first 16-key tile is kt.
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_scores(
    float* s, const uint16_t* qa, const uint32_t* kt, int64_t D) {
  const int64_t chunks = D / 32;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t c = 0; c < chunks; ++c) {
    _tile_loadd(4, qa + c * 32, D * 2);
    _tile_loadd(5, kt + c * 256, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(5, kt + (chunks + c) * 256, 64);
    _tile_dpbf16ps(1, 4, 5);
    _tile_loadd(5, kt + (2 * chunks + c) * 256, 64);
    _tile_dpbf16ps(2, 4, 5);
    _tile_loadd(5, kt + (3 * chunks + c) * 256, 64);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, s, kAmxKeys * 4);
  _tile_stored(1, s + 16, kAmxKeys * 4);
  _tile_stored(2, s + 32, kAmxKeys * 4);
  _tile_stored(3, s + 48, kAmxKeys * 4);
}

// o[r, :] += sum_j p[r, j] v[j, :] over 64 keys (vt: their two 32-key blocks).
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_pv(float* o, const uint16_t* pa,
                                                                const uint16_t* vt, int64_t D,
                                                                float* tmp) {
  const int64_t block = (D / 16) * 512;  // a 32-key block of vt
  _tile_loadd(4, pa, kAmxKeys * 2);
  _tile_loadd(5, pa + 32, kAmxKeys * 2);
  for (int64_t cc = 0; cc < D / 16; cc += 2) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, vt + cc * 512, 64);
    _tile_loadd(3, vt + block + cc * 512, 64);
    _tile_dpbf16ps(0, 4, 2);
    _tile_dpbf16ps(0, 5, 3);
    _tile_loadd(2, vt + (cc + 1) * 512, 64);
    _tile_loadd(3, vt + block + (cc + 1) * 512, 64);
    _tile_dpbf16ps(1, 4, 2);
    _tile_dpbf16ps(1, 5, 3);
    _tile_stored(0, tmp, 128);
    _tile_stored(1, tmp + 16, 128);
    for (int r = 0; r < 16; ++r) {
      float* orow = o + r * D + cc * 16;
      const float* t = tmp + r * 32;
      _mm512_storeu_ps(orow, _mm512_add_ps(_mm512_loadu_ps(orow), _mm512_loadu_ps(t)));
      _mm512_storeu_ps(orow + 16, _mm512_add_ps(_mm512_loadu_ps(orow + 16), _mm512_loadu_ps(t + 16)));
    }
  }
}

// 2^x on 16 lanes for x <= 0, to the precision P needs: P is rounded to
// bfloat16 (a relative 2^-9) for the second product, so e^(r ln 2)'s terms to
// degree 4 on r in [-0.5, 0.5] (relative error under 6e-5) and vscalefps for
// the 2^k: 7 operations a vector, in the loop that bounds this kernel (the
// tile products take a fraction of the softmax's time). A masked score's
// -1e30 gives an exact 0 (scalef underflows; r is 0 past 2^23).
inline __m512 amx_exp2_16(__m512 x) {
  const __m512 k = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, k);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(9.61812910762847716e-3f), r,
                             _mm512_set1_ps(5.55041086648215800e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.40226506959100712e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.93147180559945309e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

// Lane j: the largest lane of v[j] (16 rows' maxima at once: cpu_types_x86.h's
// vreduce_rows tree, 45 operations where 16 separate reductions take 128).
inline __m512 amx_row_max(const __m512* v) {
  return vreduce_rows(v, [](__m512 x, __m512 y) { return _mm512_max_ps(x, y); });
}

// The online softmax over one block of 64 scores a row (s, masked here), P to
// bfloat16 in pa, o rescaled where a row's max grew. The running max m[r]
// (in score units) is kept in every lane, and the running sum l[r] as 16
// partial sums (added up once, at the end). P = 2^(x c - m c), c = scale *
// log2(e): one fused multiply-subtract a vector scales, shifts and changes
// base. `masked`: some key of the block is off some row's causal/window range.
inline void amx_softmax(float* s, uint16_t* pa, __m512* m, __m512* l, float* o,
                        const int32_t* q_pos, int64_t k0, int32_t win, float scale, bool masked,
                        int64_t D) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 neg = _mm512_set1_ps(kPrefillNegInf);
  const __m512 c = _mm512_set1_ps(scale * 1.44269504088896341f);
  __m512 top[16];
  __mmask16 k[16][4];
  for (int r = 0; r < 16; ++r) {
    float* sr = s + r * kAmxKeys;
    if (masked) {  // off-range scores to -1e30, in place, and which they were
      const __m512i qp = _mm512_set1_epi32(q_pos[r]);
      const __m512i w = _mm512_set1_epi32(win), zero = _mm512_setzero_si512();
      for (int v = 0; v < 4; ++v) {
        const __m512i kp = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(k0 + 16 * v)), lane);
        const __m512i d = _mm512_sub_epi32(qp, kp);
        k[r][v] = _mm512_cmpge_epi32_mask(d, zero) & _mm512_cmplt_epi32_mask(d, w);
        _mm512_store_ps(sr + 16 * v, _mm512_mask_blend_ps(k[r][v], neg, _mm512_load_ps(sr + 16 * v)));
      }
    }
    top[r] = _mm512_max_ps(_mm512_max_ps(_mm512_load_ps(sr), _mm512_load_ps(sr + 16)),
                           _mm512_max_ps(_mm512_load_ps(sr + 32), _mm512_load_ps(sr + 48)));
  }
  const __m512 block_max = amx_row_max(top);
  for (int r = 0; r < 16; ++r) {
    const float* sr = s + r * kAmxKeys;
    const __m512 mx = _mm512_max_ps(m[r], _mm512_permutexvar_ps(_mm512_set1_epi32(r), block_max));
    const __m512 mc = _mm512_mul_ps(mx, c);
    __m512 p[4];
    for (int v = 0; v < 4; ++v) {
      p[v] = amx_exp2_16(_mm512_fmsub_ps(_mm512_load_ps(sr + 16 * v), c, mc));
      if (masked) p[v] = _mm512_maskz_mov_ps(k[r][v], p[v]);  // a row with no key yet: not 1
    }
    _mm512_storeu_si512(pa + r * kAmxKeys, (__m512i)_mm512_cvtne2ps_pbh(p[1], p[0]));
    _mm512_storeu_si512(pa + r * kAmxKeys + 32, (__m512i)_mm512_cvtne2ps_pbh(p[3], p[2]));
    if (_mm512_cmp_ps_mask(mx, m[r], _CMP_GT_OQ)) {  // the max grew: rescale
      const __m512 alpha = amx_exp2_16(_mm512_fmsub_ps(m[r], c, mc));
      l[r] = _mm512_mul_ps(l[r], alpha);
      float* orow = o + r * D;
      for (int64_t d = 0; d < D; d += 16)
        _mm512_storeu_ps(orow + d, _mm512_mul_ps(_mm512_loadu_ps(orow + d), alpha));
    }
    l[r] = _mm512_add_ps(l[r], _mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3])));
    m[r] = mx;
  }
}

// Whether it ran (false: the OS refused the tile state, its scratch could not be
// allocated, or a shape it does not take: head size not a multiple of 32, more
// than 16 query heads a kv head).
__attribute__((target("amx-tile,amx-bf16"))) bool paged_prefill_attention_amx_bf16(
    uint16_t* out, const uint16_t* query, const uint16_t* key_cache, const uint16_t* value_cache,
    const int32_t* block_tables, const int32_t* query_start_loc, const int32_t* seq_lens,
    int64_t seqs, int64_t heads, int64_t kv_heads, int64_t D, int64_t block_size,
    int64_t max_blocks, float scale, int64_t window) {
  const int64_t group = heads / kv_heads;
  if (D % 32 != 0 || D > 256 || group > 16 || !amx_permitted()) return false;
  const int64_t tile_tokens = 16 / group;
  const int64_t head_stride = block_size * D, block_stride = kv_heads * head_stride;
  // per sequence: keys packed (a multiple of kAmxKeys), offset of its kv heads' packs
  Allocs mem;
  int64_t* packed_at = mem.get<int64_t>(seqs + 1);
  if (packed_at == nullptr) return false;
  int64_t n_items = 0;
  packed_at[0] = 0;
  for (int64_t b = 0; b < seqs; ++b) {
    const int64_t n = (seq_lens[b] + kAmxKeys - 1) / kAmxKeys * kAmxKeys;
    packed_at[b + 1] = packed_at[b] + n * kv_heads * D;  // elements, per K and per V
    const int64_t q_len = query_start_loc[b + 1] - query_start_loc[b];
    n_items += kv_heads * ((q_len + tile_tokens - 1) / tile_tokens);
  }
  if (n_items == 0) return true;
  uint16_t* kt = mem.get<uint16_t>(packed_at[seqs]);
  uint16_t* vt = mem.get<uint16_t>(packed_at[seqs]);
  PrefillItem* items = mem.get<PrefillItem>(n_items);
  if (mem.failed()) return false;  // the caller runs the vector kernel, which reports it
  int64_t ni = 0;
  // A kv head's tiles one after another, so that its packed keys and values
  // (D x len x 4 bytes) stay in the threads' L2 caches; the latest (longest) first.
  for (int64_t b = 0; b < seqs; ++b) {
    const int64_t q0 = query_start_loc[b], q1 = query_start_loc[b + 1];
    for (int64_t kh = 0; kh < kv_heads; ++kh)
      for (int64_t t = (q1 - q0 + tile_tokens - 1) / tile_tokens - 1; t >= 0; --t) {
        const int64_t t0 = q0 + t * tile_tokens, t1 = t0 + tile_tokens < q1 ? t0 + tile_tokens : q1;
        items[ni++] = {static_cast<int32_t>(b), static_cast<int32_t>(kh),
                       static_cast<int32_t>(t0), static_cast<int32_t>(t1)};
      }
  }
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < seqs * kv_heads; ++w) {
      const int64_t b = w / kv_heads, kh = w % kv_heads;
      const int64_t n = (packed_at[b + 1] - packed_at[b]) / (kv_heads * D);
      const int64_t at = packed_at[b] + kh * n * D;
      amx_pack_kv(reinterpret_cast<uint32_t*>(kt + at), vt + at, key_cache, value_cache,
                  block_tables + b * max_blocks, seq_lens[b], n, D, block_size, block_stride,
                  kh * head_stride);
    }
    alignas(64) uint16_t qa[16 * 256];
    alignas(64) uint16_t pa[16 * kAmxKeys];
    alignas(64) float s[16 * kAmxKeys];
    alignas(64) float tmp[16 * 32];
    __m512 m[16], l[16];
    int32_t q_pos[16];
    alignas(64) float o[16 * 256];  // 16 rows of D <= 256
    amx_attention_configure();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const PrefillItem item = items[it];
      const int64_t b = item.seq, kh = item.kv_head, len = seq_lens[b];
      const int64_t q_len = query_start_loc[b + 1] - query_start_loc[b];
      const int64_t first_pos = len - q_len + (item.t_begin - query_start_loc[b]);
      const int64_t tokens = item.t_end - item.t_begin, rows = tokens * group;
      const int64_t n = (packed_at[b + 1] - packed_at[b]) / (kv_heads * D);
      const uint32_t* kseq = reinterpret_cast<const uint32_t*>(kt + packed_at[b] + kh * n * D);
      const uint16_t* vseq = vt + packed_at[b] + kh * n * D;
      for (int64_t r = 0; r < 16; ++r) {
        uint16_t* dst = qa + r * D;
        if (r < rows) {
          const uint16_t* src =
              query + ((item.t_begin + r / group) * heads + kh * group + r % group) * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = src[d];
          q_pos[r] = static_cast<int32_t>(first_pos + r / group);
        } else {
          for (int64_t d = 0; d < D; ++d) dst[d] = 0;
          q_pos[r] = -1;
        }
        m[r] = _mm512_set1_ps(kPrefillNegInf);
        l[r] = _mm512_setzero_ps();
      }
      for (int64_t e = 0; e < 16 * D; ++e) o[e] = 0.f;
      const int64_t last = first_pos + tokens - 1;
      int64_t first = 0;
      if (window > 0 && first_pos - window + 1 > 0) first = first_pos - window + 1;
      const int32_t win = window > 0 ? static_cast<int32_t>(window) : 0x7fffffff;
      for (int64_t k0 = first / kAmxKeys * kAmxKeys; k0 <= last; k0 += kAmxKeys) {
        amx_scores(s, qa, kseq + (k0 / 16) * (D / 32) * 256, D);
        // every row sees every key of the block: all keys at or before the
        // tile's first query and, with a window, after its last query's start.
        // Padding rows (a GQA group of 3: 15 rows) may then see them too: their
        // rows of o are never written out, and their zero queries give finite
        // scores.
        const bool masked = k0 + kAmxKeys - 1 > first_pos || (window > 0 && k0 <= last - window);
        amx_softmax(s, pa, m, l, o, q_pos, k0, win, scale, masked, D);
        amx_pv(o, pa, vseq + (k0 / 32) * (D / 16) * 512, D, tmp);
      }
      for (int64_t r = 0; r < rows; ++r) {
        uint16_t* dst = out + ((item.t_begin + r / group) * heads + kh * group + r % group) * D;
        const float sum = _mm512_reduce_add_ps(l[r]);
        const float inv = sum > 0.f ? 1.0f / sum : 0.f;
        const float* orow = o + r * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) dst[d] = float_to_bf16(orow[d] * inv);
      }
    }
    _tile_release();
  }
  return true;
}
#endif

}  // namespace
}  // namespace engine::cpu
