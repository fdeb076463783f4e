#pragma once

#include "kernels.h"

namespace engine {
namespace cpu {
// The kernel table in use: chosen on first call from what the processor
// supports, or by select_isa().
const engine_cpu::KernelTable& kernels();
}  // namespace cpu
}  // namespace engine
