// Argument validation shared by every device's ops. Each op calls its
// prepare_* function first: it checks every argument (naming the one it
// refuses), and returns the shapes and views the device's kernels need, so no
// kernel can read or write out of bounds. Device-agnostic, with one exception:
// the values inside index tensors (slots, block tables, positions) are checked
// on the CPU always, but on a GPU only when set_device_bound_checks(true) was
// called (VLLM_CHECK_BOUNDS=1, engine/envs.py): reading them back synchronizes
// the device on every call and cannot be captured in a CUDA graph.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <optional>

namespace engine {
namespace checks {

// One flag for the whole library (an inline variable: one instance across
// translation units).
inline std::atomic<bool> device_bound_checks{false};

inline void set_device_bound_checks(bool enabled) { device_bound_checks.store(enabled); }

// Whether the values of an index tensor on this device are to be checked.
inline bool check_values_on(const at::Tensor& t) {
  return t.device().is_cpu() || device_bound_checks.load(std::memory_order_relaxed);
}

// The data tensor every other argument is compared with: float32 or bfloat16,
// on the device whose kernels were dispatched to.
inline at::ScalarType dtype_of(const at::Tensor& t, c10::DeviceType device, const char* op,
                               const char* name) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.device().type() == device, op, ": ", name, " must be a ",
                    c10::DeviceTypeName(device), " tensor for these kernels, got device ",
                    t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, op, ": ",
                   name, " has dtype ", t.scalar_type(),
                   "; the kernels support float32 and bfloat16");
  return t.scalar_type();
}

inline void check_like(const at::Tensor& t, const at::Tensor& ref, const char* op,
                       const char* name, const char* ref_name) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", name, " is on ", t.device(), " but ",
                    ref_name, " is on ", ref.device());
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ",
                   t.scalar_type(), " but ", ref_name, " has dtype ", ref.scalar_type(),
                   "; they must match");
}

inline void check_index_tensor(const at::Tensor& t, const at::Tensor& like, at::ScalarType want,
                               int64_t dim, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device() == like.device(), op, ": ", name, " must be on ", like.device(),
                    ", got ", t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == want, op, ": ", name, " must have dtype ", want,
                   ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, op, ": ", name, " must have ", dim,
                    " dimensions, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

// A [rows, hidden] view with unit stride in the last dimension, without
// copying: required for tensors written in place.
inline at::Tensor rows_view(const at::Tensor& t, int64_t hidden, const char* op,
                            const char* name) {
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.size(-1) == hidden, op, ": ", name,
                    " must have last dimension ", hidden, ", got shape ", t.sizes());
  if (t.dim() == 2 && t.stride(1) == 1) return t;
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name,
                    " must be contiguous (or 2-D with a contiguous last dimension), got strides ",
                    t.strides());
  return t.view({-1, hidden});
}

// Read-only inputs may be anything; copy only when the layout needs it.
inline at::Tensor rows_input(const at::Tensor& t, int64_t hidden) {
  at::Tensor v = t.reshape({-1, hidden});
  return v.stride(1) == 1 ? v : v.contiguous();
}

inline void check_range(const at::Tensor& idx, int64_t lo_ok, int64_t hi_excl, const char* op,
                        const char* what_msg) {
  if (idx.numel() == 0 || !check_values_on(idx)) return;
  int64_t lo, hi;
  if (idx.device().is_cpu() && idx.is_contiguous()) {
    // A scan on the host: cheaper than two reductions for the small index
    // tensors these are, and these checks run in every layer of every step.
    auto scan = [&](const auto* p) {
      lo = hi = static_cast<int64_t>(p[0]);
      for (int64_t i = 1; i < idx.numel(); ++i) {
        const int64_t v = static_cast<int64_t>(p[i]);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
      }
    };
    if (idx.scalar_type() == at::kLong)
      scan(idx.const_data_ptr<int64_t>());
    else
      scan(idx.const_data_ptr<int32_t>());
  } else {
    auto mm = at::aminmax(idx);
    lo = std::get<0>(mm).item<int64_t>();
    hi = std::get<1>(mm).item<int64_t>();
  }
  TORCH_CHECK_INDEX(lo >= lo_ok && hi < hi_excl, op, ": ", what_msg, " range over [", lo, ", ",
                    hi, "] but must lie in [", lo_ok, ", ", hi_excl, ")");
}

// The activations of a matmul-like op (linear, int8_linear, fused_moe,
// wna16_linear): 2-D, rows contiguous in their last dimension.
inline void check_matrix_input(const at::Tensor& input, const char* op) {
  TORCH_CHECK_VALUE(input.dim() == 2 && input.stride(1) == 1, op,
                    ": input must be 2-D with a contiguous last dimension, got shape ",
                    input.sizes(), " and strides ", input.strides());
}

// Its result: [input's rows, N], contiguous in the last dimension.
inline void check_matrix_out(const at::Tensor& out, const at::Tensor& input, const char* op) {
  TORCH_CHECK_VALUE(out.dim() == 2 && out.size(0) == input.size(0) && out.stride(1) == 1, op,
                    ": out must be [", input.size(0), ", N] with a contiguous last dimension, "
                    "got shape ", out.sizes());
}

// ---- per-op preparation ------------------------------------------------------

struct Rows {
  at::ScalarType dtype;
  at::Tensor a, b;  // the two row views the op reads/writes
  int64_t rows, width;
};

// The checks both norms share: input, a second tensor of input's shape (the
// result, or the residual), and a weight of the hidden size. Returns hidden.
inline int64_t check_norm(const at::Tensor& input, const at::Tensor& other,
                          const at::Tensor& weight, double epsilon, const char* op,
                          const char* other_name) {
  check_like(other, input, op, other_name, "input");
  check_like(weight, input, op, "weight", "input");
  TORCH_CHECK_VALUE(input.dim() >= 1, op, ": input must have at least 1 dimension");
  const int64_t hidden = input.size(-1);
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == hidden && weight.is_contiguous(), op,
                    ": weight must be a contiguous 1-D tensor of size ", hidden,
                    " (input's last dimension), got shape ", weight.sizes());
  TORCH_CHECK_VALUE(other.sizes() == input.sizes(), op, ": ", other_name, " has shape ",
                    other.sizes(), " but input has shape ", input.sizes());
  TORCH_CHECK_VALUE(epsilon >= 0, op, ": epsilon must be >= 0, got ", epsilon);
  return hidden;
}

inline Rows prepare_rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
                             double epsilon, c10::DeviceType device) {
  const char* op = "rms_norm";
  auto dt = dtype_of(input, device, op, "input");
  const int64_t hidden = check_norm(input, out, weight, epsilon, op, "result");
  if (input.numel() == 0) return {dt, {}, {}, 0, hidden};
  at::Tensor in2 = rows_input(input, hidden);
  return {dt, in2, rows_view(out, hidden, op, "result"), in2.size(0), hidden};
}

inline Rows prepare_fused_add_rms_norm(at::Tensor& input, at::Tensor& residual,
                                       const at::Tensor& weight, double epsilon,
                                       c10::DeviceType device) {
  const char* op = "fused_add_rms_norm";
  auto dt = dtype_of(input, device, op, "input");
  const int64_t hidden = check_norm(input, residual, weight, epsilon, op, "residual");
  if (input.numel() == 0) return {dt, {}, {}, 0, hidden};
  at::Tensor in2 = rows_view(input, hidden, op, "input");
  return {dt, in2, rows_view(residual, hidden, op, "residual"), in2.size(0), hidden};
}

// a: input rows [rows, 2 * width], b: result rows [rows, width]
inline Rows prepare_silu_and_mul(at::Tensor& out, const at::Tensor& input,
                                 c10::DeviceType device) {
  const char* op = "silu_and_mul";
  auto dt = dtype_of(input, device, op, "input");
  check_like(out, input, op, "result", "input");
  TORCH_CHECK_VALUE(input.dim() >= 1 && input.size(-1) % 2 == 0, op,
                    ": input's last dimension must be even (gate and up halves), got shape ",
                    input.sizes());
  const int64_t d = input.size(-1) / 2;
  auto want = input.sizes().vec();
  want.back() = d;
  TORCH_CHECK_VALUE(out.sizes() == at::IntArrayRef(want), op, ": result must have shape ",
                    at::IntArrayRef(want), ", got ", out.sizes());
  if (out.numel() == 0) return {dt, {}, {}, 0, d};
  at::Tensor in2 = rows_input(input, 2 * d);
  return {dt, in2, rows_view(out, d, op, "result"), in2.size(0), d};
}

struct RotaryTarget {
  int64_t heads = 0, token_stride = 0, head_stride = 0;
};

// query/key may be [tokens..., heads * head_size] or [tokens..., heads, head_size],
// where tokens... are the dimensions of `positions`. Written in place, so the
// layout must be addressable as (token, head, element) without a copy.
inline RotaryTarget rotary_layout(const at::Tensor& x, const at::Tensor& positions,
                                  int64_t head_size, const char* name) {
  const char* op = "rotary_embedding";
  const int64_t td = positions.dim();
  TORCH_CHECK_VALUE(x.dim() == td + 1 || x.dim() == td + 2, op, ": ", name, " has shape ",
                    x.sizes(), "; expected positions' shape ", positions.sizes(),
                    " followed by [heads * head_size] or [heads, head_size]");
  for (int64_t i = 0; i < td; ++i)
    TORCH_CHECK_VALUE(x.size(i) == positions.size(i), op, ": ", name, " has shape ", x.sizes(),
                      " which does not start with positions' shape ", positions.sizes());
  TORCH_CHECK_VALUE(x.stride(-1) == 1, op, ": ", name,
                    " must be contiguous in its last dimension");
  RotaryTarget r;
  if (x.dim() == td + 1) {
    TORCH_CHECK_VALUE(x.size(-1) % head_size == 0, op, ": ", name, "'s last dimension ",
                      x.size(-1), " is not a multiple of head_size ", head_size);
    r.heads = x.size(-1) / head_size;
    r.head_stride = head_size;
  } else {
    TORCH_CHECK_VALUE(x.size(-1) == head_size, op, ": ", name, "'s last dimension ", x.size(-1),
                      " must equal head_size ", head_size);
    r.heads = x.size(-2);
    r.head_stride = x.stride(-2);
  }
  r.token_stride = x.stride(td - 1);
  // Leading token dimensions must collapse into one stride.
  for (int64_t i = 0; i + 1 < td; ++i)
    TORCH_CHECK_VALUE(x.size(i + 1) == 1 || x.stride(i) == x.stride(i + 1) * x.size(i + 1), op,
                      ": ", name, "'s token dimensions are not contiguous with each other");
  return r;
}

struct Rotary {
  at::ScalarType dtype;
  at::Tensor positions;  // contiguous
  RotaryTarget q, k;
  int64_t tokens, rot_dim;
};

inline Rotary prepare_rotary(const at::Tensor& positions, const at::Tensor& query,
                             const std::optional<at::Tensor>& key, int64_t head_size,
                             const at::Tensor& cos_sin_cache, c10::DeviceType device) {
  const char* op = "rotary_embedding";
  auto dt = dtype_of(query, device, op, "query");
  TORCH_CHECK_VALUE(head_size > 0, op, ": head_size must be positive, got ", head_size);
  TORCH_CHECK_VALUE(positions.device() == query.device(), op, ": positions must be on ",
                    query.device(), ", got ", positions.device());
  TORCH_CHECK_TYPE(positions.scalar_type() == at::kLong, op,
                   ": positions must have dtype int64, got ", positions.scalar_type());
  TORCH_CHECK_VALUE(positions.dim() >= 1 && positions.dim() <= 2, op,
                    ": positions must be [tokens] or [batch, seq], got shape ", positions.sizes());
  check_like(cos_sin_cache, query, op, "cos_sin_cache", "query");
  TORCH_CHECK_VALUE(cos_sin_cache.dim() == 2 && cos_sin_cache.stride(1) == 1, op,
                    ": cos_sin_cache must be [max_position, rot_dim] with a contiguous last "
                    "dimension, got shape ", cos_sin_cache.sizes());
  const int64_t rot_dim = cos_sin_cache.size(1);
  TORCH_CHECK_VALUE(rot_dim % 2 == 0 && rot_dim > 0 && rot_dim <= head_size, op,
                    ": cos_sin_cache's rot_dim ", rot_dim, " must be even and in (0, head_size=",
                    head_size, "]");
  Rotary r{dt, positions.contiguous(), rotary_layout(query, positions, head_size, "query"), {},
           positions.numel(), rot_dim};
  if (key.has_value()) {
    check_like(*key, query, op, "key", "query");
    r.k = rotary_layout(*key, positions, head_size, "key");
  }
  check_range(r.positions, 0, cos_sin_cache.size(0), op,
              "positions (rows of cos_sin_cache, i.e. max_position)");
  return r;
}

}  // namespace checks
}  // namespace engine

// The paged-cache ops' checks (reshape_and_cache, the attentions), in their
// own file; it includes this one.
#include "attention_checks.h"
