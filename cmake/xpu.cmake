# XPU kernels are not written yet; stop at once, naming what is missing.
find_program(VLLM_ICPX icpx)
if(NOT VLLM_ICPX)
  message(FATAL_ERROR "vllm-engine: VLLM_TARGET_DEVICE=xpu needs Intel's SYCL compiler 'icpx' "
                      "(oneAPI DPC++); it was not found.")
endif()
message(FATAL_ERROR "vllm-engine: the xpu kernels (csrc/xpu/) do not exist yet; "
                    "build the cpu variant or use a precompiled wheel.")
