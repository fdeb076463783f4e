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

namespace {

void check_plane(const at::Tensor& t, int64_t panels, int64_t rows, const char* what) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kInt && t.is_contiguous() && t.device().is_cpu() &&
                        t.sizes() == at::IntArrayRef({panels, rows, kPanel}),
                    "gguf_int8_linear: ", what, " must be contiguous int32 [", panels, ", ", rows,
                    ", ", kPanel, "] on the CPU (gguf_int8.pack), got ", t.scalar_type(), " ",
                    t.sizes());
}

}  // namespace

void gguf_int8_linear(at::Tensor& out, const at::Tensor& input, const at::Tensor& packed_weight,
                      const std::optional<at::Tensor>& high_bits, const at::Tensor& terms,
                      int64_t bits, int64_t group_size, int64_t zero) {
  const char* op = "gguf_int8_linear";
  auto dt = checks::dtype_of(input, at::kCPU, op, "input");
  checks::check_like(out, input, op, "out", "input");
  TORCH_CHECK_VALUE(input.dim() == 2 && input.stride(1) == 1 && out.dim() == 2 &&
                        out.size(0) == input.size(0) && out.stride(1) == 1,
                    op, ": input [M, K] and out [M, N] must be 2-D with a contiguous last "
                    "dimension, got ", input.sizes(), " and ", out.sizes());
  const int64_t M = input.size(0), K = input.size(1), N = out.size(1);
  TORCH_CHECK_VALUE(bits == 4 || bits == 5 || bits == 6 || bits == 8, op,
                    ": bits must be 4, 5, 6 or 8, got ", bits);
  // whole 8-k steps a group (4-k ones for bytes); 5/6-bit: whole chunks of high bits
  const int64_t high = bits == 5 || bits == 6 ? bits - 4 : 0;
  const int64_t unit = high ? 32 / high : (bits == 8 ? 4 : 8);
  TORCH_CHECK_VALUE(group_size > 0 && group_size % unit == 0, op,
                    ": group_size must be a positive multiple of ", unit, " for ", bits,
                    "-bit values, got ", group_size);
  const int64_t panels = (N + kPanel - 1) / kPanel, groups = (K + group_size - 1) / group_size;
  check_plane(packed_weight, panels, groups * group_size / (bits == 8 ? 4 : 8), "packed_weight");
  TORCH_CHECK_VALUE(high_bits.has_value() == (high > 0), op, ": high_bits is for 5- and 6-bit "
                    "values only (and those need it)");
  if (high) check_plane(*high_bits, panels, groups * group_size * high / 32, "high_bits");
  TORCH_CHECK_VALUE(terms.dim() == 4 && (terms.size(2) == 1 || terms.size(2) == 2), op,
                    ": terms must be [panels, groups, 1 or 2, ", kPanel, "], got ", terms.sizes());
  const int64_t nt = terms.size(2);
  TORCH_CHECK_VALUE(terms.scalar_type() == at::kHalf && terms.is_contiguous() &&
                        terms.device().is_cpu() &&
                        terms.sizes() == at::IntArrayRef({panels, groups, nt, kPanel}),
                    op, ": terms must be contiguous float16 [", panels, ", ", groups, ", ", nt,
                    ", ", kPanel, "] on the CPU (gguf_int8.pack_group_terms), got ",
                    terms.scalar_type(), " ", terms.sizes());
  TORCH_CHECK_VALUE(zero >= 0 && zero < (int64_t{1} << bits), op, ": zero must be a ", bits,
                    "-bit value, got ", zero);
  const KernelTable& t = kernels();
  TORCH_CHECK(t.gguf_int8_linear != nullptr, op, ": the ", t.isa, " kernels have none; the "
              "layer runs wna16_linear there");
  if (M == 0 || N == 0) return;
  const GgufInt8Weight w = {
      reinterpret_cast<const uint32_t*>(packed_weight.const_data_ptr<int32_t>()),
      high ? reinterpret_cast<const uint32_t*>(high_bits->const_data_ptr<int32_t>()) : nullptr,
      reinterpret_cast<const uint16_t*>(terms.const_data_ptr<at::Half>()),
      static_cast<int>(bits), static_cast<int>(nt), static_cast<int>(zero), N, K, group_size};
  check_scratch(t.gguf_int8_linear(dt == at::kFloat ? DType::kFloat32 : DType::kBFloat16, w,
                                   out.data_ptr(), input.const_data_ptr(), M, input.stride(0),
                                   out.stride(0)),
                op);
}

}  // namespace cpu
}  // namespace engine
