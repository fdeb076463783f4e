// Decode attention over the paged KV cache, one query token per sequence
// (paged_attention), and the cache-row addressing prefill_attention_impl.h
// shares. Written once for x86 and NEON (cpu_types.h); the generic table
// takes the portable loops.
#pragma once

#include <omp.h>
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
// Rows ahead are fetched while this one is computed: a sequence's keys (and
// values) are scattered over blocks, and one row is only a few lines. A block
// ahead (16 rows, at most the block size: row i fetches row i of the next
// block): 16 sequences x 64 tokens, 3 kv heads, head 64, bfloat16, the caches
// of 30 layers, 2 threads, Zen 4, in turns in one process: 4 rows ahead 60-64
// us a call, 8 56-58, 16 54-56, 32 (past the next block) 70-73; at 160 tokens
// 4 rows 151-153 us, 16 133-136.
constexpr int64_t kAttnAhead = 16;
template <typename T>
inline void prefetch_lines(const T* row, int64_t head_size) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < head_size * static_cast<int64_t>(sizeof(T)); b += 64) vprefetch(p + b);
}
// fn(t, row t) for t < len, one kv head's rows in place, walking the blocks:
// a row's address is a step from the last (a division and a table read per
// row, twice with the fetch ahead, cost as much as a row's products at
// SmolLM's head size 64). The row kAttnAhead on is fetched, in the next block
// when it is there.
template <typename T, typename F>
inline void for_each_row(const T* cache, const int32_t* table, int64_t len, int64_t block_size,
                         int64_t block_stride, int64_t head_off, int64_t head_size, F&& fn) {
  const T* base = cache + table[0] * block_stride + head_off;
  const int64_t ahead = kAttnAhead < block_size ? kAttnAhead : block_size;
  for (int64_t b0 = 0, blk = 0; b0 < len; b0 += block_size, ++blk) {
    const int64_t n = len - b0 < block_size ? len - b0 : block_size;
    const T* next = b0 + block_size < len ? cache + table[blk + 1] * block_stride + head_off : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t a = i + ahead;
      if (a < n)
        prefetch_lines(base + a * head_size, head_size);
      else if (next != nullptr && a - block_size < len - b0 - block_size)
        prefetch_lines(next + (a - block_size) * head_size, head_size);
      fn(b0 + i, base + i * head_size);
    }
    base = next;
  }
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

#ifdef ENGINE_VEC_WIDTH
// acc[g] = sum_t p[g * ps + t] v_t for G query heads of HV vectors each, the
// sums in registers (through memory, a load and a store per vector per token
// bounded the value pass).
template <int G, int HV, typename T>
void weighted_values(float* acc, const float* p, int64_t ps, const T* cache, const int32_t* table,
                     int64_t len, int64_t block_size, int64_t block_stride, int64_t head_off) {
  VecF a[G][HV];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < HV; ++c) a[g][c] = vset1(0.f);
  for_each_row(cache, table, len, block_size, block_stride, head_off, HV * W,
               [&](int64_t t, const T* v) {
    VecF r[HV];
    for (int c = 0; c < HV; ++c) r[c] = vload(v + c * W);
    for (int g = 0; g < G; ++g) {
      const VecF pg = vset1(p[g * ps + t]);
      for (int c = 0; c < HV; ++c) a[g][c] = vfma(pg, r[c], a[g][c]);
    }
  });
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < HV; ++c) vstore(acc + (g * HV + c) * W, a[g][c]);
}

// weighted_values for this group and head size where its sums fit the
// registers (x86 AVX-512 and NEON: 32, AVX2: 16); false elsewhere.
template <typename T>
bool weighted_values_in_registers(int64_t group, int64_t head_size, float* acc, const float* p,
                                  int64_t ps, const T* cache, const int32_t* table, int64_t len,
                                  int64_t block_size, int64_t block_stride, int64_t head_off) {
  constexpr int64_t kMaxSums = W == 8 ? 8 : 16;
  const int64_t hv = head_size / W;
  if (head_size % W || group * hv > kMaxSums) return false;
#define ENGINE_WV(g, h)                                                                          \
  if (group == g && hv == h) {                                                                   \
    weighted_values<g, h>(acc, p, ps, cache, table, len, block_size, block_stride, head_off);    \
    return true;                                                                                 \
  }
  ENGINE_WV(1, 2) ENGINE_WV(2, 2) ENGINE_WV(3, 2) ENGINE_WV(4, 2)
  ENGINE_WV(1, 4) ENGINE_WV(2, 4) ENGINE_WV(3, 4) ENGINE_WV(4, 4)
  ENGINE_WV(1, 8) ENGINE_WV(2, 8)
  ENGINE_WV(1, 16)
#undef ENGINE_WV
  return false;
}

// logits[g * ls + t] = q_g . k_t for G query heads of HV vectors each, with q
// and each key row in registers: the row is widened once for the group (the
// generic pass widened it once a head) and W tokens' products are summed to
// one vector each (vsum_rows). parts: G * W * W floats.
template <int G, int HV, typename T>
void key_logits(float* logits, int64_t ls, const float* q, float* parts, const T* cache,
                const int32_t* table, int64_t len, int64_t block_size, int64_t block_stride,
                int64_t head_off) {
  VecF qr[G][HV];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < HV; ++c) qr[g][c] = vload(q + (g * HV + c) * W);
  for_each_row(cache, table, len, block_size, block_stride, head_off, HV * W,
               [&](int64_t t, const T* k) {
    VecF kr[HV];
    for (int c = 0; c < HV; ++c) kr[c] = vload(k + c * W);
    const int64_t j = t % W;
    for (int g = 0; g < G; ++g) {
      VecF a0 = vmul(kr[0], qr[g][0]), a1 = vmul(kr[1], qr[g][1]);
      for (int c = 2; c < HV; c += 2) {
        a0 = vfma(kr[c], qr[g][c], a0);
        a1 = vfma(kr[c + 1], qr[g][c + 1], a1);
      }
      vstore(parts + (g * W + j) * W, vadd(a0, a1));
    }
    if (j == W - 1 || t == len - 1)  // rows past the last token: a former chunk's, unread
      for (int g = 0; g < G; ++g) vstore(logits + g * ls + t - j, vsum_rows(parts + g * W * W));
  });
}

// key_logits for this group and head size where q, a row and two sums fit
// the registers (x86 AVX-512 and NEON: 32, AVX2: 16); false elsewhere.
template <typename T>
bool key_logits_in_registers(int64_t group, int64_t head_size, float* logits, int64_t ls,
                             const float* q, float* parts, const T* cache, const int32_t* table,
                             int64_t len, int64_t block_size, int64_t block_stride,
                             int64_t head_off) {
  constexpr int64_t kRegs = W == 8 ? 16 : 32;
  const int64_t hv = head_size / W;
  if (head_size % (2 * W) || (group + 1) * hv + 2 > kRegs) return false;
#define ENGINE_KL(g, h)                                                                          \
  if (group == g && hv == h) {                                                                   \
    key_logits<g, h>(logits, ls, q, parts, cache, table, len, block_size, block_stride, head_off); \
    return true;                                                                                 \
  }
  ENGINE_KL(1, 2) ENGINE_KL(2, 2) ENGINE_KL(3, 2) ENGINE_KL(4, 2)
  ENGINE_KL(1, 4) ENGINE_KL(2, 4) ENGINE_KL(3, 4) ENGINE_KL(4, 4) ENGINE_KL(6, 4)
  ENGINE_KL(1, 8) ENGINE_KL(2, 8)
#undef ENGINE_KL
  return false;
}
#endif

template <typename T>
int64_t paged_attention_t(T* out, const T* query, int64_t query_stride, const T* key_cache,
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

  // Per-thread scratch, sized for the longest sequence of the batch; a query
  // head's logits in rows of whole vectors (the key pass stores W at a time).
  int64_t max_len = 1;
  for (int64_t s = 0; s < seqs; ++s) max_len = seq_lens[s] > max_len ? seq_lens[s] : max_len;
#ifdef ENGINE_VEC_WIDTH
  const int64_t max_stride = (max_len + W - 1) / W * W, parts_n = group * W * W;
#else
  const int64_t max_stride = max_len, parts_n = 0;
#endif
  const int64_t scratch =
      sizeof(float) * (group * max_stride + 2 * group * head_size + head_size + parts_n);
  int64_t failed = 0;
  // A sequence's kv heads one after another on one thread, where there are
  // sequences enough to go round: a block holds their rows side by side, and
  // one core reading them in turn streams them (2 KiB a head and block at
  // SmolLM's shape; 786 KB read in random 2 KiB runs took 48 us here, in 8 KiB
  // runs 29). 16 sequences x 64 tokens, 3 kv heads, the caches of 30 layers
  // from memory, Zen 4, in turns in one process: 76 -> 57 us a call.
  const int64_t chunk = seqs >= 4 * omp_get_max_threads() ? kv_heads : 1;

#pragma omp parallel
  {
    float* logits = static_cast<float*>(malloc(sizeof(float) * group * max_stride));
    float* q = static_cast<float*>(malloc(sizeof(float) * group * head_size));
    float* acc = static_cast<float*>(malloc(sizeof(float) * group * head_size));
    float* row = static_cast<float*>(malloc(sizeof(float) * head_size));
    // per query head, W tokens' products summed to one vector each (key pass)
    float* parts = static_cast<float*>(calloc(parts_n ? parts_n : 1, sizeof(float)));
    // an exception cannot leave a parallel region: note it, skip the work, report after
    const bool ok = logits && q && acc && row && parts;
    if (!ok) {
#pragma omp atomic write
      failed = scratch;
    }

#pragma omp for schedule(dynamic, chunk)
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
      const T* q_s = query + s * query_stride + kh * group * head_size;
      int64_t qi = 0;
#ifdef ENGINE_VEC_WIDTH
      for (; qi + W <= group * head_size; qi += W) vstore(q + qi, vmul(vload(q_s + qi), vset1(scale)));
#endif
      for (; qi < group * head_size; ++qi) q[qi] = Elem<T>::load(q_s[qi]) * scale;
#ifdef ENGINE_VEC_WIDTH
      const int64_t ls = (len + W - 1) / W * W;  // a query head's row of logits
#else
      const int64_t ls = len;
#endif

      // logits[g, t] = q_g . k_t
#ifdef ENGINE_VEC_WIDTH
      // fn(t, row t of cache): this kv head's rows in place, the next fetched ahead
      auto each_row = [&](const T* cache, auto fn) {
        for_each_row(cache, table, len, block_size, block_stride, kh * head_stride, head_size, fn);
      };
      if (vec_heads && key_logits_in_registers(group, head_size, logits, ls, q, parts, key_cache,
                                               table, len, block_size, block_stride,
                                               kh * head_stride)) {
      } else if (vec_heads) {  // W tokens at a time: their W vectors a query head summed together
        each_row(key_cache, [&](int64_t t, const T* k) {
          const int64_t j = t % W;
          for (int64_t g = 0; g < group; ++g) {
            const float* qg = q + g * head_size;
            VecF a0 = vset1(0.f), a1 = vset1(0.f);
            for (int64_t i = 0; i < head_size; i += 2 * W) {
              a0 = vfma(vload(k + i), vload(qg + i), a0);
              a1 = vfma(vload(k + i + W), vload(qg + i + W), a1);
            }
            vstore(parts + (g * W + j) * W, vadd(a0, a1));
          }
          if (j == W - 1 || t == len - 1)  // rows past the last token: a former chunk's, unread
            for (int64_t g = 0; g < group; ++g)
              vstore(logits + g * ls + t - j, vsum_rows(parts + g * W * W));
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
          logits[g * ls + t] = dot;
        }
      }

      // softmax over t, per query head
      for (int64_t g = 0; g < group; ++g) {
        float* lg = logits + g * ls;
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
#ifdef ENGINE_VEC_WIDTH
      const bool in_registers =
          vec_heads && weighted_values_in_registers(group, head_size, acc, logits, ls, value_cache,
                                                    table, len, block_size, block_stride,
                                                    kh * head_stride);
#else
      const bool in_registers = false;
#endif
      if (!in_registers) {
        for (int64_t i = 0; i < group * head_size; ++i) acc[i] = 0.f;
#ifdef ENGINE_VEC_WIDTH
        if (vec_heads) {
          each_row(value_cache, [&](int64_t t, const T* v) {
            for (int64_t g = 0; g < group; ++g) {
              const VecF p = vset1(logits[g * ls + t]);
              float* ag = acc + g * head_size;
              for (int64_t i = 0; i < head_size; i += W) vstore(ag + i, vfma(p, vload(v + i), vload(ag + i)));
            }
          });
        } else
#endif
        for (int64_t t = 0; t < len; ++t) {
          load_row(row, value_cache, table, t, block_size, block_stride, kh * head_stride, head_size);
          for (int64_t g = 0; g < group; ++g) {
            const float p = logits[g * ls + t];
            float* ag = acc + g * head_size;
#pragma omp simd
            for (int64_t i = 0; i < head_size; ++i) ag[i] += p * row[i];
          }
        }
      }
      int64_t oi = 0;
#ifdef ENGINE_VEC_WIDTH
      for (; oi + W <= group * head_size; oi += W) vstore(out_s + oi, vload(acc + oi));
#endif
      for (; oi < group * head_size; ++oi) out_s[oi] = Elem<T>::store(acc[oi]);
    }
    free(logits);
    free(q);
    free(acc);
    free(row);
    free(parts);
  }
  return failed;
}

}  // namespace
}  // namespace engine::cpu
