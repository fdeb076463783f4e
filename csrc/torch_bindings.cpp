// Op schemas (the names and signatures users see as torch.ops._C.*) and their
// per-device registrations. The first four keep upstream vLLM's schemas so
// code written against upstream's ops runs unchanged.
#include <torch/library.h>

#include "op_checks.h"
#include "ops.h"

TORCH_LIBRARY(_C, m) {
  m.def("rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()");
  m.def("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()");
  m.def("silu_and_mul(Tensor! result, Tensor input) -> ()");
  m.def(
      "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
      "Tensor cos_sin_cache, bool is_neox) -> ()");
  m.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor! key_cache, Tensor! value_cache, "
      "Tensor slot_mapping) -> ()");
  m.def(
      "paged_attention(Tensor! out, Tensor query, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor seq_lens, float scale) -> ()");
  // Settings, not kernels: no tensors, no dispatch key.
  m.def("set_device_bound_checks", &engine::checks::set_device_bound_checks);
#ifdef ENGINE_WITH_CPU_KERNELS
  m.def("cpu_isa", &engine::cpu::isa);
  m.def("select_cpu_isa", &engine::cpu::select_isa);
  m.def("cpu_compiled_isas", &engine::cpu::compiled_isas);
  m.def("cpu_has_linear", &engine::cpu::has_linear);
  m.def("cpu_has_linear_bf16_pairs", &engine::cpu::has_linear_bf16_pairs);
  // CPU only: decode-sized linear layers over a weight packed by
  // engine.model_executor.layers.linear.pack_panels ([ceil(N/16), K, 16], or for bfloat16
  // on AVX512_BF16 CPUs [ceil(N/16), ceil(K/2), 32]: k pairs).
  m.def("linear(Tensor! out, Tensor input, Tensor packed_weight, Tensor? bias) -> ()");
  m.def("cpu_has_int8_linear", &engine::cpu::has_int8_linear);
  m.def("cpu_set_amx", &engine::cpu::set_amx);
  m.def("cpu_amx", &engine::cpu::amx_enabled);
  // CPU only: W8A8 linear layers, input quantised to int8 per row (dynamic)
  // or with input_scale, int8 weight packed by
  // engine.model_executor.layers.quantization.w8a8.pack_int8.
  m.def(
      "int8_linear(Tensor! out, Tensor input, Tensor packed_weight, Tensor weight_scale, "
      "Tensor weight_comp, Tensor? input_scale) -> ()");
  // CPU only (for now): prefill and chunked-prefill attention over the paged
  // cache; sequence b's queries are rows query_start_loc[b]..[b+1]-1, the last
  // tokens of its seq_lens[b] cached ones. sliding_window -1: none.
  m.def("cpu_has_paged_prefill_attention", &engine::cpu::has_paged_prefill_attention);
  m.def(
      "paged_prefill_attention(Tensor! out, Tensor query, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, float scale, "
      "int sliding_window) -> ()");
  // CPU only: a mixture-of-experts MLP over experts packed by
  // engine.model_executor.layers.fused_moe.pack_experts, rows routed by
  // topk_ids (int32) and weighted by topk_weights (float32), both [T, topk].
  m.def("cpu_has_fused_moe", &engine::cpu::has_fused_moe);
  m.def(
      "fused_moe(Tensor! out, Tensor input, Tensor w13, Tensor w2, Tensor topk_weights, "
      "Tensor topk_ids, int intermediate) -> ()");
#endif
}

#define ENGINE_REGISTER_OPS(ns)                               \
  m.impl("rms_norm", &engine::ns::rms_norm);                   \
  m.impl("fused_add_rms_norm", &engine::ns::fused_add_rms_norm); \
  m.impl("silu_and_mul", &engine::ns::silu_and_mul);           \
  m.impl("rotary_embedding", &engine::ns::rotary_embedding);   \
  m.impl("reshape_and_cache", &engine::ns::reshape_and_cache); \
  m.impl("paged_attention", &engine::ns::paged_attention);

#ifdef ENGINE_WITH_CPU_KERNELS
TORCH_LIBRARY_IMPL(_C, CPU, m) {
  ENGINE_REGISTER_OPS(cpu)
  m.impl("linear", &engine::cpu::linear);
  m.impl("int8_linear", &engine::cpu::int8_linear);
  m.impl("paged_prefill_attention", &engine::cpu::paged_prefill_attention);
  m.impl("fused_moe", &engine::cpu::fused_moe);
}
#endif

#ifdef ENGINE_WITH_CUDA_KERNELS
TORCH_LIBRARY_IMPL(_C, CUDA, m) { ENGINE_REGISTER_OPS(cuda) }
#endif

#ifdef ENGINE_WITH_CPU_KERNELS
#include "cpu/wna16_ops.h"
// CPU only: weight-only quantized linear layers (W4A16, W8A16), weight packed by
// engine.model_executor.layers.quantization.wna16.pack_wna16: wna16_linear for
// few rows, wna16_dequant ([K, N], the panel a large-M GEMM multiplies) and
// wna16_dequant_panels (the weight in the panel kernel's layout, for ours).
TORCH_LIBRARY_FRAGMENT(_C, m) {
  m.def("cpu_has_wna16_linear", &engine::cpu::has_wna16_linear);
  m.def(
      "wna16_linear(Tensor! out, Tensor input, Tensor packed_weight, Tensor scales, "
      "Tensor zeros, int bits, int group_size) -> ()");
  m.def(
      "wna16_dequant(Tensor! out, Tensor packed_weight, Tensor scales, Tensor zeros, int bits, "
      "int group_size) -> ()");
  m.def(
      "wna16_dequant_panels(Tensor! out, Tensor packed_weight, Tensor scales, Tensor zeros, "
      "int bits, int group_size, int n, int k) -> ()");
}
TORCH_LIBRARY_IMPL(_C, CPU, m) {
  m.impl("wna16_linear", &engine::cpu::wna16_linear);
  m.impl("wna16_dequant", &engine::cpu::wna16_dequant);
  m.impl("wna16_dequant_panels", &engine::cpu::wna16_dequant_panels);
}
#include "cpu/gguf_int8_ops.h"
// CPU only: GGUF's few-row layers with int8 activations, over the weight
// engine.model_executor.layers.quantization.gguf_int8 packs.
TORCH_LIBRARY_FRAGMENT(_C, m) {
  m.def("cpu_has_gguf_int8_linear", &engine::cpu::has_gguf_int8_linear);
  m.def(
      "gguf_int8_linear(Tensor! out, Tensor input, Tensor packed_weight, Tensor? high_bits, "
      "Tensor terms, int bits, int group_size, int zero) -> ()");
}
TORCH_LIBRARY_IMPL(_C, CPU, m) { m.impl("gguf_int8_linear", &engine::cpu::gguf_int8_linear); }
#endif

#ifdef ENGINE_WITH_CPU_KERNELS
#include "cpu/sample_ops.h"
// CPU only: greedy sampling, each row's first index of its maximum (a NaN
// counting as the maximum, as torch.max) into out (int64, one per row).
TORCH_LIBRARY_FRAGMENT(_C, m) { m.def("argmax_rows(Tensor! out, Tensor logits) -> ()"); }
TORCH_LIBRARY_IMPL(_C, CPU, m) { m.impl("argmax_rows", &engine::cpu::argmax_rows); }
#endif

#ifdef ENGINE_WITH_CPU_KERNELS
#include "cpu/lora_ops.h"
// CPU only: the LoRA term of a linear layer for few tokens (punica's bgmv),
// each token against its own adapter slot (token_slot int32, -1: none);
// layout: engine.lora.layers.LinearWithLoRA.
TORCH_LIBRARY_FRAGMENT(_C, m) {
  m.def(
      "lora_add(Tensor! out, Tensor input, Tensor lora_a, Tensor lora_bt, Tensor token_slot, "
      "Tensor ranks, int[] bounds) -> ()");
}
TORCH_LIBRARY_IMPL(_C, CPU, m) { m.impl("lora_add", &engine::cpu::lora_add); }
#endif
