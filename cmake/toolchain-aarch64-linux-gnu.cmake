# Cross-compiling for AArch64 Linux on another host (ci/build-wheel.sh --arch
# aarch64): Debian's g++-aarch64-linux-gnu (ci/setup-aarch64.sh installs it).
# No sysroot is searched: torch comes from VLLM_TORCH_ROOT (cmake/torch_root.cmake)
# and the Python headers of the limited API are the same for every architecture.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(_triple aarch64-linux-gnu)
if(DEFINED ENV{VLLM_AARCH64_CROSS_PREFIX})
  set(_triple "$ENV{VLLM_AARCH64_CROSS_PREFIX}")
endif()
find_program(CMAKE_C_COMPILER ${_triple}-gcc)
find_program(CMAKE_CXX_COMPILER ${_triple}-g++)
if(NOT CMAKE_CXX_COMPILER)
  message(FATAL_ERROR "vllm-engine: ${_triple}-g++ not found; run 'bash ci/setup-aarch64.sh' "
                      "(or apt-get install g++-aarch64-linux-gnu)")
endif()
# try_run and tests of the build run the target's programs under user-mode qemu.
find_program(_qemu qemu-aarch64-static)
if(_qemu)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${_qemu};-L;/usr/${_triple}")
endif()
