// The LoRA term for few tokens (decode), as upstream's punica bgmv: each token
// against its own slot's A and B only (a torch GEMM of every token against
// every slot does max_loras times the work, in small, inefficient products),
// one call a layer. Portable loops the compiler vectorizes for the ISA of
// the translation unit (`omp simd`: the sums may be reordered); compiled once
// per ISA as kernels_impl.cpp is, on every architecture.
//
// The tokens are grouped by slot, in units of up to kUnit tokens: a unit reads
// its slot's A and Bt once (L1 after its first token) and shares each load
// between two tokens. Per token t of slot s (s < 0, or a slot of rank 0 here:
// nothing to add):
//   shrink  h[j, r] = x[t] . A[s, j, r]        (j < slices, r < ranks[s])
//   expand  out[t, n] += sum_r h[j, r] * Bt[s, r, n]  (n in slice j's columns)
// in float32 (bfloat16 operands widened), out rounded once. The padded ranks
// (ranks[s] .. max_rank, zeros) are skipped.
#include "lora.h"
#include "scratch.h"

#include <stdint.h>

namespace engine::cpu {
namespace {

// Output columns an expand block: four AVX-512 (eight AVX2) accumulators
// held across the ranks.
constexpr int64_t kCols = 64;
// Multiply-adds below which the tokens run on the calling thread, as the other
// decode kernels (wna16: 2^18): on a quiet 2-core Xeon, 16 requests over 4
// adapters went 0.76x -> 0.78-0.80x the base's tok/s with a decode step's term
// on both threads (at 2^24 it ran on one). Where other work keeps the cores busy a
// parallel region costs milliseconds (6-7 ms a call measured under load).
constexpr int64_t kThreadMacs = int64_t{1} << 18;

// h[i] = x . a[i] for the n rows of a [n, K]: four rows a pass share the loads
// of x and keep four independent sums in flight.
template <typename T>
void shrink(float* h, const T* x, const T* a, int64_t n, int64_t K) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const T *a0 = a + i * K, *a1 = a0 + K, *a2 = a1 + K, *a3 = a2 + K;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t k = 0; k < K; ++k) {
      const float xk = Elem<T>::load(x[k]);
      s0 += xk * Elem<T>::load(a0[k]);
      s1 += xk * Elem<T>::load(a1[k]);
      s2 += xk * Elem<T>::load(a2[k]);
      s3 += xk * Elem<T>::load(a3[k]);
    }
    h[i] = s0, h[i + 1] = s1, h[i + 2] = s2, h[i + 3] = s3;
  }
  for (; i < n; ++i) {
    const T* ai = a + i * K;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < K; ++k) s += Elem<T>::load(x[k]) * Elem<T>::load(ai[k]);
    h[i] = s;
  }
}

// The same for two tokens of one slot, x and y into g and h: each load of a
// row of A feeds two sums (eight a pass: 0.75 loads a multiply-add, 1.25 above).
template <typename T>
void shrink2(float* g, float* h, const T* x, const T* y, const T* a, int64_t n, int64_t K) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const T *a0 = a + i * K, *a1 = a0 + K, *a2 = a1 + K, *a3 = a2 + K;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f, t0 = 0.f, t1 = 0.f, t2 = 0.f, t3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3, t0, t1, t2, t3)
    for (int64_t k = 0; k < K; ++k) {
      const float xk = Elem<T>::load(x[k]), yk = Elem<T>::load(y[k]);
      const float w0 = Elem<T>::load(a0[k]), w1 = Elem<T>::load(a1[k]);
      const float w2 = Elem<T>::load(a2[k]), w3 = Elem<T>::load(a3[k]);
      s0 += xk * w0, s1 += xk * w1, s2 += xk * w2, s3 += xk * w3;
      t0 += yk * w0, t1 += yk * w1, t2 += yk * w2, t3 += yk * w3;
    }
    g[i] = s0, g[i + 1] = s1, g[i + 2] = s2, g[i + 3] = s3;
    h[i] = t0, h[i + 1] = t1, h[i + 2] = t2, h[i + 3] = t3;
  }
  if (i < n) {
    shrink(g + i, x, a + i * K, n - i, K);
    shrink(h + i, y, a + i * K, n - i, K);
  }
}

// o[c] += sum_{r < rank} h[r] * bt[r * ldb + c] for c < cols (<= kCols); a
// full block's columns are a constant, so its sums stay in registers.
template <typename T, bool kFull>
void expand(T* o, const float* h, const T* bt, int64_t rank, int64_t ldb, int64_t cols) {
  const int64_t nc = kFull ? kCols : cols;
  float acc[kCols] = {};
  for (int64_t r = 0; r < rank; ++r) {
    const float hr = h[r];
    const T* b = bt + r * ldb;
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) acc[c] += hr * Elem<T>::load(b[c]);
  }
#pragma omp simd
  for (int64_t c = 0; c < nc; ++c) o[c] = Elem<T>::store(Elem<T>::load(o[c]) + acc[c]);
}

// Tokens a work unit at most: of one slot, their slices' rows of A and block of
// Bt are read once for all (from L1 after the first) and shared in pairs.
constexpr int64_t kUnit = 8;

// One unit: the n (<= kUnit) tokens tok[0..n) of one slot, whose A [slices,
// R, K] and Bt [R, N] are a and bt; h [n, slices * R] their shrinks.
template <typename T>
void unit(T* out, const T* x, const T* a, const T* bt, float* h, const int64_t* tok, int64_t n,
          int64_t rank, const int64_t* bounds, int64_t slices, int64_t R, int64_t K, int64_t ldx,
          int64_t ldo) {
  const int64_t N = bounds[slices], hs = slices * R;
  for (int64_t j = 0; j < slices; ++j) {
    const T* aj = a + j * R * K;
    int64_t i = 0;
    for (; i + 2 <= n; i += 2)
      shrink2(h + i * hs + j * R, h + (i + 1) * hs + j * R, x + tok[i] * ldx,
              x + tok[i + 1] * ldx, aj, rank, K);
    if (i < n) shrink(h + i * hs + j * R, x + tok[i] * ldx, aj, rank, K);
  }
  for (int64_t j = 0; j < slices; ++j) {
    for (int64_t c = bounds[j]; c < bounds[j + 1]; c += kCols) {
      const int64_t cols = bounds[j + 1] - c;
      for (int64_t i = 0; i < n; ++i) {
        T* o = out + tok[i] * ldo + c;
        if (cols >= kCols) expand<T, true>(o, h + i * hs + j * R, bt + c, rank, N, kCols);
        else expand<T, false>(o, h + i * hs + j * R, bt + c, rank, N, cols);
      }
    }
  }
}

// The entry point for elements of type T (float, or bfloat16 bits).
template <typename T>
int64_t add_t(void* out_p, const void* x_p, const void* a_p, const void* bt_p,
              const int32_t* token_slot, const int32_t* ranks, const int64_t* bounds,
              int64_t tokens, int64_t slices, int64_t R, int64_t K, int64_t ldx, int64_t ldo) {
  T* out = static_cast<T*>(out_p);
  const T *x = static_cast<const T*>(x_p), *lora_a = static_cast<const T*>(a_p);
  const T* lora_bt = static_cast<const T*>(bt_p);
  const int64_t N = bounds[slices];
  auto rank_of = [&](int64_t t) { return token_slot[t] < 0 ? 0 : ranks[token_slot[t]]; };
  int64_t macs = 0, adapted = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    macs += rank_of(t) * (slices * K + N);
    adapted += rank_of(t) > 0;
  }
  if (macs == 0) return 0;
  // the adapted tokens by slot (a stable counting sort: slots are few), cut
  // into units of up to kUnit tokens of one slot
  Allocs mem;
  int64_t* tok = mem.get<int64_t>(adapted);
  int64_t* units = mem.get<int64_t>(adapted + 1);  // each unit's first index in tok
  float* h = mem.get<float>(adapted * slices * R);
  if (mem.failed()) return mem.failed();
  int32_t top = -1;  // the highest slot in use
  for (int64_t t = 0; t < tokens; ++t)
    if (rank_of(t) > 0 && token_slot[t] > top) top = token_slot[t];
  int64_t n = 0, n_units = 0;
  for (int32_t s = 0; s <= top; ++s) {
    int64_t in_slot = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      if (rank_of(t) == 0 || token_slot[t] != s) continue;
      if (in_slot++ % kUnit == 0) units[n_units++] = n;
      tok[n++] = t;
    }
  }
  units[n_units] = n;
#pragma omp parallel for schedule(static) if (macs >= kThreadMacs)
  for (int64_t u = 0; u < n_units; ++u) {
    const int64_t t0 = tok[units[u]];
    const int32_t s = token_slot[t0];
    unit(out, x, lora_a + s * slices * R * K, lora_bt + s * R * N, h + units[u] * slices * R,
         tok + units[u], units[u + 1] - units[u], ranks[s], bounds, slices, R, K, ldx, ldo);
  }
  return 0;
}

}  // namespace

namespace ENGINE_CAT(lora_, ENGINE_ISA) {

int64_t add(DType dt, void* out, const void* x, const void* lora_a, const void* lora_bt,
            const int32_t* token_slot, const int32_t* ranks, const int64_t* bounds,
            int64_t tokens, int64_t slices, int64_t max_rank, int64_t K, int64_t ldx,
            int64_t ldo) {
  auto* fn = dt == DType::kFloat32 ? add_t<float> : add_t<uint16_t>;
  return fn(out, x, lora_a, lora_bt, token_slot, ranks, bounds, tokens, slices, max_rank, K, ldx,
            ldo);
}

}  // namespace ENGINE_CAT(lora_, ENGINE_ISA)
}  // namespace engine::cpu
