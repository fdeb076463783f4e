// What the AMX kernels (int8_linear_impl.h, prefill_attention_amx.h,
// wna16_impl.cpp) share, and the per-thread scratch buffers. Internal linkage
// (kernels.h says why): each ISA's translation unit has its own copy.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace engine_cpu {
namespace {

// A grow-only, 64-byte-aligned buffer per calling thread and slot. A prefill's
// activations are megabytes: from malloc they would be a fresh mapping every
// call, and its first touch would cost more than the product.
inline void* scratch(int slot, size_t bytes) {
  struct Buf {
    void* p = nullptr;
    size_t n = 0;
    ~Buf() { free(p); }
  };
  static thread_local Buf bufs[4];
  Buf& b = bufs[slot];
  if (b.n < bytes) {
    free(b.p);
    b.n = (bytes + 63) / 64 * 64;
    b.p = aligned_alloc(64, b.n);
  }
  return b.p;
}

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
}  // namespace engine_cpu
