// Fused mixture-of-experts MLP for the x86 vector ISAs: it runs
// linear_impl.h's tiles.
//
// out[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = ids[t, j].
// The (token, j) rows are grouped by expert (a counting sort), then each
// (expert, panel group) pair is one work item for all threads: every used
// expert's weights are streamed once per call whatever the batch, an unused
// one is never read, and no thread waits on a per-expert launch. Each expert
// holds gate and up as one [2I, H] weight and down as [H, I], both packed as
// the linear kernel's panels.
#pragma once

#include <stdint.h>

#include "linear_impl.h"
#include "scalar.h"
#include "scratch.h"

namespace engine::cpu {
namespace {

// Rows of one expert: its tile shape follows its own row count (decode's few
// rows read the weight once; many rows take the compute-bound shape).
struct MoeExpert {
  int64_t first, rows;  // in the expert-sorted order
  int np, mr_max;
};

// Where sorted row s sits in its expert's tiles: the tile's first row, its
// row count, and s's row in it (tiles never straddle two experts).
struct MoeSlot {
  int64_t m0;
  int mr, r;
};
inline MoeSlot moe_slot(const MoeExpert& ex, int64_t s) {
  const int64_t m0 = ex.first + (s - ex.first) / ex.mr_max * ex.mr_max;
  const int64_t end = ex.first + ex.rows;
  return {m0, static_cast<int>(end - m0 < ex.mr_max ? end - m0 : ex.mr_max),
          static_cast<int>(s - m0)};
}

// One work item: rows of expert `ex` (packed in `a`, step-major per tile) times
// the panels [p0, p0 + np) of its weight; float results to dst rows (ld
// columns), scaled by row_scale[r] when given.
template <typename Tile, typename T>
void moe_item(const MoeExpert& ex, const typename Tile::A* a, const T* panels, int64_t steps,
              int64_t p0, int64_t np, float* dst, int64_t ld, const float* row_scale) {
  constexpr int64_t KPS = NR * Tile::KP;  // elements of one panel a step
  alignas(64) float tile[PREFILL.mr_max * PREFILL.np * NR > DECODE.mr_max * NR
                             ? PREFILL.mr_max * PREFILL.np * NR
                             : DECODE.mr_max * NR];
  const T* panel = panels + p0 * steps * KPS;
  for (int64_t m0 = 0; m0 < ex.rows; m0 += ex.mr_max) {
    const int mr = static_cast<int>(ex.rows - m0 < ex.mr_max ? ex.rows - m0 : ex.mr_max);
    const typename Tile::A* at = a + (ex.first + m0) * steps;
    const int64_t cols = np * NR;
    if (np == PREFILL.np && ex.np == PREFILL.np)
      tile_fn<Tile, PREFILL.np, PREFILL.mr_max, T>(mr)(at, panel, steps, tile, nullptr);
    else if (ex.mr_max == DECODE.mr_max)
      tile_fn<Tile, 1, DECODE.mr_max, T>(mr)(at, panel, steps, tile, nullptr);
    else
      tile_fn<Tile, 1, PREFILL.mr_max, T>(mr)(at, panel, steps, tile, nullptr);
    for (int r = 0; r < mr; ++r) {
      float* d = dst + (ex.first + m0 + r) * ld + p0 * NR;
      const float s = row_scale ? row_scale[ex.first + m0 + r] : 1.f;
      const float* t = tile + r * cols;
      for (int64_t c = 0; c < cols; c += W) vstore(d + c, vmul(vload(t + c), vset1(s)));
    }
  }
}

// Work items over every expert: (expert, group of np panels) in order; item
// i belongs to the expert whose prefix count passes i.
inline int64_t moe_items(const MoeExpert* ex, int64_t E, int64_t panels, int64_t* start) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    start[e] = n;
    if (ex[e].rows) n += (panels + ex[e].np - 1) / ex[e].np;
  }
  start[E] = n;
  return n;
}

template <typename Tile, typename T>
void moe_gemm(const MoeExpert* ex, const int64_t* start, int64_t E, int64_t items,
              const typename Tile::A* a, const T* w, int64_t panels, int64_t steps,
              float* dst, int64_t ld, const float* row_scale) {
  const int64_t expert_size = panels * steps * NR * Tile::KP;
#pragma omp for schedule(dynamic, 1)
  for (int64_t i = 0; i < items; ++i) {
    int64_t e = 0;
    while (start[e + 1] <= i) ++e;
    const int64_t g = i - start[e];
    const int64_t p0 = g * ex[e].np;
    const int64_t np = panels - p0 < ex[e].np ? panels - p0 : ex[e].np;
    moe_item<Tile>(ex[e], a, w + e * expert_size, steps, p0, np, dst, ld, row_scale);
  }
}

// One chunk of tokens (bounded, so that the float buffers stay small).
template <typename Tile, typename T>
int64_t fused_moe_chunk(T* out, const T* x, const T* w13, const T* w2, const float* topk_w,
                     const int32_t* topk_ids, int64_t tokens, int64_t H, int64_t I, int64_t E,
                     int64_t topk, int64_t ldx, int64_t ldo) {
  using A = typename Tile::A;
  const int64_t rows = tokens * topk;
  const int64_t steps1 = (H + Tile::KP - 1) / Tile::KP, steps2 = (I + Tile::KP - 1) / Tile::KP;
  const int64_t panels1 = (2 * I + NR - 1) / NR, panels2 = (H + NR - 1) / NR;
  const int64_t ld1 = panels1 * NR, ld2 = panels2 * NR;
  // counting sort of the rows by expert: order[s] = the (token, j) at sorted s
  Allocs mem;
  MoeExpert* ex = mem.get<MoeExpert>(E);
  int64_t* start1 = mem.get<int64_t>(E + 1);
  int64_t* start2 = mem.get<int64_t>(E + 1);
  int64_t* order = mem.get<int64_t>(rows);
  int64_t* where = mem.get<int64_t>(rows);
  float* scale = mem.get<float>(rows);
  A* a1 = mem.get<A>(rows * steps1);
  A* a2 = mem.get<A>(rows * steps2);
  float* h = mem.get<float>(rows * ld1);
  float* y = mem.get<float>(rows * ld2);
  if (mem.failed()) return mem.failed();
  for (int64_t e = 0; e < E; ++e) ex[e] = MoeExpert{};
  for (int64_t r = 0; r < rows; ++r) ex[topk_ids[r]].rows++;
  for (int64_t e = 0, acc = 0; e < E; ++e) {
    ex[e].first = acc;
    acc += ex[e].rows;
    const bool few = ex[e].rows <= DECODE.mr_max;
    ex[e].np = few ? DECODE.np : PREFILL.np;
    ex[e].mr_max = few ? DECODE.mr_max : PREFILL.mr_max;
    ex[e].rows = 0;  // refilled below as the fill cursor
  }
  for (int64_t r = 0; r < rows; ++r) {
    MoeExpert& e = ex[topk_ids[r]];
    const int64_t s = e.first + e.rows++;
    order[s] = r;
    where[r] = s;
    scale[s] = topk_w[r];
  }
  const int64_t items1 = moe_items(ex, E, panels1, start1);
  const int64_t items2 = moe_items(ex, E, panels2, start2);
  const bool threads = rows * H * I >= (int64_t{1} << 16);
  int64_t failed = 0;
#pragma omp parallel if (threads)
  {
    Allocs tmem;
    T* act = tmem.get<T>(I + 1);
    // a thread without it cannot skip its share (the steps share buffers): it
    // stores nothing, the others finish and the call reports the failure
    if (act == nullptr) note_failed(failed, tmem.failed());
    // 1. x rows, grouped by expert, step-major per tile
#pragma omp for schedule(static)
    for (int64_t s = 0; s < rows; ++s) {
      const MoeSlot p = moe_slot(ex[topk_ids[order[s]]], s);
      const T* xr = x + order[s] / topk * ldx;
      A* at = a1 + p.m0 * steps1;
      for (int64_t k = 0; k < steps1; ++k) at[k * p.mr + p.r] = Tile::load_a(xr, k, H);
    }
    // 2. gate and up of every row: h = x @ [gate; up]^T
    moe_gemm<Tile>(ex, start1, E, items1, a1, w13, panels1, steps1, h, ld1, nullptr);
    // 3. silu(gate) * up, rounded to T as the unfused layers would, then laid out for down
#pragma omp for schedule(static)
    for (int64_t s = 0; s < rows; ++s) {
      if (act == nullptr) continue;
      const float* hr = h + s * ld1;
      for (int64_t i = 0; i < I; ++i) act[i] = Elem<T>::store(silu(hr[i]) * hr[I + i]);
      act[I] = Elem<T>::store(0.f);
      const MoeSlot p = moe_slot(ex[topk_ids[order[s]]], s);
      A* at = a2 + p.m0 * steps2;
      for (int64_t k = 0; k < steps2; ++k) at[k * p.mr + p.r] = Tile::load_a(act, k, I);
    }
    // 4. down, each row scaled by its routing weight
    moe_gemm<Tile>(ex, start2, E, items2, a2, w2, panels2, steps2, y, ld2, scale);
    // 5. each token's rows summed, in j order
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      T* o = out + t * ldo;
      for (int64_t c = 0; c < H; ++c) {
        float sum = 0.f;
        for (int64_t j = 0; j < topk; ++j) sum += y[where[t * topk + j] * ld2 + c];
        o[c] = Elem<T>::store(sum);
      }
    }
  }
  return failed;
}

// Tokens a chunk: the float buffers hold chunk * topk rows of 2I and H.
constexpr int64_t kMoeChunk = 512;

template <typename Tile, typename T>
int64_t fused_moe_t(T* out, const T* x, const T* w13, const T* w2, const float* topk_w,
                 const int32_t* topk_ids, int64_t tokens, int64_t H, int64_t I, int64_t E,
                 int64_t topk, int64_t ldx, int64_t ldo) {
  for (int64_t t0 = 0; t0 < tokens; t0 += kMoeChunk) {
    const int64_t n = tokens - t0 < kMoeChunk ? tokens - t0 : kMoeChunk;
    const int64_t failed = fused_moe_chunk<Tile>(out + t0 * ldo, x + t0 * ldx, w13, w2,
                                                 topk_w + t0 * topk, topk_ids + t0 * topk, n, H,
                                                 I, E, topk, ldx, ldo);
    if (failed) return failed;
  }
  return 0;
}

}  // namespace
}  // namespace engine::cpu
