// The AArch64 kernel tables (csrc/cpu/arm/kernels_neon.cpp, compiled once per
// ISA). Which exist is decided by CMake: ENGINE_HAS_NEON / ENGINE_HAS_NEON_BF16.
#pragma once

#include "../kernels.h"

namespace engine::cpu {
const KernelTable* kernels_neon();
const KernelTable* kernels_neon_bf16();
}  // namespace engine::cpu
