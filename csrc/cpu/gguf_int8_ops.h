// Declarations of GGUF's int8-activation linear op (gguf_int8_ops.cpp); its
// schema is in torch_bindings.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace engine {
namespace cpu {
// Whether the CPU code path in use has the kernel (x86 AVX2/AVX-512).
bool has_gguf_int8_linear();
void gguf_int8_linear(at::Tensor& out, const at::Tensor& input, const at::Tensor& packed_weight,
                      const std::optional<at::Tensor>& high_bits, const at::Tensor& terms,
                      int64_t bits, int64_t group_size, int64_t zero);
}  // namespace cpu
}  // namespace engine
