// Decode-shaped matmuls (M = 1..8 rows of activations) of bf16, int8 and int4 weights on AVX-512 CPUs.
//
// y[M, N] = x[M, K] @ W[N, K]^T, W in one of five forms (kernels/packing.py makes the packed ones and
// holds the plain-PyTorch reference of each; kernels/__init__.py says which module runs which):
//
//   fp32_mm    W fp32 [N, K] row-major (nn.Linear's own weight), x fp32. _mm512_fmadd_ps.
//   bf16_mm    W bf16 [N, K] row-major (nn.Linear's own weight), x bf16. _mm512_dpbf16_ps, fp32 sums.
//   int8_mm    W = q[N, K] int8 · s[N], x bf16 or fp32. int8 → fp32 in registers, fp32 FMA: the same
//              tensors aten::_weight_int8pack_mm reads, so no layout change.
//   int4_mm    W = ((q − 8) · s + z) per group, q packed 16 rows × 4 k per 32 bytes (pack_int4_bf16),
//              x bf16 (fp32 x runs as bf16 hi + lo parts). Each nibble becomes the bf16 1 + q/16 with
//              one shift and one ternary-logic op, then _mm512_dpbf16_ps against a broadcast x pair;
//              per group, Σ w·x = 16·s·D + (z − 24·s)·Σx where D = Σ (1 + q/16)·x.
//   w8a8_mm    W = q[N, K] int8 · s[N], x quantized per token to int8 (as qp.quantize_int8_per_token),
//              _mm512_dpbusd_epi32 on (xq + 128) as u8: Σ xq·q = Σ (xq + 128)·q − 128·Σ q.
//   decode_attention  one query position per sequence against a KV cache [B, Hkv, L, D] (grouped
//              heads read their shared K/V head), skipping masked positions: softmax(q·Kᵀ·scale)·V in fp32.
//   w4a8_mm    int4 as above, packed 16 rows × 8 k per 64 bytes (pack_int4_vnni), x quantized per
//              token; _mm512_dpbusd_epi32 with the nibbles as u8 and xq as s8, per group
//              Σ w·xq = s·Σ q·xq + (z − 8·s)·Σ xq.
//
// Rows are split between threads with at::parallel_for (torch's OpenMP pool, torch.set_num_threads), or,
// inside the decode step's persistent team (decode_step.cpp: one OpenMP region for every layer of a token,
// barriers between dependent steps), each thread runs its own static share and writes only its own outputs.
// At M = 1 the row-major kernels (fp32, bf16, int8, w8a8) read one row at a time, front to back, so that
// each thread's share of W is one sequential stream: reading 4 rows at once (4 streams of one short row
// each, 768-3072 bytes at these widths) kept the hardware prefetcher from ramping up, and read at 14-27
// GB/s where one stream reads at 22-29 (benchmarks/kernel_rows.py; -DVK_NO_ROW1 builds the old way).
// M > 8 is run in chunks of 8 rows of x (each chunk reads W again): these kernels are for decode;
// callers keep aten for prefill. Compiled with -mavx512f/bw/vl/bf16/vnni: loading it on a CPU without
// those is prevented in Python (kernels/_build.py checks the CPU flags first).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common.h"
#include "vk.h"

namespace {

// Software prefetch distance (bytes ahead in each weight stream). At M = 1 the int8 and int4 loops
// issue several instructions per byte of weight, so the out-of-order window alone keeps too few
// cache misses in flight to reach the memory bandwidth; bf16's loop needs none.
#ifndef VK_PREFETCH
#define VK_PREFETCH 1024
#endif
constexpr int64_t kAhead = VK_PREFETCH;

inline void prefetch(const void* p) {
#ifdef VK_T1
  if (kAhead > 0) _mm_prefetch(static_cast<const char*>(p) + kAhead, _MM_HINT_T1);
#else
  if (kAhead > 0) _mm_prefetch(static_cast<const char*>(p) + kAhead, _MM_HINT_T0);
#endif
}

inline __m512 load_bf16x16(const uint16_t* p) {  // 16 bf16 → 16 fp32 (exact)
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }

template <typename T>
inline void store16(T* p, __m512 v, __mmask16 mask);
template <>
inline void store16<float>(float* p, __m512 v, __mmask16 mask) { _mm512_mask_storeu_ps(p, mask, v); }
template <>   // vcvtneps2bf16 rounds to nearest even, as c10::BFloat16(float) does
inline void store16<at::BFloat16>(at::BFloat16* p, __m512 v, __mmask16 mask) {
  _mm256_mask_storeu_epi16(p, mask, (__m256i)_mm512_cvtneps_pbh(v));
}

// v rounded to bf16 and back, 16 lanes (what storing to bf16 and reading back gives).
inline __m512 round_bf16(__m512 v) {
  const __m256i b = (__m256i)_mm512_cvtneps_pbh(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// ------------------------------------------------------------------------------------------------
// Dense (fp32 or bf16) weights: R rows of W at a time against M rows of x; horizontal sums at the end
// of each row. A traits type says how one step of K is loaded and multiplied.

struct Fp32Dense {  // 16 fp32 lanes a step, fused multiply-add
  using E = float;
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int64_t kStep = 16;
  static V load(const E* p) { return _mm512_loadu_ps(p); }
  static V load(const E* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static __m512 dot(__m512 acc, V x, V w) { return _mm512_fmadd_ps(x, w, acc); }
};

struct Bf16Dense {  // 32 bf16 lanes a step, _mm512_dpbf16_ps (pairs multiplied, summed into fp32)
  using E = uint16_t;
  using V = __m512i;
  using Mask = __mmask32;
  static constexpr int64_t kStep = 32;
  static V load(const E* p) { return _mm512_loadu_si512(p); }
  static V load(const E* p, Mask m) { return _mm512_maskz_loadu_epi16(m, p); }
  static __m512 dot(__m512 acc, V x, V w) { return _mm512_dpbf16_ps(acc, as_bh(x), as_bh(w)); }
};

template <typename D, int M, int R, typename T>
void dense_rows(const typename D::E* x, const typename D::E* w, int64_t K, int64_t n, T* y, int64_t N) {
  __m512 acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  const typename D::E* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = w + (n + r) * K;
  int64_t k = 0;
  for (; k + D::kStep <= K; k += D::kStep) {
    typename D::V wv[R];
    for (int r = 0; r < R; ++r) wv[r] = D::load(wr[r] + k);
    for (int m = 0; m < M; ++m) {
      const typename D::V xv = D::load(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[m][r] = D::dot(acc[m][r], xv, wv[r]);
    }
  }
  if (k < K) {
    const auto tail = (typename D::Mask)((1ull << (K - k)) - 1);
    typename D::V wv[R];
    for (int r = 0; r < R; ++r) wv[r] = D::load(wr[r] + k, tail);
    for (int m = 0; m < M; ++m) {
      const typename D::V xv = D::load(x + m * K + k, tail);
      for (int r = 0; r < R; ++r) acc[m][r] = D::dot(acc[m][r], xv, wv[r]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) store(y + m * N + n + r, _mm512_reduce_add_ps(acc[m][r]));
}

// One row at a time, read front to back with four accumulators: at M = 1 the thread's rows are one
// sequential stream, which the hardware prefetcher follows (four rows at once are four short streams).
template <typename D, typename T>
void dense_row1(const typename D::E* x, const typename D::E* w, int64_t K, int64_t n, T* y) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const typename D::E* wr = w + n * K;
  int64_t k = 0;
  for (; k + 4 * D::kStep <= K; k += 4 * D::kStep) {
    for (int u = 0; u < 4; ++u) acc[u] = D::dot(acc[u], D::load(x + k + u * D::kStep), D::load(wr + k + u * D::kStep));
  }
  for (; k + D::kStep <= K; k += D::kStep) acc[0] = D::dot(acc[0], D::load(x + k), D::load(wr + k));
  if (k < K) {
    const auto tail = (typename D::Mask)((1ull << (K - k)) - 1);
    acc[1] = D::dot(acc[1], D::load(x + k, tail), D::load(wr + k, tail));
  }
  store(y + n, _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]))));
}

template <typename D, int M, typename T>
void dense_run(const typename D::E* x, const typename D::E* w, int64_t K, int64_t N, T* y) {
#ifndef VK_NO_ROW1
  if (M == 1) {
    par_for(0, N, 1, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) dense_row1<D>(x, w, K, n, y);
    });
    return;
  }
#endif
  constexpr int R = M <= 2 ? 4 : M <= 4 ? 2 : 1;
  const int64_t blocks = (N + R - 1) / R;
  par_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * R;
      if (n + R <= N) dense_rows<D, M, R>(x, w, K, n, y, N);
      else
        for (int64_t r = n; r < N; ++r) dense_rows<D, M, 1>(x, w, K, r, y, N);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// int8 weights, float activations (converted to fp32 once per call): int8 → fp32 in registers.

template <int M, int R, typename T, typename S>
void int8_rows(const float* x, const int8_t* q, const S* s, int64_t K, int64_t n, T* y, int64_t N) {
  __m512 acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  const int8_t* qr[R];
  for (int r = 0; r < R; ++r) qr[r] = q + (n + r) * K;
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    if (k % 64 == 0)
      for (int r = 0; r < R; ++r) prefetch(qr[r] + k);
    __m512 wv[R];
    for (int r = 0; r < R; ++r)
      wv[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(qr[r] + k))));
    for (int m = 0; m < M; ++m) {
      __m512 xv = _mm512_loadu_ps(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
  if (k < K) {
    const __mmask16 tail = (__mmask16)((1u << (K - k)) - 1);
    __m512 wv[R];
    for (int r = 0; r < R; ++r)
      wv[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(tail, qr[r] + k)));
    for (int m = 0; m < M; ++m) {
      __m512 xv = _mm512_maskz_loadu_ps(tail, x + m * K + k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float sc = static_cast<float>(s[n + r]);
    for (int m = 0; m < M; ++m) store(y + m * N + n + r, _mm512_reduce_add_ps(acc[m][r]) * sc);
  }
}

// M = 1, one row at a time front to back (see dense_row1): 64 weights a step, four accumulators.
template <typename T, typename S>
void int8_row1(const float* x, const int8_t* q, const S* s, int64_t K, int64_t n, T* y) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const int8_t* qr = q + n * K;
  int64_t k = 0;
  for (; k + 64 <= K; k += 64)
    for (int u = 0; u < 4; ++u)
      acc[u] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 16 * u),
                               _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(qr + k + 16 * u)))),
                               acc[u]);
  for (; k + 16 <= K; k += 16)
    acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + k),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(qr + k)))), acc[0]);
  if (k < K) {
    const __mmask16 tail = (__mmask16)((1u << (K - k)) - 1);
    acc[1] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x + k),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(tail, qr + k))), acc[1]);
  }
  const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
  store(y + n, _mm512_reduce_add_ps(sum) * static_cast<float>(s[n]));
}

template <int M, typename T, typename S>
void int8_run(const float* x, const int8_t* q, const S* s, int64_t K, int64_t N, T* y) {
#ifndef VK_NO_ROW1
  if (M == 1) {
    par_for(0, N, 1, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) int8_row1(x, q, s, K, n, y);
    });
    return;
  }
#endif
#ifdef VK_R8
  constexpr int R = M <= 2 ? VK_R8 : M <= 4 ? 2 : 1;
#else
  constexpr int R = M <= 2 ? 4 : M <= 4 ? 2 : 1;
#endif
  const int64_t blocks = (N + R - 1) / R;
  par_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * R;
      if (n + R <= N) int8_rows<M, R>(x, q, s, K, n, y, N);
      else
        for (int64_t r = n; r < N; ++r) int8_rows<M, 1>(x, q, s, K, r, y, N);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// int4 group-wise, bf16 activations. Block b holds rows 16b..16b+15: K/4 chunks of 32 bytes, then its
// scales and zeros [G][2][16] (S = bf16 or fp32). xp: x as uint32 pairs of bf16 [M, K/2]; xs: Σx per
// group [M, G] (fp32, from the same bf16 values).

template <typename S>
inline __m512 load16(const S* p);
template <>
inline __m512 load16<float>(const float* p) { return _mm512_loadu_ps(p); }
template <>
inline __m512 load16<at::BFloat16>(const at::BFloat16* p) { return load_bf16x16((const uint16_t*)p); }

template <int M, typename S>
void int4_block(const uint8_t* p, const S* sz, const uint32_t* xp, const float* xs, int64_t K, int64_t G,
                int64_t gs, float* out /* [M][16] */) {
  const __m512i one = _mm512_set1_epi16(0x3F80), field = _mm512_set1_epi16(0x78);
  const __m512 m24 = _mm512_set1_ps(-24.f), c16 = _mm512_set1_ps(16.f);
  __m512 o[M];
  for (int m = 0; m < M; ++m) o[m] = _mm512_setzero_ps();
  const int64_t half = K / 2;
  for (int64_t g = 0; g < G; ++g) {
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    const int64_t j0 = g * gs / 4, j1 = j0 + gs / 4;
    for (int64_t j = j0; j < j1; ++j, p += 32) {
      if (j % 2 == 0) prefetch(p);
      const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p));
      // (v << 3) & 0x78 | 0x3F80 = bf16 1 + lo/16; (v >> 1) & 0x78 | 0x3F80 = bf16 1 + hi/16
      const __m512i lo = _mm512_ternarylogic_epi32(_mm512_slli_epi16(v, 3), field, one, 0xEA);
      const __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 1), field, one, 0xEA);
      for (int m = 0; m < M; ++m) {
        const uint32_t* xm = xp + m * half + 2 * j;
        acc[m] = _mm512_dpbf16_ps(acc[m], as_bh(lo), as_bh(_mm512_set1_epi32(xm[0])));
        acc[m] = _mm512_dpbf16_ps(acc[m], as_bh(hi), as_bh(_mm512_set1_epi32(xm[1])));
      }
    }
    const __m512 s = load16(sz + g * 32), z = load16(sz + g * 32 + 16);
    const __m512 s16 = _mm512_mul_ps(s, c16), zz = _mm512_fmadd_ps(s, m24, z);
    for (int m = 0; m < M; ++m) {
      o[m] = _mm512_fmadd_ps(acc[m], s16, o[m]);
      o[m] = _mm512_fmadd_ps(zz, _mm512_set1_ps(xs[m * G + g]), o[m]);
    }
  }
  for (int m = 0; m < M; ++m) _mm512_storeu_ps(out + m * 16, o[m]);
}

// ------------------------------------------------------------------------------------------------
// int8 weights × int8 activations (VNNI): xu = xq + 128 as u8 [M, K] (K padded to 64 with 128s, so
// the padding adds 128·0 against masked-out weights), Σ xq·q = Σ xu·q − 128·Σ q.

// wsums: Σ q of each row, when the caller has them (the decode step computes them once); else summed here.
template <int M, int R, typename T, typename S>
void w8a8_rows(const uint8_t* xu, int64_t Kp, const int8_t* q, const S* s, const float* a, int64_t K, int64_t n,
               T* y, int64_t N, const int32_t* wsums) {
  __m512i acc[M][R], qs[R];
  const __m512i ones = _mm512_set1_epi8(1);
  for (int r = 0; r < R; ++r) {
    qs[r] = _mm512_setzero_si512();
    for (int m = 0; m < M; ++m) acc[m][r] = _mm512_setzero_si512();
  }
  const int8_t* qr[R];
  for (int r = 0; r < R; ++r) qr[r] = q + (n + r) * K;
  auto step = [&](int64_t k, __mmask64 mask, bool full) {
    __m512i wv[R];
    for (int r = 0; r < R; ++r) {
      if (full) {
        prefetch(qr[r] + k);
        wv[r] = _mm512_loadu_si512(qr[r] + k);
      } else {
        wv[r] = _mm512_maskz_loadu_epi8(mask, qr[r] + k);
      }
      if (!wsums) qs[r] = _mm512_dpbusd_epi32(qs[r], ones, wv[r]);
    }
    for (int m = 0; m < M; ++m) {
      const __m512i xv = _mm512_loadu_si512(xu + m * Kp + k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_dpbusd_epi32(acc[m][r], xv, wv[r]);
    }
  };
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) step(k, ~0ull, true);
  if (k < K) step(k, (1ull << (K - k)) - 1, false);
  for (int r = 0; r < R; ++r) {
    const int32_t wsum = wsums ? wsums[n + r] : _mm512_reduce_add_epi32(qs[r]);
    const float sc = static_cast<float>(s[n + r]);
    for (int m = 0; m < M; ++m) {
      const int32_t dot = _mm512_reduce_add_epi32(acc[m][r]) - 128 * wsum;
      store(y + m * N + n + r, static_cast<float>(dot) * a[m] * sc);  // as W8A8._mm: acc * a * s
    }
  }
}

// M = 1, one row at a time front to back (see dense_row1), four accumulators; Σ q from wsums or summed here.
template <typename T, typename S>
void w8a8_row1(const uint8_t* xu, const int8_t* q, const S* s, float a, int64_t K, int64_t n, T* y,
               const int32_t* wsums) {
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  __m512i qs = _mm512_setzero_si512();
  const __m512i ones = _mm512_set1_epi8(1);
  const int8_t* qr = q + n * K;
  int64_t k = 0;
  for (; k + 256 <= K; k += 256)
    for (int u = 0; u < 4; ++u) {
      const __m512i wv = _mm512_loadu_si512(qr + k + 64 * u);
      acc[u] = _mm512_dpbusd_epi32(acc[u], _mm512_loadu_si512(xu + k + 64 * u), wv);
      if (!wsums) qs = _mm512_dpbusd_epi32(qs, ones, wv);
    }
  for (; k < K; k += 64) {
    const __mmask64 m = K - k >= 64 ? ~0ull : (1ull << (K - k)) - 1;
    const __m512i wv = _mm512_maskz_loadu_epi8(m, qr + k);
    acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_loadu_si512(xu + k), wv);
    if (!wsums) qs = _mm512_dpbusd_epi32(qs, ones, wv);
  }
  const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3]));
  const int32_t wsum = wsums ? wsums[n] : _mm512_reduce_add_epi32(qs);
  const int32_t dot = _mm512_reduce_add_epi32(sum) - 128 * wsum;
  store(y + n, static_cast<float>(dot) * a * static_cast<float>(s[n]));
}

template <int M, typename T, typename S>
void w8a8_run(const uint8_t* xu, int64_t Kp, const int8_t* q, const S* s, const float* a, int64_t K, int64_t N,
              T* y, const int32_t* wsums) {
#ifndef VK_NO_ROW1
  if (M == 1) {
    par_for(0, N, 1, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) w8a8_row1(xu, q, s, a[0], K, n, y, wsums);
    });
    return;
  }
#endif
  constexpr int R = M <= 2 ? 4 : M <= 4 ? 2 : 1;
  const int64_t blocks = (N + R - 1) / R;
  par_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * R;
      if (n + R <= N) w8a8_rows<M, R>(xu, Kp, q, s, a, K, n, y, N, wsums);
      else
        for (int64_t r = n; r < N; ++r) w8a8_rows<M, 1>(xu, Kp, q, s, a, K, r, y, N, wsums);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// int4 group-wise × int8 activations (VNNI). Block b: K/8 chunks of 64 bytes (16 rows × 8 k; byte
// 4i + j = q[i, 8c + j] | q[i, 8c + 4 + j] << 4), then scales and zeros [G][2][16] (Z) or, symmetric int4,
// the scales alone [G][16] (zeros 0). xq4: xq as int32 quads [M, K/4]; xs: Σ xq per group [M, G] (int32 →
// fp32); a: per-token scales [M].

template <int M, typename S, bool Z>
void w4a8_block(const uint8_t* p, const S* sz, const int32_t* xq4, const float* xs, int64_t K, int64_t G,
                int64_t gs, float* out) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512 m8 = _mm512_set1_ps(-8.f);
  __m512 o[M];
  for (int m = 0; m < M; ++m) o[m] = _mm512_setzero_ps();
  const int64_t quads = K / 4;
  for (int64_t g = 0; g < G; ++g) {
    __m512i acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_si512();
    const int64_t c0 = g * gs / 8, c1 = c0 + gs / 8;
    for (int64_t c = c0; c < c1; ++c, p += 64) {
      prefetch(p);
      const __m512i v = _mm512_loadu_si512(p);
      const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int m = 0; m < M; ++m) {
        const int32_t* xm = xq4 + m * quads + 2 * c;
        acc[m] = _mm512_dpbusd_epi32(acc[m], lo, _mm512_set1_epi32(xm[0]));
        acc[m] = _mm512_dpbusd_epi32(acc[m], hi, _mm512_set1_epi32(xm[1]));
      }
    }
    const __m512 s = load16(sz + g * (Z ? 32 : 16));
    const __m512 zz = Z ? _mm512_fmadd_ps(s, m8, load16(sz + g * 32 + 16)) : _mm512_mul_ps(s, m8);
    for (int m = 0; m < M; ++m) {
      o[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[m]), s, o[m]);
      o[m] = _mm512_fmadd_ps(zz, _mm512_set1_ps(xs[m * G + g]), o[m]);
    }
  }
  for (int m = 0; m < M; ++m) _mm512_storeu_ps(out + m * 16, o[m]);
}

// ------------------------------------------------------------------------------------------------
// Decode attention: q [B, H, 1, D] (any strides but the last), k, v [B, Hkv, L, D] (last dim
// contiguous), keep: which of the L positions each row attends to (nullptr: all). fp32 sums; the
// softmax is taken over kept positions only, so the unused tail of a static cache is never read.

// The first `left` of 16 lanes (all 16 from 16 on): the mask of a row's tail.
inline __mmask16 tail16(int64_t left) { return (__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1); }

template <typename T>
inline __m512 load_row16(const T* p, __mmask16 m);
template <>
inline __m512 load_row16<float>(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
template <>
inline __m512 load_row16<at::BFloat16>(const at::BFloat16* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// e^x for 16 lanes (x ≤ 0 here: scores minus their max): x = n·ln2 + r, |r| ≤ ln2/2, e^r by its degree-6
// Taylor polynomial (relative error < 2e-7, about one fp32 ulp), times 2^n by vscalefps; x below −104 gives 0.
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-104.f);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);   // ln2 = hi + lo, hi exact in n·hi
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_mov_ps(~under, _mm512_scalef_ps(p, n));
}

// 16 vectors → one: lane i = Σ lanes of v[i] (a transposing reduction, 15 adds).
inline __m512 sum16(__m512* v) {
  for (int i = 0; i < 8; ++i) {   // 16 → 8: pair (i, i + 8), lanes interleaved by 256-bit halves
    const __m512 a = _mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), b = _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE);
    v[i] = _mm512_add_ps(a, b);   // lanes 0-7: v[i]'s halves summed; 8-15: v[i + 8]'s
  }
  for (int i = 0; i < 4; ++i) {   // 8 → 4: 128-bit quarters
    const __m512 a = _mm512_shuffle_f32x4(v[i], v[i + 4], 0x88), b = _mm512_shuffle_f32x4(v[i], v[i + 4], 0xDD);
    v[i] = _mm512_add_ps(a, b);
  }
  for (int i = 0; i < 2; ++i) {   // 4 → 2: 64-bit pairs
    const __m512 a = _mm512_shuffle_ps(v[i], v[i + 2], 0x44), b = _mm512_shuffle_ps(v[i], v[i + 2], 0xEE);
    v[i] = _mm512_add_ps(a, b);
  }
  const __m512 a = _mm512_shuffle_ps(v[0], v[1], 0x88), b = _mm512_shuffle_ps(v[0], v[1], 0xDD);
  return _mm512_add_ps(a, b);     // vector j's sum in lane sum16_order()[j]
}

// Where sum16 leaves each vector's sum (worked out from the shuffles above; the kernel tests check it).
inline __m512i sum16_order() { return _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15); }

template <typename T>
inline __m512 dot_row(const __m512* qv, const T* kr, int64_t D, int64_t chunks) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const __mmask16 m = tail16(D - c * 16);
    acc = _mm512_fmadd_ps(qv[c], load_row16(kr + c * 16, m), acc);
  }
  return acc;
}

template <typename T>
void attend_one(const T* q, const T* k, const T* v, int64_t L, int64_t D, int64_t ks, const bool* keep,
                int64_t keep_stride, float scale, float* scores, T* out) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  const int64_t chunks = (D + 15) / 16;
  __m512 qv[16];  // D ≤ 256
  for (int64_t c = 0; c < chunks; ++c) {
    const __mmask16 m = tail16(D - c * 16);
    qv[c] = _mm512_mul_ps(load_row16(q + c * 16, m), _mm512_set1_ps(scale));
  }
  // scores, 16 positions at a time where all 16 are kept (one transposing reduction), else one at a time
  const __m512i order = sum16_order();
  __m512 mxv = _mm512_set1_ps(kNone);
  int64_t l = 0;
  for (; l + 16 <= L; l += 16) {
    bool all = true;
    if (keep)
      for (int64_t i = 0; i < 16 && all; ++i) all = keep[(l + i) * keep_stride];
    if (all) {
      __m512 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = dot_row(qv, k + (l + i) * ks, D, chunks);
      const __m512 sv = _mm512_permutexvar_ps(order, sum16(acc));
      _mm512_storeu_ps(scores + l, sv);
      mxv = _mm512_max_ps(mxv, sv);
      continue;
    }
    for (int64_t i = l; i < l + 16; ++i) {
      scores[i] = keep[i * keep_stride] ? _mm512_reduce_add_ps(dot_row(qv, k + i * ks, D, chunks)) : kNone;
      mxv = _mm512_max_ps(mxv, _mm512_set1_ps(scores[i]));
    }
  }
  for (; l < L; ++l) {
    scores[l] = keep && !keep[l * keep_stride] ? kNone : _mm512_reduce_add_ps(dot_row(qv, k + l * ks, D, chunks));
    mxv = _mm512_max_ps(mxv, _mm512_set1_ps(scores[l]));
  }
  const float mx = _mm512_reduce_max_ps(mxv);
  __m512 o[16];
  for (int64_t c = 0; c < chunks; ++c) o[c] = _mm512_setzero_ps();
  float sum = 0.f;
  if (mx != kNone) {
    // probabilities, 16 at a time (masked positions: e^−∞ = 0), then Σ p·v over the positions with p > 0
    const __m512 mv = _mm512_set1_ps(mx);
    __m512 sv = _mm512_setzero_ps();
    for (int64_t i = 0; i < L; i += 16) {
      const __mmask16 m = tail16(L - i);
      const __m512 p = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + i), mv));
      _mm512_mask_storeu_ps(scores + i, m, p);
      sv = _mm512_add_ps(sv, _mm512_maskz_mov_ps(m, p));
    }
    sum = _mm512_reduce_add_ps(sv);
    for (int64_t i = 0; i < L; ++i) {
      const float p = scores[i];
      if (p == 0.f) continue;
      const __m512 pv = _mm512_set1_ps(p);
      const T* vr = v + i * ks;
      for (int64_t c = 0; c < chunks; ++c) {
        const __mmask16 m = tail16(D - c * 16);
        o[c] = _mm512_fmadd_ps(pv, load_row16(vr + c * 16, m), o[c]);
      }
    }
  }
  const __m512 inv = _mm512_set1_ps(sum > 0.f ? 1.f / sum : 0.f);  // a row that keeps nothing gives zeros
  for (int64_t c = 0; c < chunks; ++c) {
    store16(out + c * 16, _mm512_mul_ps(o[c], inv), tail16(D - c * 16));
  }
}

// ---- fp32_mm and bf16_mm: the dense path, with the tensor types of each. The ops' bodies after their checks are
// on pointers (dense_into, int8_into, int8x_rows, w4a8x_rows): the emulator's harness calls them too
// (tests/variants/avx512_harness.cpp), so an AVX2 host runs them on an emulated AVX-512 core.

template <typename D, typename T>
struct Dense {
  template <int M>
  struct At {
    static void run(const typename D::E* x, const typename D::E* w, int64_t K, int64_t N, T* y) {
      dense_run<D, M>(x, w, K, N, y);
    }
  };
};

// y [M, N] = x [M, K] · w [N, K]ᵀ, in chunks of up to 8 rows of x.
template <typename D, typename T>
void dense_into(const typename D::E* x, const typename D::E* w, int64_t M, int64_t K, int64_t N, T* y) {
  for (int64_t m0 = 0; m0 < M; m0 += kMaxM)
    dispatch_m<Dense<D, T>::template At>(std::min(kMaxM, M - m0), x + m0 * K, w, K, N, y + m0 * N);
}

template <typename D, typename T>
at::Tensor dense_mm(const at::Tensor& x, const at::Tensor& w, at::ScalarType dtype, const char* name,
                    const char* dtype_name, const at::Tensor* out = nullptr) {
  check_2d(x, "x");
  check_2d(w, "w");
  TORCH_CHECK(x.scalar_type() == dtype && w.scalar_type() == dtype, name, ": x and w must be ", dtype_name);
  TORCH_CHECK(x.size(1) == w.size(1), name, ": x is [M, K], w is [N, K]");
  auto y = out_or_empty(out, x.size(0), w.size(0), x);
  using E = typename D::E;
  dense_into<D, T>(reinterpret_cast<const E*>(x.data_ptr<T>()), reinterpret_cast<const E*>(w.data_ptr<T>()),
                   x.size(0), x.size(1), w.size(0), y.data_ptr<T>());
  return y;
}

// ---- int8_mm

template <typename T, typename S>
struct Int8 {
  template <int M>
  struct At {
    static void run(const float* x, const int8_t* q, const S* s, int64_t K, int64_t N, T* y) {
      int8_run<M>(x, q, s, K, N, y);
    }
  };
};

// y [M, N] = x [M, K] (fp32) · (q [N, K] · s [N])ᵀ, in chunks of up to 8 rows of x.
template <typename T, typename S>
void int8_into(const float* x, const int8_t* q, const S* s, int64_t M, int64_t K, int64_t N, T* y) {
  for (int64_t m0 = 0; m0 < M; m0 += kMaxM)
    dispatch_m<Int8<T, S>::template At>(std::min(kMaxM, M - m0), x + m0 * K, q, s, K, N, y + m0 * N);
}

at::Tensor int8_mm_out(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor* out) {
  check_int8(x, q, s, "int8_mm");
  const auto xf = x.to(at::kFloat).contiguous();
  auto y = out_or_empty(out, x.size(0), q.size(0), x);
  by_dtypes(y, s, [&](auto t, auto sc) {
    using T = decltype(t);
    using S = decltype(sc);
    int8_into<T, S>(xf.data_ptr<float>(), q.data_ptr<int8_t>(), s.data_ptr<S>(), x.size(0), x.size(1), q.size(0),
                    y.data_ptr<T>());
  });
  return y;
}

// ---- int4_mm and w4a8_mm share the block loop: blocks of 16 packed int4 rows, split between
// threads; B::block<M, S> computes one (int4_block for
// bf16 activation pairs, w4a8_block for int8 activation quads: X is what the activations are held as).
struct Int4Blocks {   // zeros always (check_int4)
  template <int M, typename S, bool Z>
  static void block(const uint8_t* p, const S* sz, const uint32_t* x, const float* xs, int64_t K, int64_t G,
                    int64_t gs, float* out) {
    int4_block<M>(p, sz, x, xs, K, G, gs, out);
  }
};

struct W4A8Blocks {
  template <int M, typename S, bool Z>
  static void block(const uint8_t* p, const S* sz, const int32_t* x, const float* xs, int64_t K, int64_t G,
                    int64_t gs, float* out) {
    w4a8_block<M, S, Z>(p, sz, x, xs, K, G, gs, out);
  }
};


at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t gs, int64_t n) {
  check_2d(x, "x");
  check_float(x, "x");
  const int64_t M = x.size(0), K = x.size(1), G = K / gs;
  check_int4(packed, sz, K, gs, n, 4);
  const int64_t N16 = packed.size(0) * 16;
  const bool split = x.scalar_type() == at::kFloat;
  const at::Tensor xb = bf16_rows(x);   // fp32 x: two bf16 rows, summed below
  const auto xs = xb.to(at::kFloat).view({xb.size(0), G, gs}).sum(2).contiguous();  // [M', G]
  auto yf = at::empty({xb.size(0), N16}, x.options().dtype(at::kFloat));
  const uint32_t* xp = (const uint32_t*)xb.data_ptr<at::BFloat16>();
  for (int64_t m0 = 0; m0 < xb.size(0); m0 += kMaxM)
    dispatch_m<PackedInt4<Int4Blocks, uint32_t>::template At>(std::min(kMaxM, xb.size(0) - m0), packed, sz, xp + m0 * K / 2, xs.data_ptr<float>() + m0 * G, K,
                     G, gs, yf.data_ptr<float>() + m0 * N16, N16);
  if (split) yf = yf.narrow(0, 0, M) + yf.narrow(0, M, M);
  return yf.narrow(1, 0, n).to(x.scalar_type());
}

// ---- activations quantized per token, as variants/quant_packing.quantize_int8_per_token:
// a = max(amax|x| / 127, FLT_MIN), xq = clamp(round_half_even(x / a), −127, 127).

// Read in place (fp32 or bf16, converted per element): no fp32 copy of x is made, and no aten op runs
// around the kernel (each would cost a dispatch, ~1 µs, per linear per token: issue 10's explain).
template <typename T>
float row_scale(const T* row, int64_t K) {   // max|x| / 127, at least FLT_MIN
  __m512 amax = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load_row16(row + k, tail16(K - k))));
  return std::max(_mm512_reduce_max_ps(amax) / 127.f, std::numeric_limits<float>::min());
}

// 16 lanes rounded half to even and clamped to [−127, 127], as int8 (std::nearbyint, clamp, cast: exact).
inline __m128i round_clamp_i8(__m512 v) {
  const __m512 r = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 c = _mm512_min_ps(_mm512_set1_ps(127.f), _mm512_max_ps(_mm512_set1_ps(-127.f), r));
  return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(c));
}

template <typename T>
void quantize_rows_typed(const T* p, int64_t M, int64_t K, int64_t sm, int8_t* xq, int64_t ld, float* a) {
  for (int64_t m = 0; m < M; ++m) {
    const T* row = p + m * sm;
    const float am = row_scale(row, K);
    a[m] = am;
    const __m512 av = _mm512_set1_ps(am);
    for (int64_t k = 0; k < K; k += 16) {   // x / a (a division, as the reference divides), then rounded
      const __mmask16 t = tail16(K - k);
      _mm_mask_storeu_epi8(xq + m * ld + k, t, round_clamp_i8(_mm512_div_ps(load_row16(row + k, t), av)));
    }
  }
}

// y[m, j] = yf[m, j] · a[m] for j < n, in y's dtype: the per-token scale and the cast, in one pass.
// In a team, only this thread's blocks of 16 columns (those it computed: PackedInt4's share).
template <typename T>
void scale_rows_into(const float* yf, int64_t ldf, const float* a, int64_t M, int64_t n, T* y) {
  const auto [b0, b1] = share((n + 15) / 16);
  for (int64_t m = 0; m < M; ++m) {
    const __m512 am = _mm512_set1_ps(a[m]);
    for (int64_t j = 16 * b0; j < std::min(n, 16 * b1); j += 16)
      store16(y + m * n + j, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail16(n - j), yf + m * ldf + j), am), tail16(n - j));
  }
}

// ---- int8_digits_mm: int8 weights × float activations, in VNNI integer dot products. Each activation row is
// held as two int8 digits per value on a per-row scale a = max|x| / 127: x ≈ a·(hi + lo/256), hi = round(x/a),
// lo = round((x/a − hi)·256), both in [−127, 127] — 16-bit fixed point per row, whose error (≤ a/512 a value)
// is below bf16's rounding of the row's large values. Σ x·q = a·(Σ hi·q + Σ lo·q / 256): two dpbusd per 64
// weights, where int8_mm converts every weight to fp32 (three instructions per 16: bound by them, not by
// memory). One weight row at a time against all 2M digit rows (see dense_row1).

template <int MM, typename T, typename S>
void digits_row(const uint8_t* xu, int64_t Kp, const int8_t* q, const S* s, const float* a, int64_t K, int64_t n,
                T* y, int64_t N, const int32_t* wsums) {
  __m512i acc[MM], qs = _mm512_setzero_si512();
  for (int m = 0; m < MM; ++m) acc[m] = _mm512_setzero_si512();
  const __m512i ones = _mm512_set1_epi8(1);
  const int8_t* qr = q + n * K;
  for (int64_t k = 0; k < K; k += 64) {
    const __mmask64 mk = K - k >= 64 ? ~0ull : (1ull << (K - k)) - 1;
    const __m512i wv = _mm512_maskz_loadu_epi8(mk, qr + k);
    if (!wsums) qs = _mm512_dpbusd_epi32(qs, ones, wv);
    for (int m = 0; m < MM; ++m) acc[m] = _mm512_dpbusd_epi32(acc[m], _mm512_loadu_si512(xu + m * Kp + k), wv);
  }
  const int32_t wsum = wsums ? wsums[n] : _mm512_reduce_add_epi32(qs);
  const float sc = static_cast<float>(s[n]);
  for (int m = 0; m < MM; m += 2) {
    const float hi = static_cast<float>(_mm512_reduce_add_epi32(acc[m]) - 128 * wsum);
    const float lo = static_cast<float>(_mm512_reduce_add_epi32(acc[m + 1]) - 128 * wsum);
    store(y + (m / 2) * N + n, (hi + lo * (1.f / 256.f)) * a[m / 2] * sc);
  }
}

// x [M, K] → digit rows xq [2M][ld]: row 2m = hi, row 2m + 1 = lo, x ≈ a[m]·(hi + lo/256) (int8_digits_mm below).
template <typename T>
void digits_rows(const T* p, int64_t M, int64_t K, int64_t sm, int8_t* xq, int64_t ld, float* a) {
  for (int64_t m = 0; m < M; ++m) {
    const T* row = p + m * sm;
    const float am = row_scale(row, K);
    a[m] = am;
    const __m512 av = _mm512_set1_ps(am), lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 t = tail16(K - k);
      const __m512 v = _mm512_div_ps(load_row16(row + k, t), av);
      const __m512 h = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT |
                                                                                     _MM_FROUND_NO_EXC)));
      _mm_mask_storeu_epi8(xq + 2 * m * ld + k, t, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(h)));
      _mm_mask_storeu_epi8(xq + (2 * m + 1) * ld + k, t,
                           round_clamp_i8(_mm512_mul_ps(_mm512_sub_ps(v, h), _mm512_set1_ps(256.f))));
    }
  }
}

// The int8-activation ops (w8a8_mm; int8_digits_mm when Digits) after their checks, on pointers: x [M, K] (rows
// sm apart) quantized per token into xq [M, Kp], or as two digit rows a row into xq [2M, Kp] (digits_rows), then
// + 128 as u8 for dpbusd (the padding, 0 + 128: against masked-out weights), with scales a [M]; then against
// q [N, K] · s into y [M, N]. xq (zeroed, Kp = K rounded up to 64) and a are the caller's.
template <bool Digits, typename T, typename S>
struct Int8x {
  template <int M>
  struct At {
    static void run(const uint8_t* xu, int64_t Kp, const int8_t* q, const S* s, const float* a, int64_t K, int64_t N,
                    T* y, const int32_t* wsums) {
      if constexpr (Digits)
        par_for(0, N, 1, [&](int64_t n0, int64_t n1) {
          for (int64_t n = n0; n < n1; ++n) digits_row<2 * M>(xu, Kp, q, s, a, K, n, y, N, wsums);
        });
      else
        w8a8_run<M>(xu, Kp, q, s, a, K, N, y, wsums);
    }
  };
};

template <bool Digits, typename T, typename S>
void int8x_rows(const T* x, int64_t sm, int64_t M, int64_t K, const int8_t* q, const S* s, const int32_t* wsums,
                int64_t N, T* y, int8_t* xq, float* a) {
  const int64_t Kp = (K + 63) / 64 * 64, rows = Digits ? 2 : 1;
  if constexpr (Digits) digits_rows(x, M, K, sm, xq, Kp, a);
  else quantize_rows_typed(x, M, K, sm, xq, Kp, a);
  for (int64_t i = 0; i < rows * M * Kp; ++i) xq[i] = static_cast<int8_t>(static_cast<uint8_t>(xq[i]) ^ 0x80);
  const auto* xu = reinterpret_cast<const uint8_t*>(xq);
  for (int64_t m0 = 0; m0 < M; m0 += kMaxM)
    dispatch_m<Int8x<Digits, T, S>::template At>(std::min(kMaxM, M - m0), xu + rows * m0 * Kp, Kp, q, s, a + m0, K,
                                                 N, y + m0 * N, wsums);
}

at::Tensor int8x_mm(bool digits, const at::Tensor& x_, const at::Tensor& q, const at::Tensor& s, const int32_t* wsums,
                    const at::Tensor* out) {
  const char* name = digits ? "int8_digits_mm" : "w8a8_mm";
  if (!digits) check_2d(x_, "x");
  check_int8(x_, q, s, name);
  const auto x = x_.stride(1) == 1 ? x_ : x_.contiguous();   // rows in place; a strided column, copied
  const int64_t M = x.size(0), K = x.size(1), Kp = (K + 63) / 64 * 64;
  auto y = out_or_empty(out, M, q.size(0), x);
  TORCH_CHECK(y.scalar_type() == x.scalar_type(), name, ": out must be in x's dtype");
  Aligned<int8_t> xq((digits ? 2 : 1) * M * Kp, true);
  Aligned<float> a(M);
  by_dtypes(y, s, [&](auto t, auto sc) {
    using T = decltype(t);
    using S = decltype(sc);
    if (digits)
      int8x_rows<true>(x.data_ptr<T>(), x.stride(0), M, K, q.data_ptr<int8_t>(), s.data_ptr<S>(), wsums, q.size(0),
                       y.data_ptr<T>(), xq.data(), a.data());
    else
      int8x_rows<false>(x.data_ptr<T>(), x.stride(0), M, K, q.data_ptr<int8_t>(), s.data_ptr<S>(), wsums, q.size(0),
                        y.data_ptr<T>(), xq.data(), a.data());
  });
  return y;
}

// yf [R, N16] = the packed int4 weights p (scales sz: S; Z: zeros beside them) against R int8 rows xq [R, K],
// before any per-row scale; xs [R, G]: their Σ per group, summed here. What w4a8_mm and int4_digits_mm share
// (on pointers: the emulator's harness calls it too, tests/variants/avx512_harness.cpp).
template <typename S, bool Z>
void w4a8_rows_into(const int8_t* xq, int64_t R, const uint8_t* p, const S* sz, int64_t K, int64_t gs, int64_t N16,
                    float* xs, float* yf) {
  const int64_t G = K / gs;
  for (int64_t m = 0; m < R; ++m)   // gs is a multiple of 8 (check_int4): 8 int8 at a time
    for (int64_t g = 0; g < G; ++g) {
      __m256i t = _mm256_setzero_si256();
      for (int64_t k = g * gs; k < (g + 1) * gs; k += 8)
        t = _mm256_add_epi32(t, _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(xq + m * K + k))));
      const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
      const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      xs[m * G + g] = static_cast<float>(_mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1))));
    }
  const int32_t* xq4 = (const int32_t*)xq;
  for (int64_t m0 = 0; m0 < R; m0 += kMaxM)
    dispatch_m<PackedInt4Blocks<W4A8Blocks, int32_t, S, Z>::template At>(std::min(kMaxM, R - m0), p, sz,
                                                                         xq4 + m0 * K / 4, xs + m0 * G, K, G, gs,
                                                                         yf + m0 * N16, N16);
}


// int4 weight-only with the activations as two int8 digits a value (see int8_digits_mm, digits_rows): row 2m
// of the digit rows is hi, 2m + 1 lo, and y[m] = a[m]·(yf[2m] + yf[2m + 1] / 256); the packed layout is w4a8_mm's.
template <typename T>
void combine_digits(const float* yf, int64_t N16, const float* a, int64_t M, int64_t n, T* y) {
  const auto [b0, b1] = share((n + 15) / 16);   // in a team: this thread's blocks (scale_rows_into)
  for (int64_t m = 0; m < M; ++m) {
    const __m512 am = _mm512_set1_ps(a[m]), inv = _mm512_set1_ps(1.f / 256.f);
    for (int64_t j = 16 * b0; j < std::min(n, 16 * b1); j += 16) {
      const __mmask16 t = tail16(n - j);
      const __m512 hi = _mm512_maskz_loadu_ps(t, yf + 2 * m * N16 + j), lo = _mm512_maskz_loadu_ps(t, yf + (2 * m + 1) * N16 + j);
      store16(y + m * n + j, _mm512_mul_ps(_mm512_add_ps(hi, _mm512_mul_ps(lo, inv)), am), t);
    }
  }
}


// w4a8_mm (int4_digits_mm when Digits) after its checks, on pointers: x [M, K] (rows sm apart) quantized per token
// into xq [M, K] (Digits: two digit rows a row, [2M, K]) with scales a [M]; those rows against the packed int4 p
// (w4a8_rows_into, into xs [rows, G] and yf [rows, N16]); then the per-row scale, and the digits combined, into
// y [M, n]. Every buffer is the caller's.
template <bool Digits, typename T, typename S, bool Z>
void w4a8x_rows(const T* x, int64_t sm, int64_t M, int64_t K, const uint8_t* p, const S* sz, int64_t gs, int64_t n,
                int64_t N16, T* y, int8_t* xq, float* a, float* xs, float* yf) {
  if constexpr (Digits) digits_rows(x, M, K, sm, xq, K, a);
  else quantize_rows_typed(x, M, K, sm, xq, K, a);
  w4a8_rows_into<S, Z>(xq, Digits ? 2 * M : M, p, sz, K, gs, N16, xs, yf);
  if constexpr (Digits) combine_digits(yf, N16, a, M, n, y);
  else scale_rows_into(yf, N16, a, M, n, y);
}

at::Tensor w4a8x_mm(bool digits, const at::Tensor& x_, const at::Tensor& packed, const at::Tensor& sz, int64_t gs,
                    int64_t n, const at::Tensor* out) {
  const char* name = digits ? "int4_digits_mm" : "w4a8_mm";
  if (!digits) check_2d(x_, "x");
  check_float(x_, "x");
  TORCH_CHECK(x_.dim() == 2, name, ": x must be [M, K]");
  const auto x = x_.stride(1) == 1 ? x_ : x_.contiguous();   // rows in place; a strided column, copied
  const int64_t M = x.size(0), K = x.size(1);
  check_int4(packed, sz, K, gs, n, 8);
  const int64_t N16 = packed.size(0) * 16, G = K / gs, rows = digits ? 2 * M : M;
  auto y = out_or_empty(out, M, n, x);
  TORCH_CHECK(y.scalar_type() == x.scalar_type(), name, ": out must be in x's dtype");
  Aligned<int8_t> xq(rows * K);
  Aligned<float> a(M), xs(rows * G), yf(rows * N16);
  by_scales(sz, N16, G, [&](auto s, auto z) {
    using S = decltype(s);
    constexpr bool Z = decltype(z)::value;
    auto go = [&](auto t) {
      using T = decltype(t);
      auto* rows_of = digits ? w4a8x_rows<true, T, S, Z> : w4a8x_rows<false, T, S, Z>;
      rows_of(x.data_ptr<T>(), x.stride(0), M, K, packed.data_ptr<uint8_t>(), sz.data_ptr<S>(), gs, n, N16,
              y.data_ptr<T>(), xq.data(), a.data(), xs.data(), yf.data());
    };
    if (x.scalar_type() == at::kBFloat16) go(at::BFloat16{});
    else go(float{});
  });
  return y;
}

// ---- decode_attention
// B rows of q against the first L positions of k, v (which may hold more rows and positions: a static cache).


template <typename T>
struct Attend {   // (attention_heads, common.h)
  template <typename... A>
  static void run(A... args) { attend_one<T>(args...); }
};

}  // namespace

// The ops above as plain C++ functions, for the decode step (decode_step.cpp, in the same library).
namespace vk {
// out: the team's shared output [M, N] (decode_step.cpp), or nullptr: made here.
at::Tensor fp32(const at::Tensor& x, const at::Tensor& w, const at::Tensor* out) {
  return dense_mm<Fp32Dense, float>(x, w, at::kFloat, "fp32_mm", "fp32", out);
}
at::Tensor bf16(const at::Tensor& x, const at::Tensor& w, const at::Tensor* out) {
  return dense_mm<Bf16Dense, at::BFloat16>(x, w, at::kBFloat16, "bf16_mm", "bf16", out);
}
at::Tensor int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor* out) {
  return int8_mm_out(x, q, s, out);
}
at::Tensor w8a8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor& sums,
                const at::Tensor* out) {
  return int8x_mm(false, x, q, s, sums_or_null(sums, q.size(0), "w8a8"), out);
}
at::Tensor int8_digits(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor& sums,
                       const at::Tensor* out) {
  return int8x_mm(true, x, q, s, sums_or_null(sums, q.size(0), "int8_digits"), out);
}
at::Tensor int4(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n) {
  return int4_mm(x, p, sz, gs, n);
}
at::Tensor int4_digits(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n,
                       const at::Tensor* out) {
  return w4a8x_mm(true, x, p, sz, gs, n, out);
}
at::Tensor w4a8(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n,
                const at::Tensor* out) {
  return w4a8x_mm(false, x, p, sz, gs, n, out);
}

// q [B, H, 1, D] against the first `length` positions of a static cache k, v [≥ B, Hkv, ≥ length, D] (their
// shapes and dtypes checked by the caller, decode_layers): no views made. keep: bool [B, length] or undefined.
at::Tensor attention_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t length,
                           const c10::optional<at::Tensor>& keep, double scale, const at::Tensor* into) {
  return attention_cache_over<Attend>(q, k, v, length, keep, scale, into);
}

// g ← dtype(dtype(silu(g)) · u) in place, as transformers' MLP: act_fn(gate) * up, each op rounding to the dtype.
template <typename T>
void silu_mul_typed(T* g, const T* u, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.f);
  const auto [b0, b1] = share((n + 15) / 16);   // in a team: this thread's blocks of 16
  for (int64_t i = 16 * b0; i < std::min(n, 16 * b1); i += 16) {
    const __mmask16 m = tail16(n - i);
    const __m512 x = load_row16(g + i, m);
    __m512 a = _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    if constexpr (std::is_same_v<T, at::BFloat16>) a = round_bf16(a);
    store16(g + i, _mm512_mul_ps(a, load_row16(u + i, m)), m);
  }
}

// out[m] = w · dtype(h[m] · rsqrt(mean(h[m]²) + eps)), the mean in fp32: LlamaRMSNorm / Qwen2RMSNorm.
template <typename T>
void rms_norm(const T* h, const T* w, int64_t M, int64_t D, float eps, T* out) {
  for (int64_t m = 0; m < M; ++m) {
    const T* row = h + m * D;
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; i += 16) {
      const __m512 v = load_row16(row + i, tail16(D - i));
      ss = _mm512_fmadd_ps(v, v, ss);
    }
    const __m512 r = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(D) + eps));
    for (int64_t i = 0; i < D; i += 16) {
      const __mmask16 k = tail16(D - i);
      __m512 x = _mm512_mul_ps(load_row16(row + i, k), r);
      if constexpr (std::is_same_v<T, at::BFloat16>) x = round_bf16(x);
      store16(out + m * D + i, _mm512_mul_ps(load_row16(w + i, k), x), k);
    }
  }
}
template void rms_norm<float>(const float*, const float*, int64_t, int64_t, float, float*);
template void rms_norm<at::BFloat16>(const at::BFloat16*, const at::BFloat16*, int64_t, int64_t, float, at::BFloat16*);

void silu_mul(at::Tensor& g, const at::Tensor& u) {
  if (g.scalar_type() == at::kFloat) silu_mul_typed(g.data_ptr<float>(), u.data_ptr<float>(), g.numel());
  else silu_mul_typed(g.data_ptr<at::BFloat16>(), u.data_ptr<at::BFloat16>(), g.numel());
}
}  // namespace vk
