// The glue's view of the kernels (compiled for the baseline ISA): the table in
// use and how a kernel's refused scratch becomes an error.
#pragma once

#include <c10/util/Exception.h>

#include "kernels.h"

namespace engine::cpu {
// The kernel table in use: chosen on first call from what the processor
// supports, or by select_isa().
const KernelTable& kernels();

// A kernel's return (kernels.h): 0, or the bytes it could not allocate, in
// which case nothing it wrote can be trusted.
inline void check_scratch(int64_t failed, const char* op) {
  TORCH_CHECK_WITH(OutOfMemoryError, failed == 0, op, ": a thread could not allocate ", failed,
                   " bytes of scratch; lower max_num_batched_tokens or max_model_len, or free "
                   "memory");
}
}  // namespace engine::cpu
