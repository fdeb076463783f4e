# CPU kernels. On x86-64, csrc/cpu/kernels_impl.cpp is compiled once for AVX2,
# once for AVX-512 and once for AVX-512 with AVX512_BF16, and the library
# picks at run time (csrc/cpu/isa.cpp);
# on AArch64 csrc/cpu/arm/kernels_neon.cpp is compiled for NEON and NEON+BF16;
# elsewhere kernels_impl.cpp is compiled once for the baseline ISA ("generic").
if(NOT TARGET torch)  # a cross build has it already (cmake/torch_root.cmake)
  find_package(Torch REQUIRED)
endif()
find_package(OpenMP REQUIRED COMPONENTS CXX)

option(VLLM_CPU_DISABLE_AVX512 "leave the AVX-512 code path out" OFF)
if(DEFINED ENV{VLLM_CPU_DISABLE_AVX512} AND "$ENV{VLLM_CPU_DISABLE_AVX512}" MATCHES "^(1|true|TRUE|True|yes|on|ON)$")
  set(VLLM_CPU_DISABLE_AVX512 ON)
endif()

if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 12)
  message(FATAL_ERROR "vllm-engine: CPU builds need GCC >= 12 (found ${CMAKE_CXX_COMPILER_VERSION})")
endif()

set(_kernel_src csrc/cpu/kernels_impl.cpp)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(_isas avx2)
  set(_flags_avx2 -mavx2 -mfma -mf16c)
  if(NOT VLLM_CPU_DISABLE_AVX512)
    # avx512_bf16: the same kernels where the CPU also has AVX512_BF16 (Zen 4,
    # Cooper Lake, Sapphire Rapids): one instruction rounds two float vectors
    # to bfloat16, and bfloat16 linear layers use its dot products. Those CPUs
    # all have AVX512_VNNI too, which the int8 linear layers use.
    list(APPEND _isas avx512 avx512_bf16)
    set(_flags_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c
                      -mprefer-vector-width=512)
    set(_flags_avx512_bf16 ${_flags_avx512} -mavx512bf16 -mavx512vnni)
  endif()
  # weight-only quantized linear layers (W4A16, W8A16), x86 only
  list(APPEND _kernel_src csrc/cpu/wna16_impl.cpp)
  # GGUF's layers on int8 dot products (AArch64: cmake/cpu_arm.cmake adds it)
  list(APPEND _kernel_src csrc/cpu/gguf_int8_impl.cpp)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
  include(cmake/cpu_arm.cmake)
  set(_isas ${VLLM_ARM_ISAS})
  set(_kernel_src ${VLLM_ARM_KERNEL_SRC})
  foreach(_isa IN LISTS _isas)
    set(_flags_${_isa} ${VLLM_ARM_FLAGS_${_isa}})
  endforeach()
  target_sources(_C PRIVATE csrc/cpu/arm/glibc_compat.c)
else()
  set(_isas generic)
  set(_flags_generic "")
endif()
include(cmake/cpu_portable.cmake)
list(APPEND _kernel_src ${VLLM_CPU_PORTABLE_KERNEL_SRC})

foreach(_isa IN LISTS _isas)
  # Kernels include no torch header: they must not share inline code with the
  # baseline-compiled glue (see csrc/cpu/kernels.h).
  add_library(_kernels_${_isa} OBJECT ${_kernel_src})
  target_compile_definitions(_kernels_${_isa} PRIVATE ENGINE_ISA=${_isa})
  target_compile_options(_kernels_${_isa} PRIVATE -O3 -fno-math-errno -fno-trapping-math
                                                   ${_flags_${_isa}} ${OpenMP_CXX_FLAGS})
  target_sources(_C PRIVATE $<TARGET_OBJECTS:_kernels_${_isa}>)
  string(TOUPPER "${_isa}" _ISA)
  target_compile_definitions(_C PRIVATE ENGINE_HAS_${_ISA})
  list(APPEND VLLM_CODE_PATHS "cpu-${_isa}")
endforeach()

target_sources(_C PRIVATE csrc/cpu/cpu_ops.cpp csrc/cpu/moe_ops.cpp csrc/cpu/isa.cpp)
target_sources(_C PRIVATE csrc/cpu/wna16_ops.cpp csrc/cpu/gguf_int8_ops.cpp csrc/cpu/lora_ops.cpp
                          csrc/cpu/sample_ops.cpp)
target_compile_definitions(_C PRIVATE ENGINE_WITH_CPU_KERNELS)
# OpenMP::OpenMP_CXX links libgomp.so.1 by soname: at run time that is the
# libgomp torch has already loaded, so there is one OpenMP thread pool.
target_link_libraries(_C PRIVATE OpenMP::OpenMP_CXX)
