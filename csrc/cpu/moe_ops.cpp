// Torch-facing fused MoE op: validate, then call the kernel table in use.
#include "../op_checks.h"
#include "../ops.h"
#include "dispatch.h"

namespace engine {
namespace cpu {

using namespace engine::checks;

bool has_fused_moe() { return kernels().fused_moe != nullptr; }

namespace {
// A packed expert stack [E, ceil(rows/16), steps, 16 * kp] with k = cols.
void check_experts(const at::Tensor& w, const at::Tensor& input, int64_t E, int64_t rows,
                   int64_t cols, int64_t kp, const char* op, const char* name) {
  const int64_t panels = (rows + kPanel - 1) / kPanel, steps = (cols + kp - 1) / kp;
  TORCH_CHECK_VALUE(w.dim() == 4 && w.size(0) == E && w.size(1) == panels &&
                        w.size(2) == steps && w.size(3) == kPanel * kp && w.is_contiguous(),
                    op, ": ", name, " must be contiguous [", E, ", ", panels, ", ", steps, ", ",
                    kPanel * kp, "] (engine.model_executor.layers.fused_moe.pack_experts), got ",
                    "shape ", w.sizes());
  check_like(w, input, op, name, "input");
}
}  // namespace

void fused_moe(at::Tensor& out, const at::Tensor& input, const at::Tensor& w13,
               const at::Tensor& w2, const at::Tensor& topk_weights,
               const at::Tensor& topk_ids, int64_t intermediate) {
  const char* op = "fused_moe";
  auto dt = dtype_of(input, at::kCPU, op, "input");
  check_like(out, input, op, "out", "input");
  check_matrix_input(input, op);
  const int64_t T = input.size(0), H = input.size(1), I = intermediate;
  TORCH_CHECK_VALUE(out.dim() == 2 && out.size(0) == T && out.size(1) == H && out.stride(1) == 1,
                    op, ": out must be [", T, ", ", H, "] with a contiguous last dimension, got ",
                    "shape ", out.sizes());
  TORCH_CHECK_VALUE(I > 0, op, ": intermediate must be positive, got ", I);
  TORCH_CHECK_VALUE(w13.dim() == 4 && w13.size(3) > 0, op, ": w13 must be 4-D, got shape ",
                    w13.sizes());
  const int64_t E = w13.size(0), kp = w13.size(3) / kPanel;
  TORCH_CHECK_VALUE(kp == 1 || (kp == 2 && dt == at::kBFloat16), op,
                    ": experts packed in k pairs are bfloat16 only, got ", dt);
  check_experts(w13, input, E, 2 * I, H, kp, op, "w13");
  check_experts(w2, input, E, H, I, kp, op, "w2");
  check_index_tensor(topk_ids, input, at::kInt, 2, op, "topk_ids");
  TORCH_CHECK_VALUE(topk_ids.size(0) == T, op, ": topk_ids must have ", T, " rows, got shape ",
                    topk_ids.sizes());
  check_index_tensor(topk_weights, input, at::kFloat, 2, op, "topk_weights");
  TORCH_CHECK_VALUE(topk_weights.sizes() == topk_ids.sizes(), op, ": topk_weights has shape ",
                    topk_weights.sizes(), " but topk_ids has ", topk_ids.sizes());
  check_range(topk_ids, 0, E, op, "topk_ids (experts)");
  const auto& table = kernels();
  TORCH_CHECK(table.fused_moe != nullptr, op, ": the ", table.isa,
              " kernels have no fused_moe; use engine.reference.fused_moe");
  TORCH_CHECK_VALUE(kp == 1 || table.linear_bf16_pairs != nullptr, op, ": the experts are packed "
                    "in k pairs for AVX512_BF16, which the ", table.isa, " code path lacks");
  if (T == 0 || topk_ids.size(1) == 0) {
    out.zero_();
    return;
  }
  check_scratch(table.fused_moe(dt == at::kFloat ? DType::kFloat32 : DType::kBFloat16, kp == 2,
                                out.data_ptr(), input.const_data_ptr(), w13.const_data_ptr(),
                                w2.const_data_ptr(), topk_weights.const_data_ptr<float>(),
                                topk_ids.const_data_ptr<int32_t>(), T, H, I, E, topk_ids.size(1),
                                input.stride(0), out.stride(0)),
                op);
}

}  // namespace cpu
}  // namespace engine
