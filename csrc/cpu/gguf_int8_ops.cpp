// Torch-facing GGUF int8-activation linear op: check every argument, then call
// the kernel of the kernel table in use (gguf_int8_impl.cpp, once per x86 ISA).
// Elsewhere there is none and the layer runs wna16_linear
// (engine.model_executor.layers.quantization.gguf).
#include <c10/util/Exception.h>

#include "../op_checks.h"
#include "dispatch.h"
#include "gguf_int8_ops.h"

namespace engine {
namespace cpu {

bool has_gguf_int8_linear() { return kernels().gguf_int8_linear != nullptr; }

void gguf_int8_linear(at::Tensor& out, const at::Tensor& input, const at::Tensor& packed_weight,
                      const at::Tensor& terms, int64_t bits, int64_t group_size) {
  const char* op = "gguf_int8_linear";
  auto dt = checks::dtype_of(input, at::kCPU, op, "input");
  checks::check_like(out, input, op, "out", "input");
  TORCH_CHECK_VALUE(input.dim() == 2 && input.stride(1) == 1 && out.dim() == 2 &&
                        out.size(0) == input.size(0) && out.stride(1) == 1,
                    op, ": input [M, K] and out [M, N] must be 2-D with a contiguous last "
                    "dimension, got ", input.sizes(), " and ", out.sizes());
  const int64_t M = input.size(0), K = input.size(1), N = out.size(1);
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, op, ": bits must be 4 or 8, got ", bits);
  // 4-bit: whole 8-k lanes a group; 8-bit: whole 4-k ones
  TORCH_CHECK_VALUE(group_size > 0 && group_size % (32 / bits) == 0 && group_size % 4 == 0, op,
                    ": group_size must be a positive multiple of ", 32 / bits, ", got ",
                    group_size);
  const int64_t panels = (N + kPanel - 1) / kPanel, groups = (K + group_size - 1) / group_size;
  const int64_t steps = groups * group_size * bits / 32;
  TORCH_CHECK_VALUE(packed_weight.scalar_type() == at::kInt && packed_weight.is_contiguous() &&
                        packed_weight.sizes() == at::IntArrayRef({panels, steps, kPanel}),
                    op, ": packed_weight must be contiguous int32 [", panels, ", ", steps, ", ",
                    kPanel, "] (wna16.pack_wna16), got ", packed_weight.scalar_type(), " ",
                    packed_weight.sizes());
  TORCH_CHECK_VALUE(terms.scalar_type() == at::kHalf && terms.is_contiguous() &&
                        terms.sizes() == at::IntArrayRef({panels, groups, 2, kPanel}),
                    op, ": terms must be contiguous float16 [", panels, ", ", groups, ", 2, ",
                    kPanel, "] (gguf_int8.pack_group_terms), got ", terms.scalar_type(), " ",
                    terms.sizes());
  TORCH_CHECK_VALUE(packed_weight.device().is_cpu() && terms.device().is_cpu(), op,
                    ": the weight must be on the CPU");
  const KernelTable& t = kernels();
  TORCH_CHECK(t.gguf_int8_linear != nullptr, op, ": the ", t.isa, " kernels have none; the "
              "layer runs wna16_linear there");
  if (M == 0 || N == 0) return;
  check_scratch(
      t.gguf_int8_linear(dt == at::kFloat ? DType::kFloat32 : DType::kBFloat16,
                         static_cast<int>(bits), out.data_ptr(), input.const_data_ptr(),
                         reinterpret_cast<const uint32_t*>(packed_weight.const_data_ptr<int32_t>()),
                         reinterpret_cast<const uint16_t*>(terms.const_data_ptr<at::Half>()), M,
                         N, K, group_size, input.stride(0), out.stride(0)),
      op);
}

}  // namespace cpu
}  // namespace engine
