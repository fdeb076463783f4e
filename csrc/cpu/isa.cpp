// Run-time choice of the kernel table. Compiled for the baseline ISA so that
// it runs (and can refuse politely) on any x86-64 processor.
#include <c10/util/Exception.h>

#include <atomic>
#include <string>

#include "../ops.h"
#include "dispatch.h"
#include "kernels.h"
#if defined(__aarch64__)
#include <sys/auxv.h>

#include "arm/kernels_arm.h"
#endif

namespace engine {
namespace cpu {
namespace {

#if defined(__x86_64__)
bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
// __builtin_cpu_supports also checks that the OS saves the ZMM state.
bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  // Every CPU with AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4) has
  // AVX512_VNNI too; the path is compiled with both (cmake/cpu.cmake).
  return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16") &&
         __builtin_cpu_supports("avx512vnni");
}
#endif

#if defined(__aarch64__)
// The kernel asks the CPU (ID_AA64ISAR1_EL1.BF16) and reports it in HWCAP2.
bool cpu_has_bf16() {
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1 << 14)
#endif
  return (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
}
#endif

const KernelTable* table_for(const std::string& name) {
#ifdef ENGINE_HAS_AVX512_BF16
  if (name == "avx512_bf16") {
    TORCH_CHECK(cpu_has_avx512_bf16(),
                "the avx512_bf16 kernels were requested but this processor does not "
                "support AVX512_BF16; unset VLLM_CPU_ISA or set it to avx512 or avx2");
    return kernels_avx512_bf16();
  }
#endif
#ifdef ENGINE_HAS_AVX512
  if (name == "avx512") {
    TORCH_CHECK(cpu_has_avx512(),
                "the avx512 kernels were requested but this processor does not "
                "support AVX-512 (F/BW/VL/DQ); unset VLLM_CPU_ISA or set it to avx2");
    return kernels_avx512();
  }
#endif
#ifdef ENGINE_HAS_AVX2
  if (name == "avx2") {
    TORCH_CHECK(cpu_has_avx2(),
                "this processor lacks AVX2/FMA, which the x86 build of vllm-engine needs "
                "at least; use a machine with AVX2 or VLLM_TARGET_DEVICE=empty");
    return kernels_avx2();
  }
#endif
#ifdef ENGINE_HAS_NEON_BF16
  if (name == "neon_bf16") {
    TORCH_CHECK(cpu_has_bf16(),
                "the neon_bf16 kernels were requested but this processor lacks the BF16 "
                "extension; unset VLLM_CPU_ISA or set it to neon");
    return kernels_neon_bf16();
  }
#endif
#ifdef ENGINE_HAS_NEON
  if (name == "neon") return kernels_neon();
#endif
#ifdef ENGINE_HAS_GENERIC
  if (name == "generic") return kernels_generic();
#endif
  TORCH_CHECK(false, "CPU ISA '", name, "' is not compiled into this build of vllm-engine; "
              "valid values: auto, ", compiled_isas());
}

const KernelTable* auto_table() {
#ifdef ENGINE_HAS_AVX512_BF16
  if (cpu_has_avx512_bf16()) return kernels_avx512_bf16();
#endif
#ifdef ENGINE_HAS_AVX512
  if (cpu_has_avx512()) return kernels_avx512();
#endif
#ifdef ENGINE_HAS_NEON_BF16
  if (cpu_has_bf16()) return kernels_neon_bf16();
#endif
#ifdef ENGINE_HAS_AVX2
  return table_for("avx2");
#elif defined(ENGINE_HAS_NEON)
  return kernels_neon();
#elif defined(ENGINE_HAS_GENERIC)
  return kernels_generic();
#else
  TORCH_CHECK(false, "no CPU kernels usable on this processor were compiled in");
#endif
}

std::atomic<const KernelTable*> current{nullptr};

}  // namespace

const KernelTable& kernels() {
  const KernelTable* t = current.load(std::memory_order_acquire);
  if (t == nullptr) {
    t = auto_table();
    current.store(t, std::memory_order_release);
  }
  return *t;
}

std::string isa() { return kernels().isa; }

// Only the avx512_bf16 table has it, and that table is only ever chosen on a
// CPU with AVX512_BF16 (table_for checks).
bool has_linear_bf16_pairs() { return kernels().linear_bf16_pairs != nullptr; }

std::string select_isa(const std::string& name) {
  const KernelTable* t = name == "auto" ? auto_table() : table_for(name);
  current.store(t, std::memory_order_release);
  return t->isa;
}

std::string compiled_isas() {
  std::string out;
  auto add = [&out](const char* s) { out += out.empty() ? s : std::string(",") + s; };
#ifdef ENGINE_HAS_AVX512_BF16
  add("avx512_bf16");
#endif
#ifdef ENGINE_HAS_AVX512
  add("avx512");
#endif
#ifdef ENGINE_HAS_AVX2
  add("avx2");
#endif
#ifdef ENGINE_HAS_NEON_BF16
  add("neon_bf16");
#endif
#ifdef ENGINE_HAS_NEON
  add("neon");
#endif
#ifdef ENGINE_HAS_GENERIC
  add("generic");
#endif
  return out;
}

}  // namespace cpu
}  // namespace engine
