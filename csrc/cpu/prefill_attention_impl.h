// Prefill attention over the paged KV cache: a flash kernel (query tiles x key
// tiles, online softmax), so no score matrix of the whole sequence and no mask
// tensor exist. Written against cpu_types_x86.h's vectors (portable loops on
// the generic path); compiled per ISA.
//
// One work item is (sequence, kv head, query tile): the tile holds every query
// head of the kv head's group for up to kPrefillRows / group tokens, so each
// key and value row gathered from the cache serves the whole group (GQA
// without copying K/V per query head).
#pragma once

#include <stdint.h>

#include "attention_impl.h"
#include "cpu_types.h"
#include "scalar.h"
#include "scratch.h"

namespace engine::cpu {
namespace {

// Keys per tile.
constexpr int64_t kPrefillKeys = 24;
// Query rows (tokens x heads of the group) per tile, padded to whole vectors.
constexpr int64_t kPrefillRows = 64;
// A score no real one reaches: masked keys and the running max's start. Finite,
// so that max - max is 0, never NaN.
constexpr float kPrefillNegInf = -1e30f;

struct PrefillItem {
  int32_t seq, kv_head, t_begin, t_end;  // query rows [t_begin, t_end) of `seq`
};

// The query tile is kept transposed, qt[d, r] (R rows, a multiple of the
// vector width), and the scores as s[j, r]: each score step broadcasts one
// key element and multiplies whole vectors of rows, and the softmax runs
// element-wise along r, so no horizontal sum or transpose of keys is needed.
#ifdef ENGINE_VEC_WIDTH
// s[j, r0:r0+RV*W] for KB keys: KB x RV accumulators.
template <int KB, int RV>
inline void prefill_scores_block(float* s, const float* const* k, const float* qt, int64_t R,
                                 int64_t D, int64_t r0) {
  VecF a[KB][RV];
  for (int j = 0; j < KB; ++j)
    for (int v = 0; v < RV; ++v) a[j][v] = vset1(0.f);
  for (int64_t d = 0; d < D; ++d) {
    VecF q[RV];
    for (int v = 0; v < RV; ++v) q[v] = vload(qt + d * R + r0 + v * W);
    for (int j = 0; j < KB; ++j) {
      const VecF kb = vset1(k[j][d]);
      for (int v = 0; v < RV; ++v) a[j][v] = vfma(kb, q[v], a[j][v]);
    }
  }
  for (int j = 0; j < KB; ++j)
    for (int v = 0; v < RV; ++v) vstore(s + j * R + r0 + v * W, a[j][v]);
}

// Register blocks: KB keys x RV vectors of rows for the scores, ROWS rows x U
// vectors of columns for p V; 24 accumulators with AVX-512's 32 registers, 12
// with AVX2's 16, so each broadcast or load feeds 4-6 FMAs.
#if ENGINE_VEC_WIDTH >= 16
constexpr int kScoreKeys = 6, kScoreVecs = 4, kPvRows = 6;
#else
constexpr int kScoreKeys = 6, kScoreVecs = 2, kPvRows = 3;
#endif

template <int KB>
inline void prefill_scores_keys(float* s, const float* const* k, const float* qt, int64_t R,
                                int64_t D) {
  int64_t r0 = 0;
  for (; r0 + kScoreVecs * W <= R; r0 += kScoreVecs * W)
    prefill_scores_block<KB, kScoreVecs>(s, k, qt, R, D, r0);
  for (; r0 < R; r0 += W) prefill_scores_block<KB, 1>(s, k, qt, R, D, r0);
}

inline void prefill_scores(float* s, const float* const* k, const float* qt, int64_t R,
                           int64_t nk, int64_t D) {
  int64_t j = 0;
  for (; j + kScoreKeys <= nk; j += kScoreKeys)
    prefill_scores_keys<kScoreKeys>(s + j * R, k + j, qt, R, D);
  for (; j + 2 <= nk; j += 2) prefill_scores_keys<2>(s + j * R, k + j, qt, R, D);
  for (; j < nk; ++j) prefill_scores_keys<1>(s + j * R, k + j, qt, R, D);
}

// o[r, c:c+U*W] = o[r, c:c+U*W] * alpha[r] + sum_j p[j, r] v[j, c:c+U*W] for ROWS rows.
template <int ROWS, int U>
inline void prefill_pv_chunk(float* o, const float* p, const float* alpha,
                             const float* const* v, int64_t nk, int64_t R, int64_t D,
                             int64_t r0, int64_t c) {
  VecF acc[ROWS][U];
  for (int i = 0; i < ROWS; ++i) {
    const VecF al = vset1(alpha[r0 + i]);
    for (int u = 0; u < U; ++u) acc[i][u] = vmul(vload(o + (r0 + i) * D + c + u * W), al);
  }
  for (int64_t j = 0; j < nk; ++j) {
    VecF vv[U];
    for (int u = 0; u < U; ++u) vv[u] = vload(v[j] + c + u * W);
    for (int i = 0; i < ROWS; ++i) {
      const VecF pb = vset1(p[j * R + r0 + i]);
      for (int u = 0; u < U; ++u) acc[i][u] = vfma(pb, vv[u], acc[i][u]);
    }
  }
  for (int i = 0; i < ROWS; ++i)
    for (int u = 0; u < U; ++u) vstore(o + (r0 + i) * D + c + u * W, acc[i][u]);
}

template <int ROWS>
inline void prefill_pv_rows(float* o, const float* p, const float* alpha, const float* const* v,
                            int64_t nk, int64_t R, int64_t D, int64_t r0) {
  int64_t c = 0;
  for (; c + 4 * W <= D; c += 4 * W) prefill_pv_chunk<ROWS, 4>(o, p, alpha, v, nk, R, D, r0, c);
  for (; c + W <= D; c += W) prefill_pv_chunk<ROWS, 1>(o, p, alpha, v, nk, R, D, r0, c);
  for (; c < D; ++c)  // a head size that is no multiple of the vector width
    for (int i = 0; i < ROWS; ++i) {
      const int64_t r = r0 + i;
      float acc = o[r * D + c] * alpha[r];
      for (int64_t j = 0; j < nk; ++j) acc += p[j * R + r] * v[j][c];
      o[r * D + c] = acc;
    }
}

inline void prefill_pv(float* o, const float* p, const float* alpha, const float* const* v,
                       int64_t rows, int64_t nk, int64_t R, int64_t D) {
  int64_t r = 0;
  for (; r + kPvRows <= rows; r += kPvRows) prefill_pv_rows<kPvRows>(o, p, alpha, v, nk, R, D, r);
  for (; r + 2 <= rows; r += 2) prefill_pv_rows<2>(o, p, alpha, v, nk, R, D, r);
  for (; r < rows; ++r) prefill_pv_rows<1>(o, p, alpha, v, nk, R, D, r);
}
#else
inline void prefill_scores(float* s, const float* const* k, const float* qt, int64_t R,
                           int64_t nk, int64_t D) {
  for (int64_t j = 0; j < nk; ++j) {
    float* sj = s + j * R;
    for (int64_t r = 0; r < R; ++r) sj[r] = 0.f;
    for (int64_t d = 0; d < D; ++d) {
      const float kd = k[j][d];
#pragma omp simd
      for (int64_t r = 0; r < R; ++r) sj[r] += kd * qt[d * R + r];
    }
  }
}

inline void prefill_pv(float* o, const float* p, const float* alpha, const float* const* v,
                       int64_t rows, int64_t nk, int64_t R, int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    float* orow = o + r * D;
    const float al = alpha[r];
#pragma omp simd
    for (int64_t c = 0; c < D; ++c) orow[c] *= al;
    for (int64_t j = 0; j < nk; ++j) {
      const float pj = p[j * R + r];
      const float* vj = v[j];
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) orow[c] += pj * vj[c];
    }
  }
}
#endif

// Masks and the online softmax, element-wise along the rows: turns s[j, r]
// into p (in place), sets alpha[r] (the factor that rescales row r's
// accumulator) and updates the running max m[r] and sum l[r]. Row r's query
// sits at q_pos[r] (-1: a padding row, which sees nothing); key j at k_pos + j.
inline void prefill_softmax_step(float* s, float* m, float* l, float* alpha, float* mx,
                                 const int32_t* q_pos, int64_t R, int64_t nk, int64_t k_pos,
                                 int64_t window) {
  // window <= 0: no window; a bound no position difference reaches.
  const int32_t win = window > 0 ? static_cast<int32_t>(window) : 0x7fffffff;
#pragma omp simd
  for (int64_t r = 0; r < R; ++r) mx[r] = m[r];
  for (int64_t j = 0; j < nk; ++j) {
    const int32_t kp = static_cast<int32_t>(k_pos + j);
    float* sj = s + j * R;
#pragma omp simd
    for (int64_t r = 0; r < R; ++r) {
      const int32_t diff = q_pos[r] - kp;  // causal: diff >= 0; window: diff < win
      const float v = (diff >= 0 && diff < win) ? sj[r] : kPrefillNegInf;
      mx[r] = v > mx[r] ? v : mx[r];
    }
  }
#pragma omp simd
  for (int64_t r = 0; r < R; ++r) {
    alpha[r] = fast_exp(m[r] - mx[r]);
    l[r] *= alpha[r];
    m[r] = mx[r];
  }
  for (int64_t j = 0; j < nk; ++j) {
    const int32_t kp = static_cast<int32_t>(k_pos + j);
    float* sj = s + j * R;
#pragma omp simd
    for (int64_t r = 0; r < R; ++r) {
      const int32_t diff = q_pos[r] - kp;
      const float e = fast_exp(sj[r] - m[r]);
      const float p = (diff >= 0 && diff < win) ? e : 0.f;
      sj[r] = p;
      l[r] += p;
    }
  }
}

template <typename T>
int64_t paged_prefill_attention_t(T* out, const T* query, const T* key_cache, const T* value_cache,
                               const int32_t* block_tables, const int32_t* query_start_loc,
                               const int32_t* seq_lens, int64_t seqs, int64_t heads,
                               int64_t kv_heads, int64_t D, int64_t block_size,
                               int64_t max_blocks, float scale, int64_t window) {
#ifdef ENGINE_VEC_WIDTH
  constexpr int64_t kPad = W;
#else
  constexpr int64_t kPad = 1;
#endif
  const int64_t group = heads / kv_heads;
  const int64_t tile_tokens = kPrefillRows / group > 0 ? kPrefillRows / group : 1;
  const int64_t max_rows = tile_tokens * group;
  const int64_t max_R = (max_rows + kPad - 1) / kPad * kPad;
  const int64_t head_stride = block_size * D;
  const int64_t block_stride = kv_heads * head_stride;

  // The work list, the longest tiles (latest queries) of each sequence first so
  // that the dynamic schedule ends with short items.
  int64_t n_items = 0;
  for (int64_t b = 0; b < seqs; ++b) {
    const int64_t q_len = query_start_loc[b + 1] - query_start_loc[b];
    n_items += kv_heads * ((q_len + tile_tokens - 1) / tile_tokens);
  }
  if (n_items == 0) return 0;
  Allocs mem;
  PrefillItem* items = mem.get<PrefillItem>(n_items);
  if (items == nullptr) return mem.failed();
  int64_t n = 0;
  for (int64_t b = 0; b < seqs; ++b) {
    const int64_t q0 = query_start_loc[b], q1 = query_start_loc[b + 1];
    const int64_t tiles = (q1 - q0 + tile_tokens - 1) / tile_tokens;
    for (int64_t t = tiles - 1; t >= 0; --t)
      for (int64_t kh = 0; kh < kv_heads; ++kh) {
        const int64_t t0 = q0 + t * tile_tokens;
        const int64_t t1 = t0 + tile_tokens < q1 ? t0 + tile_tokens : q1;
        items[n++] = {static_cast<int32_t>(b), static_cast<int32_t>(kh),
                      static_cast<int32_t>(t0), static_cast<int32_t>(t1)};
      }
  }

  int64_t failed = 0;
#pragma omp parallel if (n_items > 1)
  {
    Allocs tmem;
    float* qt = tmem.get<float>(D * max_R);
    float* o = tmem.get<float>(max_R * D);
    float* s = tmem.get<float>(kPrefillKeys * max_R);
    float* m = tmem.get<float>(max_R * 4);
    float* l = m + max_R;
    float* alpha = l + max_R;
    float* mx = alpha + max_R;
    int32_t* q_pos = tmem.get<int32_t>(max_R);
    // bfloat16 keys/values are widened here; float32 ones are read in place.
    float* kv_buf = IsBf16<T>::value ? tmem.get<float>(2 * kPrefillKeys * D) : nullptr;
    if (tmem.failed()) note_failed(failed, tmem.failed());
    const float* krow[kPrefillKeys];
    const float* vrow[kPrefillKeys];

#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      if (tmem.failed()) continue;
      const PrefillItem item = items[it];
      const int64_t b = item.seq, kh = item.kv_head;
      const int64_t len = seq_lens[b];
      const int64_t q_len = query_start_loc[b + 1] - query_start_loc[b];
      // Query row t of the sequence sits at absolute position len - q_len + (t - q0).
      const int64_t first_pos = len - q_len + (item.t_begin - query_start_loc[b]);
      const int64_t tokens = item.t_end - item.t_begin;
      const int64_t rows = tokens * group;
      const int64_t R = (rows + kPad - 1) / kPad * kPad;
      const int32_t* table = block_tables + b * max_blocks;
      const int64_t head_off = kh * head_stride;

      // Row r = i * group + g: token i of the tile, query head kh * group + g,
      // contiguous in query's [T, heads, D] layout; stored transposed.
      for (int64_t r = 0; r < R; ++r) {
        if (r < rows) {
          const T* src = query + ((item.t_begin + r / group) * heads + kh * group + r % group) * D;
          for (int64_t d = 0; d < D; ++d) qt[d * R + r] = Elem<T>::load(src[d]) * scale;
          q_pos[r] = static_cast<int32_t>(first_pos + r / group);
        } else {
          for (int64_t d = 0; d < D; ++d) qt[d * R + r] = 0.f;
          q_pos[r] = -1;
        }
        m[r] = kPrefillNegInf;
        l[r] = 0.f;
      }
      for (int64_t e = 0; e < rows * D; ++e) o[e] = 0.f;

      const int64_t last = first_pos + tokens - 1;  // the tile's last query position
      int64_t first = 0;
      if (window > 0 && first_pos - window + 1 > 0) first = first_pos - window + 1;
      for (int64_t k0 = first; k0 <= last; k0 += kPrefillKeys) {
        const int64_t nk = last + 1 - k0 < kPrefillKeys ? last + 1 - k0 : kPrefillKeys;
        for (int64_t j = 0; j < nk; ++j) {
          const T* kr = cache_row(key_cache, table, k0 + j, block_size, block_stride, head_off, D);
          const T* vr = cache_row(value_cache, table, k0 + j, block_size, block_stride, head_off, D);
          if constexpr (IsBf16<T>::value) {
            float* kd = kv_buf + j * D;
            float* vd = kv_buf + (kPrefillKeys + j) * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) {
              kd[d] = Elem<T>::load(kr[d]);
              vd[d] = Elem<T>::load(vr[d]);
            }
            krow[j] = kd;
            vrow[j] = vd;
          } else {
            krow[j] = reinterpret_cast<const float*>(kr);
            vrow[j] = reinterpret_cast<const float*>(vr);
          }
        }
        prefill_scores(s, krow, qt, R, nk, D);
        prefill_softmax_step(s, m, l, alpha, mx, q_pos, R, nk, k0, window);
        prefill_pv(o, s, alpha, vrow, rows, nk, R, D);
      }

      for (int64_t r = 0; r < rows; ++r) {
        T* dst = out + ((item.t_begin + r / group) * heads + kh * group + r % group) * D;
        const float inv = l[r] > 0.f ? 1.0f / l[r] : 0.f;
        const float* orow = o + r * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) dst[d] = Elem<T>::store(orow[d] * inv);
      }
    }
  }
  return failed;
}

}  // namespace
}  // namespace engine::cpu
