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
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "vk.h"   // the kernels, whichever instruction set's source the library was built with

namespace {

enum Kind : int64_t { DENSE = 0, INT8 = 1, INT4 = 2, W8A8 = 3, W4A8 = 4, INT4_DIGITS = 5 };
constexpr int64_t kLinears = 7;          // q, k, v, o, gate, up, down
constexpr int64_t kTensorsPerLinear = 4; // a, b, bias, aux (empty where none; INT8's and W8A8's: Σ q of each row)
constexpr int64_t kIntsPerLinear = 4;    // kind, group size, out features, rows (ours up to that M, then aten's)
constexpr int64_t kTensorsPerLayer = 2 + kLinears * kTensorsPerLinear;  // + the two norms' weights

// A profiler range named for what a sub-step does; in the team, thread 0's alone (its view, barriers aside).
struct Range {
  std::optional<at::RecordFunction> guard;
  explicit Range(const char* name) {
    if (omp_get_thread_num() != 0) return;
    guard.emplace(at::RecordScope::FUNCTION);
    if (guard->isActive()) ::at::detail::record_function_with_scope(*guard, name, std::vector<c10::IValue>());
  }
};
#define VK_RANGE(name) Range vk_range_("variantlab_kernels::" name)

struct Linear {
  int64_t kind, gs, n, rows;
  const at::Tensor *a, *b, *bias, *aux;
};

// Whether `linear` runs one of our kernels at M rows: up to l.rows (kernels.OURS_UP_TO at its K, from Python;
// 0: aten's at every M). The team needs every linear on ours: aten's would run whole in every thread.
bool ours_at(const Linear& l, int64_t M) { return M <= l.rows; }

// x [M, K] (M ≤ 8) → [M, n] in x's dtype: the kernel the module itself calls at this M (quant_linear.py,
// kernel_linear.py, kernels.OURS_UP_TO), with its bias. out: the team's shared output (this thread writes its
// share; the bias is then the caller's), or nullptr.
at::Tensor linear(const Linear& l, const at::Tensor& x, const at::Tensor* out = nullptr) {
  const bool ours = ours_at(l, x.size(0));
  at::Tensor y;
  switch (l.kind) {
    case DENSE:
      if (ours && x.scalar_type() == at::kFloat) {
        VK_RANGE("fp32_mm");
        y = vk::fp32(x, *l.a, out);
      } else if (ours) {
        VK_RANGE("bf16_mm");
        y = vk::bf16(x, *l.a, out);
      } else {
        VK_RANGE("linear_mm");   // aten::linear
        y = at::linear(x, *l.a);
      }
      break;
    case INT8:
      if (ours && x.scalar_type() == at::kBFloat16) {
        VK_RANGE("int8_digits_mm");
        y = vk::int8_digits(x, *l.a, *l.b, *l.aux, out);
      } else if (ours) {
        VK_RANGE("int8_mm");
        y = vk::int8(x, *l.a, *l.b, out);
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
      y = vk::w8a8(x, *l.a, *l.b, *l.aux, out);
      break;
    }
    case INT4_DIGITS: {
      VK_RANGE("int4_digits_mm");
      y = vk::int4_digits(x, *l.a, *l.b, l.gs, l.n, out);
      break;
    }
    case W4A8: {
      VK_RANGE("w4a8_mm");
      y = vk::w4a8(x, *l.a, *l.b, l.gs, l.n, out);
      break;
    }
    default:
      TORCH_CHECK(false, "decode_layers: unknown linear kind ", l.kind);
  }
  if (l.bias->numel() > 0 && !out) y.add_(*l.bias);
  return y;
}

template <typename T>
inline T round_to(float v) { return static_cast<T>(v); }   // c10::BFloat16(float): round to nearest even

// One head v [D] in place: v·cos + rotate_half(v)·sin, each product and the sum rounded to T (as eager).
template <typename T>
void rope_one(T* v, const T* c, const T* s, int64_t D, float* tmp) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < D; ++i) {
    const float rot = i < half ? -static_cast<float>(v[i + half]) : static_cast<float>(v[i - half]);
    const float a = static_cast<float>(round_to<T>(static_cast<float>(v[i]) * static_cast<float>(c[i])));
    const float b = static_cast<float>(round_to<T>(rot * static_cast<float>(s[i])));
    tmp[i] = a + b;
  }
  for (int64_t i = 0; i < D; ++i) v[i] = round_to<T>(tmp[i]);
}

// x [M, heads, D] in place, every head (rope_one).
template <typename T>
void rope(T* x, const T* cos, const T* sin, int64_t M, int64_t heads, int64_t D) {
  std::vector<float> tmp(D);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < heads; ++h) rope_one(x + (m * heads + h) * D, cos + m * D, sin + m * D, D, tmp.data());
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

// ---- the team: every layer of a token in one OpenMP region, each thread computing its share of each step and
// the steps separated by barriers (an OpenMP region costs ~1.5 µs to open on 2 cores, a barrier ~0.5: eight
// regions a layer were 5-10% of a 4-bit decode step at the 115M shape). Outputs every thread writes to are made
// before the region; each thread keeps its own normed activations (computed whole by every thread: cheaper than
// a barrier), so only the steps that read what other threads wrote wait for them.

struct Shared {
  at::Tensor q, k, v, a, a2, o, g, u, d;   // the layer's outputs ([M, ·] in h's dtype); a2: a as [M, heads·hd]
  at::Tensor q4;                           // q as [M, heads, 1, hd], attention's view
  std::vector<at::Tensor> x;               // per thread: rmsnorm(h) [M, D]
};

// The first exception a thread meets ends the token for all: each step's work is caught, and after each barrier
// every thread reads the same flag (written before it), so all leave at the same barrier; it is rethrown after.
struct Failure {
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  template <typename F>
  bool step(F&& f) {
    if (!failed.load(std::memory_order_relaxed)) {
      try {
        f();
      } catch (...) {
#pragma omp critical(variantlab_decode_failure)
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
#pragma omp barrier
    return !failed.load();
  }
};

// y[m, j] ← dtype(y + bias[j]) over this thread's share of the flat [M, n] in blocks of 16 (silu_mul's split).
template <typename T>
void add_bias_share(at::Tensor& y, const at::Tensor& bias, int64_t M, int64_t n) {
  if (bias.numel() == 0) return;
  T* p = y.data_ptr<T>();
  const T* b = bias.data_ptr<T>();
  const auto [b0, b1] = vk::team_share((M * n + 15) / 16);
  for (int64_t i = 16 * b0; i < std::min(M * n, 16 * b1); ++i) p[i] = round_to<T>(static_cast<float>(p[i]) + static_cast<float>(b[i % n]));
}

// h ← dtype(h + dtype(y + bias)) over this thread's share of the flat [M, D] (the residual, the bias rounded first
// as the non-team path's y.add_(bias) rounds it).
template <typename T>
void residual_share(at::Tensor& h, const at::Tensor& y, const at::Tensor& bias, int64_t M, int64_t D) {
  T* hp = h.data_ptr<T>();
  const T* yp = y.data_ptr<T>();
  const T* b = bias.numel() ? bias.data_ptr<T>() : nullptr;
  const auto [b0, b1] = vk::team_share((M * D + 15) / 16);
  for (int64_t i = 16 * b0; i < std::min(M * D, 16 * b1); ++i) {
    const float yv = b ? static_cast<float>(round_to<T>(static_cast<float>(yp[i]) + static_cast<float>(b[i % D])))
                       : static_cast<float>(yp[i]);
    hp[i] = round_to<T>(static_cast<float>(hp[i]) + yv);
  }
}

template <typename T>
bool team_layer(at::Tensor& h, const at::Tensor* t, const Linear* lin, at::Tensor& keys, at::Tensor& values,
                const at::Tensor& cos, const at::Tensor& sin, const c10::optional<at::Tensor>& keep, int64_t col,
                int64_t length, double eps, int64_t heads, int64_t kv_heads, int64_t head_dim, double scale,
                Shared& S, Failure& F) {
  const int64_t M = h.size(0), D = h.size(1), hd = head_dim;
  at::Tensor& x = S.x[omp_get_thread_num()];
  const bool ok = F.step([&] {
    {
      VK_RANGE("rms_norm");
      vk::rms_norm(h.data_ptr<T>(), t[0].data_ptr<T>(), M, D, static_cast<float>(eps), x.data_ptr<T>());
    }
    linear(lin[0], x, &S.q);
    linear(lin[1], x, &S.k);
    linear(lin[2], x, &S.v);
  }) && F.step([&] {   // biases, rotary embedding and the cache write, by (row, head)
    VK_RANGE("rotary_embedding");
    std::vector<float> tmp(hd);
    const auto [i0, i1] = vk::team_share(M * (heads + kv_heads));
    for (int64_t i = i0; i < i1; ++i) {
      const bool query = i < M * heads;
      const int64_t m = query ? i / heads : (i - M * heads) / kv_heads, head = query ? i % heads : (i - M * heads) % kv_heads;
      const T* c = cos.data_ptr<T>() + m * hd;
      const T* sn = sin.data_ptr<T>() + m * hd;
      auto one = [&](at::Tensor& y, const Linear& l, int64_t count, bool rotate) -> T* {
        T* row = y.data_ptr<T>() + (m * count + head) * hd;
        if (l.bias->numel()) {
          const T* b = l.bias->data_ptr<T>() + head * hd;
          for (int64_t j = 0; j < hd; ++j) row[j] = round_to<T>(static_cast<float>(row[j]) + static_cast<float>(b[j]));
        }
        if (rotate) rope_one(row, c, sn, hd, tmp.data());
        return row;
      };
      if (query) {
        one(S.q, lin[0], heads, true);
        continue;
      }
      const T* kr = one(S.k, lin[1], kv_heads, true);
      const T* vr = one(S.v, lin[2], kv_heads, false);
      std::memcpy(keys.data_ptr<T>() + m * keys.stride(0) + head * keys.stride(1) + col * keys.stride(2), kr, hd * sizeof(T));
      std::memcpy(values.data_ptr<T>() + m * values.stride(0) + head * values.stride(1) + col * values.stride(2), vr,
                  hd * sizeof(T));
    }
  }) && F.step([&] {
    VK_RANGE("decode_attention");
    vk::attention_cache(S.q4, keys, values, length, keep, scale, &S.a);
  }) && F.step([&] {
    linear(lin[3], S.a2, &S.o);
  }) && F.step([&] {
    VK_RANGE("residual_add");
    residual_share<T>(h, S.o, *lin[3].bias, M, D);
  }) && F.step([&] {
    {
      VK_RANGE("rms_norm");
      vk::rms_norm(h.data_ptr<T>(), t[1].data_ptr<T>(), M, D, static_cast<float>(eps), x.data_ptr<T>());
    }
    linear(lin[4], x, &S.g);
    linear(lin[5], x, &S.u);
  }) && F.step([&] {
    VK_RANGE("silu_mul");
    add_bias_share<T>(S.g, *lin[4].bias, M, lin[4].n);
    add_bias_share<T>(S.u, *lin[5].bias, M, lin[5].n);
    vk::silu_mul(S.g, S.u);
  }) && F.step([&] {
    linear(lin[6], S.g, &S.d);
  }) && F.step([&] {
    VK_RANGE("residual_add");
    residual_share<T>(h, S.d, *lin[6].bias, M, D);
  });
  return ok;
}

// Every layer through the team (team_layer), h in place; rethrows the first error a thread met.
template <typename T>
void team_layers(at::Tensor& h, at::TensorList tensors, const std::vector<Linear>& lins, at::TensorList keys,
                 at::TensorList values, const at::Tensor& cos, const at::Tensor& sin,
                 const c10::optional<at::Tensor>& keep, int64_t col, int64_t length, double eps, int64_t heads,
                 int64_t kv_heads, int64_t head_dim, double scale, int threads) {
  const int64_t M = h.size(0);
  const auto o = h.options();
  Shared S;
  S.q = at::empty({M, heads * head_dim}, o);
  S.k = at::empty({M, kv_heads * head_dim}, o);
  S.v = at::empty({M, kv_heads * head_dim}, o);
  S.a = at::empty({M, 1, heads, head_dim}, o);
  S.a2 = S.a.view({M, heads * head_dim});
  S.q4 = S.q.view({M, heads, 1, head_dim});
  S.o = at::empty({M, lins[3].n}, o);
  S.g = at::empty({M, lins[4].n}, o);
  S.u = at::empty({M, lins[5].n}, o);
  S.d = at::empty({M, lins[6].n}, o);
  for (int i = 0; i < threads; ++i) S.x.push_back(at::empty_like(h));
  std::vector<at::Tensor> k(keys.begin(), keys.end()), v(values.begin(), values.end());
  Failure F;
#pragma omp parallel num_threads(threads)
  {
    vk::set_team(true);
    for (size_t i = 0; i < k.size(); ++i)
      if (!team_layer<T>(h, &tensors[i * kTensorsPerLayer], &lins[i * kLinears], k[i], v[i], cos, sin, keep, col,
                         length, eps, heads, kv_heads, head_dim, scale, S, F))
        break;
    vk::set_team(false);
  }
  if (F.error) std::rethrow_exception(F.error);
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
    TORCH_CHECK(counters[i].scalar_type() == at::kLong && counters[i].numel() == 1,
                "decode_layers: counters are int64 scalars");
  }
  std::vector<Linear> lins(layers * kLinears);
  const bool fp32 = h.scalar_type() == at::kFloat;
  bool ours = true;   // every linear on our kernels at this M: the team can run the token
  for (int64_t i = 0; i < layers; ++i)
    for (int64_t j = 0; j < kLinears; ++j) {
      const int64_t* iv = &ints[(i * kLinears + j) * kIntsPerLinear];
      const at::Tensor* lt = &tensors[i * kTensorsPerLayer + 2 + j * kTensorsPerLinear];
      Linear& l = lins[i * kLinears + j];
      l = Linear{iv[0], iv[1], iv[2], iv[3], lt, lt + 1, lt + 2, lt + 3};
      ours = ours && ours_at(l, h.size(0));
    }
  const int threads = at::get_num_threads();
  if (ours && threads > 1 && !omp_in_parallel()) {
    if (fp32)
      team_layers<float>(h, tensors, lins, keys, values, cos, sin, keep, col, length, eps, heads, kv_heads, head_dim,
                         scale, threads);
    else
      team_layers<at::BFloat16>(h, tensors, lins, keys, values, cos, sin, keep, col, length, eps, heads, kv_heads,
                                head_dim, scale, threads);
  } else {
    for (int64_t i = 0; i < layers; ++i) {
      at::Tensor k = keys[i], v = values[i];
      const at::Tensor* t = &tensors[i * kTensorsPerLayer];
      if (fp32)
        layer<float>(h, t, &lins[i * kLinears], k, v, cos, sin, keep, col, length, eps, heads, kv_heads, head_dim, scale);
      else
        layer<at::BFloat16>(h, t, &lins[i * kLinears], k, v, cos, sin, keep, col, length, eps, heads, kv_heads, head_dim,
                            scale);
    }
  }
  for (int64_t i = 0; i < layers; ++i) *counters[i].data_ptr<int64_t>() += 1;
  return h;
}

// ---- the whole token in one call: a model's plan, made once, bound to each cache it decodes into

// decode_layers' arguments that stay the same from token to token, kept on this side: converting its lists of
// tensors from Python took ~0.27 µs a tensor (~130 µs a token for 16 layers), and the embedding lookup, rotary
// cos/sin, final norm, head and argmax around it ~140 µs more as modules and aten ops (the tiny shapes of
// benchmarks/decode_overhead.py). Made by variants/decode_step.py for a model whose embedding is a plain table,
// whose head is a linear the step runs and whose rotary frequencies never change; bound to a cache with its
// layers' keys, values and counters and the rotary cos/sin of each of its positions (the model's own module's).
struct DecodePlan : torch::CustomClassHolder {
  std::vector<at::Tensor> tensors, head;
  std::vector<int64_t> ints, head_ints;
  at::Tensor embed, norm;
  double eps, norm_eps, scale;
  int64_t heads, kv_heads, head_dim;
  std::vector<at::Tensor> keys, values, counters;
  at::Tensor cos, sin;   // [positions, head_dim] in the activations' dtype
  bool keep_logits = false;   // keep each token's logits for logits() (the tests compare them bit for bit)
  at::Tensor last_logits;

  void keep(bool on) { keep_logits = on, last_logits = at::Tensor(); }
  at::Tensor logits() const {
    TORCH_CHECK(last_logits.defined(), "DecodePlan.logits: none kept (keep(True) first, then a step)");
    return last_logits;
  }

  DecodePlan(std::vector<at::Tensor> tensors_, std::vector<int64_t> ints_, at::Tensor embed_, at::Tensor norm_,
             std::vector<at::Tensor> head_, std::vector<int64_t> head_ints_, double eps_, double norm_eps_,
             int64_t heads_, int64_t kv_heads_, int64_t head_dim_, double scale_)
      : tensors(std::move(tensors_)), head(std::move(head_)), ints(std::move(ints_)), head_ints(std::move(head_ints_)),
        embed(std::move(embed_)), norm(std::move(norm_)), eps(eps_), norm_eps(norm_eps_), scale(scale_),
        heads(heads_), kv_heads(kv_heads_), head_dim(head_dim_) {
    TORCH_CHECK(embed.dim() == 2 && embed.is_contiguous() &&
                    (embed.scalar_type() == at::kFloat || embed.scalar_type() == at::kBFloat16),
                "DecodePlan: the embedding must be a contiguous fp32 or bf16 [vocab, hidden] table");
    TORCH_CHECK(norm.dim() == 1 && norm.size(0) == embed.size(1) && norm.scalar_type() == embed.scalar_type() &&
                    norm.is_contiguous(),
                "DecodePlan: the final norm's weight must be [hidden] in the embedding's dtype");
    TORCH_CHECK(head.size() == kTensorsPerLinear && head_ints.size() == kIntsPerLinear,
                "DecodePlan: the head is one linear: ", kTensorsPerLinear, " tensors and ", kIntsPerLinear, " ints");
  }

  void bind(std::vector<at::Tensor> keys_, std::vector<at::Tensor> values_, std::vector<at::Tensor> counters_,
            at::Tensor cos_, at::Tensor sin_) {
    TORCH_CHECK(cos_.dim() == 2 && cos_.size(1) == head_dim && cos_.is_contiguous() && sin_.sizes() == cos_.sizes() &&
                    sin_.is_contiguous() && cos_.scalar_type() == embed.scalar_type() &&
                    sin_.scalar_type() == embed.scalar_type(),
                "DecodePlan.bind: cos and sin must be contiguous [positions, head_dim] in the activations' dtype");
    keys = std::move(keys_), values = std::move(values_), counters = std::move(counters_);
    cos = std::move(cos_), sin = std::move(sin_);
  }
};

// The first index of each row's largest value, NaN counting as the largest (as at::argmax).
template <typename T>
void argmax_rows(const T* x, int64_t M, int64_t n, int64_t* out) {
  for (int64_t m = 0; m < M; ++m) {
    const T* r = x + m * n;
    int64_t best = 0;
    float top = static_cast<float>(r[0]);
    if (!std::isnan(top))
      for (int64_t j = 1; j < n; ++j) {
        const float v = static_cast<float>(r[j]);
        if (std::isnan(v)) {
          best = j;
          break;
        }
        if (v > top) top = v, best = j;
      }
    out[m] = best;
  }
}

// ids [B] (int64) → the next token of each row [B, 1]: the embedding, every layer (decode_layers, over the
// bound cache, at column col), the final norm, the head and the greedy choice. positions [B]: each row's
// rotary position (None: col for every row); keep: decode_layers'.
at::Tensor decode_next(const c10::intrusive_ptr<DecodePlan>& plan, const at::Tensor& ids,
                       const c10::optional<at::Tensor>& positions, const c10::optional<at::Tensor>& keep, int64_t col,
                       int64_t length) {
  RECORD_FUNCTION("variantlab_kernels::decode_next", std::vector<c10::IValue>());
  const DecodePlan& p = *plan;
  TORCH_CHECK(!p.keys.empty() && p.cos.defined(), "decode_next: the plan is bound to no cache");
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "decode_next: ids must be int64 [B]");
  TORCH_CHECK(length <= p.cos.size(0), "decode_next: the rotary table holds ", p.cos.size(0), " positions, not ",
              length);
  const int64_t B = ids.size(0);
  at::Tensor h, cos, sin;
  {
    VK_RANGE("embedding");
    h = p.embed.index_select(0, ids);                                      // [B, D]
    if (positions.has_value()) {
      TORCH_CHECK(positions->dim() == 1 && positions->size(0) == B, "decode_next: positions must be [B]");
      cos = p.cos.index_select(0, *positions);
      sin = p.sin.index_select(0, *positions);
    } else {
      cos = p.cos.narrow(0, col, 1).expand({B, p.head_dim}).contiguous();
      sin = p.sin.narrow(0, col, 1).expand({B, p.head_dim}).contiguous();
    }
  }
  decode_layers(h, p.tensors, p.ints, p.keys, p.values, p.counters, cos, sin, keep, col, length, p.eps, p.heads,
                p.kv_heads, p.head_dim, p.scale);
  auto x = at::empty_like(h);
  {
    VK_RANGE("rms_norm");
    if (h.scalar_type() == at::kFloat)
      vk::rms_norm(h.data_ptr<float>(), p.norm.data_ptr<float>(), B, h.size(1), static_cast<float>(p.norm_eps),
                   x.data_ptr<float>());
    else
      vk::rms_norm(h.data_ptr<at::BFloat16>(), p.norm.data_ptr<at::BFloat16>(), B, h.size(1),
                   static_cast<float>(p.norm_eps), x.data_ptr<at::BFloat16>());
  }
  const int64_t* hi = p.head_ints.data();
  const Linear head{hi[0], hi[1], hi[2], hi[3], &p.head[0], &p.head[1], &p.head[2], &p.head[3]};
  const at::Tensor logits = linear(head, x);                                 // [B, vocab]
  if (p.keep_logits) plan->last_logits = logits;
  auto tokens = at::empty({B, 1}, ids.options());
  {
    VK_RANGE("argmax");
    if (logits.scalar_type() == at::kFloat)
      argmax_rows(logits.data_ptr<float>(), B, logits.size(1), tokens.data_ptr<int64_t>());
    else
      argmax_rows(logits.data_ptr<at::BFloat16>(), B, logits.size(1), tokens.data_ptr<int64_t>());
  }
  return tokens;
}

// time.perf_counter()'s value now: CLOCK_MONOTONIC in seconds, converted as CPython converts it (whole seconds
// exactly, else nanoseconds / 1e9), so that a time read here and one read in Python are on one clock.
double perf_counter() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t ns = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  return ns % 1000000000 == 0 ? static_cast<double>(ns / 1000000000) : static_cast<double>(ns) / 1e9;
}

// One sequence's greedy decode, token after token in this call: what the engine's per-token Python loop does
// (decode_next, read the token back, read the clock, ask the stop rules) without going back to Python between
// tokens. From Python, a call whose arguments hold the plan costs 12-19 us to dispatch, and the tiny model's
// Python loop took ~35 us a token more than this one (benchmarks/harness_overhead.py). first [1]: the last token;
// tokens [n] and times [n] (int64, float64) receive each new token and the perf_counter() time it was chosen;
// stop [V] (bool, or None): the ids after which to return (the stop rules' wake set; that token is kept). The
// column is the bound cache's count of positions, as decode_next's caller reads it. Returns the tokens written.
int64_t decode_run(const c10::intrusive_ptr<DecodePlan>& plan, const at::Tensor& first,
                   const c10::optional<at::Tensor>& stop, at::Tensor tokens, at::Tensor times) {
  RECORD_FUNCTION("variantlab_kernels::decode_run", std::vector<c10::IValue>());
  const DecodePlan& p = *plan;
  TORCH_CHECK(!p.keys.empty() && p.cos.defined(), "decode_run: the plan is bound to no cache");
  TORCH_CHECK(first.dim() == 1 && first.size(0) == 1 && first.scalar_type() == at::kLong,
              "decode_run: first must be int64 [1]");
  TORCH_CHECK(tokens.dim() == 1 && tokens.is_contiguous() && tokens.scalar_type() == at::kLong && times.dim() == 1 &&
                  times.is_contiguous() && times.scalar_type() == at::kDouble && times.size(0) == tokens.size(0),
              "decode_run: tokens and times must be contiguous int64 and float64 [n] each");
  const bool* ends = nullptr;
  int64_t vocab = 0;
  if (stop.has_value()) {
    TORCH_CHECK(stop->dim() == 1 && stop->is_contiguous() && stop->scalar_type() == at::kBool,
                "decode_run: stop must be a contiguous bool [V]");
    ends = stop->data_ptr<bool>(), vocab = stop->size(0);
  }
  const int64_t n = tokens.size(0);
  int64_t* out = tokens.data_ptr<int64_t>();
  double* when = times.data_ptr<double>();
  const int64_t* counter = p.counters[0].data_ptr<int64_t>();
  at::Tensor ids = first;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t col = *counter;
    const at::Tensor next = decode_next(plan, ids, c10::nullopt, c10::nullopt, col, col + 1);   // [1, 1]
    const int64_t tok = next.data_ptr<int64_t>()[0];
    when[i] = perf_counter();
    out[i] = tok;
    if (ends != nullptr && tok >= 0 && tok < vocab && ends[tok]) return i + 1;
    ids = next.view({1});
  }
  return n;
}

}  // namespace

#ifndef VK_NS
#define VK_NS variantlab_kernels
#endif
#define VK_STR2(x) #x
#define VK_STR(x) VK_STR2(x)
TORCH_LIBRARY_FRAGMENT(VK_NS, m) {
  m.def("decode_layers(Tensor(a!) h, Tensor[] tensors, int[] ints, Tensor(b!)[] keys, Tensor(c!)[] values, "
        "Tensor(d!)[] counters, Tensor cos, Tensor sin, Tensor? keep, int col, int length, float eps, int heads, "
        "int kv_heads, int head_dim, float scale) -> Tensor(a!)");
  m.class_<DecodePlan>("DecodePlan")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, at::Tensor, at::Tensor, std::vector<at::Tensor>,
                       std::vector<int64_t>, double, double, int64_t, int64_t, int64_t, double>())
      .def("bind", &DecodePlan::bind)
      .def("keep", &DecodePlan::keep)
      .def("logits", &DecodePlan::logits);
  m.def("decode_next(__torch__.torch.classes." VK_STR(VK_NS) ".DecodePlan plan, Tensor ids, Tensor? positions, "
        "Tensor? keep, int col, int length) -> Tensor");
  m.def("decode_run(__torch__.torch.classes." VK_STR(VK_NS) ".DecodePlan plan, Tensor first, Tensor? stop, "
        "Tensor(a!) tokens, Tensor(b!) times) -> int");
}

TORCH_LIBRARY_IMPL(VK_NS, CPU, m) {
  m.impl("decode_layers", &decode_layers);
  m.impl("decode_next", &decode_next);
  m.impl("decode_run", &decode_run);
}
