// Weight-only quantized linear layers (W4A16, W8A16): the boundary between the
// torch-facing glue (wna16_ops.cpp, baseline ISA) and the kernels
// (wna16_impl.cpp, compiled once per x86 ISA). Torch-free and STL-free for
// the reason kernels.h gives.
//
// The weight, packed once at load (engine.model_executor.layers.quantization.
// wna16.pack_wna16), for BITS = 4 or 8 and PF = 32 / BITS values a 32-bit lane:
//   packed [ceil(N/16), steps, 16] uint32: steps = groups * G / PF, lane c of
//          step s holds column c's k = s * PF + j at bits j * BITS (unsigned);
//   scales [ceil(N/16), groups, 16] float32; zeros [ceil(N/16), groups, 16] uint8;
// groups = ceil(K / G) and W[n, k] = (q[n, k] - zero[n, g]) * scale[n, g],
// g = k / G. Columns past N and k past K are zero-padded.
#pragma once

#include <stdint.h>

#include "kernels.h"

namespace engine_cpu {

struct WNA16Table {
  const char* isa;
  // out[m, :N] = x[m, :K] @ W^T, in float32 (bfloat16 x converted), out rounded
  // once to its dtype. For few rows (decode): the weight is read once a call.
  void (*linear)(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
                 const float* scales, const uint8_t* zeros, int64_t M, int64_t N, int64_t K,
                 int64_t group_size, int64_t ldx, int64_t ldo);
  // wt[k, n] = W[n, k] ([K, N] contiguous, rounded once to dt): the panel for
  // a large-M GEMM (prefill), run by torch.
  void (*dequant)(DType dt, int bits, void* wt, const uint32_t* packed, const float* scales,
                  const uint8_t* zeros, int64_t N, int64_t K, int64_t group_size);
  // linear with AMX tiles, bfloat16 only (avx512_bf16 path; null elsewhere),
  // for a CPU the caller has checked; false (nothing written) where it does
  // not run: float32, a group size not a multiple of 32, no tile state.
  bool (*linear_amx)(DType dt, int bits, void* out, const void* x, const uint32_t* packed,
                     const float* scales, const uint8_t* zeros, int64_t M, int64_t N, int64_t K,
                     int64_t group_size, int64_t ldx, int64_t ldo);
  // the weight in the panel kernel's layout (linear_impl.h): k_pack 1,
  // [ceil(N/16), K, 16]; k_pack 2 (bfloat16 only), [ceil(N/16), ceil(K/2), 16]
  // k pairs; the B of a large-M GEMM by the engine's own panel kernel.
  void (*dequant_panels)(DType dt, int bits, int k_pack, void* wp, const uint32_t* packed,
                         const float* scales, const uint8_t* zeros, int64_t N, int64_t K,
                         int64_t group_size);
};

// Defined by wna16_impl.cpp for the x86 ISAs CMake compiles (ENGINE_HAS_*).
const WNA16Table* wna16_avx2();
const WNA16Table* wna16_avx512();
const WNA16Table* wna16_avx512_bf16();

}  // namespace engine_cpu
