// Torch-facing CPU ops: validate every argument (so no kernel can read or
// write out of bounds), then call the kernel table picked for this processor.
#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "../ops.h"
#include "dispatch.h"

namespace engine {
namespace cpu {
namespace {

using engine_cpu::DType;

DType dtype_of(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name,
                    " must be a CPU tensor for the CPU kernels, got device ", t.device());
  if (t.scalar_type() == at::kFloat) return DType::kFloat32;
  if (t.scalar_type() == at::kBFloat16) return DType::kBFloat16;
  TORCH_CHECK_TYPE(false, op, ": ", name, " has dtype ", t.scalar_type(),
                   "; the CPU kernels support float32 and bfloat16");
}

void check_like(const at::Tensor& t, const at::Tensor& ref, const char* op,
                const char* name, const char* ref_name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", name, " is on ", t.device(),
                    " but ", ref_name, " is on ", ref.device());
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ",
                   t.scalar_type(), " but ", ref_name, " has dtype ", ref.scalar_type(),
                   "; they must match");
}

void check_index_tensor(const at::Tensor& t, at::ScalarType want, int64_t dim,
                        const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ",
                    t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == want, op, ": ", name, " must have dtype ", want,
                   ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(dim < 0 || t.dim() == dim, op, ": ", name, " must have ", dim,
                    " dimensions, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

// A [rows, hidden] view with unit stride in the last dimension, without
// copying: required for tensors written in place.
at::Tensor rows_view(const at::Tensor& t, int64_t hidden, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.size(-1) == hidden, op, ": ", name,
                    " must have last dimension ", hidden, ", got shape ", t.sizes());
  if (t.dim() == 2 && t.stride(1) == 1) return t;
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name,
                    " must be contiguous (or 2-D with a contiguous last dimension), got strides ",
                    t.strides());
  return t.view({-1, hidden});
}

// Read-only inputs may be anything; copy only when the layout needs it.
at::Tensor rows_input(const at::Tensor& t, int64_t hidden) {
  at::Tensor v = t.reshape({-1, hidden});
  return v.stride(1) == 1 ? v : v.contiguous();
}

}  // namespace

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
              double epsilon) {
  const char* op = "rms_norm";
  DType dt = dtype_of(input, op, "input");
  check_like(out, input, op, "result", "input");
  check_like(weight, input, op, "weight", "input");
  TORCH_CHECK_VALUE(input.dim() >= 1, op, ": input must have at least 1 dimension");
  const int64_t hidden = input.size(-1);
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == hidden && weight.is_contiguous(), op,
                    ": weight must be a contiguous 1-D tensor of size ", hidden,
                    " (input's last dimension), got shape ", weight.sizes());
  TORCH_CHECK_VALUE(out.sizes() == input.sizes(), op, ": result has shape ", out.sizes(),
                    " but input has shape ", input.sizes());
  TORCH_CHECK_VALUE(epsilon >= 0, op, ": epsilon must be >= 0, got ", epsilon);
  if (input.numel() == 0) return;
  at::Tensor in2 = rows_input(input, hidden);
  at::Tensor out2 = rows_view(out, hidden, op, "result");
  kernels().rms_norm(dt, out2.data_ptr(), in2.const_data_ptr(), weight.const_data_ptr(),
                     in2.size(0), hidden, in2.stride(0), out2.stride(0),
                     static_cast<float>(epsilon));
}

void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                        double epsilon) {
  const char* op = "fused_add_rms_norm";
  DType dt = dtype_of(input, op, "input");
  check_like(residual, input, op, "residual", "input");
  check_like(weight, input, op, "weight", "input");
  TORCH_CHECK_VALUE(input.dim() >= 1, op, ": input must have at least 1 dimension");
  const int64_t hidden = input.size(-1);
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == hidden && weight.is_contiguous(), op,
                    ": weight must be a contiguous 1-D tensor of size ", hidden,
                    ", got shape ", weight.sizes());
  TORCH_CHECK_VALUE(residual.sizes() == input.sizes(), op, ": residual has shape ",
                    residual.sizes(), " but input has shape ", input.sizes());
  TORCH_CHECK_VALUE(epsilon >= 0, op, ": epsilon must be >= 0, got ", epsilon);
  if (input.numel() == 0) return;
  at::Tensor in2 = rows_view(input, hidden, op, "input");
  at::Tensor res2 = rows_view(residual, hidden, op, "residual");
  kernels().fused_add_rms_norm(dt, in2.data_ptr(), res2.data_ptr(), weight.const_data_ptr(),
                               in2.size(0), hidden, in2.stride(0), res2.stride(0),
                               static_cast<float>(epsilon));
}

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  const char* op = "silu_and_mul";
  DType dt = dtype_of(input, op, "input");
  check_like(out, input, op, "result", "input");
  TORCH_CHECK_VALUE(input.dim() >= 1 && input.size(-1) % 2 == 0, op,
                    ": input's last dimension must be even (gate and up halves), got shape ",
                    input.sizes());
  const int64_t d = input.size(-1) / 2;
  auto want = input.sizes().vec();
  want.back() = d;
  TORCH_CHECK_VALUE(out.sizes() == at::IntArrayRef(want), op, ": result must have shape ",
                    at::IntArrayRef(want), ", got ", out.sizes());
  if (out.numel() == 0) return;
  at::Tensor in2 = rows_input(input, 2 * d);
  at::Tensor out2 = rows_view(out, d, op, "result");
  kernels().silu_and_mul(dt, out2.data_ptr(), in2.const_data_ptr(), in2.size(0), d,
                         in2.stride(0), out2.stride(0));
}

namespace {

struct RotaryTarget {
  int64_t heads, token_stride, head_stride;
};

// query/key may be [tokens..., heads * head_size] or [tokens..., heads, head_size],
// where tokens... are the dimensions of `positions`. Written in place, so the
// layout must be addressable as (token, head, element) without a copy.
RotaryTarget rotary_layout(const at::Tensor& x, const at::Tensor& positions,
                           int64_t head_size, const char* name) {
  const char* op = "rotary_embedding";
  const int64_t td = positions.dim();
  TORCH_CHECK_VALUE(x.dim() == td + 1 || x.dim() == td + 2, op, ": ", name, " has shape ",
                    x.sizes(), "; expected positions' shape ", positions.sizes(),
                    " followed by [heads * head_size] or [heads, head_size]");
  for (int64_t i = 0; i < td; ++i)
    TORCH_CHECK_VALUE(x.size(i) == positions.size(i), op, ": ", name, " has shape ", x.sizes(),
                      " which does not start with positions' shape ", positions.sizes());
  TORCH_CHECK_VALUE(x.stride(-1) == 1, op, ": ", name, " must be contiguous in its last dimension");
  RotaryTarget r{};
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

}  // namespace

void rotary_embedding(const at::Tensor& positions, at::Tensor& query,
                      std::optional<at::Tensor> key, int64_t head_size,
                      const at::Tensor& cos_sin_cache, bool is_neox) {
  const char* op = "rotary_embedding";
  DType dt = dtype_of(query, op, "query");
  TORCH_CHECK_VALUE(head_size > 0, op, ": head_size must be positive, got ", head_size);
  TORCH_CHECK_VALUE(positions.device().is_cpu(), op, ": positions must be a CPU tensor");
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
  RotaryTarget q = rotary_layout(query, positions, head_size, "query");
  RotaryTarget k{};
  if (key.has_value()) {
    check_like(*key, query, op, "key", "query");
    k = rotary_layout(*key, positions, head_size, "key");
  }
  const int64_t tokens = positions.numel();
  if (tokens == 0) return;
  at::Tensor pos = positions.contiguous();
  auto mm = at::aminmax(pos);
  const int64_t lo = std::get<0>(mm).item<int64_t>();
  const int64_t hi = std::get<1>(mm).item<int64_t>();
  TORCH_CHECK_INDEX(lo >= 0 && hi < cos_sin_cache.size(0), op, ": positions range over [", lo,
                    ", ", hi, "] but cos_sin_cache has ", cos_sin_cache.size(0),
                    " rows (max_position)");
  const auto& K = kernels();
  K.rotary_embedding(dt, pos.const_data_ptr<int64_t>(), query.data_ptr(),
                     cos_sin_cache.const_data_ptr(), tokens, q.heads, q.token_stride,
                     q.head_stride, rot_dim, cos_sin_cache.stride(0), is_neox);
  if (key.has_value())
    K.rotary_embedding(dt, pos.const_data_ptr<int64_t>(), key->data_ptr(),
                       cos_sin_cache.const_data_ptr(), tokens, k.heads, k.token_stride,
                       k.head_stride, rot_dim, cos_sin_cache.stride(0), is_neox);
}

namespace {

// Cache layout shared by reshape_and_cache and paged_attention.
struct CacheShape {
  int64_t blocks, kv_heads, block_size, head_size;
};

CacheShape check_caches(const at::Tensor& key_cache, const at::Tensor& value_cache,
                        const char* op) {
  TORCH_CHECK_VALUE(key_cache.dim() == 4, op,
                    ": key_cache must be [num_blocks, num_kv_heads, block_size, head_size], "
                    "got shape ", key_cache.sizes());
  TORCH_CHECK_VALUE(value_cache.sizes() == key_cache.sizes(), op, ": value_cache has shape ",
                    value_cache.sizes(), " but key_cache has shape ", key_cache.sizes());
  check_like(value_cache, key_cache, op, "value_cache", "key_cache");
  TORCH_CHECK_VALUE(key_cache.is_contiguous() && value_cache.is_contiguous(), op,
                    ": key_cache and value_cache must be contiguous");
  return {key_cache.size(0), key_cache.size(1), key_cache.size(2), key_cache.size(3)};
}

}  // namespace

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  const char* op = "reshape_and_cache";
  dtype_of(key, op, "key");
  check_like(value, key, op, "value", "key");
  check_like(key_cache, key, op, "key_cache", "key");
  CacheShape c = check_caches(key_cache, value_cache, op);
  TORCH_CHECK_VALUE(key.dim() == 3 && key.size(1) == c.kv_heads && key.size(2) == c.head_size,
                    op, ": key must be [tokens, ", c.kv_heads, ", ", c.head_size,
                    "] to match the cache, got shape ", key.sizes());
  TORCH_CHECK_VALUE(value.sizes() == key.sizes(), op, ": value has shape ", value.sizes(),
                    " but key has shape ", key.sizes());
  TORCH_CHECK_VALUE(key.stride(2) == 1 && value.stride(2) == 1, op,
                    ": key and value must be contiguous in their last dimension");
  check_index_tensor(slot_mapping, at::kLong, 1, op, "slot_mapping");
  const int64_t tokens = key.size(0);
  TORCH_CHECK_VALUE(slot_mapping.size(0) == tokens, op, ": slot_mapping has ",
                    slot_mapping.size(0), " entries but key has ", tokens, " tokens");
  if (tokens == 0) return;
  auto mm = at::aminmax(slot_mapping);
  const int64_t lo = std::get<0>(mm).item<int64_t>();
  const int64_t hi = std::get<1>(mm).item<int64_t>();
  TORCH_CHECK_INDEX(lo >= -1 && hi < c.blocks * c.block_size, op, ": slot_mapping ranges over [",
                    lo, ", ", hi, "] but the cache holds ", c.blocks * c.block_size,
                    " slots (", c.blocks, " blocks of ", c.block_size,
                    "); -1 marks a token not to store");
  kernels().reshape_and_cache(key.element_size(), key.const_data_ptr(), value.const_data_ptr(),
                              key_cache.data_ptr(), value_cache.data_ptr(),
                              slot_mapping.const_data_ptr<int64_t>(), tokens, c.kv_heads,
                              c.head_size, c.block_size, key.stride(0), key.stride(1),
                              value.stride(0), value.stride(1));
}

void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                     const at::Tensor& value_cache, const at::Tensor& block_tables,
                     const at::Tensor& seq_lens, double scale) {
  const char* op = "paged_attention";
  DType dt = dtype_of(query, op, "query");
  check_like(out, query, op, "out", "query");
  check_like(key_cache, query, op, "key_cache", "query");
  CacheShape c = check_caches(key_cache, value_cache, op);
  TORCH_CHECK_VALUE(query.dim() == 3 && query.is_contiguous(), op,
                    ": query must be a contiguous [num_seqs, num_heads, head_size] tensor, got "
                    "shape ", query.sizes());
  TORCH_CHECK_VALUE(out.sizes() == query.sizes() && out.is_contiguous(), op,
                    ": out must be contiguous with query's shape ", query.sizes(), ", got ",
                    out.sizes());
  const int64_t seqs = query.size(0), heads = query.size(1);
  TORCH_CHECK_VALUE(query.size(2) == c.head_size, op, ": query's head_size ", query.size(2),
                    " differs from the cache's ", c.head_size);
  TORCH_CHECK_VALUE(c.kv_heads > 0 && heads % c.kv_heads == 0, op, ": num_heads ", heads,
                    " must be a multiple of the cache's num_kv_heads ", c.kv_heads);
  check_index_tensor(block_tables, at::kInt, 2, op, "block_tables");
  check_index_tensor(seq_lens, at::kInt, 1, op, "seq_lens");
  TORCH_CHECK_VALUE(block_tables.size(0) == seqs && seq_lens.size(0) == seqs, op,
                    ": block_tables and seq_lens need one row per sequence (", seqs,
                    "), got ", block_tables.size(0), " and ", seq_lens.size(0));
  TORCH_CHECK_VALUE(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  if (seqs == 0) return;
  const int64_t max_blocks = block_tables.size(1);
  const int32_t* bt = block_tables.const_data_ptr<int32_t>();
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t len = sl[s];
    TORCH_CHECK_VALUE(len >= 0 && len <= max_blocks * c.block_size, op, ": seq_lens[", s,
                      "] = ", len, " does not fit block_tables' ", max_blocks, " blocks of ",
                      c.block_size, " tokens");
    const int64_t used = (len + c.block_size - 1) / c.block_size;
    for (int64_t b = 0; b < used; ++b) {
      const int64_t blk = bt[s * max_blocks + b];
      TORCH_CHECK_INDEX(blk >= 0 && blk < c.blocks, op, ": block_tables[", s, ", ", b, "] = ",
                        blk, " points outside the cache's ", c.blocks, " blocks");
    }
  }
  kernels().paged_attention(dt, out.data_ptr(), query.const_data_ptr(),
                            key_cache.const_data_ptr(), value_cache.const_data_ptr(), bt, sl,
                            seqs, heads, c.kv_heads, c.head_size, c.block_size, max_blocks,
                            static_cast<float>(scale));
}

}  // namespace cpu
}  // namespace engine
