// Every op of every compiled kernel table against a double-precision reference,
// in float32 and bfloat16, without torch: the kernel files include no torch
// header, so this driver links them directly (tests/toolchain/test_aarch64_native.py
// cross-compiles it and runs it under qemu in seconds).
//
// usage: kernel_check [isa...]   (default: every table this CPU can run)
// Exit status 0 when every case is within tolerance, 1 otherwise.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "cpu/kernels.h"
#if defined(__aarch64__)
#include <sys/auxv.h>

#include "cpu/arm/kernels_arm.h"
#endif

using engine::cpu::DType;
using engine::cpu::KernelTable;

namespace {

uint64_t rng_state = 0x9E3779B97F4A7C15ull;
float uniform(float lo, float hi) {  // xorshift64*
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  uint64_t r = rng_state * 2685821657736338717ull;
  return lo + (hi - lo) * static_cast<float>(r >> 40) / static_cast<float>(1 << 24);
}

uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// A tensor kept as float values that are exactly representable in its dtype,
// with its storage (float or bf16 bits) for the kernel.
struct Buf {
  DType dt;
  std::vector<float> v;
  std::vector<uint16_t> h;
  Buf(DType d, size_t n, float lo = -1.f, float hi = 1.f) : dt(d), v(n), h(n) {
    for (size_t i = 0; i < n; ++i) set(i, uniform(lo, hi));
  }
  void set(size_t i, float x) {
    h[i] = to_bf16(x);
    v[i] = dt == DType::kBFloat16 ? from_bf16(h[i]) : x;
  }
  void* data() { return dt == DType::kFloat32 ? static_cast<void*>(v.data()) : h.data(); }
  float at(size_t i) const { return dt == DType::kFloat32 ? v[i] : from_bf16(h[i]); }
  float round(double x) const { return dt == DType::kFloat32 ? static_cast<float>(x) : from_bf16(to_bf16(static_cast<float>(x))); }
};

int failures = 0, cases = 0;

void check(const char* isa, const char* op, DType dt, const std::string& what, const Buf& got,
           const std::vector<double>& want, double tol_scale = 1.0) {
  const double tol = (dt == DType::kFloat32 ? 2e-5 : 1.6e-2) * tol_scale;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double err = fabs(got.at(i) - want[i]) / (tol + tol * fabs(want[i]));
    if (!(err <= worst)) { worst = err; at = i; }  // NaN counts as worst
  }
  ++cases;
  const bool ok = worst <= 1.0;
  if (!ok) ++failures;
  printf("%-4s %-9s %-18s %-4s %-28s err/tol %.3f%s\n", ok ? "ok" : "FAIL", isa, op,
         dt == DType::kFloat32 ? "fp32" : "bf16", what.c_str(), worst,
         ok ? "" : (" at " + std::to_string(at) + ": got " + std::to_string(got.at(at)) +
                    " want " + std::to_string(want[at])).c_str());
}

void rms_norm(const char* isa, const KernelTable& k, DType dt, int64_t rows, int64_t hidden) {
  Buf in(dt, rows * hidden, -2, 2), w(dt, hidden, 0.5, 1.5), out(dt, rows * hidden);
  k.rms_norm(dt, out.data(), in.data(), w.data(), rows, hidden, hidden, hidden, 1e-6f);
  std::vector<double> want(rows * hidden);
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t i = 0; i < hidden; ++i) acc += double(in.v[r * hidden + i]) * in.v[r * hidden + i];
    double inv = 1.0 / sqrt(acc / hidden + 1e-6);
    for (int64_t i = 0; i < hidden; ++i) want[r * hidden + i] = in.v[r * hidden + i] * inv * w.v[i];
  }
  check(isa, "rms_norm", dt, std::to_string(rows) + "x" + std::to_string(hidden), out, want);
}

void fused_add_rms_norm(const char* isa, const KernelTable& k, DType dt, int64_t rows, int64_t hidden) {
  Buf in(dt, rows * hidden, -2, 2), res(dt, rows * hidden, -2, 2), w(dt, hidden, 0.5, 1.5);
  Buf in0 = in, res0 = res;
  k.fused_add_rms_norm(dt, in.data(), res.data(), w.data(), rows, hidden, hidden, hidden, 1e-6f);
  std::vector<double> want_out(rows * hidden), want_res(rows * hidden);
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t i = 0; i < hidden; ++i) {
      // the residual is rounded to the dtype, then normalized as stored
      double s = res0.round(double(in0.v[r * hidden + i]) + res0.v[r * hidden + i]);
      want_res[r * hidden + i] = s;
      acc += s * s;
    }
    double inv = 1.0 / sqrt(acc / hidden + 1e-6);
    for (int64_t i = 0; i < hidden; ++i) want_out[r * hidden + i] = want_res[r * hidden + i] * inv * w.v[i];
  }
  std::string what = std::to_string(rows) + "x" + std::to_string(hidden);
  check(isa, "fused_add_rms_norm", dt, what + " out", in, want_out);
  check(isa, "fused_add_rms_norm", dt, what + " residual", res, want_res);
}

void silu_and_mul(const char* isa, const KernelTable& k, DType dt, int64_t rows, int64_t d) {
  Buf in(dt, rows * 2 * d, -8, 8), out(dt, rows * d);
  in.set(0, -100.f);  // far tail of exp
  k.silu_and_mul(dt, out.data(), in.data(), rows, d, 2 * d, d);
  std::vector<double> want(rows * d);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d; ++i) {
      double a = in.v[r * 2 * d + i], b = in.v[r * 2 * d + d + i];
      want[r * d + i] = a / (1.0 + exp(-a)) * b;
    }
  check(isa, "silu_and_mul", dt, std::to_string(rows) + "x" + std::to_string(d), out, want);
}

void rotary(const char* isa, const KernelTable& k, DType dt, int64_t tokens, int64_t heads,
            int64_t head_size, int64_t rot_dim, bool neox) {
  const int64_t max_pos = 64, half = rot_dim / 2;
  Buf x(dt, tokens * heads * head_size, -2, 2), cache(dt, max_pos * rot_dim);
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double theta = p * pow(10000.0, -2.0 * i / rot_dim);
      cache.set(p * rot_dim + i, static_cast<float>(cos(theta)));
      cache.set(p * rot_dim + half + i, static_cast<float>(sin(theta)));
    }
  std::vector<int64_t> pos(tokens);
  for (int64_t t = 0; t < tokens; ++t) pos[t] = (t * 7 + 3) % max_pos;
  Buf x0 = x;
  k.rotary_embedding(dt, pos.data(), x.data(), cache.data(), tokens, heads, heads * head_size,
                     head_size, rot_dim, rot_dim, neox);
  std::vector<double> want(x0.v.begin(), x0.v.end());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (t * heads + h) * head_size;
      for (int64_t i = 0; i < half; ++i) {
        double c = cache.v[pos[t] * rot_dim + i], s = cache.v[pos[t] * rot_dim + half + i];
        int64_t i1 = neox ? i : 2 * i, i2 = neox ? i + half : 2 * i + 1;
        double x1 = x0.v[base + i1], x2 = x0.v[base + i2];
        want[base + i1] = x1 * c - x2 * s;
        want[base + i2] = x2 * c + x1 * s;
      }
    }
  check(isa, "rotary_embedding", dt,
        std::string(neox ? "neox " : "gptj ") + std::to_string(tokens) + "t " + std::to_string(heads) +
            "h " + std::to_string(head_size) + "/" + std::to_string(rot_dim),
        x, want);
}

void reshape_and_cache(const char* isa, const KernelTable& k, DType dt, int64_t tokens,
                       int64_t kv_heads, int64_t head_size, int64_t block_size) {
  const int64_t blocks = (tokens + block_size - 1) / block_size + 2;
  const int64_t cache_n = blocks * kv_heads * block_size * head_size;
  Buf key(dt, tokens * kv_heads * head_size), value(dt, tokens * kv_heads * head_size);
  Buf kc(dt, cache_n), vc(dt, cache_n);
  Buf kc0 = kc, vc0 = vc;
  std::vector<int64_t> slots(tokens);
  for (int64_t t = 0; t < tokens; ++t)
    slots[t] = (t % 5 == 4) ? -1 : (blocks * block_size - 1 - t * 3 % (blocks * block_size));
  // keep slots distinct: a reversed walk with stride 3 can collide, so dedupe
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t u = 0; u < t; ++u)
      if (slots[t] >= 0 && slots[u] == slots[t]) slots[t] = -1;
  const int64_t esize = dt == DType::kFloat32 ? 4 : 2;
  k.reshape_and_cache(esize, key.data(), value.data(), kc.data(), vc.data(), slots.data(), tokens,
                      kv_heads, head_size, block_size, kv_heads * head_size, head_size,
                      kv_heads * head_size, head_size);
  std::vector<double> wk(kc0.v.begin(), kc0.v.end()), wv(vc0.v.begin(), vc0.v.end());
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    const int64_t b = slots[t] / block_size, o = slots[t] % block_size;
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t i = 0; i < head_size; ++i) {
        const int64_t dst = ((b * kv_heads + h) * block_size + o) * head_size + i;
        wk[dst] = key.v[(t * kv_heads + h) * head_size + i];
        wv[dst] = value.v[(t * kv_heads + h) * head_size + i];
      }
  }
  std::string what = std::to_string(tokens) + "t " + std::to_string(kv_heads) + "kv " +
                     std::to_string(head_size) + "d b" + std::to_string(block_size);
  check(isa, "reshape_and_cache", dt, what + " key", kc, wk, 1e-9);  // a copy: exact
  check(isa, "reshape_and_cache", dt, what + " value", vc, wv, 1e-9);
}

// q_pad: elements between one sequence's query row and the next (a fused qkv row's k and v)
void paged_attention(const char* isa, const KernelTable& k, DType dt, int64_t seqs, int64_t heads,
                     int64_t kv_heads, int64_t head_size, int64_t block_size, int64_t max_len,
                     int64_t q_pad = 0) {
  const int64_t max_blocks = (max_len + block_size - 1) / block_size;
  const int64_t blocks = seqs * max_blocks + 1, q_stride = heads * head_size + q_pad;
  Buf q(dt, seqs * q_stride), kc(dt, blocks * kv_heads * block_size * head_size),
      vc(dt, blocks * kv_heads * block_size * head_size), out(dt, seqs * heads * head_size);
  std::vector<int32_t> lens(seqs), table(seqs * max_blocks);
  for (int64_t s = 0; s < seqs; ++s) lens[s] = static_cast<int32_t>(s == 0 ? max_len : 1 + (s * 37) % max_len);
  if (seqs > 2) lens[1] = 0;  // an empty sequence: zeros
  for (int64_t i = 0; i < seqs * max_blocks; ++i) table[i] = static_cast<int32_t>((i * 7 + 1) % blocks);
  const float scale = 1.0f / sqrtf(static_cast<float>(head_size));
  k.paged_attention(dt, out.data(), q.data(), q_stride, kc.data(), vc.data(), table.data(), lens.data(), seqs,
                    heads, kv_heads, head_size, block_size, max_blocks, scale);
  std::vector<double> want(seqs * heads * head_size, 0.0), logits(max_len);
  const int64_t group = heads / kv_heads;
  for (int64_t s = 0; s < seqs; ++s)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kh = h / group, len = lens[s];
      if (len == 0) continue;
      const float* qv = &q.v[s * q_stride + h * head_size];
      double mx = -1e300, sum = 0;
      for (int64_t t = 0; t < len; ++t) {
        const int64_t off = ((int64_t(table[s * max_blocks + t / block_size]) * kv_heads + kh) * block_size +
                             t % block_size) * head_size;
        double d = 0;
        for (int64_t i = 0; i < head_size; ++i) d += double(qv[i]) * kc.v[off + i];
        logits[t] = d * scale;
        mx = logits[t] > mx ? logits[t] : mx;
      }
      for (int64_t t = 0; t < len; ++t) sum += (logits[t] = exp(logits[t] - mx));
      for (int64_t t = 0; t < len; ++t) {
        const int64_t off = ((int64_t(table[s * max_blocks + t / block_size]) * kv_heads + kh) * block_size +
                             t % block_size) * head_size;
        for (int64_t i = 0; i < head_size; ++i)
          want[(s * heads + h) * head_size + i] += logits[t] / sum * vc.v[off + i];
      }
    }
  check(isa, "paged_attention", dt,
        std::to_string(seqs) + "s " + std::to_string(heads) + "/" + std::to_string(kv_heads) + "h " +
            std::to_string(head_size) + "d b" + std::to_string(block_size) + " len" + std::to_string(max_len) +
            (q_pad ? " q+" + std::to_string(q_pad) : ""),
        out, want, dt == DType::kFloat32 ? 5.0 : 1.0);
}

// Two adapters (ranks 8 and 3 of max 8) over three slices of uneven widths;
// tokens of slot 0, slot 1 and none, interleaved.
void lora_add(const char* isa, const KernelTable& k, DType dt, int64_t tokens, int64_t K) {
  const int64_t slices = 3, max_rank = 8, loras = 2;
  const int64_t bounds[] = {0, 70, 100, 229};
  const int32_t ranks[] = {8, 3};
  const int64_t N = bounds[slices];
  std::vector<int32_t> slot(tokens);
  for (int64_t t = 0; t < tokens; ++t) slot[t] = static_cast<int32_t>(t % 3) - 1;
  Buf x(dt, tokens * K), a(dt, loras * slices * max_rank * K, -0.2f, 0.2f),
      bt(dt, loras * max_rank * N, -0.2f, 0.2f), out(dt, tokens * N);
  for (int64_t s = 0; s < loras; ++s)  // the padded ranks are zeros, as the caller keeps them
    for (int64_t j = 0; j < slices; ++j)
      for (int64_t r = ranks[s]; r < max_rank; ++r)
        for (int64_t i = 0; i < K; ++i) a.set(((s * slices + j) * max_rank + r) * K + i, 0.f);
  std::vector<double> want(tokens * N);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t n = 0; n < N; ++n) want[t * N + n] = out.at(t * N + n);
    if (slot[t] < 0) continue;
    const int64_t s = slot[t];
    for (int64_t j = 0; j < slices; ++j)
      for (int64_t r = 0; r < ranks[s]; ++r) {
        double h = 0;
        for (int64_t i = 0; i < K; ++i)
          h += double(x.v[t * K + i]) * a.v[((s * slices + j) * max_rank + r) * K + i];
        for (int64_t n = bounds[j]; n < bounds[j + 1]; ++n)
          want[t * N + n] += h * bt.v[(s * max_rank + r) * N + n];
      }
  }
  const int64_t status = k.lora_add(dt, out.data(), x.data(), a.data(), bt.data(), slot.data(),
                                    ranks, bounds, tokens, slices, max_rank, K, K, N);
  if (status != 0) {
    printf("FAIL %-9s lora_add returned %lld\n", isa, static_cast<long long>(status));
    ++failures;
  }
  check(isa, "lora_add", dt, std::to_string(tokens) + "t K" + std::to_string(K), out, want, 2.0);
}

uint16_t to_f16(float f) {  // the kernel's float16 factors (AArch64's __fp16, round to nearest)
  const __fp16 h = static_cast<__fp16>(f);
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
float from_f16(uint16_t u) {
  __fp16 h;
  memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

// GGUF's int8-activation product (cpu/gguf_int8.h's layout) for 4- to 8-bit q
// (5 and 6 with their high bits in a plane of their own, placed as
// engine/reference.py reads them), one term (the zero point) or two (scale and
// min), against x rounded to int8 per row and group as the kernel does (float
// id = 127 / max|x|, to nearest even) and everything after in double.
void gguf_int8_linear(const char* isa, const KernelTable& k, DType dt, int64_t M, int64_t N,
                      int64_t K, int64_t G, int bits, int n_terms, int zero) {
  if (k.gguf_int8_linear == nullptr) return;
  const int B = bits == 8 ? 8 : 4, PF = 32 / B;
  const int64_t groups = (K + G - 1) / G, P = (N + 15) / 16, steps = groups * G / PF;
  std::vector<int> q(N * K);
  std::vector<float> sc(N * groups), tm(N * groups);
  for (auto& v : q) v = static_cast<int>(uniform(0, static_cast<float>(1 << bits))) & ((1 << bits) - 1);
  for (auto& v : sc) v = from_f16(to_f16(uniform(1e-3f, 2e-2f)));
  for (auto& v : tm) v = from_f16(to_f16(uniform(-2e-2f, 2e-2f)));
  const int H = bits == 8 ? 0 : bits - 4, chunk = H ? 32 / H : 1;
  const int64_t chunks = H ? groups * G * H / 32 : 0;
  std::vector<uint32_t> packed(P * steps * 16, 0), high(H ? P * chunks * 16 : 1, 0);
  std::vector<uint16_t> terms(P * groups * n_terms * 16, 0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t p = n / 16, c = n % 16;
    for (int64_t kk = 0; kk < K; ++kk) {
      const uint32_t v = static_cast<uint32_t>(q[n * K + kk]);
      packed[(p * steps + kk / PF) * 16 + c] |= (H ? v & 15 : v) << (kk % PF * B);
      const int64_t j = kk % chunk;  // its place in the chunk's lane
      if (H) high[(p * chunks + kk / chunk) * 16 + c] |= (v >> 4) << (8 * (j % 8 / 2) + 2 * H * (j / 8) + H * (j % 2));
    }
    for (int64_t g = 0; g < groups; ++g) {
      terms[((p * groups + g) * n_terms) * 16 + c] = to_f16(sc[n * groups + g]);
      if (n_terms == 2) terms[((p * groups + g) * n_terms + 1) * 16 + c] = to_f16(tm[n * groups + g]);
    }
  }
  Buf x(dt, M * K, -2, 2), out(dt, M * N);
  const engine::cpu::GgufInt8Weight w{packed.data(), H ? high.data() : nullptr, terms.data(), bits,
                                      n_terms, zero, N, K, G};
  const int64_t failed = k.gguf_int8_linear(dt, w, out.data(), x.data(), M, K, N);
  std::vector<double> want(M * N, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * G, k1 = k0 + G < K ? k0 + G : K;
      float amax = 0.f;
      for (int64_t kk = k0; kk < k1; ++kk) amax = fmaxf(amax, fabsf(x.v[m * K + kk]));
      const float id = amax > 0.f ? 127.f / amax : 0.f;
      const double d = amax / 127.f;
      std::vector<double> qx(k1 - k0);
      double sx = 0;
      for (int64_t kk = k0; kk < k1; ++kk) sx += (qx[kk - k0] = nearbyintf(x.v[m * K + kk] * id));
      for (int64_t n = 0; n < N; ++n) {
        double dot = 0;
        for (int64_t kk = k0; kk < k1; ++kk) dot += qx[kk - k0] * q[n * K + kk];
        const double s = sc[n * groups + g];
        want[m * N + n] += n_terms == 1 ? s * d * (dot - zero * sx) : s * d * dot + tm[n * groups + g] * d * sx;
      }
    }
  if (failed) printf("FAIL %s gguf_int8_linear: %lld bytes of scratch refused\n", isa, static_cast<long long>(failed));
  failures += failed != 0;
  check(isa, "gguf_int8_linear", dt,
        std::to_string(M) + "x" + std::to_string(N) + " K" + std::to_string(K) + " g" + std::to_string(G) +
            " q" + std::to_string(bits) + " t" + std::to_string(n_terms),
        out, want);
}

void run_all(const char* isa, const KernelTable& k) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const int64_t rh[][2] = {{1, 1}, {1, 17}, {7, 128}, {33, 4097}, {3, 4096}};
    for (auto& c : rh) rms_norm(isa, k, dt, c[0], c[1]);
    for (auto& c : rh) fused_add_rms_norm(isa, k, dt, c[0], c[1]);
    const int64_t sd[][2] = {{1, 1}, {5, 13}, {4, 4096}, {64, 1000}};
    for (auto& c : sd) silu_and_mul(isa, k, dt, c[0], c[1]);
    for (bool neox : {true, false}) {
      rotary(isa, k, dt, 1, 1, 2, 2, neox);
      rotary(isa, k, dt, 5, 3, 64, 64, neox);
      rotary(isa, k, dt, 9, 4, 128, 32, neox);
      rotary(isa, k, dt, 3, 2, 80, 18, neox);
    }
    reshape_and_cache(isa, k, dt, 1, 1, 1, 32);
    reshape_and_cache(isa, k, dt, 37, 4, 64, 16);
    reshape_and_cache(isa, k, dt, 64, 2, 36, 32);
    paged_attention(isa, k, dt, 1, 1, 1, 64, 32, 1);
    paged_attention(isa, k, dt, 4, 8, 2, 64, 16, 100);    // GQA 4
    paged_attention(isa, k, dt, 5, 9, 3, 64, 16, 70, 384);  // SmolLM's q inside its qkv row
    paged_attention(isa, k, dt, 3, 8, 8, 36, 32, 70);     // MHA, odd head size
    paged_attention(isa, k, dt, 2, 16, 2, 128, 32, 513);  // GQA 8
    lora_add(isa, k, dt, 1, 64);
    lora_add(isa, k, dt, 7, 300);
    // rows across a tile (8) and its rest, columns past a panel (16) and
    // within one vector (4), K of 5 groups of 8, whole 32s and a group of 64
    // (5-bit q: groups of whole 32 k, 6-bit: 16)
    const int64_t g[][4] = {{1, 16, 64, 32}, {5, 7, 40, 8}, {9, 40, 96, 32}, {17, 33, 128, 64},
                            {3, 20, 48, 16}};
    for (auto& c : g)
      for (int bits : {4, 5, 6, 8}) {
        if (c[3] % (bits == 5 ? 32 : bits == 6 ? 16 : 1)) continue;
        gguf_int8_linear(isa, k, dt, c[0], c[1], c[2], c[3], bits, 1, bits == 8 ? 128 : 1 << (bits - 1));
        gguf_int8_linear(isa, k, dt, c[0], c[1], c[2], c[3], bits, 2, 0);
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  struct Entry { const char* name; const KernelTable* (*get)(); bool usable; };
  std::vector<Entry> tables;
#if defined(ENGINE_HAS_NEON)
  tables.push_back({"neon", engine::cpu::kernels_neon, true});
#endif
#if defined(ENGINE_HAS_NEON_BF16)
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1 << 14)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
  // as csrc/cpu/isa.cpp asks: the table is built +bf16+dotprod
  tables.push_back({"neon_bf16", engine::cpu::kernels_neon_bf16,
                    (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0 && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0});
#endif
#if defined(ENGINE_HAS_GENERIC)
  tables.push_back({"generic", engine::cpu::kernels_generic, true});
#endif
  int ran = 0;
  for (const Entry& e : tables) {
    bool wanted = argc == 1;
    for (int i = 1; i < argc; ++i) wanted |= strcmp(argv[i], e.name) == 0;
    if (!wanted) continue;
    if (!e.usable) {
      printf("skip %s: this CPU lacks it\n", e.name);
      if (argc > 1) ++failures;  // asked for by name: not running it is a failure
      continue;
    }
    const KernelTable* k = e.get();
    if (strcmp(k->isa, e.name) != 0) {
      printf("FAIL table %s reports isa %s\n", e.name, k->isa);
      ++failures;
    }
    run_all(e.name, *k);
    ++ran;
  }
  printf("%d cases on %d kernel tables, %d failed\n", cases, ran, failures);
  return failures == 0 && ran > 0 ? 0 : 1;
}
