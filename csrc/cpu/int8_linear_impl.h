// W8A8 linear layers: int8 activations x int8 weights, int32 accumulation,
// for the x86 vector ISAs.
//
// out[m, n] = float(sum_k q[m, k] * W[n, k]) * a_scale[m] * w_scale[n], where
// q is x quantised per row (dynamic: scale = max|x[m, :]| / 127, or one static
// scale), round to nearest even, clamped to [-128, 127]. The float products are
// done in that order and never fused, so engine.reference.int8_linear matches
// bit for bit.
//
// The weight is packed once at load as [ceil(N/16), ceil(K/4), 16, 4]: per
// panel of 16 columns, each column's 4 consecutive k values side by side (one
// 32-bit lane), zero-padded. As with linear_impl.h a thread streams its panels
// once per call whatever M is: at decode the weight read is the whole cost,
// and it is a quarter of float32's, half of bfloat16's.
//
// AVX512_VNNI (on the avx512_bf16 path): vpdpbusd multiplies 4 unsigned bytes
// by 4 signed bytes a lane and adds the four products to an int32. Activations
// are offset by 128 to make them unsigned; comp[n] = 128 * sum_k W[n, k]
// (computed at pack time) takes the offset back out. Elsewhere (AVX-512BW,
// AVX2) the weight bytes are widened to int16 and vpmaddwd multiplies pairs.
#pragma once

#include <math.h>
#include <stdint.h>

#include "amx.h"
#include "cpu_types.h"
#include "kernels.h"
#include "scalar.h"
#include "scratch.h"
#include "tiles.h"

namespace engine::cpu {
namespace {

#ifdef __AVX512VNNI__
// q + 128 as 4 bytes a step; one vpdpbusd a panel and row.
struct I8Vnni {
  using A = uint32_t;
  static constexpr int CH = 1;  // accumulator vectors a panel
  static A load_a(const int8_t* q, int64_t s, int64_t K) {
    uint32_t v = 0;
    for (int j = 0; j < 4; ++j) {
      const int64_t k = 4 * s + j;
      const uint32_t u = k < K ? static_cast<uint32_t>(q[k] + 128) : 128u;  // pad: 0 after the offset
      v |= u << (8 * j);
    }
    return v;
  }
  static __m512i broadcast(A a) { return _mm512_set1_epi32(static_cast<int>(a)); }
  static __m512i add(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
  static __m512i madd(__m512i acc, __m512i a, const int8_t* p, int) {
    return _mm512_dpbusd_epi32(acc, a, _mm512_loadu_si512(p));
  }
  // 16 int32 column sums from the accumulator; the offset removed.
  static void finish(const __m512i* acc, const int32_t* comp, int32_t* out) {
    _mm512_storeu_si512(out, _mm512_sub_epi32(acc[0], _mm512_loadu_si512(comp)));
  }
};
#endif

// q as four int16 a step; each 2W bytes of the panel step widened to int16
// and multiplied in pairs: lane 2c holds column c's k0, k1 products, lane
// 2c + 1 its k2, k3 ones.
struct I8Widen {
  using A = uint64_t;
  using V = VecI;
  static constexpr int CH = 32 / W;  // 2 W bytes a vector
  static V broadcast(A a) { return vset1_i64(static_cast<int64_t>(a)); }
  static V add(V a, V b) { return ENGINE_MM(add_epi32)(a, b); }
  static V madd(V acc, V a, const int8_t* p, int ch) {
    const V w = ENGINE_MM(cvtepi8_epi16)(vload_h(p + 2 * W * ch));
    return ENGINE_MM(add_epi32)(acc, ENGINE_MM(madd_epi16)(a, w));
  }
  static void store(int32_t* o, V v) { ENGINE_MMI(storeu)(reinterpret_cast<V*>(o), v); }
  static A load_a(const int8_t* q, int64_t s, int64_t K) {
    uint64_t v = 0;
    for (int j = 0; j < 4; ++j) {
      const int64_t k = 4 * s + j;
      const uint16_t u = k < K ? static_cast<uint16_t>(static_cast<int16_t>(q[k])) : 0;
      v |= static_cast<uint64_t>(u) << (16 * j);
    }
    return v;
  }
  static void finish(const V* acc, const int32_t*, int32_t* out) {
    alignas(64) int32_t lanes[2 * kPanel];
    for (int c = 0; c < CH; ++c) store(lanes + c * (2 * kPanel / CH), acc[c]);
    for (int n = 0; n < kPanel; ++n) out[n] = lanes[2 * n] + lanes[2 * n + 1];
  }
};

template <typename Ops>
using I8Vec = decltype(Ops::broadcast(0));

// Column sums of MR rows by P panels ([MR][P * 16] int32 in out). With few
// accumulators each gets a second set for odd steps, so that the dot
// product's latency does not bound the weight stream.
template <typename Ops, int MR, int P>
void i8_tile(const typename Ops::A* a, const int8_t* panel, int64_t steps, const int32_t* comp,
             int32_t* out) {
  using V = I8Vec<Ops>;
  constexpr int CH = Ops::CH;
  constexpr int KU = MR * P * CH < 4 ? 2 : 1;
  constexpr int64_t STEP = 4 * kPanel;  // bytes of one panel a step
  V acc[KU][MR][P * CH];
  for (int u = 0; u < KU; ++u)
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < P * CH; ++v) acc[u][r][v] = V{};
  constexpr int64_t ahead = 4096 / STEP;  // steps: 4 KiB ahead, as linear_impl.h
  int64_t s = 0;
  for (; s + KU <= steps; s += KU) {
#pragma GCC unroll 2
    for (int u = 0; u < KU; ++u) {
      for (int j = 0; j < P; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(panel + j * steps * STEP + (s + u + ahead) * STEP),
                     _MM_HINT_T0);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const V av = Ops::broadcast(a[(s + u) * MR + r]);
        for (int j = 0; j < P; ++j)
          for (int c = 0; c < CH; ++c)
            acc[u][r][j * CH + c] =
                Ops::madd(acc[u][r][j * CH + c], av, panel + j * steps * STEP + (s + u) * STEP, c);
      }
    }
  }
  for (; s < steps; ++s)
    for (int r = 0; r < MR; ++r) {
      const V av = Ops::broadcast(a[s * MR + r]);
      for (int j = 0; j < P; ++j)
        for (int c = 0; c < CH; ++c)
          acc[0][r][j * CH + c] = Ops::madd(acc[0][r][j * CH + c], av, panel + j * steps * STEP + s * STEP, c);
    }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < P; ++j) {
      V sum[CH];
      for (int c = 0; c < CH; ++c) {
        sum[c] = acc[0][r][j * CH + c];
        for (int u = 1; u < KU; ++u) sum[c] = Ops::add(sum[c], acc[u][r][j * CH + c]);
      }
      Ops::finish(sum, comp + j * kPanel, out + r * P * kPanel + j * kPanel);
    }
}

template <typename Ops>
using I8TileFn = void (*)(const typename Ops::A*, const int8_t*, int64_t, const int32_t*, int32_t*);

template <typename Ops, int P, int MR_MAX>
inline I8TileFn<Ops> i8_tile_fn(int mr) {
  return tile_for_rows<MR_MAX>(mr, []<int R>() { return &i8_tile<Ops, R, P>; });
}

// q[m, :] = round(x[m, :] / s[m]), s[m] = max|x[m, :]| / 127 (1 for a zero row)
// or the static scale.
// ldq >= K: q's row stride; the bytes past K are zeroed.
template <typename T>
void quant_rows(int8_t* q, float* scale, const T* x, int64_t M, int64_t K, int64_t ldx,
                const float* static_scale, int64_t ldq) {
#pragma omp parallel for schedule(static) if (M * K >= (int64_t{1} << 16))
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * ldx;
    float s;
    if (static_scale) {
      s = *static_scale;
    } else {
      float mx = 0.f;
#pragma omp simd reduction(max : mx)
      for (int64_t k = 0; k < K; ++k) mx = fmaxf(mx, fabsf(Elem<T>::load(xr[k])));
      s = mx / 127.0f;
      if (s == 0.f) s = 1.f;
    }
    scale[m] = s;
    int8_t* qr = q + m * ldq;
#pragma omp simd
    for (int64_t k = 0; k < K; ++k) {
      float v = nearbyintf(Elem<T>::load(xr[k]) / s);
      v = v < -128.f ? -128.f : (v > 127.f ? 127.f : v);
      qr[k] = static_cast<int8_t>(static_cast<int32_t>(v));
    }
    for (int64_t k = K; k < ldq; ++k) qr[k] = 0;
  }
}

template <typename Ops, int NP, int MR_MAX, typename T>
int64_t int8_linear_shaped(T* out, const int8_t* q, const float* a_scale, const int8_t* packed,
                        const float* w_scale, const int32_t* comp, int64_t M, int64_t N,
                        int64_t K, int64_t ldo) {
  using A = typename Ops::A;
  constexpr int64_t TILE_COLS = NP * kPanel;
  const int64_t steps = (K + 3) / 4;
  const int64_t panel_size = steps * 4 * kPanel;
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const int64_t groups = (panels + NP - 1) / NP;
  const int64_t tiles = (M + MR_MAX - 1) / MR_MAX;
  A* a = static_cast<A*>(scratch(2, M * steps * sizeof(A)));
  if (a == nullptr) return static_cast<int64_t>(M * steps * sizeof(A));
  const bool threads = M * N * K >= (int64_t{1} << 18);
#pragma omp parallel if (threads)
  {
    pack_rows<MR_MAX>(a, M, steps,
                      [&](int64_t m, int64_t s) { return Ops::load_a(q + m * K, s, K); });
    alignas(64) int32_t tile[MR_MAX * TILE_COLS];
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t p0 = g * NP, np = panels - p0 < NP ? panels - p0 : NP;
      const int8_t* panel = packed + p0 * panel_size;
      const int64_t n0 = p0 * kPanel, cols = N - n0 < TILE_COLS ? N - n0 : TILE_COLS;
      const int64_t width = np == NP ? TILE_COLS : kPanel;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m0 = t * MR_MAX;
        const int mr = tile_rows(M, m0, MR_MAX);
        if (np == NP)
          i8_tile_fn<Ops, NP, MR_MAX>(mr)(a + m0 * steps, panel, steps, comp + n0, tile);
        else  // the last, lone panel
          i8_tile_fn<Ops, 1, MR_MAX>(mr)(a + m0 * steps, panel, steps, comp + n0, tile);
        store_int8_tile(out + m0 * ldo, ldo, tile, width, mr, a_scale + m0, w_scale, n0, cols);
      }
    }
  }
  return 0;
}

template <typename T>
int64_t int8_linear_t(T* out, const T* x, const float* static_scale, const int8_t* packed,
                      const float* w_scale, const int32_t* comp, int64_t M, int64_t N, int64_t K,
                      int64_t ldx, int64_t ldo) {
  int8_t* q = static_cast<int8_t*>(scratch(0, M * K));
  if (q == nullptr) return M * K;
  float* a_scale = static_cast<float*>(scratch(1, sizeof(float) * M));
  if (a_scale == nullptr) return static_cast<int64_t>(sizeof(float) * M);
  quant_rows(q, a_scale, x, M, K, ldx, static_scale, K);
#ifdef __AVX512VNNI__
  // 16 rows by one panel at decode (the weight read once), 8 rows by two
  // panels for more (two weight loads per 16 dot products), as linear_impl.h.
  if (M <= 16)
    return int8_linear_shaped<I8Vnni, 1, 16>(out, q, a_scale, packed, w_scale, comp, M, N, K, ldo);
  return int8_linear_shaped<I8Vnni, 2, 8>(out, q, a_scale, packed, w_scale, comp, M, N, K, ldo);
#elif ENGINE_VEC_WIDTH == 16
  return int8_linear_shaped<I8Widen, 1, 8>(out, q, a_scale, packed, w_scale, comp, M, N, K, ldo);
#else
  return int8_linear_shaped<I8Widen, 1, 2>(out, q, a_scale, packed, w_scale, comp, M, N, K, ldo);
#endif
}

}  // namespace
}  // namespace engine::cpu
