// GGUF's quantized linear layers for few rows (decode) with int8 activations,
// as llama.cpp multiplies them: gguf_int8_impl.cpp's entry point, once per x86
// ISA in a namespace of its own (gguf_int8_avx2, gguf_int8_avx512, ...), which
// kernels_impl.cpp puts in that ISA's KernelTable. Kernel translation units only.
//
// The weight (GgufInt8Weight, packed at load by engine.model_executor.layers.
// quantization.gguf_int8), as many bits a value as the file's blocks:
//   packed [ceil(N/16), steps, 16] uint32, wna16.h's layout: lane c of step s
//          holds column c's k = s * PF + j at bits j * B, B = 8 for 8-bit
//          values, else 4 (their low 4 bits), PF = 32 / B;
//   high   [ceil(N/16), chunks, 16] uint32, 5- and 6-bit values only: their
//          bits above 4 (H = bits - 4 each), a lane a column and chunk of
//          32 / H k: byte j of the lane, at bit 2H * t, holds k = 8t + 2j's
//          and at bit 2H * t + H k = 8t + 2j + 1's (t: the chunk's 8-k step),
//          so that a step's bits are one shift and mask from a nibble's place;
//   terms  [ceil(N/16), groups, T, 16] float16: [.., 0, c] = scale[n, g]; with
//          T = 2, [.., 1, c] = min[n, g] - scale[n, g] * zero[n, g], with T = 1
//          the zero point is the layer's one `zero` and there is no min.
// W[n, k] = q * scale + term (T = 2) or (q - zero) * scale (T = 1), and over a
// group x . W = scale * (x . q) + term * sum(x), or scale * (x . q - zero * sum(x)).
// x is quantized per row and group to int8 (scale max|x| / 127, round to
// nearest even, as llama.cpp's q8_0): x . q is then an integer dot product.
#pragma once

#include <stdint.h>

#include "kernels.h"
#include "scalar.h"

#ifndef ENGINE_ISA
#error "gguf_int8.h is for the kernel translation units (ENGINE_ISA set)"
#endif

namespace engine::cpu::ENGINE_CAT(gguf_int8_, ENGINE_ISA) {

int64_t linear(DType dt, const GgufInt8Weight& w, void* out, const void* x, int64_t M,
               int64_t ldx, int64_t ldo);

}  // namespace engine::cpu::ENGINE_CAT(gguf_int8_, ENGINE_ISA)
