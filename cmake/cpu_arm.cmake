# The AArch64 CPU kernels: one source compiled once per ISA. Read by
# cmake/cpu.cmake (the extension) and tests/native/CMakeLists.txt (the
# torch-free kernel check), so both build exactly the same objects.
set(VLLM_ARM_KERNEL_SRC "${CMAKE_CURRENT_LIST_DIR}/../csrc/cpu/arm/kernels_neon.cpp"
                        "${CMAKE_CURRENT_LIST_DIR}/../csrc/cpu/gguf_int8_impl.cpp")
set(VLLM_ARM_ISAS neon neon_bf16)
set(VLLM_ARM_FLAGS_neon -march=armv8-a)
# +dotprod: GGUF's int8 products (SDOT); every CPU with BF16 has it, and
# csrc/cpu/isa.cpp picks this table only where the CPU reports both
set(VLLM_ARM_FLAGS_neon_bf16 -march=armv8.2-a+bf16+dotprod)
