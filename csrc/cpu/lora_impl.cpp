// The LoRA term for few tokens (decode), as upstream's punica bgmv: each token
// against its own slot's A and B only (a torch GEMM of every token against
// every slot does max_loras times the work, in small, inefficient products),
// one call a layer. Portable loops the compiler vectorizes for the ISA of
// the translation unit (`omp simd`: the sums may be reordered); compiled once
// per ISA as kernels_impl.cpp is, on every architecture.
//
// Per token t of slot s (s < 0, or a slot of rank 0 here: nothing to add):
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
// Multiply-adds below which the tokens run on the calling thread: a parallel
// region's wake-up costs more (measured, benchmarks/lora.py's layers: decode).
constexpr int64_t kThreadMacs = int64_t{1} << 21;

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

// One token: its shrink into h [slices, max_rank], then each slice's expand.
template <typename T>
void token(T* o, const T* x, const T* a, const T* bt, float* h, int64_t rank,
           const int64_t* bounds, int64_t slices, int64_t R, int64_t K) {
  const int64_t N = bounds[slices];
  for (int64_t j = 0; j < slices; ++j) shrink(h + j * R, x, a + j * R * K, rank, K);
  for (int64_t j = 0; j < slices; ++j) {
    int64_t n = bounds[j];
    for (; n + kCols <= bounds[j + 1]; n += kCols)
      expand<T, true>(o + n, h + j * R, bt + n, rank, N, kCols);
    if (n < bounds[j + 1]) expand<T, false>(o + n, h + j * R, bt + n, rank, N, bounds[j + 1] - n);
  }
}

template <typename T>
int64_t add_t(T* out, const T* x, const T* lora_a, const T* lora_bt, const int32_t* token_slot,
              const int32_t* ranks, const int64_t* bounds, int64_t tokens, int64_t slices,
              int64_t R, int64_t K, int64_t ldx, int64_t ldo) {
  const int64_t N = bounds[slices];
  int64_t macs = 0;
  for (int64_t t = 0; t < tokens; ++t)
    if (token_slot[t] >= 0) macs += ranks[token_slot[t]] * (slices * K + N);
  if (macs == 0) return 0;
  Allocs mem;
  float* h = mem.get<float>(tokens * slices * R);
  if (mem.failed()) return mem.failed();
#pragma omp parallel for schedule(static) if (macs >= kThreadMacs)
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t s = token_slot[t];
    if (s < 0 || ranks[s] == 0) continue;
    token(out + t * ldo, x + t * ldx, lora_a + s * slices * R * K, lora_bt + s * R * N,
          h + t * slices * R, ranks[s], bounds, slices, R, K);
  }
  return 0;
}

}  // namespace

namespace ENGINE_CAT(lora_, ENGINE_ISA) {

int64_t add(DType dt, void* out, const void* x, const void* lora_a, const void* lora_bt,
            const int32_t* token_slot, const int32_t* ranks, const int64_t* bounds,
            int64_t tokens, int64_t slices, int64_t max_rank, int64_t K, int64_t ldx,
            int64_t ldo) {
  if (dt == DType::kFloat32)
    return add_t(static_cast<float*>(out), static_cast<const float*>(x),
                 static_cast<const float*>(lora_a), static_cast<const float*>(lora_bt),
                 token_slot, ranks, bounds, tokens, slices, max_rank, K, ldx, ldo);
  return add_t(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(x),
               static_cast<const uint16_t*>(lora_a), static_cast<const uint16_t*>(lora_bt),
               token_slot, ranks, bounds, tokens, slices, max_rank, K, ldx, ldo);
}

}  // namespace ENGINE_CAT(lora_, ENGINE_ISA)
}  // namespace engine::cpu
