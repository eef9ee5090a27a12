// The kernels' C++ API (namespace vk): what ops.cpp registers as torch ops and decode_step.cpp calls directly.
// One implementation per instruction set, the same API and the same packed layouts (kernels/packing.py):
// gemv_avx512.cpp (AVX-512 F/BW/VL/BF16/VNNI) or gemv_avx2.cpp (AVX2 + FMA); kernels/_build.py links the
// one this CPU runs. out: the team's shared output [M, N] (decode_step.cpp), or nullptr: made there.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

namespace vk {
at::Tensor fp32(const at::Tensor& x, const at::Tensor& w, const at::Tensor* out = nullptr);
at::Tensor bf16(const at::Tensor& x, const at::Tensor& w, const at::Tensor* out = nullptr);
at::Tensor int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor* out = nullptr);
// sums: Σ q of each row (int32 [N]), or an undefined tensor: summed here
at::Tensor int8_digits(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor& sums,
                       const at::Tensor* out = nullptr);
at::Tensor w8a8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor& sums,
                const at::Tensor* out = nullptr);
at::Tensor int4(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n);
at::Tensor w4a8(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n,
                const at::Tensor* out = nullptr);
at::Tensor int4_digits(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n,
                       const at::Tensor* out = nullptr);
// q [B, H, 1, D] against the first `length` positions of k, v [≥ B, Hkv, ≥ length, D] (checked by the caller);
// keep: bool [B, length] or none (all).
at::Tensor attention_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t length,
                           const c10::optional<at::Tensor>& keep, double scale, const at::Tensor* into = nullptr);
void silu_mul(at::Tensor& g, const at::Tensor& u);
template <typename T>
void rms_norm(const T* h, const T* w, int64_t M, int64_t D, float eps, T* out);
// This thread joins (or leaves) a persistent team: each kernel then runs its share only.
void set_team(bool on);
std::pair<int64_t, int64_t> team_share(int64_t n);
}  // namespace vk
