// The checks of the ops over the paged KV cache (reshape_and_cache, decode and
// prefill attention): op_checks.h's rules (each prepare_* checks every
// argument and returns what the kernels need), split out by job.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/any.h>
#include <ATen/ops/arange.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "op_checks.h"

namespace engine {
namespace checks {

// Cache layout shared by reshape_and_cache and paged_attention.
struct CacheShape {
  int64_t blocks, kv_heads, block_size, head_size;
};

inline CacheShape check_caches(const at::Tensor& key_cache, const at::Tensor& value_cache,
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

inline CacheShape prepare_reshape_and_cache(const at::Tensor& key, const at::Tensor& value,
                                            const at::Tensor& key_cache,
                                            const at::Tensor& value_cache,
                                            const at::Tensor& slot_mapping,
                                            c10::DeviceType device) {
  const char* op = "reshape_and_cache";
  dtype_of(key, device, op, "key");
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
  check_index_tensor(slot_mapping, key, at::kLong, 1, op, "slot_mapping");
  TORCH_CHECK_VALUE(slot_mapping.size(0) == key.size(0), op, ": slot_mapping has ",
                    slot_mapping.size(0), " entries but key has ", key.size(0), " tokens");
  check_range(slot_mapping, -1, c.blocks * c.block_size, op,
              "slot_mapping entries (cache slots; -1 marks a token not to store)");
  return c;
}

// Every block a sequence's seq_lens[s] tokens use must lie inside the cache
// (checked on the CPU always, on a GPU under set_device_bound_checks).
inline void check_block_tables(const at::Tensor& block_tables, const at::Tensor& seq_lens,
                               const CacheShape& c, const char* op) {
  const int64_t seqs = seq_lens.size(0), max_blocks = block_tables.size(1);
  if (seqs > 0 && check_values_on(seq_lens)) {
    check_range(seq_lens, 0, max_blocks * c.block_size + 1, op,
                "seq_lens (must fit block_tables' blocks)");
    // Every block a sequence uses must lie inside the cache.
    bool bad_entry = false;
    if (block_tables.device().is_cpu()) {
      const int32_t* bt = block_tables.const_data_ptr<int32_t>();
      const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
      for (int64_t s = 0; s < seqs && !bad_entry; ++s)
        for (int64_t b = 0; b < (sl[s] + c.block_size - 1) / c.block_size; ++b) {
          const int32_t blk = bt[s * max_blocks + b];
          if (blk < 0 || blk >= c.blocks) {
            bad_entry = true;
            break;
          }
        }
    } else {
      at::Tensor blocks_used = seq_lens.add(c.block_size - 1).div(c.block_size, "floor");
      at::Tensor used = at::arange(max_blocks, block_tables.options())
                            .unsqueeze(0)
                            .lt(blocks_used.unsqueeze(1));
      at::Tensor bad = block_tables.lt(0).logical_or(block_tables.ge(c.blocks)).logical_and(used);
      bad_entry = at::any(bad).item<bool>();
    }
    TORCH_CHECK_INDEX(!bad_entry, op, ": block_tables has an entry that points outside the "
                      "cache's ", c.blocks, " blocks");
  }
}

struct Attention {
  at::ScalarType dtype;
  CacheShape cache;
  int64_t seqs, heads, max_blocks;
};

// query as the decode kernels read it: each row's heads contiguous, its rows
// where they lie (the q part of a fused qkv output, whose copy was ~1.5% of a
// 16-request decode step); any other [seqs, heads, head_size] layout copied.
inline bool heads_packed(const at::Tensor& query) {
  return query.dim() == 3 && query.stride(2) == 1 && query.stride(1) == query.size(2) &&
         query.stride(0) >= query.size(1) * query.size(2);
}
inline at::Tensor readable_query(const at::Tensor& query) {
  return query.dim() != 3 || heads_packed(query) ? query : query.contiguous();
}

// What both attentions check of query, out, the caches and the index tensors
// (rows: what query's first dimension counts). Returns all but seqs and
// max_blocks, which the caller reads once its own index tensors are checked.
// strided_rows: query's rows may lie apart (each row's heads contiguous: what
// readable_query gives), else query is contiguous.
inline Attention check_query_and_caches(const at::Tensor& out, const at::Tensor& query,
                                        const at::Tensor& key_cache,
                                        const at::Tensor& value_cache,
                                        const at::Tensor& block_tables,
                                        const at::Tensor& seq_lens, const char* rows,
                                        c10::DeviceType device, const char* op,
                                        bool strided_rows = false) {
  auto dt = dtype_of(query, device, op, "query");
  check_like(out, query, op, "out", "query");
  check_like(key_cache, query, op, "key_cache", "query");
  CacheShape c = check_caches(key_cache, value_cache, op);
  const bool rows_ok = strided_rows && heads_packed(query);
  TORCH_CHECK_VALUE(query.dim() == 3 && (query.is_contiguous() || rows_ok), op,
                    ": query must be a [", rows, ", num_heads, head_size] tensor, ",
                    strided_rows ? "each row's heads contiguous" : "contiguous",
                    ", got shape ", query.sizes(), " and strides ", query.strides());
  TORCH_CHECK_VALUE(out.sizes() == query.sizes() && out.is_contiguous(), op,
                    ": out must be contiguous with query's shape ", query.sizes(), ", got ",
                    out.sizes());
  const int64_t heads = query.size(1);
  TORCH_CHECK_VALUE(query.size(2) == c.head_size, op, ": query's head_size ", query.size(2),
                    " differs from the cache's ", c.head_size);
  TORCH_CHECK_VALUE(c.kv_heads > 0 && heads % c.kv_heads == 0, op, ": num_heads ", heads,
                    " must be a multiple of the cache's num_kv_heads ", c.kv_heads);
  check_index_tensor(block_tables, query, at::kInt, 2, op, "block_tables");
  check_index_tensor(seq_lens, query, at::kInt, 1, op, "seq_lens");
  return {dt, c, 0, heads, 0};
}

inline Attention prepare_paged_attention(const at::Tensor& out, const at::Tensor& query,
                                         const at::Tensor& key_cache,
                                         const at::Tensor& value_cache,
                                         const at::Tensor& block_tables,
                                         const at::Tensor& seq_lens, double scale,
                                         c10::DeviceType device) {
  const char* op = "paged_attention";
  Attention a = check_query_and_caches(out, query, key_cache, value_cache, block_tables,
                                       seq_lens, "num_seqs", device, op, true);
  const int64_t seqs = query.size(0);
  TORCH_CHECK_VALUE(block_tables.size(0) == seqs && seq_lens.size(0) == seqs, op,
                    ": block_tables and seq_lens need one row per sequence (", seqs, "), got ",
                    block_tables.size(0), " and ", seq_lens.size(0));
  TORCH_CHECK_VALUE(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  check_block_tables(block_tables, seq_lens, a.cache, op);
  return {a.dtype, a.cache, seqs, a.heads, block_tables.size(1)};
}

// query_start_loc [seqs + 1]: 0, non-decreasing, ending at the token count;
// each sequence's query count at most its seq_lens (its queries are the last
// tokens of its context).
inline void check_query_starts(const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                               int64_t tokens, const char* op) {
  if (!check_values_on(query_start_loc)) return;
  const at::Tensor qsl = query_start_loc.cpu(), sl = seq_lens.cpu();
  const int32_t* q = qsl.const_data_ptr<int32_t>();
  const int32_t* n = sl.const_data_ptr<int32_t>();
  const int64_t seqs = sl.size(0);
  TORCH_CHECK_VALUE(q[0] == 0 && q[seqs] == tokens, op, ": query_start_loc must start at 0 "
                    "and end at the number of query tokens (", tokens, "), got ", q[0], " and ",
                    q[seqs]);
  for (int64_t b = 0; b < seqs; ++b) {
    TORCH_CHECK_VALUE(q[b + 1] >= q[b], op, ": query_start_loc must be non-decreasing, got ",
                      q[b], " then ", q[b + 1], " at sequence ", b);
    TORCH_CHECK_VALUE(q[b + 1] - q[b] <= n[b], op, ": sequence ", b, " has ", q[b + 1] - q[b],
                      " queries but seq_lens says its context is only ", n[b],
                      " tokens (the queries are its last tokens, already in the cache)");
  }
}

inline Attention prepare_paged_prefill_attention(
    const at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
    const at::Tensor& value_cache, const at::Tensor& block_tables,
    const at::Tensor& query_start_loc, const at::Tensor& seq_lens, double scale,
    int64_t sliding_window, c10::DeviceType device) {
  const char* op = "paged_prefill_attention";
  Attention a = check_query_and_caches(out, query, key_cache, value_cache, block_tables,
                                       seq_lens, "num_tokens", device, op);
  check_index_tensor(query_start_loc, query, at::kInt, 1, op, "query_start_loc");
  const int64_t seqs = seq_lens.size(0);
  TORCH_CHECK_VALUE(block_tables.size(0) == seqs && query_start_loc.size(0) == seqs + 1, op,
                    ": block_tables needs one row per sequence (", seqs,
                    ", the length of seq_lens) and query_start_loc ", seqs + 1,
                    " entries, got ", block_tables.size(0), " and ", query_start_loc.size(0));
  TORCH_CHECK_VALUE(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  TORCH_CHECK_VALUE(sliding_window == -1 || sliding_window > 0, op,
                    ": sliding_window must be -1 (none) or a positive number of tokens, got ",
                    sliding_window);
  check_block_tables(block_tables, seq_lens, a.cache, op);
  if (seqs > 0) check_query_starts(query_start_loc, seq_lens, query.size(0), op);
  TORCH_CHECK_VALUE(seqs > 0 || query.size(0) == 0, op, ": ", query.size(0),
                    " query tokens but no sequences");
  return {a.dtype, a.cache, seqs, a.heads, block_tables.size(1)};
}

}  // namespace checks
}  // namespace engine
