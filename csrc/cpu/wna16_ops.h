// Declarations of the weight-only quantized linear ops (wna16_ops.cpp); their
// schemas are in torch_bindings.cpp.
#pragma once

#include <ATen/core/Tensor.h>

namespace engine {
namespace cpu {
// Whether the CPU code path in use has the wna16 kernels (x86 AVX2/AVX-512).
bool has_wna16_linear();
void wna16_linear(at::Tensor& out, const at::Tensor& input, const at::Tensor& packed_weight,
                  const at::Tensor& scales, const at::Tensor& zeros, int64_t bits,
                  int64_t group_size);
void wna16_dequant(at::Tensor& out, const at::Tensor& packed_weight, const at::Tensor& scales,
                   const at::Tensor& zeros, int64_t bits, int64_t group_size);
void wna16_dequant_panels(at::Tensor& out, const at::Tensor& packed_weight,
                          const at::Tensor& scales, const at::Tensor& zeros, int64_t bits,
                          int64_t group_size, int64_t n, int64_t k);
}  // namespace cpu
}  // namespace engine
