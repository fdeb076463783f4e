// Torch-facing weight-only quantized linear ops (W4A16, W8A16): check every
// argument, then call the wna16 kernels of the kernel table in use (isa.cpp
// picks it; wna16_impl.cpp defines them once per x86 ISA). Elsewhere there is no
// kernel and engine.ops runs engine.reference's.
#include <c10/util/Exception.h>


#include "../op_checks.h"
#include "../ops.h"
#include "dispatch.h"
#include "wna16_ops.h"

namespace engine {
namespace cpu {
namespace {

struct Packed {
  int64_t N, K, groups;
};

// packed [ceil(N/16), groups * G / PF, 16] int32, scales [.., groups, 16]
// float32, zeros [.., groups, 16] uint8, for N columns and K inputs.
void check_packed(const char* op, const at::Tensor& packed, const at::Tensor& scales,
                  const at::Tensor& zeros, int64_t bits, int64_t group_size, int64_t N, int64_t K) {
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, op, ": bits must be 4 or 8, got ", bits);
  const int64_t pf = 32 / bits;
  TORCH_CHECK_VALUE(group_size > 0 && group_size % pf == 0, op, ": group_size must be a positive "
                    "multiple of ", pf, " (values a 32-bit lane), got ", group_size);
  const int64_t panels = (N + kPanel - 1) / kPanel, groups = (K + group_size - 1) / group_size;
  const int64_t steps = groups * group_size / pf;
  auto is = [](const at::Tensor& t, at::ScalarType st, int64_t a, int64_t b) {
    return t.scalar_type() == st && t.device().is_cpu() && t.dim() == 3 && t.size(0) == a &&
           t.size(1) == b && t.size(2) == kPanel && t.is_contiguous();
  };
  TORCH_CHECK_VALUE(is(packed, at::kInt, panels, steps), op, ": packed_weight must be contiguous "
                    "int32 [", panels, ", ", steps, ", ", kPanel, "] (engine.model_executor.layers."
                    "quantization.wna16.pack_wna16), got ", packed.scalar_type(), " ", packed.sizes());
  TORCH_CHECK_VALUE(is(scales, at::kFloat, panels, groups), op, ": scales must be contiguous "
                    "float32 [", panels, ", ", groups, ", ", kPanel, "], got ",
                    scales.scalar_type(), " ", scales.sizes());
  TORCH_CHECK_VALUE(is(zeros, at::kByte, panels, groups), op, ": zeros must be contiguous uint8 [",
                    panels, ", ", groups, ", ", kPanel, "], got ", zeros.scalar_type(), " ",
                    zeros.sizes());
}

const KernelTable& table_or_fail(const char* op) {
  const KernelTable& t = kernels();
  TORCH_CHECK(t.wna16_linear != nullptr, op, ": the ", t.isa, " kernels have none; engine.ops "
              "runs engine.reference's there");
  return t;
}

DType kdt(at::ScalarType t) {
  return t == at::kFloat ? DType::kFloat32 : DType::kBFloat16;
}

}  // namespace

bool has_wna16_linear() { return kernels().wna16_linear != nullptr; }

void wna16_linear(at::Tensor& out, const at::Tensor& input, const at::Tensor& packed_weight,
                  const at::Tensor& scales, const at::Tensor& zeros, int64_t bits,
                  int64_t group_size) {
  const char* op = "wna16_linear";
  auto dt = checks::dtype_of(input, at::kCPU, op, "input");
  checks::check_like(out, input, op, "out", "input");
  checks::check_matrix_input(input, op);
  checks::check_matrix_out(out, input, op);
  const int64_t M = input.size(0), K = input.size(1), N = out.size(1);
  check_packed(op, packed_weight, scales, zeros, bits, group_size, N, K);
  const auto& t = table_or_fail(op);
  if (M == 0 || N == 0) return;
  // From 16 rows AMX tiles, where they run (2-core Xeon, 4-bit, K x N 2048 x 6144 and
  // 5456 x 2048: 8 rows 0.75-0.9x the vector kernel, 16 rows 1.4-1.7x, 64 3.3-3.9x)
  if (M >= 16 && t.wna16_linear_amx != nullptr && amx_enabled() &&
      t.wna16_linear_amx(kdt(dt), static_cast<int>(bits), out.data_ptr(), input.const_data_ptr(),
                   reinterpret_cast<const uint32_t*>(packed_weight.const_data_ptr<int32_t>()),
                   scales.const_data_ptr<float>(), zeros.const_data_ptr<uint8_t>(), M, N, K,
                   group_size, input.stride(0), out.stride(0)))
    return;
  check_scratch(
      t.wna16_linear(kdt(dt), static_cast<int>(bits), out.data_ptr(), input.const_data_ptr(),
                     reinterpret_cast<const uint32_t*>(packed_weight.const_data_ptr<int32_t>()),
                     scales.const_data_ptr<float>(), zeros.const_data_ptr<uint8_t>(), M, N, K,
                     group_size, input.stride(0), out.stride(0)),
      op);
}

void wna16_dequant(at::Tensor& out, const at::Tensor& packed_weight, const at::Tensor& scales,
                   const at::Tensor& zeros, int64_t bits, int64_t group_size) {
  const char* op = "wna16_dequant";
  auto dt = checks::dtype_of(out, at::kCPU, op, "out");
  TORCH_CHECK_VALUE(out.dim() == 2 && out.is_contiguous(), op,
                    ": out must be contiguous [K, N], got shape ", out.sizes());
  const int64_t K = out.size(0), N = out.size(1);
  check_packed(op, packed_weight, scales, zeros, bits, group_size, N, K);
  const auto& t = table_or_fail(op);
  if (K == 0 || N == 0) return;
  t.wna16_dequant(kdt(dt), static_cast<int>(bits), out.data_ptr(),
                  reinterpret_cast<const uint32_t*>(packed_weight.const_data_ptr<int32_t>()),
                  scales.const_data_ptr<float>(), zeros.const_data_ptr<uint8_t>(), N, K,
                  group_size);
}

void wna16_dequant_panels(at::Tensor& out, const at::Tensor& packed_weight,
                          const at::Tensor& scales, const at::Tensor& zeros, int64_t bits,
                          int64_t group_size, int64_t n, int64_t k) {
  const char* op = "wna16_dequant_panels";
  auto dt = checks::dtype_of(out, at::kCPU, op, "out");
  TORCH_CHECK_VALUE(out.dim() == 3 && out.is_contiguous() && n > 0 && k > 0, op,
                    ": out must be contiguous [ceil(n/16), rows, 16 * k_pack], got shape ",
                    out.sizes());
  const int64_t k_pack = out.size(2) / kPanel;
  TORCH_CHECK_VALUE((k_pack == 1 || (k_pack == 2 && dt == at::kBFloat16)) &&
                        out.size(2) == k_pack * kPanel && out.size(0) == (n + kPanel - 1) / kPanel &&
                        out.size(1) == (k + k_pack - 1) / k_pack,
                    op, ": out must be [", (n + kPanel - 1) / kPanel, ", ceil(", k,
                    " / k_pack), 16 * k_pack] (k_pack 2: bfloat16 only), got ", out.sizes());
  check_packed(op, packed_weight, scales, zeros, bits, group_size, n, k);
  const auto& t = table_or_fail(op);
  t.wna16_dequant_panels(
      kdt(dt), static_cast<int>(bits), static_cast<int>(k_pack), out.data_ptr(),
      reinterpret_cast<const uint32_t*>(packed_weight.const_data_ptr<int32_t>()),
      scales.const_data_ptr<float>(), zeros.const_data_ptr<uint8_t>(), n, k, group_size);
}

}  // namespace cpu
}  // namespace engine
