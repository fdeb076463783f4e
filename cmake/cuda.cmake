# CUDA kernels (csrc/cuda/). torch's CMake config turns TORCH_CUDA_ARCH_LIST
# into -gencode flags; its own default list includes compute_50, which CUDA 13
# rejects, so a default suited to the toolkit is set before torch is found.
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "vllm-engine: VLLM_TARGET_DEVICE=cuda needs the CUDA compiler 'nvcc' "
                      "(put it on PATH or set CUDACXX); it was not found.")
endif()
enable_language(CUDA)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 11.3)
  message(FATAL_ERROR "vllm-engine: CUDA builds need GCC >= 11.3 (found ${CMAKE_CXX_COMPILER_VERSION})")
endif()

if("$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
  if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13)
    set(ENV{TORCH_CUDA_ARCH_LIST} "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX")
  else()
    set(ENV{TORCH_CUDA_ARCH_LIST} "7.0;7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX")
  endif()
endif()
message(STATUS "vllm-engine: TORCH_CUDA_ARCH_LIST=$ENV{TORCH_CUDA_ARCH_LIST}")

# torch's config still uses the legacy FindCUDA, which guesses the toolkit from
# the nvcc on PATH and misses when that is a wrapper script; point it at the
# toolkit CMake's own CUDA detection found.
if(NOT EXISTS "${CUDA_TOOLKIT_ROOT_DIR}/include/cuda_runtime.h")
  set(CUDA_TOOLKIT_ROOT_DIR "${CMAKE_CUDA_COMPILER_TOOLKIT_ROOT}" CACHE PATH "CUDA toolkit" FORCE)
endif()
find_package(Torch REQUIRED)
if(NOT TARGET torch_cuda)
  message(FATAL_ERROR "vllm-engine: the torch in this build environment (${VLLM_TORCH_VERSION}) "
                      "is not a CUDA build; install requirements/build/${VLLM_VARIANT}.txt")
endif()

target_sources(_C PRIVATE csrc/cuda/cuda_ops.cu)
target_compile_definitions(_C PRIVATE ENGINE_WITH_CUDA_KERNELS)
# Architectures come from torch's -gencode flags, not from CMake's default.
set_target_properties(_C PROPERTIES CUDA_ARCHITECTURES OFF)
string(REPLACE ";" "," _archs "$ENV{TORCH_CUDA_ARCH_LIST}")
list(APPEND VLLM_CODE_PATHS "cuda-${_archs}")
