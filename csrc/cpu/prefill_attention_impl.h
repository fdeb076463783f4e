// Prefill attention over the paged KV cache: a flash kernel (query tiles x key
// tiles, online softmax), so no score matrix of the whole sequence and no mask
// tensor exist. Included by kernels_impl.cpp inside its anonymous namespace,
// after the vector helpers (VecF, vfma, ...) and cache_row; compiled per ISA.
//
// One work item is (sequence, kv head, query tile): the tile holds every query
// head of the kv head's group for up to kPrefillRows / group tokens, so each
// key and value row gathered from the cache serves the whole group (GQA
// without copying K/V per query head).
#pragma once

// Keys per tile: one AVX-512 vector (two AVX2 ones) of scores per query row.
constexpr int64_t kPrefillKeys = 16;
// Query rows (tokens x heads of the group) per tile.
constexpr int64_t kPrefillRows = 32;

struct PrefillItem {
  int32_t seq, kv_head, t_begin, t_end;  // query rows [t_begin, t_end) of `seq`
};

#ifdef ENGINE_VEC_WIDTH
// s[r, 0:kPrefillKeys] = q[r, :] . kt[:, 0:kPrefillKeys]; kt is the key tile
// transposed ([head_size, kPrefillKeys]), so each step is one broadcast of q
// and one vector of keys per row, ROWS rows at a time for independent FMAs.
template <int ROWS>
inline void prefill_scores_rows(float* s, const float* q, const float* kt, int64_t D) {
  constexpr int NV = kPrefillKeys / W;
  VecF a[ROWS][NV];
  for (int i = 0; i < ROWS; ++i)
    for (int v = 0; v < NV; ++v) a[i][v] = vset1(0.f);
  for (int64_t d = 0; d < D; ++d) {
    VecF k[NV];
    for (int v = 0; v < NV; ++v) k[v] = vload(kt + d * kPrefillKeys + v * W);
    for (int i = 0; i < ROWS; ++i) {
      const VecF qb = vset1(q[i * D + d]);
      for (int v = 0; v < NV; ++v) a[i][v] = vfma(qb, k[v], a[i][v]);
    }
  }
  for (int i = 0; i < ROWS; ++i)
    for (int v = 0; v < NV; ++v) vstore(s + i * kPrefillKeys + v * W, a[i][v]);
}

inline void prefill_scores(float* s, const float* q, const float* kt, int64_t rows, int64_t D) {
  constexpr int kRows = 8 * W / kPrefillKeys;  // 8 accumulators
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows)
    prefill_scores_rows<kRows>(s + r * kPrefillKeys, q + r * D, kt, D);
  for (; r < rows; ++r) prefill_scores_rows<1>(s + r * kPrefillKeys, q + r * D, kt, D);
}

// o[r, c:c+U*W] = o[r, c:c+U*W] * alpha[r] + sum_j p[r, j] v[j, c:c+U*W], two rows at a time.
template <int R, int U>
inline void prefill_pv_chunk(float* o, const float* p, const float* alpha, const float* v,
                             int64_t nk, int64_t D, int64_t c) {
  VecF acc[R][U];
  for (int i = 0; i < R; ++i) {
    const VecF al = vset1(alpha[i]);
    for (int u = 0; u < U; ++u) acc[i][u] = vmul(vload(o + i * D + c + u * W), al);
  }
  for (int64_t j = 0; j < nk; ++j) {
    VecF vv[U];
    for (int u = 0; u < U; ++u) vv[u] = vload(v + j * D + c + u * W);
    for (int i = 0; i < R; ++i) {
      const VecF pb = vset1(p[i * kPrefillKeys + j]);
      for (int u = 0; u < U; ++u) acc[i][u] = vfma(pb, vv[u], acc[i][u]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int u = 0; u < U; ++u) vstore(o + i * D + c + u * W, acc[i][u]);
}

template <int R>
inline void prefill_pv_rows(float* o, const float* p, const float* alpha, const float* v,
                            int64_t nk, int64_t D) {
  int64_t c = 0;
  for (; c + 4 * W <= D; c += 4 * W) prefill_pv_chunk<R, 4>(o, p, alpha, v, nk, D, c);
  for (; c < D; c += W) prefill_pv_chunk<R, 1>(o, p, alpha, v, nk, D, c);
}

inline void prefill_pv(float* o, const float* p, const float* alpha, const float* v,
                       int64_t rows, int64_t nk, int64_t D) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2)
    prefill_pv_rows<2>(o + r * D, p + r * kPrefillKeys, alpha + r, v, nk, D);
  for (; r < rows; ++r) prefill_pv_rows<1>(o + r * D, p + r * kPrefillKeys, alpha + r, v, nk, D);
}
#endif

// The portable forms (head sizes that are no multiple of the vector width, and
// builds without explicit vectors).
inline void prefill_scores_scalar(float* s, const float* q, const float* kt, int64_t rows,
                                  int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kPrefillKeys;
    for (int64_t j = 0; j < kPrefillKeys; ++j) sr[j] = 0.f;
    for (int64_t d = 0; d < D; ++d) {
      const float qd = q[r * D + d];
#pragma omp simd
      for (int64_t j = 0; j < kPrefillKeys; ++j) sr[j] += qd * kt[d * kPrefillKeys + j];
    }
  }
}

inline void prefill_pv_scalar(float* o, const float* p, const float* alpha, const float* v,
                              int64_t rows, int64_t nk, int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    float* orow = o + r * D;
    const float al = alpha[r];
#pragma omp simd
    for (int64_t c = 0; c < D; ++c) orow[c] *= al;
    for (int64_t j = 0; j < nk; ++j) {
      const float pj = p[r * kPrefillKeys + j];
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) orow[c] += pj * v[j * D + c];
    }
  }
}

// Masks, online softmax: turns s[r, :nk] into p (in place), sets alpha[r] (the
// factor that rescales row r's accumulator) and updates m[r], l[r]. Row r's
// query sits at position q_pos + r / group; the tile's keys at k_pos + j.
inline void prefill_softmax_step(float* s, float* m, float* l, float* alpha, int64_t rows,
                                 int64_t group, int64_t nk, int64_t q_pos, int64_t k_pos,
                                 int64_t window) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kPrefillKeys;
    const int64_t qp = q_pos + r / group;
    // Keys [lo, hi] are visible to this query: causal, and within the window.
    const int64_t hi = qp - k_pos;
    const int64_t lo = window > 0 ? qp - window + 1 - k_pos : 0;
    const int64_t j0 = lo > 0 ? lo : 0, j1 = hi + 1 < nk ? hi + 1 : nk;
    if (j0 >= j1) {  // nothing visible in this tile: the row is left as it was
      alpha[r] = 1.f;
      for (int64_t j = 0; j < nk; ++j) sr[j] = 0.f;
      continue;
    }
    float mx = sr[j0];
    for (int64_t j = j0 + 1; j < j1; ++j) mx = sr[j] > mx ? sr[j] : mx;
    const float m_new = mx > m[r] ? mx : m[r];
    // m[r] starts at -inf: fast_exp clamps, and the accumulator it scales is zero.
    alpha[r] = fast_exp(m[r] - m_new);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < nk; ++j) {
      const float e = (j >= j0 && j < j1) ? fast_exp(sr[j] - m_new) : 0.f;
      sr[j] = e;
      sum += e;
    }
    l[r] = l[r] * alpha[r] + sum;
    m[r] = m_new;
  }
}

template <typename T>
void paged_prefill_attention_t(T* out, const T* query, const T* key_cache, const T* value_cache,
                               const int32_t* block_tables, const int32_t* query_start_loc,
                               const int32_t* seq_lens, int64_t seqs, int64_t heads,
                               int64_t kv_heads, int64_t D, int64_t block_size,
                               int64_t max_blocks, float scale, int64_t window) {
  const int64_t group = heads / kv_heads;
  const int64_t tile_tokens = kPrefillRows / group > 0 ? kPrefillRows / group : 1;
  const int64_t max_rows = tile_tokens * group;
  const int64_t head_stride = block_size * D;
  const int64_t block_stride = kv_heads * head_stride;
#ifdef ENGINE_VEC_WIDTH
  const bool vec = D % W == 0;
#endif

  // The work list, the longest tiles (latest queries) of each sequence first so
  // that the dynamic schedule ends with short items.
  int64_t n_items = 0;
  for (int64_t b = 0; b < seqs; ++b) {
    const int64_t q_len = query_start_loc[b + 1] - query_start_loc[b];
    n_items += kv_heads * ((q_len + tile_tokens - 1) / tile_tokens);
  }
  if (n_items == 0) return;
  PrefillItem* items = static_cast<PrefillItem*>(malloc(sizeof(PrefillItem) * n_items));
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

#pragma omp parallel if (n_items > 1)
  {
    float* q = static_cast<float*>(malloc(sizeof(float) * max_rows * D));
    float* o = static_cast<float*>(malloc(sizeof(float) * max_rows * D));
    float* s = static_cast<float*>(malloc(sizeof(float) * max_rows * kPrefillKeys));
    float* kt = static_cast<float*>(malloc(sizeof(float) * D * kPrefillKeys));
    float* v = static_cast<float*>(malloc(sizeof(float) * kPrefillKeys * D));
    float* m = static_cast<float*>(malloc(sizeof(float) * max_rows * 3));
    float* l = m + max_rows;
    float* alpha = l + max_rows;

#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const PrefillItem item = items[it];
      const int64_t b = item.seq, kh = item.kv_head;
      const int64_t len = seq_lens[b];
      const int64_t q_len = query_start_loc[b + 1] - query_start_loc[b];
      // Query row t of the sequence sits at absolute position len - q_len + (t - q0).
      const int64_t q_pos = len - q_len + (item.t_begin - query_start_loc[b]);
      const int64_t tokens = item.t_end - item.t_begin;
      const int64_t rows = tokens * group;
      const int32_t* table = block_tables + b * max_blocks;
      const int64_t head_off = kh * head_stride;

      // Row r = i * group + g: token i of the tile, query head kh * group + g,
      // contiguous in query's [T, heads, D] layout.
      for (int64_t i = 0; i < tokens; ++i) {
        const T* src = query + ((item.t_begin + i) * heads + kh * group) * D;
        float* dst = q + i * group * D;
#pragma omp simd
        for (int64_t e = 0; e < group * D; ++e) dst[e] = Elem<T>::load(src[e]) * scale;
      }
      for (int64_t e = 0; e < rows * D; ++e) o[e] = 0.f;
      for (int64_t r = 0; r < rows; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.f;
      }

      const int64_t last = q_pos + tokens - 1;  // the tile's last query position
      int64_t first = 0;
      if (window > 0 && q_pos - window + 1 > 0) first = q_pos - window + 1;
      for (int64_t k0 = first; k0 <= last; k0 += kPrefillKeys) {
        const int64_t nk = last + 1 - k0 < kPrefillKeys ? last + 1 - k0 : kPrefillKeys;
        // Gather the key tile transposed and the value tile as floats.
        for (int64_t j = 0; j < nk; ++j) {
          const T* kr = cache_row(key_cache, table, k0 + j, block_size, block_stride, head_off, D);
          const T* vr = cache_row(value_cache, table, k0 + j, block_size, block_stride, head_off, D);
          for (int64_t d = 0; d < D; ++d) kt[d * kPrefillKeys + j] = Elem<T>::load(kr[d]);
          float* vd = v + j * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) vd[d] = Elem<T>::load(vr[d]);
        }
        for (int64_t j = nk; j < kPrefillKeys; ++j)
          for (int64_t d = 0; d < D; ++d) kt[d * kPrefillKeys + j] = 0.f;

#ifdef ENGINE_VEC_WIDTH
        if (vec)
          prefill_scores(s, q, kt, rows, D);
        else
#endif
          prefill_scores_scalar(s, q, kt, rows, D);
        prefill_softmax_step(s, m, l, alpha, rows, group, nk, q_pos, k0, window);
#ifdef ENGINE_VEC_WIDTH
        if (vec)
          prefill_pv(o, s, alpha, v, rows, nk, D);
        else
#endif
          prefill_pv_scalar(o, s, alpha, v, rows, nk, D);
      }

      for (int64_t i = 0; i < tokens; ++i) {
        T* dst = out + ((item.t_begin + i) * heads + kh * group) * D;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t r = i * group + g;
          const float inv = l[r] > 0.f ? 1.0f / l[r] : 0.f;
          const float* orow = o + r * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) dst[g * D + d] = Elem<T>::store(orow[d] * inv);
        }
      }
    }
    free(q);
    free(o);
    free(s);
    free(kt);
    free(v);
    free(m);
  }
  free(items);
}
