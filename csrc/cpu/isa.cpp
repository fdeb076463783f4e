// Run-time choice of the kernel table. Compiled for the baseline ISA so that
// it runs (and can refuse politely) on any x86-64 processor.
#include <c10/util/Exception.h>

#include <atomic>
#include <iterator>
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
// The kernel asks the CPU (ID_AA64ISAR1_EL1.BF16, ID_AA64ISAR0_EL1.DP) and
// reports it in HWCAP2 / HWCAP. The neon_bf16 table is built +dotprod too
// (GGUF's int8 products): every CPU with BF16 has it, and this checks.
bool cpu_has_bf16() {
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1 << 14)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
  return (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0 && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
}
#endif

// The compiled tables, preferred first: auto takes the first this CPU runs; a
// name takes its own entry, refused (with `missing`) on a CPU that lacks it.
struct Isa {
  const char* name;
  const KernelTable* (*table)();
  bool (*supported)();  // nullptr: every CPU of the architecture
  const char* missing;  // why this CPU cannot run it
};
const Isa kIsas[] = {
#ifdef ENGINE_HAS_AVX512_BF16
    {"avx512_bf16", kernels_avx512_bf16, cpu_has_avx512_bf16,
     "the avx512_bf16 kernels were requested but this processor does not "
     "support AVX512_BF16; unset VLLM_CPU_ISA or set it to avx512 or avx2"},
#endif
#ifdef ENGINE_HAS_AVX512
    {"avx512", kernels_avx512, cpu_has_avx512,
     "the avx512 kernels were requested but this processor does not "
     "support AVX-512 (F/BW/VL/DQ); unset VLLM_CPU_ISA or set it to avx2"},
#endif
#ifdef ENGINE_HAS_AVX2
    {"avx2", kernels_avx2, cpu_has_avx2,
     "this processor lacks AVX2/FMA, which the x86 build of vllm-engine needs "
     "at least; use a machine with AVX2 or VLLM_TARGET_DEVICE=empty"},
#endif
#ifdef ENGINE_HAS_NEON_BF16
    {"neon_bf16", kernels_neon_bf16, cpu_has_bf16,
     "the neon_bf16 kernels were requested but this processor lacks the BF16 "
     "or the dot product extension; unset VLLM_CPU_ISA or set it to neon"},
#endif
#ifdef ENGINE_HAS_NEON
    {"neon", kernels_neon, nullptr, ""},
#endif
#ifdef ENGINE_HAS_GENERIC
    {"generic", kernels_generic, nullptr, ""},
#endif
};

const KernelTable* table_for(const std::string& name) {
  for (const Isa& e : kIsas) {
    if (name != e.name) continue;
    TORCH_CHECK(e.supported == nullptr || e.supported(), e.missing);
    return e.table();
  }
  TORCH_CHECK(false, "CPU ISA '", name, "' is not compiled into this build of vllm-engine; "
              "valid values: auto, ", compiled_isas());
}

// The first table this CPU runs; where none, the last one's refusal (x86:
// AVX2 is the least the build needs).
const KernelTable* auto_table() {
  for (const Isa& e : kIsas)
    if (e.supported == nullptr || e.supported()) return e.table();
  return table_for(std::end(kIsas)[-1].name);
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
  for (const Isa& e : kIsas) out += (out.empty() ? "" : ",") + std::string(e.name);
  return out;
}

}  // namespace cpu
}  // namespace engine
