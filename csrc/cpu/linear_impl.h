// Linear layers on the x86 vector ISAs (cpu_types_x86.h), decode's few rows
// and prefill's many.
//
// out[M, N] = x[M, K] @ W[N, K]^T (+ bias). The weight is packed once at load
// into panels of NR = 16 columns, each K x 16 and contiguous ([ceil(N/16), K,
// 16], zero-padded), so a thread streams its share of the weight front to back
// exactly once per call whatever M is: at decode the weight is read from
// memory and that read is the whole cost. Rows of x are converted to float and
// packed k-major per tile of MR rows, so the microkernel does one weight load
// (converted from bfloat16 in registers) per MR fused multiply-adds.
//
#pragma once

#include <stdint.h>

#include "cpu_types.h"
#include "kernels.h"
#include "scalar.h"
#include "scratch.h"
#include "tiles.h"

namespace engine::cpu {
namespace {

constexpr int64_t NR = kPanel;
constexpr int64_t NV = NR / W;  // vectors per panel row
// A tile is up to MR_MAX rows by NP panels. AVX2: 6 rows by one panel (its 16
// registers hold 6 x 2 accumulators). AVX-512, up to 16 rows (decode): 16 rows
// by one panel, so the weight is read once; more rows (prefill, compute-bound):
// 8 rows by two panels side by side, 2 weight loads and 8 broadcasts per 16
// FMAs instead of 17 loads, which the two load ports could not keep up with.
// (Measured on the benchmark's Llama, 2 threads: 16 rows 93 ms vs 114 ms a
// step the other way round; 528 rows 1.94 s vs 2.26 s.)
// Rows of x (packed) a thread block keeps while the weight streams past them.
// All M rows at once re-read x from memory for every panel group once x
// outgrew the caches: 1920 rows of the large Llama's down_proj (K 5456) on a
// 2-core Zen 4, bfloat16 149 -> 108 ms, float32 417 -> 234 ms (oneDNN's
// prepacked: 98 ms in bfloat16); no change at 32-512 rows or for K 2048.
constexpr int64_t kBlockBytes = int64_t{2} << 20;

struct TileShape {
  int np, mr_max;
};
constexpr TileShape DECODE = {1, W == 16 ? 16 : 6};
constexpr TileShape PREFILL = {W == 16 ? 2 : 1, W == 16 ? 8 : 6};

// How rows of x are laid out for a tile and how the microkernel multiplies
// them with the weight, which holds KP k values a step per column.
// FmaTile: x as floats, one k a step, the weight converted to float in
// registers (float32 and bfloat16 on AVX2 and AVX-512).
template <typename T>
struct FmaTile {
  using A = float;
  static constexpr int64_t KP = 1;  // k values a step
  static A load_a(const T* xr, int64_t k, int64_t) { return Elem<T>::load(xr[k]); }
  static VecF load_b(const T* p) { return vload(p); }
  static VecF broadcast(A a) { return vset1(a); }
  static VecF madd(VecF acc, VecF a, VecF b) { return vfma(a, b, acc); }
};

#ifdef __AVX512BF16__
// bfloat16 on CPUs with AVX512_BF16 (Zen 4 and later, Cooper Lake, Sapphire
// Rapids): vdpbf16ps multiplies two bfloat16 pairs a lane and adds both
// products to a float accumulator, exactly (bfloat16 products fit a float),
// so one instruction does the work of two FMAs and the weight is never
// converted. The weight holds k pairs, [ceil(N/16), ceil(K/2), 16, 2]: one
// 64-byte vector a pair of k for 16 columns; x is broadcast a pair at a time.
struct Bf16PairTile {
  using A = uint32_t;  // x[k] in the low half, x[k + 1] in the high one
  static constexpr int64_t KP = 2;
  static A load_a(const uint16_t* xr, int64_t step, int64_t K) {
    const int64_t k = 2 * step;
    return uint32_t{xr[k]} | (k + 1 < K ? uint32_t{xr[k + 1]} << 16 : 0u);
  }
  static __m512bh load_b(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static __m512bh broadcast(A a) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(a)); }
  static VecF madd(VecF acc, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(acc, a, b); }
};
#endif

// acc[r] = sum over steps s of a[s * MR + r] times the P panels from `panel`
// (P * steps * NR * KP apart) at step s. With few rows, each row gets two
// accumulator sets (even and odd steps) so that FMA latency does not bound it.
template <typename Tile, int MR, int P, typename T>
void linear_tile(const typename Tile::A* a, const T* panel, int64_t steps, float* out_f,
                 const float* bias) {
  constexpr int64_t TILE_COLS = P * NR;
  constexpr int64_t STEP = NR * Tile::KP;  // elements of one panel a step
  constexpr int64_t VSTEP = W * Tile::KP;  // elements of one vector a step
  constexpr int NB = P * NV;  // vectors a step
  constexpr int KU = MR * NB < 4 ? 2 : 1;
  using B = decltype(Tile::load_b(panel));
  VecF acc[KU][MR][NB];
  for (int u = 0; u < KU; ++u)
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NB; ++v) acc[u][r][v] = bias && u == 0 ? vload(bias + v * W) : vset1(0.f);
  // The hardware prefetcher alone leaves most of the memory bandwidth unused
  // here; this fetches 4 KiB ahead in each panel, running past a panel's end
  // into the next one, which is the thread's next.
  constexpr int64_t ahead = 4096 / (STEP * sizeof(T));  // steps
  int64_t k = 0;
  for (; k + KU <= steps; k += KU) {
#pragma GCC unroll 2
    for (int u = 0; u < KU; ++u) {
      B b[NB];
      for (int j = 0; j < P; ++j) {
        const T* pk = panel + j * steps * STEP + (k + u) * STEP;
        vprefetch(pk + ahead * STEP);
        for (int v = 0; v < NV; ++v) b[j * NV + v] = Tile::load_b(pk + v * VSTEP);
      }
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const auto av = Tile::broadcast(a[(k + u) * MR + r]);
        for (int v = 0; v < NB; ++v) acc[u][r][v] = Tile::madd(acc[u][r][v], av, b[v]);
      }
    }
  }
  for (; k < steps; ++k) {
    B b[NB];
    for (int j = 0; j < P; ++j)
      for (int v = 0; v < NV; ++v) b[j * NV + v] = Tile::load_b(panel + j * steps * STEP + k * STEP + v * VSTEP);
    for (int r = 0; r < MR; ++r) {
      const auto av = Tile::broadcast(a[k * MR + r]);
      for (int v = 0; v < NB; ++v) acc[0][r][v] = Tile::madd(acc[0][r][v], av, b[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NB; ++v) {
      VecF sum = acc[0][r][v];
      for (int u = 1; u < KU; ++u) sum = vadd(sum, acc[u][r][v]);
      vstore(out_f + r * TILE_COLS + v * W, sum);
    }
}

template <typename Tile, typename T>
using TileFn = void (*)(const typename Tile::A*, const T*, int64_t, float*, const float*);

template <typename Tile, int P, int MR_MAX, typename T>
inline TileFn<Tile, T> tile_fn(int mr) {
  return tile_for_rows<MR_MAX>(mr, []<int R>() { return &linear_tile<Tile, R, P, T>; });
}

// The weight holds Tile::KP k values per step: [ceil(N/16), steps, 16, KP].
template <TileShape S, typename Tile, typename T>
int64_t linear_shaped(T* out, const T* x, const T* packed, const T* bias, int64_t M, int64_t N,
                   int64_t K, int64_t ldx, int64_t ldo) {
  using A = typename Tile::A;
  constexpr int NP = S.np, MR_MAX = S.mr_max;
  constexpr int64_t TILE_COLS = NP * NR;
  const int64_t steps = (K + Tile::KP - 1) / Tile::KP;
  const int64_t panel_size = steps * Tile::KP * NR;  // elements of T
  const int64_t panels = (N + NR - 1) / NR;
  const int64_t groups = (panels + NP - 1) / NP;  // tiles across N
  const int64_t tiles = (M + MR_MAX - 1) / MR_MAX;
  // x step-major per tile of MR_MAX rows (the last tile has M % MR_MAX)
  Allocs mem;
  A* a = mem.get<A>(M * steps);
  float* bias_f = bias ? mem.get<float>(groups * TILE_COLS) : nullptr;
  if (mem.failed()) return mem.failed();
  if (bias) {
    for (int64_t n = 0; n < groups * TILE_COLS; ++n)
      bias_f[n] = n < N ? Elem<T>::load(bias[n]) : 0.f;
  }
  const bool threads = M * N * K >= (int64_t{1} << 18);
  // Tiles of x a block: every panel group runs a block's tiles before the next
  // block, so those rows of x stay in cache while the weight streams past.
  const int64_t tile_bytes = MR_MAX * steps * static_cast<int64_t>(sizeof(A));
  const int64_t block_tiles = kBlockBytes / tile_bytes > 0 ? kBlockBytes / tile_bytes : 1;
#pragma omp parallel if (threads)
  {
    pack_rows<MR_MAX>(a, M, steps,
                      [&](int64_t m, int64_t k) { return Tile::load_a(x + m * ldx, k, K); });
    alignas(64) float tile[MR_MAX * TILE_COLS];
    for (int64_t t0 = 0; t0 < tiles; t0 += block_tiles) {
      const int64_t t1 = t0 + block_tiles < tiles ? t0 + block_tiles : tiles;
#pragma omp for schedule(static)
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t p0 = g * NP, np = panels - p0 < NP ? panels - p0 : NP;
        const T* panel = packed + p0 * panel_size;
        const int64_t n0 = p0 * NR, cols = N - n0 < TILE_COLS ? N - n0 : TILE_COLS;
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t m0 = t * MR_MAX;
          const int mr = tile_rows(M, m0, MR_MAX);
          const float* b = bias_f ? bias_f + n0 : nullptr;
          if (np == NP) {
            tile_fn<Tile, NP, MR_MAX, T>(mr)(a + m0 * steps, panel, steps, tile, b);
            store_tile(out + m0 * ldo, ldo, tile, TILE_COLS, mr, n0, cols);
          } else {  // the last, lone panel
            tile_fn<Tile, 1, MR_MAX, T>(mr)(a + m0 * steps, panel, steps, tile, b);
            store_tile(out + m0 * ldo, ldo, tile, NR, mr, n0, cols);
          }
        }
      }
    }
  }
  return 0;
}

template <typename Tile, typename T>
int64_t linear_t(T* out, const T* x, const T* packed, const T* bias, int64_t M, int64_t N,
                 int64_t K, int64_t ldx, int64_t ldo) {
  if (M <= DECODE.mr_max) return linear_shaped<DECODE, Tile>(out, x, packed, bias, M, N, K, ldx, ldo);
  return linear_shaped<PREFILL, Tile>(out, x, packed, bias, M, N, K, ldx, ldo);
}

}  // namespace
}  // namespace engine::cpu
