// Kernel memory, every allocation checked. A kernel cannot throw (it is
// compiled without torch and may sit inside an OpenMP region), so a refused
// allocation becomes a null pointer plus the bytes asked for, which the kernel
// returns to the glue and the glue raises (cpu_ops.cpp, check_scratch).
// Internal linkage (kernels.h says why): each ISA's translation unit has its own copy.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

namespace engine::cpu {
namespace {

constexpr size_t round_up64(size_t n) { return (n + 63) / 64 * 64; }

// A grow-only, 64-byte-aligned buffer per calling thread and slot. A prefill's
// activations are megabytes: from malloc they would be a fresh mapping every
// call, and its first touch would cost more than the product. Null when the
// buffer could not grow (it is then empty, and the next call tries again).
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
    b.n = round_up64(bytes);
    b.p = aligned_alloc(64, b.n);
    if (b.p == nullptr) b.n = 0;
  }
  return b.p;
}

// The heap blocks of one call (or of one thread in a parallel region), 64-byte
// aligned and freed together. A refused block is null and its size is kept in
// failed(), so that a kernel allocates everything and then checks once.
class Allocs {
 public:
  Allocs() = default;
  Allocs(const Allocs&) = delete;
  Allocs& operator=(const Allocs&) = delete;
  ~Allocs() {
    for (int i = 0; i < n_; ++i) free(blocks_[i]);
  }
  template <typename T>
  T* get(int64_t count) {
    const size_t bytes = round_up64(sizeof(T) * static_cast<size_t>(count > 0 ? count : 1));
    void* p = n_ < kMax ? aligned_alloc(64, bytes) : nullptr;
    if (p == nullptr) {
      if (failed_ == 0) failed_ = static_cast<int64_t>(bytes);
      return nullptr;
    }
    blocks_[n_++] = p;
    return static_cast<T*>(p);
  }
  int64_t failed() const { return failed_; }

 private:
  static constexpr int kMax = 16;
  void* blocks_[kMax];
  int n_ = 0;
  int64_t failed_ = 0;
};

// Inside a parallel region an error cannot leave: a thread whose allocation
// failed records the bytes in the kernel's `failed` and skips its share.
inline void note_failed(int64_t& failed, int64_t bytes) {
#pragma omp atomic write
  failed = bytes;
}

}  // namespace
}  // namespace engine::cpu
