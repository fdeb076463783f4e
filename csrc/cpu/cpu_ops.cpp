// Torch-facing CPU ops: validate (op_checks.h), then call the kernel table
// picked for this processor (isa.cpp).
#include <atomic>

#include "../op_checks.h"
#include "../ops.h"
#include "dispatch.h"

namespace engine {
namespace cpu {
namespace {

using namespace engine::checks;

DType kdt(at::ScalarType t) {
  return t == at::kFloat ? DType::kFloat32 : DType::kBFloat16;
}

}  // namespace

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
              double epsilon) {
  Rows r = prepare_rms_norm(out, input, weight, epsilon, at::kCPU);
  if (r.rows == 0) return;
  check_scratch(kernels().rms_norm(kdt(r.dtype), r.b.data_ptr(), r.a.const_data_ptr(),
                                   weight.const_data_ptr(), r.rows, r.width, r.a.stride(0),
                                   r.b.stride(0), static_cast<float>(epsilon)),
                "rms_norm");
}

void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                        double epsilon) {
  Rows r = prepare_fused_add_rms_norm(input, residual, weight, epsilon, at::kCPU);
  if (r.rows == 0) return;
  check_scratch(kernels().fused_add_rms_norm(kdt(r.dtype), r.a.data_ptr(), r.b.data_ptr(),
                                             weight.const_data_ptr(), r.rows, r.width,
                                             r.a.stride(0), r.b.stride(0),
                                             static_cast<float>(epsilon)),
                "fused_add_rms_norm");
}

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  Rows r = prepare_silu_and_mul(out, input, at::kCPU);
  if (r.rows == 0) return;
  kernels().silu_and_mul(kdt(r.dtype), r.b.data_ptr(), r.a.const_data_ptr(), r.rows, r.width,
                         r.a.stride(0), r.b.stride(0));
}

void rotary_embedding(const at::Tensor& positions, at::Tensor& query,
                      std::optional<at::Tensor> key, int64_t head_size,
                      const at::Tensor& cos_sin_cache, bool is_neox) {
  Rotary r = prepare_rotary(positions, query, key, head_size, cos_sin_cache, at::kCPU);
  if (r.tokens == 0) return;
  const auto& K = kernels();
  const int64_t* pos = r.positions.const_data_ptr<int64_t>();
  K.rotary_embedding(kdt(r.dtype), pos, query.data_ptr(), cos_sin_cache.const_data_ptr(),
                     r.tokens, r.q.heads, r.q.token_stride, r.q.head_stride, r.rot_dim,
                     cos_sin_cache.stride(0), is_neox);
  if (key.has_value())
    K.rotary_embedding(kdt(r.dtype), pos, key->data_ptr(), cos_sin_cache.const_data_ptr(),
                       r.tokens, r.k.heads, r.k.token_stride, r.k.head_stride, r.rot_dim,
                       cos_sin_cache.stride(0), is_neox);
}

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  CacheShape c =
      prepare_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, at::kCPU);
  if (key.size(0) == 0) return;
  kernels().reshape_and_cache(key.element_size(), key.const_data_ptr(), value.const_data_ptr(),
                              key_cache.data_ptr(), value_cache.data_ptr(),
                              slot_mapping.const_data_ptr<int64_t>(), key.size(0), c.kv_heads,
                              c.head_size, c.block_size, key.stride(0), key.stride(1),
                              value.stride(0), value.stride(1));
}

void paged_attention(at::Tensor& out, const at::Tensor& query_in, const at::Tensor& key_cache,
                     const at::Tensor& value_cache, const at::Tensor& block_tables,
                     const at::Tensor& seq_lens, double scale) {
  const at::Tensor query = readable_query(query_in);
  Attention a = prepare_paged_attention(out, query, key_cache, value_cache, block_tables,
                                        seq_lens, scale, at::kCPU);
  if (a.seqs == 0) return;
  const int64_t failed = kernels().paged_attention(
      kdt(a.dtype), out.data_ptr(), query.const_data_ptr(), query.stride(0),
      key_cache.const_data_ptr(),
      value_cache.const_data_ptr(), block_tables.const_data_ptr<int32_t>(),
      seq_lens.const_data_ptr<int32_t>(), a.seqs, a.heads, a.cache.kv_heads, a.cache.head_size,
      a.cache.block_size, a.max_blocks, static_cast<float>(scale));
  check_scratch(failed, "paged_attention");
}

bool has_paged_prefill_attention() { return kernels().paged_prefill_attention != nullptr; }

namespace {
std::atomic<bool> amx{false};
// From this many rows AMX tiles run; fewer stream the weight as fast with
// vpdpbusd. Measured (2-core Xeon, 2 threads, K x N 2048 x 6144, 2048 x 10912,
// 5456 x 2048), AMX over VNNI: 1-4 rows 0.88-1.07x, 16 rows 1.8-2.0x, 64 2.6-2.9x,
// 480 2.7-3.7x.
constexpr int64_t kAmxInt8Rows = 8;
}  // namespace

void paged_prefill_attention(at::Tensor& out, const at::Tensor& query,
                             const at::Tensor& key_cache, const at::Tensor& value_cache,
                             const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                             const at::Tensor& seq_lens, double scale, int64_t sliding_window) {
  Attention a = prepare_paged_prefill_attention(out, query, key_cache, value_cache, block_tables,
                                                query_start_loc, seq_lens, scale,
                                                sliding_window, at::kCPU);
  const auto& table = kernels();
  TORCH_CHECK(table.paged_prefill_attention != nullptr, "paged_prefill_attention: the ",
              table.isa, " kernels have none; engine.ops runs the torch reference there");
  if (a.seqs == 0 || query.size(0) == 0) return;
  if (table.paged_prefill_attention_amx != nullptr && amx_enabled() &&
      table.paged_prefill_attention_amx(
          kdt(a.dtype), out.data_ptr(), query.const_data_ptr(), key_cache.const_data_ptr(),
          value_cache.const_data_ptr(), block_tables.const_data_ptr<int32_t>(),
          query_start_loc.const_data_ptr<int32_t>(), seq_lens.const_data_ptr<int32_t>(), a.seqs,
          a.heads, a.cache.kv_heads, a.cache.head_size, a.cache.block_size, a.max_blocks,
          static_cast<float>(scale), sliding_window))
    return;
  check_scratch(
      table.paged_prefill_attention(
          kdt(a.dtype), out.data_ptr(), query.const_data_ptr(), key_cache.const_data_ptr(),
          value_cache.const_data_ptr(), block_tables.const_data_ptr<int32_t>(),
          query_start_loc.const_data_ptr<int32_t>(), seq_lens.const_data_ptr<int32_t>(), a.seqs,
          a.heads, a.cache.kv_heads, a.cache.head_size, a.cache.block_size, a.max_blocks,
          static_cast<float>(scale), sliding_window),
      "paged_prefill_attention");
}

bool has_linear() { return kernels().linear != nullptr; }

void linear(at::Tensor& out, const at::Tensor& input, const at::Tensor& packed_weight,
            const std::optional<at::Tensor>& bias) {
  const char* op = "linear";
  auto dt = dtype_of(input, at::kCPU, op, "input");
  check_like(out, input, op, "out", "input");
  check_like(packed_weight, input, op, "packed_weight", "input");
  check_matrix_input(input, op);
  const int64_t M = input.size(0), K = input.size(1);
  // The panel width says the layout: kPanel k-major columns, or kPanel columns
  // by k pairs (2 * kPanel values a step) for the AVX512_BF16 kernel.
  const bool pairs = packed_weight.dim() == 3 && packed_weight.size(2) == 2 * kPanel;
  const int64_t steps = pairs ? (K + 1) / 2 : K;
  TORCH_CHECK_VALUE(packed_weight.dim() == 3 && packed_weight.size(1) == steps &&
                        (packed_weight.size(2) == kPanel || pairs) && packed_weight.is_contiguous(),
                    op, ": packed_weight must be contiguous [ceil(N/", kPanel, "), ", K, ", ",
                    kPanel, "] or, in k pairs, [ceil(N/", kPanel, "), ", (K + 1) / 2, ", ",
                    2 * kPanel, "] (engine.model_executor.layers.linear.pack_panels), got shape ",
                    packed_weight.sizes());
  TORCH_CHECK_VALUE(!pairs || dt == at::kBFloat16, op,
                    ": a weight packed in k pairs is bfloat16 only, got ", dt);
  check_matrix_out(out, input, op);
  const int64_t N = out.size(1);
  TORCH_CHECK_VALUE((N + kPanel - 1) / kPanel == packed_weight.size(0), op, ": out has ", N,
                    " columns but packed_weight holds ", packed_weight.size(0) * kPanel,
                    " (padded to ", kPanel, ")");
  const void* b = nullptr;
  if (bias.has_value()) {
    check_like(*bias, input, op, "bias", "input");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N && bias->is_contiguous(), op,
                      ": bias must be contiguous [", N, "], got shape ", bias->sizes());
    b = bias->const_data_ptr();
  }
  const auto& table = kernels();
  TORCH_CHECK(table.linear != nullptr, op, ": the ", table.isa,
              " kernels have no linear; use torch's (engine.model_executor.layers.linear decides)");
  TORCH_CHECK(!pairs || has_linear_bf16_pairs(), op, ": the weight is packed in k pairs for "
              "AVX512_BF16, which the ", table.isa, " code path on this CPU lacks; pack it "
              "with engine.model_executor.layers.linear.pack_panels(weight, ops.panel_k_pack(dtype))");
  if (M == 0 || N == 0) return;
  const int64_t failed =
      pairs ? table.linear_bf16_pairs(out.data_ptr(), input.const_data_ptr(),
                                      packed_weight.const_data_ptr(), b, M, N, K,
                                      input.stride(0), out.stride(0))
            : table.linear(kdt(dt), out.data_ptr(), input.const_data_ptr(),
                           packed_weight.const_data_ptr(), b, M, N, K, input.stride(0),
                           out.stride(0));
  check_scratch(failed, op);
}

bool has_int8_linear() { return kernels().int8_linear != nullptr; }

bool set_amx(bool enable) {
  amx.store(enable, std::memory_order_relaxed);
  return amx_enabled();
}

bool amx_enabled() {
  return amx.load(std::memory_order_relaxed) && kernels().int8_linear_amx != nullptr;
}

void int8_linear(at::Tensor& out, const at::Tensor& input, const at::Tensor& packed_weight,
                 const at::Tensor& weight_scale, const at::Tensor& weight_comp,
                 const std::optional<at::Tensor>& input_scale) {
  const char* op = "int8_linear";
  auto dt = dtype_of(input, at::kCPU, op, "input");
  check_like(out, input, op, "out", "input");
  check_matrix_input(input, op);
  check_matrix_out(out, input, op);
  const int64_t M = input.size(0), K = input.size(1), N = out.size(1);
  const int64_t panels = (N + kPanel - 1) / kPanel;
  TORCH_CHECK_VALUE(packed_weight.scalar_type() == at::kChar && packed_weight.device().is_cpu() &&
                        packed_weight.dim() == 3 && packed_weight.size(0) == panels &&
                        packed_weight.size(1) == (K + 3) / 4 && packed_weight.size(2) == 4 * kPanel &&
                        packed_weight.is_contiguous(),
                    op, ": packed_weight must be contiguous int8 [", panels, ", ", (K + 3) / 4, ", ",
                    4 * kPanel, "] (engine.model_executor.layers.quantization.w8a8.pack_int8), got ",
                    packed_weight.scalar_type(), " ", packed_weight.sizes());
  TORCH_CHECK_VALUE(weight_scale.scalar_type() == at::kFloat && weight_scale.device().is_cpu() &&
                        weight_scale.dim() == 1 && weight_scale.size(0) == N &&
                        weight_scale.is_contiguous(),
                    op, ": weight_scale must be contiguous float32 [", N, "], got ",
                    weight_scale.scalar_type(), " ", weight_scale.sizes());
  TORCH_CHECK_VALUE(weight_comp.scalar_type() == at::kInt && weight_comp.device().is_cpu() &&
                        weight_comp.dim() == 1 && weight_comp.size(0) == panels * kPanel &&
                        weight_comp.is_contiguous(),
                    op, ": weight_comp must be contiguous int32 [", panels * kPanel, "], got ",
                    weight_comp.scalar_type(), " ", weight_comp.sizes());
  const float* s = nullptr;
  if (input_scale.has_value()) {
    TORCH_CHECK_VALUE(input_scale->scalar_type() == at::kFloat && input_scale->device().is_cpu() &&
                          input_scale->numel() == 1,
                      op, ": input_scale must be one float32, got ", input_scale->scalar_type(),
                      " ", input_scale->sizes());
    s = input_scale->const_data_ptr<float>();
    TORCH_CHECK_VALUE(*s > 0.f, op, ": input_scale must be positive, got ", *s);
  }
  const auto& table = kernels();
  TORCH_CHECK(table.int8_linear != nullptr, op, ": the ", table.isa,
              " kernels have no int8_linear; use engine.reference.int8_linear");
  if (M == 0 || N == 0) return;
  if (M >= kAmxInt8Rows && table.int8_linear_amx != nullptr && amx_enabled() &&
      table.int8_linear_amx(kdt(dt), out.data_ptr(), input.const_data_ptr(), s,
                            packed_weight.const_data_ptr<int8_t>(),
                            weight_scale.const_data_ptr<float>(),
                            weight_comp.const_data_ptr<int32_t>(), M, N, K, input.stride(0),
                            out.stride(0)))
    return;
  check_scratch(table.int8_linear(kdt(dt), out.data_ptr(), input.const_data_ptr(), s,
                                  packed_weight.const_data_ptr<int8_t>(),
                                  weight_scale.const_data_ptr<float>(),
                                  weight_comp.const_data_ptr<int32_t>(), M, N, K,
                                  input.stride(0), out.stride(0)),
                op);
}

}  // namespace cpu
}  // namespace engine
