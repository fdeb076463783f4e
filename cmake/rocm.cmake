# ROCm kernels are not written yet; stop before anything is compiled, naming
# what is missing, rather than half-way through a build.
find_program(VLLM_HIPCC hipcc HINTS "$ENV{ROCM_PATH}/bin" /opt/rocm/bin)
if(NOT VLLM_HIPCC)
  message(FATAL_ERROR "vllm-engine: VLLM_TARGET_DEVICE=rocm needs the ROCm compiler 'hipcc' "
                      "(set ROCM_PATH or install ROCm); it was not found.")
endif()
message(FATAL_ERROR "vllm-engine: the rocm kernels (csrc/rocm/) do not exist yet; "
                    "build the cpu variant or use a precompiled wheel.")
