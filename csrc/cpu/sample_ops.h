// Declaration of greedy sampling's argmax op (sample_ops.cpp); its schema is
// in torch_bindings.cpp.
#pragma once

#include <ATen/core/Tensor.h>

namespace engine {
namespace cpu {
void argmax_rows(at::Tensor& out, const at::Tensor& logits);
}  // namespace cpu
}  // namespace engine
