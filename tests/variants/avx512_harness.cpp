// The AVX-512 kernels (gemv_avx512.cpp, included whole) behind plain C entry points, for a CPU emulator to call:
// tests/variants/avx512_emulator.py loads this library's bytes into an emulated AVX-512 CPU and calls one entry
// point at a time, on buffers of its own. Built with -DVK_SERIAL (common.h): one thread, nothing called outside
// the library (and -Wl,-Bsymbolic, the few libc functions the compiler calls defined below), so the code runs
// with no OS and no dynamic linker beneath it. Each entry point calls what the library's op of the same name
// runs after its checks, on pointers (dense_into, int8_into, int8x_rows, w4a8x_rows; int4_mm's block loop);
// fp32 out unless `bf16` says bf16 (then x, w and y are bf16, as the ops take them). Float arguments come by
// pointer: every argument is an integer register.
#include <cpuid.h>

#include "gemv_avx512.cpp"

namespace {

using bf16_t = at::BFloat16;

// bf16 x [R, K]: Σ per group [R, G] in fp32 (int4_mm sums them with aten).
void group_sums(const bf16_t* x, int64_t R, int64_t K, int64_t gs, float* xs) {
  const int64_t G = K / gs;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < G; ++g) {
      float t = 0;
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k) t += static_cast<float>(x[r * K + k]);
      xs[r * G + g] = t;
    }
}

}  // namespace

extern "C" {

// What the compiler calls on its own (an array zeroed, a copy; sqrtf on a negative number, for errno), defined
// here and bound here (-Wl,-Bsymbolic): nothing is linked dynamically in the emulator, so a call to libc would
// land on an unmapped page.
void* memset(void* d, int c, size_t n) {
  void* r = d;
  asm volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
  return r;
}
void* memcpy(void* d, const void* s, size_t n) {
  void* r = d;
  asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
  return r;
}
void* memmove(void* d, const void* s, size_t n) {
  if (d <= s || (const char*)s + n <= (char*)d) return memcpy(d, s, n);
  char* de = (char*)d + n - 1;
  const char* se = (const char*)s + n - 1;
  asm volatile("std\n\trep movsb\n\tcld" : "+D"(de), "+S"(se), "+c"(n) : : "memory");
  return d;
}
float sqrtf(float x) { return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x))); }

void vke_spin(const volatile int* flag) {   // returns once *flag is set: the emulator's watchdog is tested on it
  while (!*flag) {
  }
}

void vke_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t* out) {   // eax, ebx, ecx, edx
  __cpuid_count(leaf, subleaf, out[0], out[1], out[2], out[3]);
}

void vke_fp32(const float* x, const float* w, int64_t M, int64_t K, int64_t N, float* y) {
  dense_into<Fp32Dense, float>(x, w, M, K, N, y);
}

void vke_bf16(const uint16_t* x, const uint16_t* w, int64_t M, int64_t K, int64_t N, bf16_t* y) {
  dense_into<Bf16Dense, bf16_t>(x, w, M, K, N, y);
}

// int8_mm: x fp32 (the op converts bf16 x to fp32 first); s and y fp32, or both bf16.
void vke_int8(const float* x, const int8_t* q, const void* s, int64_t M, int64_t K, int64_t N, void* y, int bf16) {
  if (bf16) int8_into(x, q, (const bf16_t*)s, M, K, N, (bf16_t*)y);
  else int8_into(x, q, (const float*)s, M, K, N, (float*)y);
}

// w8a8_mm (digits = 0) and int8_digits_mm (digits = 1): x, s, y all fp32 or all bf16; wsums or null;
// xq: scratch int8 [M·(1 + digits), Kp] zeroed (Kp = K rounded up to 64), a: [M].
void vke_w8a8(const void* x, const int8_t* q, const void* s, const int32_t* wsums, int64_t M, int64_t K, int64_t N,
              void* y, int bf16, int digits, int8_t* xq, float* a) {
  auto go = [&](auto t) {
    using T = decltype(t);
    if (digits) int8x_rows<true>((const T*)x, K, M, K, q, (const T*)s, wsums, N, (T*)y, xq, a);
    else int8x_rows<false>((const T*)x, K, M, K, q, (const T*)s, wsums, N, (T*)y, xq, a);
  };
  if (bf16) go(bf16_t{});
  else go(float{});
}

// int4_mm on bf16 x [M, K] (the op runs fp32 x as two bf16 rows, common.h's bf16_rows): yf fp32 [M, N16];
// sz scales and zeros [N/16, G, 2, 16], fp32 or (sz_bf16) bf16; xs: scratch [M, G].
void vke_int4(const bf16_t* x, const uint8_t* p, const void* sz, int sz_bf16, int64_t M, int64_t K, int64_t gs,
              int64_t N16, float* yf, float* xs) {
  const int64_t G = K / gs;
  group_sums(x, M, K, gs, xs);
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x);
  auto go = [&](auto s) {
    using S = decltype(s);
    for (int64_t m0 = 0; m0 < M; m0 += kMaxM)
      dispatch_m<PackedInt4Blocks<Int4Blocks, uint32_t, S, true>::template At>(std::min(kMaxM, M - m0), p, (const S*)sz,
                                                                      xp + m0 * K / 2, xs + m0 * G, K, G, gs,
                                                                      yf + m0 * N16, N16);
  };
  if (sz_bf16) go(bf16_t{});
  else go(float{});
}

// w4a8_mm (digits = 0) and int4_digits_mm (digits = 1): x [M, K] and y [M, n] fp32 or (bf16) bf16; sz fp32 or
// (sz_bf16) bf16, with zeros ([N/16, G, 2, 16]) or the scales alone ([N/16, G, 16]); scratch xq int8
// [M·(1 + digits), K], a [M], xs [M·(1 + digits), G], yf [M·(1 + digits), N16].
void vke_w4a8(const void* x, const uint8_t* p, const void* sz, int sz_bf16, int zeros, int64_t M, int64_t K,
              int64_t gs, int64_t n, int64_t N16, void* y, int bf16, int digits, int8_t* xq, float* a, float* xs,
              float* yf) {
  auto go = [&](auto t, auto s, auto z) {
    using T = decltype(t);
    using S = decltype(s);
    constexpr bool Z = decltype(z)::value;
    auto* rows_of = digits ? w4a8x_rows<true, T, S, Z> : w4a8x_rows<false, T, S, Z>;
    rows_of((const T*)x, K, M, K, p, (const S*)sz, gs, n, N16, (T*)y, xq, a, xs, yf);
  };
  auto with_scales = [&](auto t) {
    if (sz_bf16 && zeros) go(t, bf16_t{}, std::true_type{});
    else if (sz_bf16) go(t, bf16_t{}, std::false_type{});
    else if (zeros) go(t, float{}, std::true_type{});
    else go(t, float{}, std::false_type{});
  };
  if (bf16) with_scales(bf16_t{});
  else with_scales(float{});
}

// One query position per head against the first L positions of k, v [Hkv, Lmax, D] (contiguous), keep [L] or
// null; H query heads, grouped over Hkv; scores: scratch [L]; out [H, D]. fp32 or bf16 throughout.
void vke_attention(const void* q, const void* k, const void* v, int64_t H, int64_t Hkv, int64_t L, int64_t Lmax,
                   int64_t D, const bool* keep, const float* scale, float* scores, void* out, int bf16) {
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / Hkv), kv = g * Lmax * D;
    if (bf16)
      attend_one<bf16_t>((const bf16_t*)q + h * D, (const bf16_t*)k + kv, (const bf16_t*)v + kv, L, D, D, keep, 1,
                         *scale, scores, (bf16_t*)out + h * D);
    else
      attend_one<float>((const float*)q + h * D, (const float*)k + kv, (const float*)v + kv, L, D, D, keep, 1,
                        *scale, scores, (float*)out + h * D);
  }
}

void vke_silu_mul(void* g, const void* u, int64_t n, int bf16) {
  if (bf16) vk::silu_mul_typed((bf16_t*)g, (const bf16_t*)u, n);
  else vk::silu_mul_typed((float*)g, (const float*)u, n);
}

void vke_rms_norm(const void* h, const void* w, int64_t M, int64_t D, const float* eps, void* out, int bf16) {
  if (bf16) vk::rms_norm((const bf16_t*)h, (const bf16_t*)w, M, D, *eps, (bf16_t*)out);
  else vk::rms_norm((const float*)h, (const float*)w, M, D, *eps, (float*)out);
}

}  // extern "C"
