# Torch for a cross build: the target's torch cannot be imported by the Python
# running the build, so its headers and libraries are taken from an unpacked
# wheel, VLLM_TORCH_ROOT (the `torch` folder of site-packages). The CPU kernels
# need torch's CPU library and c10 only; linking libtorch.so would also pull in
# what a CUDA build of torch links (PyPI's aarch64 torch is one).
if(NOT EXISTS "${VLLM_TORCH_ROOT}/include/torch/library.h")
  message(FATAL_ERROR "vllm-engine: VLLM_TORCH_ROOT=${VLLM_TORCH_ROOT} holds no torch headers; "
                      "point it at the torch folder of an unpacked torch wheel for the target")
endif()
file(STRINGS "${VLLM_TORCH_ROOT}/version.py" _torch_version_line REGEX "^__version__")
string(REGEX REPLACE "^__version__ = '([^']*)'.*$" "\\1" VLLM_TORCH_VERSION "${_torch_version_line}")
add_library(torch INTERFACE IMPORTED)
set_target_properties(torch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES
    "${VLLM_TORCH_ROOT}/include;${VLLM_TORCH_ROOT}/include/torch/csrc/api/include"
  INTERFACE_LINK_LIBRARIES
    "${VLLM_TORCH_ROOT}/lib/libtorch_cpu.so;${VLLM_TORCH_ROOT}/lib/libc10.so"
  INTERFACE_LINK_OPTIONS "-Wl,-rpath-link,${VLLM_TORCH_ROOT}/lib")
message(STATUS "vllm-engine: torch ${VLLM_TORCH_VERSION} from ${VLLM_TORCH_ROOT} (cross build)")
