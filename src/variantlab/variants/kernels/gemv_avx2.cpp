// Decode-shaped matmuls (M = 1..8 rows of activations) and the decode step's other kernels on AVX2 + FMA CPUs
// (no AVX-512): the API of vk.h over the same tensors and packed layouts as gemv_avx512.cpp (kernels/packing.py),
// so an artifact packed on one machine runs on the other. Each kernel equals packing.py's reference up to fp32
// summation order, as the AVX-512 ones do (tests/variants/test_kernels.py runs the same checks on either).
//
//   fp32, bf16, int8   W fp32, bf16 or int8 (· s[N]) [N, K] row-major, x converted to fp32 once per call;
//                      W widened to fp32 in registers, 8 lanes, fused multiply-add.
//   w8a8               x quantized per token to int8 (as qp.quantize_int8_per_token), W int8 [N, K] · s[N]:
//                      integer dot products the way llama.cpp's AVX2 Q8_0 does them, with no VNNI:
//                      Σ x·q = madd(maddubs(|q|, sign(x, q)), 1), exact in int32 (|q| ≤ 128, |x| ≤ 127: a pair
//                      sums to at most 32512, below int16's saturation). No Σ q is needed.
//   int8_digits        int8 weight-only with bf16/fp32 x held as two int8 digits a value (x ≈ a·(hi + lo/256),
//                      packing.activation_digits), both digit rows through w8a8's dot product.
//   w4a8, int4_digits  int4 packed 16 rows × 8 k per 64 bytes (pack_int4_vnni): per 32 bytes, 8 rows × 4 nibbles;
//                      maddubs of the nibbles (u8, ≤ 15) against a broadcast quad of int8 activations, summed
//                      in int16 over up to 32 k (at most 4·2·2·15·127 = 30480, no overflow), then madd to
//                      int32 per group: Σ w·xq = s·Σ q·xq + (z − 8·s)·Σ xq.
//   int4               the bf16-pair layout (pack_int4_bf16), nibbles widened to fp32 (a reference path: the
//                      modules run int4_digits).
//   attention_cache, silu_mul, rms_norm   as gemv_avx512.cpp's, 8 fp32 lanes (exp: a degree-6 polynomial).
//
// Rows are split between threads as gemv_avx512.cpp splits them (at::parallel_for, or the team's static share),
// and at M = 1 the row-major kernels read one row at a time, front to back. Compiled with -mavx2 -mfma -mf16c:
// kernels/_build.py builds this file only where the CPU has them.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common.h"
#include "vk.h"

namespace {

// ---- 8 fp32 lanes from fp32, bf16 or int8 memory; partial loads and stores through a zeroed buffer

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

// The first min(n, 8) lanes of p, the rest 0.
template <typename T>
inline __m256 load8n(const T* p, int64_t n) {
  if (n >= 8) return load8(p);
  alignas(32) T buf[8];
  std::memset(buf, 0, sizeof(buf));
  std::memcpy(buf, p, n * sizeof(T));
  return load8(buf);
}

// 8 fp32 → 8 bf16, rounded to nearest even (NaN → the quiet NaN), as c10::BFloat16(float).
inline __m128i to_bf16x8(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// v rounded to bf16 and back (what storing to bf16 and reading back gives).
inline __m256 round_bf16(__m256 v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(to_bf16x8(v)), 16));
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(at::BFloat16* p, __m256 v) { _mm_storeu_si128((__m128i*)p, to_bf16x8(v)); }

// The first min(n, 8) lanes of v to p.
template <typename T>
inline void store8n(T* p, __m256 v, int64_t n) {
  if (n >= 8) return store8(p, v);
  alignas(32) T buf[8];
  store8(buf, v);
  std::memcpy(p, buf, n * sizeof(T));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// e^x, 8 lanes: x = n·ln2 + r, |r| ≤ ln2/2, e^r by its degree-6 Taylor polynomial (as exp16 in gemv_avx512.cpp),
// times 2^n built in two halves of the exponent (n in [−150, 150], each half a normal float); x clamped to
// [−104, 104] (below: 0; above: +inf, through the product).
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-104.f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(104.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 e2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_andnot_ps(under, _mm256_mul_ps(_mm256_mul_ps(p, e1), e2));
}

// ------------------------------------------------------------------------------------------------
// Row-major weights widened to fp32 (W = float, bf16 or int8, the last times s[n]), x fp32 [M, K].

template <typename W, typename S>
inline float row_scale_of(const S* s, int64_t n) { return s ? static_cast<float>(s[n]) : 1.f; }

// One row, front to back, four accumulators of 8 (M = 1: the thread's rows are one sequential stream).
template <typename W, typename T, typename S>
void widen_row1(const float* x, const W* w, const S* s, int64_t K, int64_t n, T* y) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const W* wr = w + n * K;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32)
    for (int u = 0; u < 4; ++u) acc[u] = _mm256_fmadd_ps(load8(x + k + 8 * u), load8(wr + k + 8 * u), acc[u]);
  for (; k < K; k += 8) acc[0] = _mm256_fmadd_ps(load8n(x + k, K - k), load8n(wr + k, K - k), acc[0]);
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  store(y + n, hsum(sum) * row_scale_of<W>(s, n));
}

// R rows of W against M rows of x at a time.
template <int M, int R, typename W, typename T, typename S>
void widen_rows(const float* x, const W* w, const S* s, int64_t K, int64_t n, T* y, int64_t N) {
  __m256 acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load8n(w + (n + r) * K + k, K - k);
    for (int m = 0; m < M; ++m) {
      const __m256 xv = load8n(x + m * K + k, K - k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm256_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) store(y + m * N + n + r, hsum(acc[m][r]) * row_scale_of<W>(s, n + r));
}

template <int M>
struct Widen {
  template <typename W, typename T, typename S>
  static void run(const float* x, const W* w, const S* s, int64_t K, int64_t N, T* y) {
    if (M == 1) {
      par_for(0, N, 1, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) widen_row1(x, w, s, K, n, y);
      });
      return;
    }
    constexpr int R = M <= 2 ? 4 : M <= 4 ? 2 : 1;
    par_for(0, (N + R - 1) / R, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n = b * R;
        if (n + R <= N) widen_rows<M, R>(x, w, s, K, n, y, N);
        else
          for (int64_t r = n; r < N; ++r) widen_rows<M, 1>(x, w, s, K, r, y, N);
      }
    });
  }
};

// x [M, K] as contiguous fp32 rows: x itself, or a bf16 x widened once into this thread's buffer (an aten
// conversion per call would cost a dispatch and an allocation per linear; widening it in registers as it is
// loaded, once per weight row, costs the loop more).
inline const float* fp32_rows(const at::Tensor& x, Aligned<float>& buf) {
  if (x.scalar_type() == at::kFloat) return x.data_ptr<float>();
  const int64_t n = x.numel();
  buf.reserve(static_cast<size_t>(n));
  const at::BFloat16* p = x.data_ptr<at::BFloat16>();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(buf.data() + i, load8(p + i));
  for (; i < n; ++i) buf[i] = static_cast<float>(p[i]);
  return buf.data();
}

// y [M, N] in x's dtype = x @ (w · s)ᵀ; s nullptr: no scale.
template <typename W, typename S>
at::Tensor widen_mm(const at::Tensor& x_, const W* w, const S* s, int64_t N, const at::Tensor* out) {
  const int64_t M = x_.size(0), K = x_.size(1);
  const auto x = x_.is_contiguous() ? x_ : x_.contiguous();
  thread_local Aligned<float> buf;
  const float* xf = fp32_rows(x, buf);
  auto y = out_or_empty(out, M, N, x);
  for (int64_t m0 = 0; m0 < M; m0 += kMaxM) {
    const float* xm = xf + m0 * K;
    if (y.scalar_type() == at::kFloat)
      dispatch_m<Widen>(std::min(kMaxM, M - m0), xm, w, s, K, N, y.data_ptr<float>() + m0 * N);
    else
      dispatch_m<Widen>(std::min(kMaxM, M - m0), xm, w, s, K, N, y.data_ptr<at::BFloat16>() + m0 * N);
  }
  return y;
}

at::Tensor dense_mm(const at::Tensor& x, const at::Tensor& w, at::ScalarType dtype, const char* name,
                    const at::Tensor* out) {
  check_2d(x, "x");
  check_2d(w, "w");
  TORCH_CHECK(x.scalar_type() == dtype && w.scalar_type() == dtype, name, ": x and w must be ",
              dtype == at::kFloat ? "fp32" : "bf16");
  TORCH_CHECK(x.size(1) == w.size(1), name, ": x is [M, K], w is [N, K]");
  if (dtype == at::kFloat) return widen_mm<float, float>(x, w.data_ptr<float>(), nullptr, w.size(0), out);
  return widen_mm<at::BFloat16, float>(x, w.data_ptr<at::BFloat16>(), nullptr, w.size(0), out);
}

at::Tensor int8_mm_out(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor* out) {
  check_2d(x, "x");
  check_int8(x, q, s, "int8_mm");
  if (s.scalar_type() == at::kBFloat16)
    return widen_mm(x, q.data_ptr<int8_t>(), s.data_ptr<at::BFloat16>(), q.size(0), out);
  return widen_mm(x, q.data_ptr<int8_t>(), s.data_ptr<float>(), q.size(0), out);
}

// ------------------------------------------------------------------------------------------------
// int8 × int8 dot products without VNNI: xq [MM rows][Kp] signed int8 (zero padded to Kp, a multiple of 32),
// one weight row q [K] at a time; dots[m] = Σ xq[m]·q exactly.

template <int MM>
inline void i8_row(const int8_t* xq, int64_t Kp, const int8_t* qr, int64_t K, int32_t* dots) {
  __m256i acc[MM];
  for (int m = 0; m < MM; ++m) acc[m] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t k = 0; k < K; k += 32) {
    __m256i wv;
    if (K - k >= 32) {
      wv = _mm256_loadu_si256((const __m256i*)(qr + k));
    } else {
      alignas(32) int8_t buf[32] = {0};
      std::memcpy(buf, qr + k, K - k);
      wv = _mm256_load_si256((const __m256i*)buf);
    }
    const __m256i aw = _mm256_sign_epi8(wv, wv);   // |q| as u8 (−128 → 128)
    for (int m = 0; m < MM; ++m) {
      const __m256i xs = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)(xq + m * Kp + k)), wv);
      acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones));
    }
  }
  for (int m = 0; m < MM; ++m) dots[m] = hsum_i32(acc[m]);
}

// M = 1: two accumulators, 64 weights a step (one sequential stream per thread).
inline int32_t i8_row1(const int8_t* xq, const int8_t* qr, int64_t K) {
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)(qr + k)), w1 = _mm256_loadu_si256((const __m256i*)(qr + k + 32));
    const __m256i x0 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)(xq + k)), w0);
    const __m256i x1 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)(xq + k + 32)), w1);
    acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), x0), ones));
    acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1), x1), ones));
  }
  int32_t rest = 0;
  if (k < K) i8_row<1>(xq + k, 0, qr + k, K - k, &rest);
  return hsum_i32(_mm256_add_epi32(acc0, acc1)) + rest;
}

// Rows of x quantized per token, as variants/quant_packing.quantize_int8_per_token: a = max(amax|x| / 127,
// FLT_MIN), xq = clamp(round_half_even(x / a), −127, 127); read in place (fp32 or bf16, any row stride).
template <typename T>
float row_scale(const T* row, int64_t K) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 amax = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, load8n(row + k, K - k)));
  return std::max(hmax(amax) / 127.f, std::numeric_limits<float>::min());
}

inline __m256 round_clamp(__m256 v) {
  const __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_min_ps(_mm256_set1_ps(127.f), _mm256_max_ps(_mm256_set1_ps(-127.f), r));
}

// 8 integral lanes in [−127, 127] → the first min(n, 8) bytes at p.
inline void store_i8(int8_t* p, __m256 v, int64_t n) {
  const __m256i i = _mm256_cvtps_epi32(v);
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  const __m128i b = _mm_packs_epi16(w, w);
  if (n >= 8) {
    _mm_storel_epi64((__m128i*)p, b);
  } else {
    alignas(16) int8_t buf[16];
    _mm_store_si128((__m128i*)buf, b);
    std::memcpy(p, buf, n);
  }
}

// x [M, K] → xq rows (one per token, `digits` false) or digit rows (row 2m = hi, 2m + 1 = lo, x ≈ a·(hi + lo/256),
// packing.activation_digits), each `ld` bytes apart; a [M]: the rows' scales.
template <typename T>
void quantize_typed(const T* p, int64_t M, int64_t K, int64_t sm, bool digits, int8_t* xq, int64_t ld, float* a) {
  for (int64_t m = 0; m < M; ++m) {
    const T* row = p + m * sm;
    const float am = row_scale(row, K);
    a[m] = am;
    const __m256 av = _mm256_set1_ps(am);
    int8_t* hi = xq + (digits ? 2 * m : m) * ld;
    for (int64_t k = 0; k < K; k += 8) {   // x / a (a division, as the reference divides), then rounded
      const __m256 v = _mm256_div_ps(load8n(row + k, K - k), av);
      const __m256 h = round_clamp(v);
      store_i8(hi + k, h, K - k);
      if (digits) store_i8(hi + ld + k, round_clamp(_mm256_mul_ps(_mm256_sub_ps(v, h), _mm256_set1_ps(256.f))), K - k);
    }
  }
}

void quantize(const at::Tensor& x_, bool digits, int8_t* xq, int64_t ld, float* a) {
  const auto x = x_.stride(1) == 1 ? x_ : x_.contiguous();   // rows in place; a strided column, copied
  if (x.scalar_type() == at::kBFloat16)
    quantize_typed(x.data_ptr<at::BFloat16>(), x.size(0), x.size(1), x.stride(0), digits, xq, ld, a);
  else
    quantize_typed(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0), digits, xq, ld, a);
}

// w8a8 (D = 1 row a token: y = Σ xq·q · a · s) and int8_digits (D = 2 digit rows: y = (hi + lo/256) · a · s):
// one weight row at a time against the M tokens' rows.
template <int M>
struct IntRows {
  template <int D, typename T, typename S>
  static void typed(const int8_t* xq, int64_t Kp, const int8_t* q, const S* s, const float* a, int64_t K, int64_t N,
                    T* y) {
    par_for(0, N, 1, [&](int64_t n0, int64_t n1) {
      int32_t dots[D * M];
      for (int64_t n = n0; n < n1; ++n) {
        if (D * M == 1) dots[0] = i8_row1(xq, q + n * K, K);
        else i8_row<D * M>(xq, Kp, q + n * K, K, dots);
        const float sc = static_cast<float>(s[n]);
        for (int m = 0; m < M; ++m) {
          const float v = D == 1 ? static_cast<float>(dots[m])
                                 : static_cast<float>(dots[2 * m]) + static_cast<float>(dots[2 * m + 1]) * (1.f / 256.f);
          store(y + m * N + n, v * a[m] * sc);
        }
      }
    });
  }
  template <int D>
  static void run(const int8_t* xq, int64_t Kp, const at::Tensor& q, const at::Tensor& s, const float* a,
                  at::Tensor& y, int64_t m0) {
    const int64_t K = q.size(1), N = q.size(0);
    by_dtypes(y, s, [&](auto t, auto sc) {
      using T = decltype(t);
      using S = decltype(sc);
      typed<D>(xq + D * m0 * Kp, Kp, q.data_ptr<int8_t>(), s.data_ptr<S>(), a + m0, K, N, y.data_ptr<T>() + m0 * N);
    });
  }
};

template <int M>
struct W8A8Rows {
  template <typename... A>
  static void run(A&&... args) { IntRows<M>::template run<1>(args...); }
};
template <int M>
struct DigitRows {
  template <typename... A>
  static void run(A&&... args) { IntRows<M>::template run<2>(args...); }
};

at::Tensor int8_rows_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, bool digits,
                        const at::Tensor* out) {
  check_int8(x, q, s, digits ? "int8_digits_mm" : "w8a8_mm");
  const int64_t M = x.size(0), K = x.size(1), Kp = (K + 31) / 32 * 32, D = digits ? 2 : 1;
  Aligned<int8_t> xq(D * M * Kp, true);
  Aligned<float> a(M);
  quantize(x, digits, xq.data(), Kp, a.data());
  auto y = out_or_empty(out, M, q.size(0), x);
  for (int64_t m0 = 0; m0 < M; m0 += kMaxM) {
    if (digits) dispatch_m<DigitRows>(std::min(kMaxM, M - m0), xq.data(), Kp, q, s, a.data(), y, m0);
    else dispatch_m<W8A8Rows>(std::min(kMaxM, M - m0), xq.data(), Kp, q, s, a.data(), y, m0);
  }
  return y;
}

// ------------------------------------------------------------------------------------------------
// int4 packed 16 rows × 8 k per 64 bytes (pack_int4_vnni) × int8 activation quads. Block: K/8 chunks, then its
// scales and zeros [G][2][16] (Z) or the scales alone [G][16]. xq4: xq as int32 quads [M, K/4]; xs: Σ xq per
// group [M, G]. out [M][16], before the per-token scale.

template <typename S>
inline __m256 load8s(const S* p) { return load8(p); }

template <int M, typename S, bool Z>
void w4a8_block(const uint8_t* p, const S* sz, const int32_t* xq4, const float* xs, int64_t K, int64_t G,
                int64_t gs, float* out) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256 m8 = _mm256_set1_ps(-8.f);
  __m256 o[M][2];
  for (int m = 0; m < M; ++m) o[m][0] = o[m][1] = _mm256_setzero_ps();
  const int64_t quads = K / 4;
  for (int64_t g = 0; g < G; ++g) {
    __m256i acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
    const int64_t c0 = g * gs / 8, c1 = c0 + gs / 8;
    for (int64_t c = c0; c < c1; c += 4) {   // int16 sums over at most 4 chunks (32 k): no overflow
      __m256i a16[M][2];
      for (int m = 0; m < M; ++m) a16[m][0] = a16[m][1] = _mm256_setzero_si256();
      for (int64_t cc = c; cc < std::min(c + 4, c1); ++cc, p += 64) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i*)p), v1 = _mm256_loadu_si256((const __m256i*)(p + 32));
        const __m256i lo0 = _mm256_and_si256(v0, low), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
        const __m256i lo1 = _mm256_and_si256(v1, low), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
        for (int m = 0; m < M; ++m) {
          const int32_t* xm = xq4 + m * quads + 2 * cc;
          const __m256i x0 = _mm256_set1_epi32(xm[0]), x1 = _mm256_set1_epi32(xm[1]);
          a16[m][0] = _mm256_add_epi16(a16[m][0], _mm256_add_epi16(_mm256_maddubs_epi16(lo0, x0), _mm256_maddubs_epi16(hi0, x1)));
          a16[m][1] = _mm256_add_epi16(a16[m][1], _mm256_add_epi16(_mm256_maddubs_epi16(lo1, x0), _mm256_maddubs_epi16(hi1, x1)));
        }
      }
      for (int m = 0; m < M; ++m)
        for (int h = 0; h < 2; ++h) acc[m][h] = _mm256_add_epi32(acc[m][h], _mm256_madd_epi16(a16[m][h], ones));
    }
    const S* gsz = sz + g * (Z ? 32 : 16);
    for (int h = 0; h < 2; ++h) {
      const __m256 s = load8s(gsz + 8 * h);
      const __m256 zz = Z ? _mm256_fmadd_ps(s, m8, load8s(gsz + 16 + 8 * h)) : _mm256_mul_ps(s, m8);
      for (int m = 0; m < M; ++m) {
        o[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][h]), s, o[m][h]);
        o[m][h] = _mm256_fmadd_ps(zz, _mm256_set1_ps(xs[m * G + g]), o[m][h]);
      }
    }
  }
  for (int m = 0; m < M; ++m) {
    _mm256_storeu_ps(out + m * 16, o[m][0]);
    _mm256_storeu_ps(out + m * 16 + 8, o[m][1]);
  }
}

// The bf16-pair layout (pack_int4_bf16): per 4 columns, 32 bytes; as 16-bit words, word i (row i) holds the
// nibbles of columns 4c, 4c + 2, 4c + 1, 4c + 3 (low to high). xf: x fp32 [M, K]; xs: Σ x per group [M, G].
template <int M, typename S, bool Z>
void int4_block(const uint8_t* p, const S* sz, const float* xf, const float* xs, int64_t K, int64_t G, int64_t gs,
                float* out) {
  const __m256i nib = _mm256_set1_epi32(15);
  static constexpr int kCol[4] = {0, 2, 1, 3};   // nibble t of a word is column 4c + kCol[t]
  __m256 o[M][2];
  for (int m = 0; m < M; ++m) o[m][0] = o[m][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m256 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t c = g * gs / 4; c < (g + 1) * gs / 4; ++c, p += 32) {
      for (int h = 0; h < 2; ++h) {
        const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p + 16 * h)));
        for (int t = 0; t < 4; ++t) {
          const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words, 4 * t), nib));
          for (int m = 0; m < M; ++m)
            acc[m][h] = _mm256_fmadd_ps(q, _mm256_set1_ps(xf[m * K + 4 * c + kCol[t]]), acc[m][h]);
        }
      }
    }
    const S* gsz = sz + g * 32;   // Σ w·x = s·Σ q·x + (z − 8·s)·Σ x
    for (int h = 0; h < 2; ++h) {
      const __m256 s = load8s(gsz + 8 * h);
      const __m256 zz = _mm256_fmadd_ps(s, _mm256_set1_ps(-8.f), load8s(gsz + 16 + 8 * h));
      for (int m = 0; m < M; ++m) {
        o[m][h] = _mm256_fmadd_ps(acc[m][h], s, o[m][h]);
        o[m][h] = _mm256_fmadd_ps(zz, _mm256_set1_ps(xs[m * G + g]), o[m][h]);
      }
    }
  }
  for (int m = 0; m < M; ++m) {
    _mm256_storeu_ps(out + m * 16, o[m][0]);
    _mm256_storeu_ps(out + m * 16 + 8, o[m][1]);
  }
}

struct W4A8Blocks {
  template <int M, typename S, bool Z>
  static void block(const uint8_t* p, const S* sz, const int32_t* x, const float* xs, int64_t K, int64_t G,
                    int64_t gs, float* out) {
    w4a8_block<M, S, Z>(p, sz, x, xs, K, G, gs, out);
  }
};
struct Int4Blocks {
  template <int M, typename S, bool Z>
  static void block(const uint8_t* p, const S* sz, const float* x, const float* xs, int64_t K, int64_t G,
                    int64_t gs, float* out) {
    int4_block<M, S, Z>(p, sz, x, xs, K, G, gs, out);
  }
};


// yf [R, N16] = the packed int4 weights against R int8 rows xq [R, K] (their Σ per group summed here).
Aligned<float> w4a8_rows_core(const int8_t* xq, int64_t R, const at::Tensor& packed, const at::Tensor& sz,
                              int64_t K, int64_t gs) {
  const int64_t G = K / gs, N16 = packed.size(0) * 16;
  Aligned<float> xs(R * G);
  for (int64_t m = 0; m < R; ++m)
    for (int64_t g = 0; g < G; ++g) {
      int32_t t = 0;
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k) t += xq[m * K + k];
      xs[m * G + g] = static_cast<float>(t);
    }
  Aligned<float> yf(R * N16);
  const int32_t* xq4 = (const int32_t*)xq;
  for (int64_t m0 = 0; m0 < R; m0 += kMaxM)
    dispatch_m<PackedInt4<W4A8Blocks, int32_t>::template At>(std::min(kMaxM, R - m0), packed, sz, xq4 + m0 * K / 4,
                                                             xs.data() + m0 * G, K, G, gs, yf.data() + m0 * N16, N16);
  return yf;
}

// y [M, n] from yf: per token a[m]·yf[m] (w4a8) or a[m]·(yf[2m] + yf[2m + 1] / 256) (digits); in a team, only
// this thread's blocks of 16 columns (those PackedInt4 computed here).
template <typename T>
void scale_rows_into(const float* yf, int64_t N16, const float* a, int64_t M, int64_t n, bool digits, T* y) {
  const auto [b0, b1] = share((n + 15) / 16);
  const __m256 inv = _mm256_set1_ps(1.f / 256.f);
  for (int64_t m = 0; m < M; ++m) {
    const __m256 am = _mm256_set1_ps(a[m]);
    const float* hi = yf + (digits ? 2 * m : m) * N16;
    for (int64_t j = 16 * b0; j < std::min(n, 16 * b1); j += 8) {
      __m256 v = _mm256_loadu_ps(hi + j);   // yf holds N16 ≥ j + 8 columns
      if (digits) v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_loadu_ps(hi + N16 + j), inv));
      store8n(y + m * n + j, _mm256_mul_ps(v, am), n - j);
    }
  }
}

at::Tensor int4_rows_mm(const at::Tensor& x_, const at::Tensor& packed, const at::Tensor& sz, int64_t gs, int64_t n,
                        bool digits, const at::Tensor* out) {
  check_float(x_, "x");
  TORCH_CHECK(x_.dim() == 2, digits ? "int4_digits_mm" : "w4a8_mm", ": x must be [M, K]");
  const auto x = x_.stride(1) == 1 ? x_ : x_.contiguous();
  const int64_t M = x.size(0), K = x.size(1), D = digits ? 2 : 1;
  check_int4(packed, sz, K, gs, n, 8);
  Aligned<int8_t> xq(D * M * K);
  Aligned<float> a(M);
  quantize(x, digits, xq.data(), K, a.data());
  auto yf = w4a8_rows_core(xq.data(), D * M, packed, sz, K, gs);
  auto y = out_or_empty(out, M, n, x);
  const int64_t N16 = packed.size(0) * 16;
  if (x.scalar_type() == at::kBFloat16) scale_rows_into(yf.data(), N16, a.data(), M, n, digits, y.data_ptr<at::BFloat16>());
  else scale_rows_into(yf.data(), N16, a.data(), M, n, digits, y.data_ptr<float>());
  return y;
}

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t gs, int64_t n) {
  check_2d(x, "x");
  check_float(x, "x");
  const int64_t M = x.size(0), K = x.size(1), G = K / gs;
  check_int4(packed, sz, K, gs, n, 4);
  const int64_t N16 = packed.size(0) * 16;
  const bool split = x.scalar_type() == at::kFloat;
  const auto xf = bf16_rows(x).to(at::kFloat).contiguous();   // the bf16 values the AVX-512 kernel multiplies
  const auto xs = xf.view({xf.size(0), G, gs}).sum(2).contiguous();
  auto yf = at::empty({xf.size(0), N16}, x.options().dtype(at::kFloat));
  for (int64_t m0 = 0; m0 < xf.size(0); m0 += kMaxM)
    dispatch_m<PackedInt4<Int4Blocks, float>::template At>(std::min(kMaxM, xf.size(0) - m0), packed, sz,
                                                           xf.data_ptr<float>() + m0 * K, xs.data_ptr<float>() + m0 * G,
                                                           K, G, gs, yf.data_ptr<float>() + m0 * N16, N16);
  if (split) yf = yf.narrow(0, 0, M) + yf.narrow(0, M, M);
  return yf.narrow(1, 0, n).to(x.scalar_type());
}

// ------------------------------------------------------------------------------------------------
// Attention at one query position: softmax(q·Kᵀ·scale)·V over the kept positions, fp32 sums.

template <typename T>
void attend_one(const T* q, const T* k, const T* v, int64_t L, int64_t D, int64_t ks, const bool* keep,
                int64_t keep_stride, float scale, float* scores, T* out) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  const int64_t chunks = (D + 7) / 8;
  __m256 qv[32];  // D ≤ 256
  for (int64_t c = 0; c < chunks; ++c) qv[c] = _mm256_mul_ps(load8n(q + c * 8, D - c * 8), _mm256_set1_ps(scale));
  float mx = kNone;
  for (int64_t l = 0; l < L; ++l) {
    if (keep && !keep[l * keep_stride]) {
      scores[l] = kNone;
      continue;
    }
    const T* kr = k + l * ks;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) acc = _mm256_fmadd_ps(qv[c], load8n(kr + c * 8, D - c * 8), acc);
    scores[l] = hsum(acc);
    mx = std::max(mx, scores[l]);
  }
  __m256 o[32];
  for (int64_t c = 0; c < chunks; ++c) o[c] = _mm256_setzero_ps();
  float sum = 0.f;
  if (mx != kNone) {
    const __m256 mv = _mm256_set1_ps(mx);
    __m256 sv = _mm256_setzero_ps();
    for (int64_t i = 0; i < L; i += 8) {   // masked positions: e^−∞ = 0
      const __m256 p = exp8(_mm256_sub_ps(load8n(scores + i, L - i), mv));
      const __m256 kept = L - i >= 8 ? p : _mm256_and_ps(p, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
          _mm256_set1_epi32(static_cast<int>(L - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
      store8n(scores + i, kept, L - i);
      sv = _mm256_add_ps(sv, kept);
    }
    sum = hsum(sv);
    for (int64_t i = 0; i < L; ++i) {
      const float p = scores[i];
      if (p == 0.f) continue;
      const __m256 pv = _mm256_set1_ps(p);
      const T* vr = v + i * ks;
      for (int64_t c = 0; c < chunks; ++c) o[c] = _mm256_fmadd_ps(pv, load8n(vr + c * 8, D - c * 8), o[c]);
    }
  }
  const __m256 inv = _mm256_set1_ps(sum > 0.f ? 1.f / sum : 0.f);   // a row that keeps nothing gives zeros
  for (int64_t c = 0; c < chunks; ++c) store8n(out + c * 8, _mm256_mul_ps(o[c], inv), D - c * 8);
}


template <typename T>
void silu_mul_typed(T* g, const T* u, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.f);
  const auto [b0, b1] = share((n + 15) / 16);   // in a team: this thread's blocks of 16
  for (int64_t i = 16 * b0; i < std::min(n, 16 * b1); i += 8) {
    const __m256 x = load8n(g + i, n - i);
    __m256 a = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    if constexpr (std::is_same_v<T, at::BFloat16>) a = round_bf16(a);
    store8n(g + i, _mm256_mul_ps(a, load8n(u + i, n - i)), n - i);
  }
}


template <typename T>
struct Attend {   // (attention_heads, common.h)
  template <typename... A>
  static void run(A... args) { attend_one<T>(args...); }
};

}  // namespace

namespace vk {
at::Tensor fp32(const at::Tensor& x, const at::Tensor& w, const at::Tensor* out) {
  return dense_mm(x, w, at::kFloat, "fp32_mm", out);
}
at::Tensor bf16(const at::Tensor& x, const at::Tensor& w, const at::Tensor* out) {
  return dense_mm(x, w, at::kBFloat16, "bf16_mm", out);
}
at::Tensor int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor* out) {
  return int8_mm_out(x, q, s, out);
}
// sums: unused here (the sign trick needs no Σ q), checked as gemv_avx512.cpp checks them
at::Tensor w8a8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor& sums,
                const at::Tensor* out) {
  sums_or_null(sums, q.size(0), "w8a8");
  return int8_rows_mm(x, q, s, false, out);
}
at::Tensor int8_digits(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor& sums,
                       const at::Tensor* out) {
  sums_or_null(sums, q.size(0), "int8_digits");
  return int8_rows_mm(x, q, s, true, out);
}
at::Tensor int4(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n) {
  return int4_mm(x, p, sz, gs, n);
}
at::Tensor w4a8(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n,
                const at::Tensor* out) {
  return int4_rows_mm(x, p, sz, gs, n, false, out);
}
at::Tensor int4_digits(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n,
                       const at::Tensor* out) {
  return int4_rows_mm(x, p, sz, gs, n, true, out);
}

at::Tensor attention_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t length,
                           const c10::optional<at::Tensor>& keep, double scale, const at::Tensor* into) {
  return attention_cache_over<Attend>(q, k, v, length, keep, scale, into);
}

void silu_mul(at::Tensor& g, const at::Tensor& u) {
  if (g.scalar_type() == at::kFloat) silu_mul_typed(g.data_ptr<float>(), u.data_ptr<float>(), g.numel());
  else silu_mul_typed(g.data_ptr<at::BFloat16>(), u.data_ptr<at::BFloat16>(), g.numel());
}

// out[m] = w · dtype(h[m] · rsqrt(mean(h[m]²) + eps)), the mean in fp32: LlamaRMSNorm / Qwen2RMSNorm.
template <typename T>
void rms_norm(const T* h, const T* w, int64_t M, int64_t D, float eps, T* out) {
  for (int64_t m = 0; m < M; ++m) {
    const T* row = h + m * D;
    __m256 ss = _mm256_setzero_ps();
    for (int64_t i = 0; i < D; i += 8) {
      const __m256 v = load8n(row + i, D - i);
      ss = _mm256_fmadd_ps(v, v, ss);
    }
    const __m256 r = _mm256_set1_ps(1.f / std::sqrt(hsum(ss) / static_cast<float>(D) + eps));
    for (int64_t i = 0; i < D; i += 8) {
      __m256 x = _mm256_mul_ps(load8n(row + i, D - i), r);
      if constexpr (std::is_same_v<T, at::BFloat16>) x = round_bf16(x);
      store8n(out + m * D + i, _mm256_mul_ps(load8n(w + i, D - i), x), D - i);
    }
  }
}
template void rms_norm<float>(const float*, const float*, int64_t, int64_t, float, float*);
template void rms_norm<at::BFloat16>(const at::BFloat16*, const at::BFloat16*, int64_t, int64_t, float, at::BFloat16*);
}  // namespace vk
