// Declarations of every op implementation; the schemas live in
// torch_bindings.cpp, the one place where ops are named.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace engine {

#define ENGINE_DECLARE_OPS(ns)                                                 \
  namespace ns {                                                               \
  void rms_norm(at::Tensor& out, const at::Tensor& input,                      \
                const at::Tensor& weight, double epsilon);                     \
  void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual,             \
                          const at::Tensor& weight, double epsilon);           \
  void silu_and_mul(at::Tensor& out, const at::Tensor& input);                 \
  void rotary_embedding(const at::Tensor& positions, at::Tensor& query,        \
                        std::optional<at::Tensor> key, int64_t head_size,      \
                        const at::Tensor& cos_sin_cache, bool is_neox);        \
  void reshape_and_cache(const at::Tensor& key, const at::Tensor& value,       \
                         at::Tensor& key_cache, at::Tensor& value_cache,       \
                         const at::Tensor& slot_mapping);                      \
  void paged_attention(at::Tensor& out, const at::Tensor& query,               \
                       const at::Tensor& key_cache,                            \
                       const at::Tensor& value_cache,                          \
                       const at::Tensor& block_tables,                         \
                       const at::Tensor& seq_lens, double scale);              \
  }

#ifdef ENGINE_WITH_CPU_KERNELS
ENGINE_DECLARE_OPS(cpu)
namespace cpu {
// Which kernel table is in use ("avx512", "avx2", "generic").
std::string isa();
// Select "auto", "avx2", "avx512" or "generic"; returns the ISA now in use.
// Refuses an ISA that was not compiled in or that this processor lacks.
std::string select_isa(const std::string& name);
// Comma-separated list of the ISAs compiled into this library.
std::string compiled_isas();
// Whether the kernel table in use has the packed linear kernel.
bool has_linear();
bool has_linear_bf16_pairs();
// Whether the kernel table in use has the prefill attention kernel.
bool has_paged_prefill_attention();
void paged_prefill_attention(at::Tensor& out, const at::Tensor& query,
                             const at::Tensor& key_cache, const at::Tensor& value_cache,
                             const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                             const at::Tensor& seq_lens, double scale, int64_t sliding_window);
void linear(at::Tensor& out, const at::Tensor& input, const at::Tensor& packed_weight,
            const std::optional<at::Tensor>& bias);
bool has_int8_linear();
// Let the kernels use AMX tiles (int8_linear; bfloat16 prefill attention): the
// caller has checked the CPU's amx flags. Returns whether the code path in use
// has AMX kernels, i.e. whether they run.
bool set_amx(bool enable);
bool amx_enabled();  // set_amx's answer, as it stands
void int8_linear(at::Tensor& out, const at::Tensor& input, const at::Tensor& packed_weight,
                 const at::Tensor& weight_scale, const at::Tensor& weight_comp,
                 const std::optional<at::Tensor>& input_scale);
// Whether the kernel table in use has the fused MoE kernel (csrc/cpu/moe_ops.cpp).
bool has_fused_moe();
void fused_moe(at::Tensor& out, const at::Tensor& input, const at::Tensor& w13,
               const at::Tensor& w2, const at::Tensor& topk_weights,
               const at::Tensor& topk_ids, int64_t intermediate);
}  // namespace cpu
#endif

#ifdef ENGINE_WITH_CUDA_KERNELS
ENGINE_DECLARE_OPS(cuda)
#endif

#undef ENGINE_DECLARE_OPS

}  // namespace engine
