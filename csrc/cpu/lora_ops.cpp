// Torch-facing LoRA term op (punica's bgmv for few tokens): check every
// argument, then call the kernel of the table in use (lora_impl.cpp, compiled
// for every code path). engine.lora.layers calls it; engine.reference has the
// same term in torch.
#include <c10/util/Exception.h>

#include "../op_checks.h"
#include "dispatch.h"
#include "lora_ops.h"

namespace engine {
namespace cpu {

void lora_add(at::Tensor& out, const at::Tensor& input, const at::Tensor& lora_a,
              const at::Tensor& lora_bt, const at::Tensor& token_slot, const at::Tensor& ranks,
              c10::IntArrayRef bounds) {
  const char* op = "lora_add";
  auto dt = checks::dtype_of(input, at::kCPU, op, "input");
  checks::check_like(out, input, op, "out", "input");
  checks::check_like(lora_a, input, op, "lora_a", "input");
  checks::check_like(lora_bt, input, op, "lora_bt", "input");
  checks::check_matrix_input(input, op);
  checks::check_matrix_out(out, input, op);
  const int64_t T = input.size(0), K = input.size(1), N = out.size(1);
  const int64_t S = static_cast<int64_t>(bounds.size()) - 1;
  TORCH_CHECK_VALUE(S >= 1 && bounds[0] == 0 && bounds[S] == N, op, ": bounds must run from 0 "
                    "to out's ", N, " columns, one slice a step, got ", bounds);
  for (int64_t j = 0; j < S; ++j)
    TORCH_CHECK_VALUE(bounds[j] <= bounds[j + 1], op, ": bounds must not decrease, got ", bounds);
  TORCH_CHECK_VALUE(lora_a.dim() == 4 && lora_a.is_contiguous() && lora_a.size(1) == S &&
                        lora_a.size(3) == K,
                    op, ": lora_a must be contiguous [max_loras, ", S, ", max_rank, ", K,
                    "], got ", lora_a.sizes());
  const int64_t L = lora_a.size(0), R = lora_a.size(2);
  TORCH_CHECK_VALUE(lora_bt.dim() == 3 && lora_bt.is_contiguous() &&
                        lora_bt.sizes() == at::IntArrayRef({L, R, N}),
                    op, ": lora_bt must be contiguous [", L, ", ", R, ", ", N, "], got ",
                    lora_bt.sizes());
  checks::check_index_tensor(token_slot, input, at::kInt, 1, op, "token_slot");
  checks::check_index_tensor(ranks, input, at::kInt, 1, op, "ranks");
  TORCH_CHECK_VALUE(token_slot.size(0) == T && ranks.size(0) == L, op, ": token_slot must have ",
                    T, " entries (input's rows) and ranks ", L, " (max_loras), got ",
                    token_slot.size(0), " and ", ranks.size(0));
  checks::check_range(token_slot, -1, L, op, "token_slot values");
  checks::check_range(ranks, 0, R + 1, op, "ranks");
  if (T == 0 || N == 0) return;
  check_scratch(kernels().lora_add(dt == at::kFloat ? DType::kFloat32 : DType::kBFloat16,
                                   out.data_ptr(), input.const_data_ptr(),
                                   lora_a.const_data_ptr(), lora_bt.const_data_ptr(),
                                   token_slot.const_data_ptr<int32_t>(),
                                   ranks.const_data_ptr<int32_t>(), bounds.data(), T, S, R, K,
                                   input.stride(0), out.stride(0)),
                op);
}

}  // namespace cpu
}  // namespace engine
