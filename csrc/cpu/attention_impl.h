// Decode attention over the paged KV cache, one query token per sequence
// (paged_attention), and the cache-row addressing prefill_attention_impl.h
// shares. Written once for x86 and NEON (cpu_types.h); the generic table
// takes the portable loops.
#pragma once

#include <stdint.h>
#include <stdlib.h>

#include "cpu_types.h"
#include "scalar.h"

namespace engine::cpu {
namespace {


// Work item: one (sequence, kv head) pair, covering the `group` query heads
// that share that kv head, so each key/value row is read once per group.
// Token t's row of one kv head (at head_off within a block) in a paged cache.
template <typename T>
inline const T* cache_row(const T* cache, const int32_t* table, int64_t t, int64_t block_size,
                          int64_t block_stride, int64_t head_off, int64_t head_size) {
  return cache + table[t / block_size] * block_stride + head_off + (t % block_size) * head_size;
}

#ifdef ENGINE_VEC_WIDTH
// Rows a few tokens ahead are fetched while this one is computed: a sequence's
// keys (and values) are scattered over blocks, and one row is only a few lines.
constexpr int64_t kAttnAhead = 4;
template <typename T>
inline void prefetch_row(const T* cache, const int32_t* table, int64_t t, int64_t len,
                         int64_t block_size, int64_t block_stride, int64_t head_off,
                         int64_t head_size) {
  if (t >= len) return;
  const char* row = reinterpret_cast<const char*>(
      cache_row(cache, table, t, block_size, block_stride, head_off, head_size));
  for (int64_t b = 0; b < head_size * static_cast<int64_t>(sizeof(T)); b += 64) vprefetch(row + b);
}
// Token t's row, and the row kAttnAhead tokens on fetched toward L1.
template <typename T>
inline const T* row_fetching_ahead(const T* cache, const int32_t* table, int64_t t, int64_t len,
                                   int64_t block_size, int64_t block_stride, int64_t head_off,
                                   int64_t head_size) {
  prefetch_row(cache, table, t + kAttnAhead, len, block_size, block_stride, head_off, head_size);
  return cache_row(cache, table, t, block_size, block_stride, head_off, head_size);
}
#endif

// Token t's row as floats (the portable loops).
template <typename T>
inline void load_row(float* row, const T* cache, const int32_t* table, int64_t t,
                     int64_t block_size, int64_t block_stride, int64_t head_off,
                     int64_t head_size) {
  const T* r = cache_row(cache, table, t, block_size, block_stride, head_off, head_size);
#pragma omp simd
  for (int64_t i = 0; i < head_size; ++i) row[i] = Elem<T>::load(r[i]);
}

template <typename T>
int64_t paged_attention_t(T* out, const T* query, const T* key_cache,
                       const T* value_cache, const int32_t* block_tables,
                       const int32_t* seq_lens, int64_t seqs, int64_t heads,
                       int64_t kv_heads, int64_t head_size, int64_t block_size,
                       int64_t max_blocks, float scale) {
  const int64_t group = heads / kv_heads;
  const int64_t items = seqs * kv_heads;
  const int64_t head_stride = block_size * head_size;  // within a block
  const int64_t block_stride = kv_heads * head_stride;
#ifdef ENGINE_VEC_WIDTH
  const bool vec_heads = head_size % (2 * W) == 0;
#endif

  // Per-thread scratch, sized for the longest sequence of the batch.
  int64_t max_len = 1;
  for (int64_t s = 0; s < seqs; ++s) max_len = seq_lens[s] > max_len ? seq_lens[s] : max_len;
  const int64_t scratch = sizeof(float) * (group * max_len + 2 * group * head_size + head_size);
  int64_t failed = 0;

#pragma omp parallel
  {
    float* logits = static_cast<float*>(malloc(sizeof(float) * group * max_len));
    float* q = static_cast<float*>(malloc(sizeof(float) * group * head_size));
    float* acc = static_cast<float*>(malloc(sizeof(float) * group * head_size));
    float* row = static_cast<float*>(malloc(sizeof(float) * head_size));
    // an exception cannot leave a parallel region: note it, skip the work, report after
    const bool ok = logits && q && acc && row;
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
        for (int64_t i = 0; i < group * head_size; ++i) out_s[i] = Elem<T>::store(0.f);
        continue;
      }
      const T* q_s = query + (s * heads + kh * group) * head_size;
      for (int64_t i = 0; i < group * head_size; ++i) q[i] = Elem<T>::load(q_s[i]) * scale;

      // logits[g, t] = q_g . k_t
#ifdef ENGINE_VEC_WIDTH
      // fn(t, row t of cache): this kv head's rows in place, the next fetched ahead
      auto each_row = [&](const T* cache, auto fn) {
        for (int64_t t = 0; t < len; ++t)
          fn(t, row_fetching_ahead(cache, table, t, len, block_size, block_stride,
                                   kh * head_stride, head_size));
      };
      if (vec_heads) {
        each_row(key_cache, [&](int64_t t, const T* k) {
          for (int64_t g = 0; g < group; ++g) {
            const float* qg = q + g * head_size;
            VecF a0 = vset1(0.f), a1 = vset1(0.f);
            for (int64_t i = 0; i < head_size; i += 2 * W) {
              a0 = vfma(vload(k + i), vload(qg + i), a0);
              a1 = vfma(vload(k + i + W), vload(qg + i + W), a1);
            }
            logits[g * len + t] = vsum(vadd(a0, a1));
          }
        });
      } else
#endif
      for (int64_t t = 0; t < len; ++t) {
        load_row(row, key_cache, table, t, block_size, block_stride, kh * head_stride, head_size);
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = q + g * head_size;
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < head_size; ++i) dot += qg[i] * row[i];
          logits[g * len + t] = dot;
        }
      }

      // softmax over t, per query head
      for (int64_t g = 0; g < group; ++g) {
        float* lg = logits + g * len;
        float mx = lg[0];
#pragma omp simd reduction(max : mx)
        for (int64_t t = 0; t < len; ++t) mx = lg[t] > mx ? lg[t] : mx;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; ++t) {
          float e = fast_exp(lg[t] - mx);
          lg[t] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t t = 0; t < len; ++t) lg[t] *= inv;
      }

      // acc[g] = sum_t p[g, t] * v_t
      for (int64_t i = 0; i < group * head_size; ++i) acc[i] = 0.f;
#ifdef ENGINE_VEC_WIDTH
      if (vec_heads) {
        each_row(value_cache, [&](int64_t t, const T* v) {
          for (int64_t g = 0; g < group; ++g) {
            const VecF p = vset1(logits[g * len + t]);
            float* ag = acc + g * head_size;
            for (int64_t i = 0; i < head_size; i += W) vstore(ag + i, vfma(p, vload(v + i), vload(ag + i)));
          }
        });
      } else
#endif
      for (int64_t t = 0; t < len; ++t) {
        load_row(row, value_cache, table, t, block_size, block_stride, kh * head_stride, head_size);
        for (int64_t g = 0; g < group; ++g) {
          const float p = logits[g * len + t];
          float* ag = acc + g * head_size;
#pragma omp simd
          for (int64_t i = 0; i < head_size; ++i) ag[i] += p * row[i];
        }
      }
      for (int64_t i = 0; i < group * head_size; ++i) out_s[i] = Elem<T>::store(acc[i]);
    }
    free(logits);
    free(q);
    free(acc);
    free(row);
  }
  return failed;
}

}  // namespace
}  // namespace engine::cpu
