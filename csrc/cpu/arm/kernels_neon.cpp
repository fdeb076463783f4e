// AArch64 kernels: NEON for every op, float32 and bfloat16 (bf16 storage,
// fp32 math). CMake compiles this file twice, like kernels_impl.cpp on x86:
//   ENGINE_ISA=neon       baseline armv8-a (every AArch64 CPU has NEON);
//   ENGINE_ISA=neon_bf16  +bf16: BFCVTN for rounding to bf16; csrc/cpu/isa.cpp
//                         picks it at run time when HWCAP2_BF16 says the CPU
//                         has it.
// Same rules as kernels_impl.cpp (see kernels.h): only C headers, everything
// but the table getter has internal linkage, so no +bf16 instruction can leak
// into code the baseline build shares. The kernels and their entry points are
// x86's, written once (common_ops.h and the *_impl.h it includes) against the
// per-ISA vector types: NEON's are arm/cpu_types_arm.h, which cpu_types.h
// picks for this file by ENGINE_NEON_KERNELS.
#define ENGINE_NEON_KERNELS 1

#include "../kernels.h"
#include "../scalar.h"
#include "../common_ops.h"
#include "../gguf_int8.h"
#include "../lora.h"
#include "cpu_types_arm.h"

#include <stdint.h>

#ifndef ENGINE_ISA
#error "ENGINE_ISA must be defined (neon or neon_bf16)"
#endif
#if !defined(__aarch64__)
#error "kernels_neon.cpp is AArch64 only"
#endif

namespace engine::cpu {
namespace {

// Designated: the entries not named (no NEON kernel yet: the panel linear,
// prefill attention, the MoE and the other quantized layers) are null and
// their callers run torch or engine.reference. GGUF's layers run the int8
// kernel (gguf_int8_impl.cpp, compiled for each NEON ISA beside this file).
const KernelTable table = {
    .isa = ENGINE_STR(ENGINE_ISA),
    .rms_norm = rms_norm,
    .fused_add_rms_norm = fused_add_rms_norm,
    .silu_and_mul = silu_and_mul,
    .rotary_embedding = rotary_embedding,
    .reshape_and_cache = reshape_and_cache,
    .paged_attention = paged_attention,
    .gguf_int8_linear = ENGINE_CAT(gguf_int8_, ENGINE_ISA)::linear,
    .lora_add = ENGINE_CAT(lora_, ENGINE_ISA)::add,
};
}  // namespace

const KernelTable* ENGINE_CAT(kernels_, ENGINE_ISA)() { return &table; }

}  // namespace engine::cpu
