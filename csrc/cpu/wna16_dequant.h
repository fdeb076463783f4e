// The wna16 weight dequantised for a large-M GEMM (wna16.h's dequant and
// dequant_panels): W^T as [K, N], or the panel kernel's layout.
#pragma once

#include <stdint.h>

#include "scalar.h"
#include "wna16_vec.h"

namespace engine::cpu {
namespace {

// The first cols (1 to W) of v to p.
template <typename T>
inline void store_row(T* p, VecF v, int64_t cols) {
  if (cols == W) {
    store_w(p, v);
    return;
  }
  alignas(64) float t[W];
  vstore(t, v);
  for (int64_t c = 0; c < cols; ++c) p[c] = Elem<T>::store(t[c]);
}

// fn(p, s, c, v, z, sc) for every panel p, packed step s holding some k < K and
// vector c of 16 columns: v its packed lanes, z its zero points, sc its scales
// (columns past N are zero-padded, so every load is in bounds); in parallel.
template <int BITS, typename Fn>
void for_each_step(const uint32_t* packed, const float* scales, const uint8_t* zeros,
                   int64_t N, int64_t K, int64_t G, Fn fn) {
  constexpr int PF = 32 / BITS;
  const int64_t groups = (K + G - 1) / G, gsteps = G / PF, steps = groups * gsteps;
  const int64_t panels = (N + NR - 1) / NR, ksteps = (K + PF - 1) / PF;
#pragma omp parallel for collapse(2) schedule(static) if (N * K >= (int64_t{1} << 16))
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t s = 0; s < ksteps; ++s) {
      const int64_t at = (p * groups + s / gsteps) * NR;
      for (int c = 0; c < CH; ++c)
        fn(p, s, c, iload(packed + (p * steps + s) * NR + c * W), izeros(zeros + at + c * W),
           vload(scales + at + c * W));
    }
}

template <int BITS, typename T>
void dequant_t(T* wt, const uint32_t* packed, const float* scales, const uint8_t* zeros,
               int64_t N, int64_t K, int64_t G) {
  constexpr int PF = 32 / BITS;
  const VecI mask = iset1((1 << BITS) - 1);
  for_each_step<BITS>(packed, scales, zeros, N, K, G,
                      [&](int64_t p, int64_t s, int c, VecI v, VecI z, VecF sc) {
    const int64_t c0 = p * NR + c * W;
    if (c0 >= N) return;
    const int64_t cols = N - c0 < W ? N - c0 : W;
    for (int j = 0; j < PF && s * PF + j < K; ++j)
      store_row(wt + (s * PF + j) * N + c0, vmul(decode(v, j * BITS, mask, z), sc), cols);
  });
}

// The weight in the panel kernel's layout (engine.model_executor.layers.linear.
// pack_panels): k_pack 1, [panels, K, 16] of T; k_pack 2 (bfloat16), [panels,
// ceil(K/2), 16] of k pairs. Columns past N are zero (so are their scales).
template <int BITS, typename T>
void dequant_panels_t(T* wp, int k_pack, const uint32_t* packed, const float* scales,
                      const uint8_t* zeros, int64_t N, int64_t K, int64_t G) {
  constexpr int PF = 32 / BITS;
  const int64_t rows = (K + k_pack - 1) / k_pack;
  const VecI mask = iset1((1 << BITS) - 1);
  for_each_step<BITS>(packed, scales, zeros, N, K, G,
                      [&](int64_t p, int64_t s, int c, VecI v, VecI z, VecF sc) {
    const int64_t k0 = s * PF;
    if (k_pack == 2) {  // PF is even, so k0 + j is: whole pairs but at K's end
      uint32_t* dst = reinterpret_cast<uint32_t*>(wp) + (p * rows + k0 / 2) * NR + c * W;
      for (int j = 0; j < PF && k0 + j < K; j += 2, dst += NR)
        store_pair(dst, vmul(decode(v, j * BITS, mask, z), sc),
                   k0 + j + 1 < K ? vmul(decode(v, (j + 1) * BITS, mask, z), sc) : vset1(0.f));
    } else {
      for (int j = 0; j < PF && k0 + j < K; ++j)
        store_row(wp + (p * K + k0 + j) * NR + c * W, vmul(decode(v, j * BITS, mask, z), sc), W);
    }
  });
}

}  // namespace
}  // namespace engine::cpu
