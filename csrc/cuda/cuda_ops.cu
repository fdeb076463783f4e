// CUDA implementations of the ops, registered for the CUDA dispatch key under
// the same names as the CPU ones (csrc/torch_bindings.cpp). Arguments are
// validated by csrc/op_checks.h before any launch; kernels accumulate in fp32.
// c10's CUDA headers only: ATen/cuda/CUDAContext.h would pull in cuBLAS and
// cuSPARSE headers, which a bare CUDA toolkit does not have.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>

#include <algorithm>

#include "../op_checks.h"
#include "../ops.h"

namespace engine {
namespace cuda {
namespace {

using namespace engine::checks;

constexpr int kMaxThreads = 1024;

// launch(T{}, stream) for t's element type (float or bfloat16), on `on`'s device
// and its current stream; then the launch's error check
template <typename F>
void launch_on(const at::Tensor& on, at::ScalarType t, F&& launch) {
  const c10::cuda::CUDAGuard guard(on.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (t == at::kFloat)
    launch(float{}, stream);
  else
    launch(c10::BFloat16{}, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

int threads_for(int64_t work) {
  int64_t t = ((std::min<int64_t>(work, kMaxThreads) + 31) / 32) * 32;
  return static_cast<int>(std::max<int64_t>(t, 32));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>((blockDim.x + 31) >> 5) ? partial[lane] : 0.f;
    v = warp_sum(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

template <typename T>
__global__ void rms_norm_kernel(T* __restrict__ out, const T* __restrict__ in,
                                const T* __restrict__ w, int64_t hidden, int64_t in_stride,
                                int64_t out_stride, float eps) {
  const T* x = in + blockIdx.x * in_stride;
  T* y = out + blockIdx.x * out_stride;
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = static_cast<float>(x[i]);
    acc += v * v;
  }
  const float inv = rsqrtf(block_sum(acc) / static_cast<float>(hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    y[i] = static_cast<T>(static_cast<float>(x[i]) * inv * static_cast<float>(w[i]));
}

template <typename T>
__global__ void fused_add_rms_norm_kernel(T* __restrict__ in, T* __restrict__ res,
                                          const T* __restrict__ w, int64_t hidden,
                                          int64_t in_stride, int64_t res_stride, float eps) {
  T* x = in + blockIdx.x * in_stride;
  T* z = res + blockIdx.x * res_stride;
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    T s = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(z[i]));
    z[i] = s;
    float v = static_cast<float>(s);
    acc += v * v;
  }
  const float inv = rsqrtf(block_sum(acc) / static_cast<float>(hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    x[i] = static_cast<T>(static_cast<float>(z[i]) * inv * static_cast<float>(w[i]));
}

template <typename T>
__global__ void silu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t d,
                                    int64_t in_stride, int64_t out_stride) {
  const T* a = in + blockIdx.x * in_stride;
  T* y = out + blockIdx.x * out_stride;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    y[i] = static_cast<T>(silu(static_cast<float>(a[i])) * static_cast<float>(a[d + i]));
}

template <typename T>
__global__ void rotary_kernel(const int64_t* __restrict__ positions, T* __restrict__ x,
                              const T* __restrict__ cache, int64_t heads, int64_t token_stride,
                              int64_t head_stride, int64_t rot_dim, int64_t cache_stride,
                              bool neox) {
  const int64_t t = blockIdx.x;
  const int64_t half = rot_dim / 2;
  const T* cos_p = cache + positions[t] * cache_stride;
  const T* sin_p = cos_p + half;
  for (int64_t j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const int64_t h = j / half, i = j % half;
    T* v = x + t * token_stride + h * head_stride;
    const int64_t i1 = neox ? i : 2 * i, i2 = neox ? i + half : 2 * i + 1;
    const float c = static_cast<float>(cos_p[i]), s = static_cast<float>(sin_p[i]);
    const float x1 = static_cast<float>(v[i1]), x2 = static_cast<float>(v[i2]);
    v[i1] = static_cast<T>(x1 * c - x2 * s);
    v[i2] = static_cast<T>(x2 * c + x1 * s);
  }
}

template <typename T>
__global__ void reshape_and_cache_kernel(const T* __restrict__ key, const T* __restrict__ value,
                                         T* __restrict__ key_cache, T* __restrict__ value_cache,
                                         const int64_t* __restrict__ slots, int64_t kv_heads,
                                         int64_t head_size, int64_t block_size, int64_t kts,
                                         int64_t khs, int64_t vts, int64_t vhs) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int64_t block = slot / block_size, offset = slot % block_size;
  for (int64_t j = threadIdx.x; j < kv_heads * head_size; j += blockDim.x) {
    const int64_t h = j / head_size, i = j % head_size;
    const int64_t dst = ((block * kv_heads + h) * block_size + offset) * head_size + i;
    key_cache[dst] = key[t * kts + h * khs + i];
    value_cache[dst] = value[t * vts + h * vhs + i];
  }
}

constexpr int kAttnWarps = 4;
constexpr int kMaxDimsPerLane = 8;  // head_size <= 256

// One block per (head, sequence). Each warp walks a quarter of the tokens with
// an online softmax (lanes split the head dimension); the warps' partial
// results are merged at the end. No sequence-length limit, no scratch memory.
template <typename T>
__global__ void paged_attention_kernel(T* __restrict__ out, const T* __restrict__ query,
                                       const T* __restrict__ key_cache,
                                       const T* __restrict__ value_cache,
                                       const int32_t* __restrict__ block_tables,
                                       const int32_t* __restrict__ seq_lens, int heads,
                                       int kv_heads, int head_size, int block_size,
                                       int max_blocks, float scale) {
  const int h = blockIdx.x, s = blockIdx.y;
  const int kh = h / (heads / kv_heads);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int len = seq_lens[s];
  const T* q = query + (static_cast<int64_t>(s) * heads + h) * head_size;

  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxDimsPerLane; ++j) {
    const int d = lane + 32 * j;
    qr[j] = d < head_size ? static_cast<float>(q[d]) * scale : 0.f;
    acc[j] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int t = warp; t < len; t += kAttnWarps) {
    const int64_t blk = block_tables[static_cast<int64_t>(s) * max_blocks + t / block_size];
    const int64_t off = ((blk * kv_heads + kh) * block_size + t % block_size) * head_size;
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxDimsPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < head_size) dot += qr[j] * static_cast<float>(key_cache[off + d]);
    }
    dot = warp_sum(dot);
    const float m_new = fmaxf(m, dot);
    const float corr = __expf(m - m_new), p = __expf(dot - m_new);
    l = l * corr + p;
#pragma unroll
    for (int j = 0; j < kMaxDimsPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < head_size) acc[j] = acc[j] * corr + p * static_cast<float>(value_cache[off + d]);
    }
    m = m_new;
  }

  __shared__ float warp_m[kAttnWarps], warp_l[kAttnWarps];
  __shared__ float warp_acc[kAttnWarps][32 * kMaxDimsPerLane];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kMaxDimsPerLane; ++j) warp_acc[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, warp_m[w]);
  float L = 0.f, weight[kAttnWarps];
  for (int w = 0; w < kAttnWarps; ++w) {
    weight[w] = warp_m[w] == -INFINITY ? 0.f : __expf(warp_m[w] - M);
    L += warp_l[w] * weight[w];
  }
  T* o = out + (static_cast<int64_t>(s) * heads + h) * head_size;
#pragma unroll
  for (int j = 0; j < kMaxDimsPerLane; ++j) {
    const int d = lane + 32 * j;
    if (d >= head_size) continue;
    float v = 0.f;
    for (int w = 0; w < kAttnWarps; ++w) v += warp_acc[w][d] * weight[w];
    o[d] = static_cast<T>(L > 0.f ? v / L : 0.f);
  }
}

}  // namespace

namespace {

// A norm kernel over r's rows, a block a row: kernel_for(T{}) the kernel, given
// (first, second, weight, width, a's row stride, b's, epsilon)
template <typename KernelFor>
void launch_norm(const Rows& r, const at::Tensor& first, const at::Tensor& second,
                 const at::Tensor& weight, double epsilon, KernelFor kernel_for) {
  if (r.rows == 0) return;
  launch_on(first, r.dtype, [&](auto tag, cudaStream_t stream) {
    using T = decltype(tag);
    kernel_for(tag)<<<r.rows, threads_for(r.width), 0, stream>>>(
        first.data_ptr<T>(), second.data_ptr<T>(), weight.const_data_ptr<T>(), r.width,
        r.a.stride(0), r.b.stride(0), static_cast<float>(epsilon));
  });
}

}  // namespace

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
              double epsilon) {
  Rows r = prepare_rms_norm(out, input, weight, epsilon, at::kCUDA);
  launch_norm(r, r.b, r.a, weight, epsilon,
              [](auto tag) { return &rms_norm_kernel<decltype(tag)>; });
}

void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                        double epsilon) {
  Rows r = prepare_fused_add_rms_norm(input, residual, weight, epsilon, at::kCUDA);
  launch_norm(r, r.a, r.b, weight, epsilon,
              [](auto tag) { return &fused_add_rms_norm_kernel<decltype(tag)>; });
}

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  Rows r = prepare_silu_and_mul(out, input, at::kCUDA);
  if (r.rows == 0) return;
  launch_on(input, r.dtype, [&](auto tag, cudaStream_t stream) {
    using T = decltype(tag);
    silu_and_mul_kernel<T><<<r.rows, threads_for(r.width), 0, stream>>>(
        r.b.data_ptr<T>(), r.a.const_data_ptr<T>(), r.width, r.a.stride(0), r.b.stride(0));
  });
}

void rotary_embedding(const at::Tensor& positions, at::Tensor& query,
                      std::optional<at::Tensor> key, int64_t head_size,
                      const at::Tensor& cos_sin_cache, bool is_neox) {
  Rotary r = prepare_rotary(positions, query, key, head_size, cos_sin_cache, at::kCUDA);
  if (r.tokens == 0) return;
  launch_on(query, r.dtype, [&](auto tag, cudaStream_t stream) {
    using T = decltype(tag);
    const int64_t* pos = r.positions.const_data_ptr<int64_t>();
    rotary_kernel<T><<<r.tokens, threads_for(r.q.heads * r.rot_dim / 2), 0, stream>>>(
        pos, query.data_ptr<T>(), cos_sin_cache.const_data_ptr<T>(), r.q.heads,
        r.q.token_stride, r.q.head_stride, r.rot_dim, cos_sin_cache.stride(0), is_neox);
    if (key.has_value())
      rotary_kernel<T><<<r.tokens, threads_for(r.k.heads * r.rot_dim / 2), 0, stream>>>(
          pos, key->data_ptr<T>(), cos_sin_cache.const_data_ptr<T>(), r.k.heads,
          r.k.token_stride, r.k.head_stride, r.rot_dim, cos_sin_cache.stride(0), is_neox);
  });
}

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  CacheShape c =
      prepare_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, at::kCUDA);
  if (key.size(0) == 0) return;
  launch_on(key, key.scalar_type(), [&](auto tag, cudaStream_t stream) {
    using T = decltype(tag);
    reshape_and_cache_kernel<T><<<key.size(0), threads_for(c.kv_heads * c.head_size), 0,
                                  stream>>>(
        key.const_data_ptr<T>(), value.const_data_ptr<T>(), key_cache.data_ptr<T>(),
        value_cache.data_ptr<T>(), slot_mapping.const_data_ptr<int64_t>(), c.kv_heads,
        c.head_size, c.block_size, key.stride(0), key.stride(1), value.stride(0),
        value.stride(1));
  });
}

void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                     const at::Tensor& value_cache, const at::Tensor& block_tables,
                     const at::Tensor& seq_lens, double scale) {
  const at::Tensor q = query.contiguous();  // the kernel reads rows back to back
  Attention a = prepare_paged_attention(out, q, key_cache, value_cache, block_tables,
                                        seq_lens, scale, at::kCUDA);
  TORCH_CHECK_VALUE(a.cache.head_size <= 32 * kMaxDimsPerLane, "paged_attention: head_size ",
                    a.cache.head_size, " exceeds the CUDA kernel's maximum of ",
                    32 * kMaxDimsPerLane);
  if (a.seqs == 0) return;
  // a grid's second dimension holds at most 65535 blocks (the first 2^31 - 1)
  TORCH_CHECK_VALUE(a.seqs <= 65535, "paged_attention: ", a.seqs, " sequences in one batch; "
                    "the CUDA kernel takes at most 65535 (lower max_num_seqs)");
  dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.seqs));
  launch_on(q, a.dtype, [&](auto tag, cudaStream_t stream) {
    using T = decltype(tag);
    paged_attention_kernel<T><<<grid, 32 * kAttnWarps, 0, stream>>>(
        out.data_ptr<T>(), q.const_data_ptr<T>(), key_cache.const_data_ptr<T>(),
        value_cache.const_data_ptr<T>(), block_tables.const_data_ptr<int32_t>(),
        seq_lens.const_data_ptr<int32_t>(), static_cast<int>(a.heads),
        static_cast<int>(a.cache.kv_heads), static_cast<int>(a.cache.head_size),
        static_cast<int>(a.cache.block_size), static_cast<int>(a.max_blocks),
        static_cast<float>(scale));
  });
}

}  // namespace cuda
}  // namespace engine
