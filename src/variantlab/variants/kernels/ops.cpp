// The kernels as torch ops, torch.ops.variantlab_kernels.* (TORCH_LIBRARY, not pybind): each calls vk:: (vk.h),
// whichever instruction set's source the library was built with (kernels/_build.py). Fake (meta)
// implementations are registered in Python (_build._register_fakes), so torch.compile traces through them.
#include <torch/library.h>

#include "vk.h"

namespace {

at::Tensor fp32_mm(const at::Tensor& x, const at::Tensor& w) { return vk::fp32(x, w); }
at::Tensor bf16_mm(const at::Tensor& x, const at::Tensor& w) { return vk::bf16(x, w); }
at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s) { return vk::int8(x, q, s); }
at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n) {
  return vk::int4(x, p, sz, gs, n);
}
at::Tensor w8a8_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s) {
  return vk::w8a8(x, q, s, at::Tensor());
}
at::Tensor int8_digits_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s) {
  return vk::int8_digits(x, q, s, at::Tensor());
}
at::Tensor int4_digits_mm(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n) {
  return vk::int4_digits(x, p, sz, gs, n);
}
at::Tensor w4a8_mm(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n) {
  return vk::w4a8(x, p, sz, gs, n);
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const c10::optional<at::Tensor>& keep, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) == 1,
              "decode_attention: q is [B, H, 1, D], k and v [B, Hkv, L, D]");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "decode_attention: CPU tensors");
  TORCH_CHECK(k.sizes() == v.sizes() && k.strides() == v.strides() && k.size(0) == q.size(0) &&
                  k.size(3) == q.size(3) && q.size(1) % k.size(1) == 0,
              "decode_attention: k and v must match, and q's heads be a multiple of theirs");
  TORCH_CHECK(q.size(3) <= 256 && q.stride(3) == 1 && k.stride(3) == 1, "decode_attention: head dim ≤ 256, contiguous");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() &&
                  (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "decode_attention: q, k, v all fp32 or all bf16");
  if (keep.has_value()) {
    const auto& m = *keep;
    TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 2 && m.size(0) == q.size(0) && m.size(1) == k.size(2),
                "decode_attention: keep must be bool [B, L]");
  }
  return vk::attention_cache(q, k, v, k.size(2), keep, scale);
}

}  // namespace

#ifndef VK_NS
#define VK_NS variantlab_kernels
#endif
TORCH_LIBRARY(VK_NS, m) {
  m.def("fp32_mm(Tensor x, Tensor w) -> Tensor");
  m.def("bf16_mm(Tensor x, Tensor w) -> Tensor");
  m.def("int8_mm(Tensor x, Tensor q, Tensor scales) -> Tensor");
  m.def("int4_mm(Tensor x, Tensor packed, Tensor scales_zeros, int group_size, int out_features) -> Tensor");
  m.def("w8a8_mm(Tensor x, Tensor q, Tensor scales) -> Tensor");
  m.def("int8_digits_mm(Tensor x, Tensor q, Tensor scales) -> Tensor");
  m.def("int4_digits_mm(Tensor x, Tensor packed, Tensor scales_zeros, int group_size, int out_features) -> Tensor");
  m.def("w4a8_mm(Tensor x, Tensor packed, Tensor scales_zeros, int group_size, int out_features) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor? keep, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(VK_NS, CPU, m) {
  m.impl("fp32_mm", &fp32_mm);
  m.impl("bf16_mm", &bf16_mm);
  m.impl("int8_mm", &int8_mm);
  m.impl("int4_mm", &int4_mm);
  m.impl("w8a8_mm", &w8a8_mm);
  m.impl("int8_digits_mm", &int8_digits_mm);
  m.impl("int4_digits_mm", &int4_digits_mm);
  m.impl("w4a8_mm", &w4a8_mm);
  m.impl("decode_attention", &decode_attention);
}
