// Declaration of the LoRA term op (lora_ops.cpp); its schema is in
// torch_bindings.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace engine {
namespace cpu {
void lora_add(at::Tensor& out, const at::Tensor& input, const at::Tensor& lora_a,
              const at::Tensor& lora_bt, const at::Tensor& token_slot, const at::Tensor& ranks,
              c10::IntArrayRef bounds);
}  // namespace cpu
}  // namespace engine
