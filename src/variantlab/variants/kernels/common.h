// What both instruction sets' kernels share (gemv_avx512.cpp, gemv_avx2.cpp; each includes this once):
// the team's share of a loop, dispatch on M, argument checks. Nothing here is vectorized.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kMaxM = 8;   // the kernels' M; above it they loop over chunks of 8 rows, re-reading W

// Inside a team (vk::set_team), this thread's share of [0, n): OpenMP's static split; outside, all of it.
thread_local bool t_team = false;

#ifdef VK_SERIAL
// One thread, and no call out of the kernels (no OpenMP, no thread-local, no aten): how the emulator's harness
// builds them (tests/variants/avx512_harness.cpp), to run an instruction set this CPU lacks.
inline std::pair<int64_t, int64_t> share(int64_t n) { return {0, n}; }

template <typename F>
void par_for(int64_t begin, int64_t end, int64_t, const F& f) {
  if (begin < end) f(begin, end);
}
#else
inline std::pair<int64_t, int64_t> share(int64_t n) {
  if (!t_team) return {0, n};
  const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
  return {n * t / nt, n * (t + 1) / nt};
}

// at::parallel_for, or in a team this thread's share alone (no barrier: the team's caller places them).
template <typename F>
void par_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (!t_team) return at::parallel_for(begin, end, grain, f);
  const auto [b0, b1] = share(end - begin);
  if (b0 < b1) f(begin + b0, begin + b1);
}
#endif

// y given (a team's shared output, [M, n] in x's dtype) or made here.
inline at::Tensor out_or_empty(const at::Tensor* out, int64_t M, int64_t n, const at::Tensor& x) {
  return out ? *out : at::empty({M, n}, x.options());
}

// Σ q of each row from the caller (int32 [N]), or nullptr (an undefined tensor): the kernel sums them.
inline const int32_t* sums_or_null(const at::Tensor& sums, int64_t n, const char* name) {
  if (!sums.defined()) return nullptr;
  TORCH_CHECK(sums.scalar_type() == at::kInt && sums.is_contiguous() && sums.numel() == n, name,
              ": sums must be int32 [N]");
  return sums.data_ptr<int32_t>();
}

// A kernel's scratch rows (activations quantized for VNNI, per-block sums, partial outputs) on a 64-byte
// boundary: a cache line, AVX-512's widest load. std::vector's operator new aligns to 16 bytes only, so where
// its rows began within a cache line was the heap's choice, made anew by each process's history of allocations;
// a row that starts mid-line splits every 64-byte load of it in two. Measured on a 2-core AVX-512 EPYC, 115M
// Llama, int8 (int8_digits_mm reads two such rows per weight row): one process decoded 5-18% slower than the
// next for its whole life, the kernel itself 15% (perf, cpu-clock samples), as its heap had placed the rows.
template <typename T>
class Aligned {
 public:
  explicit Aligned(size_t n = 0, bool zero = false) {
    reserve(n);
    if (zero) std::memset(p_.get(), 0, n * sizeof(T));
  }
  // Room for n elements (a buffer kept between calls grows; what it held is not kept).
  void reserve(size_t n) {
    if (p_ && n <= cap_) return;
    p_.reset(static_cast<T*>(std::aligned_alloc(64, ((n ? n : 1) * sizeof(T) + 63) / 64 * 64)));
    if (!p_) throw std::bad_alloc();
    cap_ = n;
  }
  T* data() { return p_.get(); }
  T& operator[](size_t i) { return p_.get()[i]; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> p_;
  size_t cap_ = 0;
};

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
inline void store(T* p, float v) { *p = static_cast<T>(v); }  // c10::BFloat16(float) rounds to nearest even

// Dispatch on M (1..8) at compile time.
template <template <int> class F, typename... A>
void dispatch_m(int64_t m, A&&... args) {
  switch (m) {
    case 1: F<1>::run(args...); break;
    case 2: F<2>::run(args...); break;
    case 3: F<3>::run(args...); break;
    case 4: F<4>::run(args...); break;
    case 5: F<5>::run(args...); break;
    case 6: F<6>::run(args...); break;
    case 7: F<7>::run(args...); break;
    case 8: F<8>::run(args...); break;
    default: TORCH_CHECK(false, "M must be 1..8");
  }
}

inline void check_2d(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2 && t.is_contiguous(), name, " must be a contiguous 2-D CPU tensor");
}

inline void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat, name, " must be bf16 or fp32");
}

// x [M, K] and int8 q [N, K] with scales [N] (int8_mm, w8a8_mm, int8_digits_mm).
inline void check_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, name, ": x must be a 2-D CPU tensor [M, K]");
  check_2d(q, "q");
  check_float(x, "x");
  check_float(s, "scales");
  TORCH_CHECK(q.scalar_type() == at::kChar && x.size(1) == q.size(1), name, ": q must be int8 [N, K], x [M, K]");
  TORCH_CHECK(s.is_contiguous() && s.numel() == q.size(0), name, ": scales must be [N]");
}

inline void check_int4(const at::Tensor& packed, const at::Tensor& sz, int64_t K, int64_t gs, int64_t n,
                       int64_t per_byte) {
  TORCH_CHECK(packed.is_contiguous() && packed.scalar_type() == at::kByte && packed.dim() == 2,
              "packed must be a contiguous uint8 [N/16, K·8] tensor");
  TORCH_CHECK(gs > 0 && gs % per_byte == 0 && K % gs == 0, "group_size must divide K and be a multiple of ",
              per_byte);
  const int64_t N16 = packed.size(0) * 16, G = K / gs;
  TORCH_CHECK(packed.size(1) == K * 8, "packed is [N/16, K·8] for K = ", K);
  TORCH_CHECK(n > 0 && n <= N16, "out_features must be in (0, ", N16, "]");
  // w4a8's layout (8 k a chunk) also takes the scales alone: symmetric int4, zeros 0 (kernels/packing.py)
  const bool scales_alone = per_byte == 8 && sz.numel() == N16 * G;
  TORCH_CHECK(sz.is_contiguous() && (sz.numel() == N16 * G * 2 || scales_alone) &&
                  (sz.scalar_type() == at::kBFloat16 || sz.scalar_type() == at::kFloat),
              per_byte == 8 ? "scales_zeros must be bf16/fp32 [N/16, G, 2, 16] or, the scales alone, [N/16, G, 16]"
                            : "scales_zeros must be bf16/fp32 [N/16, G, 2, 16]");
}

// Calls fn(T{}, S{}) for the output dtype T of y and the scale dtype S of s (each bf16 or fp32).
template <typename Fn>
void by_dtypes(const at::Tensor& y, const at::Tensor& s, Fn&& fn) {
  const bool bf = y.scalar_type() == at::kBFloat16, sbf = s.scalar_type() == at::kBFloat16;
  if (bf && sbf) fn(at::BFloat16{}, at::BFloat16{});
  else if (bf) fn(at::BFloat16{}, float{});
  else if (sbf) fn(float{}, at::BFloat16{});
  else fn(float{}, float{});
}

// int4_mm's activations: fp32 x runs as two bf16 rows, hi = bf16(x) and lo = bf16(x − hi), |x − hi − lo| ≤ 2^-16·|x|
// (the caller adds the two halves of its output); bf16 x as it is.
inline at::Tensor bf16_rows(const at::Tensor& x) {
  if (x.scalar_type() != at::kFloat) return x;
  const auto hi = x.to(at::kBFloat16);
  return at::cat({hi, (x - hi.to(at::kFloat)).to(at::kBFloat16)}, 0);
}


// Calls fn(S{}, std::bool_constant<Z>{}) for packed int4's scales sz: S their dtype (bf16 or fp32), Z whether
// the zeros lie beside them (else the scales alone, symmetric int4: check_int4).
template <typename Fn>
void by_scales(const at::Tensor& sz, int64_t N16, int64_t G, Fn&& fn) {
  const bool z = sz.numel() == N16 * G * 2;
  if (sz.scalar_type() == at::kBFloat16) {
    if (z) fn(at::BFloat16{}, std::true_type{});
    else fn(at::BFloat16{}, std::false_type{});
  } else {
    if (z) fn(float{}, std::true_type{});
    else fn(float{}, std::false_type{});
  }
}

// Blocks of 16 packed int4 rows split between threads (in a team, this thread's share: the scaling that follows
// reads the same share); B::block<M, S, Z> computes one block's [M][16] outputs before any per-row scale (each
// instruction set's own; X: what it holds the activations as), written to yf [M, N16]. Z: zeros beside the
// scales (else the scales alone, symmetric int4: check_int4).
template <typename B, typename X>
struct PackedInt4 {
  template <int M>
  struct At {
    template <typename S, bool Z>
    static void typed(const at::Tensor& packed, const at::Tensor& sz, const X* x, const float* xs, int64_t K,
                      int64_t G, int64_t gs, float* y, int64_t N16) {
      blocks<S, Z>(packed.data_ptr<uint8_t>(), sz.data_ptr<S>(), x, xs, K, G, gs, y, N16);
    }
    template <typename S, bool Z>
    static void blocks(const uint8_t* p, const S* s, const X* x, const float* xs, int64_t K, int64_t G, int64_t gs,
                       float* y, int64_t N16) {
      par_for(0, N16 / 16, 1, [&](int64_t b0, int64_t b1) {
        alignas(64) float out[M * 16];
        for (int64_t b = b0; b < b1; ++b) {
          B::template block<M, S, Z>(p + b * K * 8, s + b * G * (Z ? 32 : 16), x, xs, K, G, gs, out);
          for (int m = 0; m < M; ++m) std::memcpy(y + m * N16 + b * 16, out + m * 16, 64);
        }
      });
    }
    static void run(const at::Tensor& packed, const at::Tensor& sz, const X* x, const float* xs, int64_t K,
                    int64_t G, int64_t gs, float* y, int64_t N16) {
      by_scales(sz, N16, G, [&](auto s, auto z) {
        typed<decltype(s), decltype(z)::value>(packed, sz, x, xs, K, G, gs, y, N16);
      });
    }
  };
};

// dispatch_m's form of PackedInt4<B, X>::At<M>::blocks<S, Z>: the block loop on pointers, S and Z known.
template <typename B, typename X, typename S, bool Z>
struct PackedInt4Blocks {
  template <int M>
  struct At {
    template <typename... A>
    static void run(A... args) { PackedInt4<B, X>::template At<M>::template blocks<S, Z>(args...); }
  };
};

// One query position per sequence and head against a static cache's first L positions, split between threads:
// Attend<T>::run(q row, its K/V head's k and v, L, D, k's position stride, keep row or nullptr, keep's stride,
// scale, scores scratch [L], out row) is each instruction set's softmax(q·Kᵀ·scale)·V.
template <template <typename> class Attend, typename T>
void attention_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const bool* keep, int64_t keep_b,
                     int64_t keep_l, double scale, at::Tensor& out, int64_t L) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), group = H / k.size(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  par_for(0, B * H, 1, [&](int64_t i0, int64_t i1) {
    Aligned<float> scores(L);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / H, h = i % H, g = h / group;
      Attend<T>::run(qp + b * q.stride(0) + h * q.stride(1), kp + b * k.stride(0) + g * k.stride(1),
                     vp + b * v.stride(0) + g * v.stride(1), L, D, k.stride(2), keep ? keep + b * keep_b : nullptr,
                     keep_l, static_cast<float>(scale), scores.data(), op + (b * H + h) * D);
    }
  });
}

// vk::attention_cache over Attend (attention_heads): q [B, H, 1, D] against the first `length` positions of
// k, v [≥ B, Hkv, ≥ length, D], keep bool [B, length] or none; into: the output, or made here.
template <template <typename> class Attend>
at::Tensor attention_cache_over(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t length,
                                const c10::optional<at::Tensor>& keep, double scale, const at::Tensor* into) {
  const bool* kp = keep.has_value() ? keep->data_ptr<bool>() : nullptr;
  const int64_t kb = keep.has_value() ? keep->stride(0) : 0, kl = keep.has_value() ? keep->stride(1) : 0;
  auto out = into ? *into : at::empty({q.size(0), 1, q.size(1), q.size(3)}, q.options());
  if (q.scalar_type() == at::kFloat) attention_heads<Attend, float>(q, k, v, kp, kb, kl, scale, out, length);
  else attention_heads<Attend, at::BFloat16>(q, k, v, kp, kb, kl, scale, out, length);
  return out;
}

}  // namespace

// The team's API (vk.h), defined here: each library links one instruction set's source, which includes this once.
namespace vk {
void set_team(bool on) { t_team = on; }
std::pair<int64_t, int64_t> team_share(int64_t n) { return share(n); }
}  // namespace vk
