# The CPU kernels written once for every architecture (portable loops the
# compiler vectorizes per ISA), compiled into each ISA's objects beside the
# architecture's own. Read by cmake/cpu.cmake (the extension) and
# tests/native/CMakeLists.txt (the torch-free kernel check).
set(VLLM_CPU_PORTABLE_KERNEL_SRC
    "${CMAKE_CURRENT_LIST_DIR}/../csrc/cpu/lora_impl.cpp")  # the LoRA term (punica's bgmv)
