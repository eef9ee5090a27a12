// The decode step of a Llama-family decoder (Llama, Mistral, Qwen2) in one call: every decoder layer for
// B ≤ 8 sequences at one new position each, over transformers' static KV cache, calling our kernels directly.
//
// What it replaces is transformers' eager forward at decode: per layer some forty aten ops and a dozen Python
// module calls, which on a 2-core CPU cost as much as the matmuls of a 100M model (benchmarks/engine_step.py).
// It computes what LlamaDecoderLayer computes, rounding where it rounds (in the activations' dtype, fp32 or
// bf16), so in fp32 it gives transformers' tokens (tests/variants/test_decode_step.py):
//
//   r = h;  x = rmsnorm(h) · w_in                       (the norm in fp32, rounded to the dtype, then · w)
//   q, k, v = x Wqᵀ (+bq), x Wkᵀ (+bk), x Wvᵀ (+bv)      (each linear: the kernel its module would call)
//   q, k = q·cos + rotate_half(q)·sin, likewise k        (cos, sin from the model's own rotary module)
//   K[:, :, col], V[:, :, col] = k, v;   a = attention(q, K[:, :, :length], V[...], keep)
//   h = r + a Woᵀ;  r = h;  x = rmsnorm(h) · w_post;  h = r + (silu(x Wgᵀ) · x Wuᵀ) Wdᵀ
//
// Linears are given as (kind, tensors): DENSE w (fp32 or bf16, as x), INT8 q s (weight-only), INT4 packed sz
// (aten's int4pack layout), INT4_DIGITS packed sz (ours, w4a8's layout), W8A8 q s, W4A8 packed sz (ours).
// Each sub-step is a profiler range named for what it does (variantlab_kernels::fp32_mm, ::int4pack_mm for aten's, ::rms_norm, ::rotary_embedding, ::silu_mul,
// ...), so `variantlab explain` still breaks a step down (explain/categories.py).
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace vk {
at::Tensor fp32(const at::Tensor& x, const at::Tensor& w);
at::Tensor bf16(const at::Tensor& x, const at::Tensor& w);
at::Tensor int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s);
at::Tensor int8_digits(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor& sums);
at::Tensor w8a8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, const at::Tensor& sums);
at::Tensor w4a8(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n);
at::Tensor int4_digits(const at::Tensor& x, const at::Tensor& p, const at::Tensor& sz, int64_t gs, int64_t n);
at::Tensor attention_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t length,
                           const c10::optional<at::Tensor>& keep, double scale);
void silu_mul(at::Tensor& g, const at::Tensor& u);
template <typename T>
void rms_norm(const T* h, const T* w, int64_t M, int64_t D, float eps, T* out);
}  // namespace vk

namespace {

enum Kind : int64_t { DENSE = 0, INT8 = 1, INT4 = 2, W8A8 = 3, W4A8 = 4, INT4_DIGITS = 5 };
constexpr int64_t kLinears = 7;          // q, k, v, o, gate, up, down
constexpr int64_t kTensorsPerLinear = 4; // a, b, bias, aux (empty where none; INT8's and W8A8's: Σ q of each row)
constexpr int64_t kIntsPerLinear = 3;    // kind, group size, out features
constexpr int64_t kTensorsPerLayer = 2 + kLinears * kTensorsPerLinear;  // + the two norms' weights

#define VK_RANGE(name) RECORD_FUNCTION("variantlab_kernels::" name, std::vector<c10::IValue>())

struct Linear {
  int64_t kind, gs, n;
  const at::Tensor *a, *b, *bias, *aux;
};

// x [M, K] (M ≤ 8) → [M, n] in x's dtype: the kernel the module itself calls at this M (quant_linear.py,
// kernel_linear.py, kernels.OURS_UP_TO), with its bias.
at::Tensor linear(const Linear& l, const at::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1);
  const bool small_k = K <= 1024;
  at::Tensor y;
  switch (l.kind) {
    case DENSE:
      if (x.scalar_type() == at::kFloat) {
        VK_RANGE("fp32_mm");
        y = vk::fp32(x, *l.a);
      } else if (M <= 4 || small_k) {
        VK_RANGE("bf16_mm");
        y = vk::bf16(x, *l.a);
      } else {
        VK_RANGE("linear_mm");   // aten::linear
        y = at::linear(x, *l.a);
      }
      break;
    case INT8:
      if ((M == 1 || small_k) && x.scalar_type() == at::kBFloat16) {
        VK_RANGE("int8_digits_mm");
        y = vk::int8_digits(x, *l.a, *l.b, *l.aux);
      } else if (M == 1 || small_k) {
        VK_RANGE("int8_mm");
        y = vk::int8(x, *l.a, *l.b);
      } else {
        VK_RANGE("int8pack_mm");   // aten::_weight_int8pack_mm
        y = at::_weight_int8pack_mm(x, *l.a, *l.b);
      }
      break;
    case INT4: {
      VK_RANGE("int4pack_mm");   // aten::_weight_int4pack_mm_for_cpu
      y = at::_weight_int4pack_mm_for_cpu(x, *l.a, l.gs, *l.b);
      if (y.size(1) != l.n) y = y.narrow(1, 0, l.n).contiguous();
      break;
    }
    case W8A8: {
      VK_RANGE("w8a8_mm");
      y = vk::w8a8(x, *l.a, *l.b, *l.aux);
      break;
    }
    case INT4_DIGITS: {
      VK_RANGE("int4_digits_mm");
      y = vk::int4_digits(x, *l.a, *l.b, l.gs, l.n);
      break;
    }
    case W4A8: {
      VK_RANGE("w4a8_mm");
      y = vk::w4a8(x, *l.a, *l.b, l.gs, l.n);
      break;
    }
    default:
      TORCH_CHECK(false, "decode_layers: unknown linear kind ", l.kind);
  }
  if (l.bias->numel() > 0) y.add_(*l.bias);
  return y;
}

template <typename T>
inline T round_to(float v) { return static_cast<T>(v); }   // c10::BFloat16(float): round to nearest even

// x [M, heads, D] in place: x·cos + rotate_half(x)·sin, each product and the sum rounded to T (as eager).
template <typename T>
void rope(T* x, const T* cos, const T* sin, int64_t M, int64_t heads, int64_t D) {
  const int64_t half = D / 2;
  std::vector<float> tmp(D);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + (m * heads + h) * D;
      const T* c = cos + m * D;
      const T* s = sin + m * D;
      for (int64_t i = 0; i < D; ++i) {
        const float rot = i < half ? -static_cast<float>(v[i + half]) : static_cast<float>(v[i - half]);
        const float a = static_cast<float>(round_to<T>(static_cast<float>(v[i]) * static_cast<float>(c[i])));
        const float b = static_cast<float>(round_to<T>(rot * static_cast<float>(s[i])));
        tmp[i] = a + b;
      }
      for (int64_t i = 0; i < D; ++i) v[i] = round_to<T>(tmp[i]);
    }
}

// cache [Bc, Hkv, L, D] (its first M rows) at position col ← x [M, Hkv, D].
template <typename T>
void write_cache(at::Tensor& cache, const T* x, int64_t M, int64_t heads, int64_t D, int64_t col) {
  T* c = cache.data_ptr<T>();
  const int64_t sb = cache.stride(0), sh = cache.stride(1), sl = cache.stride(2);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < heads; ++h) std::memcpy(c + m * sb + h * sh + col * sl, x + (m * heads + h) * D, D * sizeof(T));
}

// h ← dtype(h + y), elementwise.
template <typename T>
void add_into(T* h, const T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] = round_to<T>(static_cast<float>(h[i]) + static_cast<float>(y[i]));
}

template <typename T>
void layer(at::Tensor& h, const at::Tensor* t, const Linear* lin, at::Tensor& keys, at::Tensor& values,
           const at::Tensor& cos, const at::Tensor& sin, const c10::optional<at::Tensor>& keep, int64_t col,
           int64_t length, double eps, int64_t heads, int64_t kv_heads, int64_t head_dim, double scale) {
  const int64_t M = h.size(0), D = h.size(1);
  auto x = at::empty_like(h);
  {
    VK_RANGE("rms_norm");
    vk::rms_norm(h.data_ptr<T>(), t[0].data_ptr<T>(), M, D, static_cast<float>(eps), x.data_ptr<T>());
  }
  auto q = linear(lin[0], x), k = linear(lin[1], x), v = linear(lin[2], x);
  {
    VK_RANGE("rotary_embedding");
    rope(q.data_ptr<T>(), cos.data_ptr<T>(), sin.data_ptr<T>(), M, heads, head_dim);
    rope(k.data_ptr<T>(), cos.data_ptr<T>(), sin.data_ptr<T>(), M, kv_heads, head_dim);
  }
  {
    VK_RANGE("cache_write");
    write_cache(keys, k.data_ptr<T>(), M, kv_heads, head_dim, col);
    write_cache(values, v.data_ptr<T>(), M, kv_heads, head_dim, col);
  }
  at::Tensor a;
  {
    VK_RANGE("decode_attention");
    const auto q4 = q.view({M, heads, 1, head_dim});
    a = vk::attention_cache(q4, keys, values, length, keep, scale);       // [M, 1, heads, head_dim]
  }
  auto o = linear(lin[3], a.view({M, heads * head_dim}));
  {
    VK_RANGE("residual_add");
    add_into(h.data_ptr<T>(), o.data_ptr<T>(), M * D);
  }
  {
    VK_RANGE("rms_norm");
    vk::rms_norm(h.data_ptr<T>(), t[1].data_ptr<T>(), M, D, static_cast<float>(eps), x.data_ptr<T>());
  }
  auto g = linear(lin[4], x), u = linear(lin[5], x);
  {
    VK_RANGE("silu_mul");   // SiLU and multiply, each rounded to the dtype as transformers' MLP rounds them
    vk::silu_mul(g, u);
  }
  auto d = linear(lin[6], g);
  {
    VK_RANGE("residual_add");
    add_into(h.data_ptr<T>(), d.data_ptr<T>(), M * D);
  }
}

// h [B, D] (the embedded tokens) → h after every layer, in place and returned. tensors: per layer the two
// norms' weights and 7 linears × (a, b, bias, aux); ints: per layer 7 × (kind, group size, out features).
// keys/values: each layer's static cache [Bc ≥ B, Hkv, L, head_dim]; the new position is written at col,
// attention reads positions [0, length) where keep [B, length] (None: all) says so; counters: each layer's
// cumulative_length (transformers' count of cached positions), advanced by one.
at::Tensor decode_layers(at::Tensor h, at::TensorList tensors, at::IntArrayRef ints, at::TensorList keys,
                         at::TensorList values, at::TensorList counters, const at::Tensor& cos, const at::Tensor& sin,
                         const c10::optional<at::Tensor>& keep, int64_t col, int64_t length, double eps, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, double scale) {
  RECORD_FUNCTION("variantlab_kernels::decode_layers", std::vector<c10::IValue>());
  const int64_t layers = static_cast<int64_t>(keys.size());
  TORCH_CHECK(h.dim() == 2 && h.is_contiguous() && h.size(0) >= 1 && h.size(0) <= 8,
              "decode_layers: h must be a contiguous [B ≤ 8, hidden] tensor");
  TORCH_CHECK(h.scalar_type() == at::kFloat || h.scalar_type() == at::kBFloat16, "decode_layers: fp32 or bf16");
  TORCH_CHECK(static_cast<int64_t>(tensors.size()) == layers * kTensorsPerLayer &&
                  static_cast<int64_t>(ints.size()) == layers * kLinears * kIntsPerLinear &&
                  values.size() == keys.size() && counters.size() == keys.size(),
              "decode_layers: per layer ", kTensorsPerLayer, " tensors, ", kLinears * kIntsPerLinear,
              " ints, one key, value and counter tensor");
  TORCH_CHECK(cos.size(-1) == head_dim && sin.size(-1) == head_dim && cos.is_contiguous() && sin.is_contiguous() &&
                  cos.scalar_type() == h.scalar_type() && sin.scalar_type() == h.scalar_type(),
              "decode_layers: cos and sin must be contiguous [B, head_dim] in h's dtype");
  TORCH_CHECK(col >= 0 && col < length, "decode_layers: col must be a position below length");
  for (int64_t i = 0; i < layers; ++i) {
    at::Tensor k = keys[i], v = values[i];
    TORCH_CHECK(k.scalar_type() == h.scalar_type() && v.scalar_type() == h.scalar_type() && k.dim() == 4 &&
                    k.size(0) >= h.size(0) && k.size(1) == kv_heads && k.size(3) == head_dim && k.size(2) >= length &&
                    k.stride(3) == 1 && v.sizes() == k.sizes() && v.strides() == k.strides(),
                "decode_layers: layer ", i, "'s cache must be [B, kv_heads, ≥ length, head_dim] in h's dtype");
    const at::Tensor* t = &tensors[i * kTensorsPerLayer];
    Linear lin[kLinears];
    for (int64_t j = 0; j < kLinears; ++j) {
      const int64_t* iv = &ints[(i * kLinears + j) * kIntsPerLinear];
      const at::Tensor* lt = t + 2 + j * kTensorsPerLinear;
      lin[j] = Linear{iv[0], iv[1], iv[2], lt, lt + 1, lt + 2, lt + 3};
    }
    if (h.scalar_type() == at::kFloat)
      layer<float>(h, t, lin, k, v, cos, sin, keep, col, length, eps, heads, kv_heads, head_dim, scale);
    else
      layer<at::BFloat16>(h, t, lin, k, v, cos, sin, keep, col, length, eps, heads, kv_heads, head_dim, scale);
    at::Tensor counter = counters[i];
    TORCH_CHECK(counter.scalar_type() == at::kLong && counter.numel() == 1, "decode_layers: counters are int64 scalars");
    *counter.data_ptr<int64_t>() += 1;
  }
  return h;
}

}  // namespace

#ifndef VK_NS
#define VK_NS variantlab_kernels
#endif
TORCH_LIBRARY_FRAGMENT(VK_NS, m) {
  m.def("decode_layers(Tensor(a!) h, Tensor[] tensors, int[] ints, Tensor(b!)[] keys, Tensor(c!)[] values, "
        "Tensor(d!)[] counters, Tensor cos, Tensor sin, Tensor? keep, int col, int length, float eps, int heads, "
        "int kv_heads, int head_dim, float scale) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(VK_NS, CPU, m) { m.impl("decode_layers", &decode_layers); }
