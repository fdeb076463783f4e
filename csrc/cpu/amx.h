// What the AMX kernels (int8_linear_impl.h, prefill_attention_amx.h,
// wna16_impl.cpp) share. Internal linkage (kernels.h says why): each ISA's
// translation unit has its own copy.
#pragma once

#include <stdint.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace engine::cpu {
namespace {

#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && \
    defined(__linux__)
#define ENGINE_HAS_AMX 1
// Linux hands out the AMX tile data state only to a process that asks
// (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); once is enough for all threads.
inline bool amx_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

struct alignas(64) AmxConfig {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
#endif

}  // namespace
}  // namespace engine::cpu
