"""Quantized drop-in replacements for nn.Linear (and GPT-2's Conv1D, taken as the nn.Linear it
equals: `as_linear`): what `apply` swaps into a model.

Each module holds its weight in a quantized format (buffers) and runs one of two paths, fixed at
construction:

- kernel: the fastest kernel this device has for the scheme (below): aten's, or ours where they are faster;
- python: dequantize the whole weight in plain PyTorch ops on every call, then aten::mm. A labelled
  slow path: the dequantization overhead of the analysis, and the naive reference that every
  kernel path is tested against (tests/variants/).

`kernel` is the label of what forward actually runs; `notes` says where that is not what the scheme's
name suggests (a fallback, padding, an unpacked layout).

| module            | CPU kernel path                                   | CUDA kernel path (untested here)      |
|-------------------|---------------------------------------------------|---------------------------------------|
| Int8WeightOnly    | ours int8_digits_mm (bf16 x; int8_mm fp32 x) up   | int8→dtype cast + aten::mm            |
|                   | to the CPU's rows (kernels.OURS_UP_TO), else      |                                       |
|                   | aten::_weight_int8pack_mm(x, q[N,K], s[N])        |                                       |
| Int4WeightOnly    | ours int4_digits_mm (bf16 x), every M; else       | aten::_weight_int4pack_mm (bf16 only) |
|                   | aten::_weight_int4pack_mm_for_cpu                 |                                       |
| W8A8              | ours w8a8_mm up to the CPU's rows (AVX2: every M),| same as CPU's else; M padded to 32    |
|                   | else per-token int8 quant                         |                                       |
|                   | + torch._int_mm(xq, q.t())                        | when M ≤ 16                           |
| W4A8              | ours w4a8_mm (int4 read packed), every M; without | torch._int_mm per group               |
|                   | our kernels: torch._int_mm per int4 group         |                                       |
| Sparse24Int8      | (none: recipe unsupported on CPU)                 | torch._cslt_sparse_mm (cuSPARSELt)    |

"ours" are variants/kernels' kernels (AVX-512 or AVX2), used where they run (`kernels.available()`, checked per
call, so one module serves machines with and without them); Int4WeightOnly keeps aten's kernel, which
ours only matched (benchmarks/decode_kernels.py).

What is stored is `state_dict()`: what an artifact saves and `weight_facts` counts (the model size).
What is resident is the buffers forward reads (`resident_bytes`). They differ for W4A8's group-major
path only. Bits per weight below are for bf16 scales and zeros (fp32 doubles the per-group part):

| module (path)                    | stored                                   | resident                            |
|----------------------------------|------------------------------------------|-------------------------------------|
| Int8WeightOnly, W8A8             | int8 [N, K] + scale [N]: 8 bits          | the same                            |
| Int8Embedding                    | int8 [V, D] + scale [V]: 8 bits          | the same                            |
| Int4WeightOnly (kernel)          | aten's opaque int4 layout + [G, N', 2]   | the same                            |
|                                  | scales and zeros: 4 + 32/gs bits         |                                     |
| Int4WeightOnly, W4A8 (python)    | nibbles uint8 [N, K/2] + scales, zeros   | the same                            |
|                                  | [N, G]: 4 + 32/gs bits                   |                                     |
| W4A8 (kernel, ours)              | as the python path: 4 + 32/gs bits       | kernels/packing.py's layout: the    |
|                                  |                                          | same bits, rows padded to 16        |
| W4A8 (kernel, group-major)       | as the python path: 4 + 32/gs bits       | int8 [G, N, gs] + scales, zeros     |
|                                  |                                          | [G, N]: 8 + 32/gs bits              |
| Sparse24Int8                     | cuSPARSELt's compressed layout (kernel), | the same                            |
|                                  | dense int8 (python)                      |                                     |

A module whose running form is not its stored form says how to go from one to the other
(`_stored_form`, `_resident_form`); `state_dict()` and `load_state_dict()` go through them
(torch's `_save_to_state_dict` / `_load_from_state_dict`, as torch.ao's packed quantized modules do),
so an artifact holds the stored form and loading converts it once, to the layout this machine runs.

W4A8 has no usable aten kernel on x86 CPU: aten::_dyn_quant_matmul_4bit exists, but outside
Arm/KleidiAI it is a scalar reference loop for symmetric weights only (measured here at 1024×1024:
10x bf16 at M = 1, 68x at M = 8). Ours (variants/kernels, w4a8_mm) multiplies the packed nibbles
by int8 activations with VNNI dot products (AVX2: maddubs), 5-14x faster than the fallback below at M = 1 and
3-4x at M = 256. Without it (our kernels off), the fallback computes, per group g of the K axis,
P_g = xq[:, g] @ (q[:, g] − 8)ᵀ in int32 with torch._int_mm, then
y = a · Σ_g (s_g · P_g + z_g · Σ_k xq[:, g]) — G = K/group_size kernel calls per layer. _int_mm has no
int4 operand, so that path reads the int4 values unpacked as int8 (8 + 32/group_size bits a weight
resident, facts.extra["resident_bytes"]); it unpacks them once at load. Both costs, the G calls and
the resident bytes, are findings, not hidden.

_int_mm's second operand is passed as q.t() of a row-major [N, K] weight (column-major [K, N]):
on our CPU that is 2-3x faster than a contiguous [K, N] copy (oneDNN's preferred weight layout).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels as vk
from . import quant_packing as qp
from .kernels import packing as kp

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch._int_mm (int8 [M,K] @ int8 [K,N] → int32) on any M: CUDA needs M > 16, so pad rows there."""
    m = a.shape[0]
    if a.is_cuda and m <= 16:
        return torch._int_mm(F.pad(a, (0, 0, 0, 32 - m)), b)[:m]
    return torch._int_mm(a, b)


OURS_DTYPES = (torch.float32, torch.bfloat16)   # the activations our kernels take (fp16 stays on aten)


def _ours_for(op: str, x: torch.Tensor) -> bool:
    """x [M, K] (fp32 or bf16, on the CPU) has few enough rows for our `op` to beat aten's
    (kernels.OURS_UP_TO), and our kernels run here."""
    return (x.device.type == "cpu" and x.dtype in OURS_DTYPES and vk.ours_beats_aten(op, x.shape[0], x.shape[1])
            and vk.available())


def as_linear(layer: nn.Module) -> nn.Module:
    """The nn.Linear that computes what `layer` computes, for transformers' Conv1D (GPT-2's projections:
    y = x @ W + b with W stored [in, out]): W transposed to [out, in], copied contiguous, and the same bias.
    Any other module comes back as it is."""
    from transformers.pytorch_utils import Conv1D

    if not isinstance(layer, Conv1D):
        return layer
    w = layer.weight.detach()  # [in, out]
    linear = nn.Linear(w.shape[0], w.shape[1], bias=layer.bias is not None, device="meta", dtype=w.dtype)
    linear.weight = nn.Parameter(w.t().contiguous(), requires_grad=False)  # [out, in]
    if layer.bias is not None:
        linear.bias = nn.Parameter(layer.bias.detach(), requires_grad=False)
    return linear


class _TakesConv1D(type):
    """Calling a QuantLinear class with a Conv1D builds it from `as_linear(layer)`: every module and
    recipe quantizes GPT-2's projections as the nn.Linear they are, and reads them as [out, in]."""

    def __call__(cls, layer, *args, **kwargs):
        return super().__call__(as_linear(layer), *args, **kwargs)


class QuantLinear(nn.Module, metaclass=_TakesConv1D):
    """Shared shape handling: flatten leading dims, run `_mm` on [M, K], add bias, restore dims.

    Constructors take an nn.Linear, or a transformers Conv1D (converted first: `as_linear`)."""

    kernel: str = ""
    notes: tuple[str, ...] = ()

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, path: str) -> None:
        super().__init__()
        if path not in ("kernel", "python"):
            raise ValueError(f"path must be 'kernel' or 'python', not {path!r}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype, self.path, self.device_type = dtype, path, linear.weight.device.type
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        self.register_buffer("bias", bias)

    @property
    def logical_parameters(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias is not None else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(self.dtype).contiguous()
        y = self._mm(x2) if self.path == "kernel" else self._mm_python(x2)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, path={self.path}, kernel={self.kernel}"

    def ours(self) -> str | None:
        """Which of our kernels (variants/kernels) forward calls here, and at which M; None: aten's only."""
        return None

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _mm_python(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # --- stored form: what state_dict() holds, when it is not what forward reads

    def _stored_form(self, resident: dict) -> dict:
        """name → tensor as stored, from this module's buffers as they run; the same here (override)."""
        return resident

    def _resident_form(self, stored: dict) -> dict:
        """name → tensor as forward reads it, from the stored ones; inverse of `_stored_form`."""
        return stored

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        own: dict = {}
        super()._save_to_state_dict(own, "", keep_vars)
        destination.update((prefix + name, t) for name, t in self._stored_form(own).items())

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # state_dict is load_state_dict's own copy: replace this module's stored tensors by resident ones.
        # Converting needs all of them, so a module loads whole or not at all, and names what is missing.
        names = [k[len(prefix):] for k in state_dict if k.startswith(prefix) and "." not in k[len(prefix):]]
        want = [name for name, t in self._stored_meta().items() if t is not None]
        if any(name not in names for name in want):
            missing_keys.extend(prefix + name for name in want if name not in names)
            unexpected_keys.extend(prefix + name for name in names if name not in want)
            return
        stored = {name: state_dict.pop(prefix + name) for name in names}
        state_dict.update((prefix + name, t) for name, t in self._resident_form(stored).items())
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _stored_meta(self) -> dict:
        """name → the stored tensor on the meta device (None: an absent optional one, the bias): no data."""
        return self._stored_form({name: None if b is None else b.to("meta") for name, b in self._buffers.items()})

    # --- artifacts (variants/artifact.py): rebuild a module as it runs, without quantizing again

    def state(self) -> dict:
        """JSON metadata that, with this module's state_dict, rebuilds it (`from_state`).

        Every plain attribute the constructor set (shapes, dtype, path, device type, group size,
        padding, kernel label, notes) and which of the stored tensors (state_dict's names) are present;
        the tensors themselves are saved by the caller. An attribute of another type raises TypeError,
        so an artifact never drops state."""
        attrs: dict = {}
        for key, value in vars(self).items():
            if key.startswith("_") or key == "training":
                continue
            if isinstance(value, torch.dtype):
                value = {"dtype": str(value).removeprefix("torch.")}
            elif isinstance(value, tuple):
                value = {"tuple": list(value)}
            elif not isinstance(value, (str, int, float, bool, type(None))):
                raise TypeError(f"{type(self).__name__}.{key} is a {type(value).__name__}, which an artifact "
                                "cannot record")
            attrs[key] = value
        return {"class": type(self).__name__, "attrs": attrs,
                "buffers": {name: t is not None for name, t in self._stored_meta().items()}}

    @classmethod
    def from_state(cls, state: dict, tensors: dict[str, torch.Tensor]) -> "QuantLinear":
        """The module `state()` described, holding `tensors` (its own state_dict, the stored form) in
        their resident form. Meta tensors give the module's shapes for free, for load_state_dict to fill."""
        if state.get("class") != cls.__name__:
            raise ValueError(f"state of a {state.get('class')}, not of a {cls.__name__}")
        expected = {name for name, present in state["buffers"].items() if present}
        if set(tensors) != expected:
            raise ValueError(f"{cls.__name__} needs tensors {sorted(expected)}, got {sorted(tensors)}")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        for key, value in state["attrs"].items():
            if isinstance(value, dict) and "dtype" in value:
                value = getattr(torch, value["dtype"])
            elif isinstance(value, dict) and "tuple" in value:
                value = tuple(value["tuple"])
            setattr(module, key, value)
        for name, present in state["buffers"].items():
            if not present:
                module.register_buffer(name, None)
        stored = {name: tensors[name] for name, present in state["buffers"].items() if present}
        for name, t in module._resident_form(stored).items():
            module.register_buffer(name, t)
        return module


class Int8Embedding(QuantLinear):
    """An embedding table in int8, one symmetric scale per row (token): a lookup gathers the int8 rows
    and dequantizes only those, so no full-precision table exists at run time. `python` dequantizes
    the whole table on every call (the labelled slow path). Rebuilt from artifacts like the linears."""

    def __init__(self, embedding: nn.Embedding, dtype: torch.dtype, path: str = "kernel") -> None:
        nn.Module.__init__(self)
        if path not in ("kernel", "python"):
            raise ValueError(f"path must be 'kernel' or 'python', not {path!r}")
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.padding_idx = embedding.padding_idx
        self.dtype, self.path, self.device_type = dtype, path, embedding.weight.device.type
        q, s = qp.quantize_int8_per_channel(embedding.weight, dtype)
        self.register_buffer("qweight", q)  # [V, D] int8
        self.register_buffer("scales", s)   # [V] dtype
        self.kernel = ("aten::embedding of int8 rows × per-row scale" if path == "kernel"
                       else f"python dequant of the whole int8 table → {DTYPE_NAMES[dtype]} + aten::embedding")

    @property
    def logical_parameters(self) -> int:
        return self.num_embeddings * self.embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.path == "python":
            return F.embedding(ids, qp.dequantize_int8_per_channel(self.qweight, self.scales, self.dtype))
        return F.embedding(ids, self.qweight).to(self.dtype) * F.embedding(ids, self.scales[:, None])

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 rows, path={self.path}"


class Int8WeightOnly(QuantLinear):
    """W8A16: int8 per-output-channel symmetric weights, activations in the compute dtype."""

    OURS_OP = {torch.float32: "int8_mm", torch.bfloat16: "int8_digits_mm"}   # ours, by the activations' dtype

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, path: str = "kernel") -> None:
        super().__init__(linear, dtype, path)
        q, s = qp.quantize_int8_per_channel(linear.weight, dtype)
        self.register_buffer("qweight", q)  # [N, K] int8
        self.register_buffer("scales", s)   # [N] dtype
        name = DTYPE_NAMES[dtype]
        if path == "python":
            self.kernel = f"python dequant int8→{name} + aten::mm ({name})"
        elif self.device_type == "cpu":
            self.kernel = "aten::_weight_int8pack_mm"
        else:
            self.kernel = f"aten::mm ({name}) on an int8→{name} cast per call"
            self.notes = (f"int8 on {self.device_type}: aten has no fast weight-only int8 matmul here; the "
                          f"weight is cast to {name} on every call (dequantization overhead)",)

    def ours(self):
        runs = self.path == "kernel" and self.device_type == "cpu" and self.dtype in OURS_DTYPES
        if not runs:
            return None
        return vk.rows_label(self.OURS_OP[self.dtype])

    def _mm(self, x):
        if self.device_type == "cpu":
            if _ours_for(self.OURS_OP.get(x.dtype, "int8_mm"), x):   # bf16 x: two int8 digits a value
                if x.dtype == torch.bfloat16:
                    return vk.int8_digits_mm(x, self.qweight, self.scales)
                return vk.int8_mm(x, self.qweight, self.scales)
            return torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scales)
        return F.linear(x, self.qweight.to(x.dtype)) * self.scales

    def _mm_python(self, x):
        return F.linear(x, qp.dequantize_int8_per_channel(self.qweight, self.scales, x.dtype))


class W8A8(QuantLinear):
    """int8 per-channel symmetric weights × int8 per-token symmetric activations (dynamic), int32 accumulate."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, path: str = "kernel") -> None:
        super().__init__(linear, dtype, path)
        q, s = qp.quantize_int8_per_channel(linear.weight, dtype)
        self.register_buffer("qweight", q)  # [N, K] int8; passed to _int_mm as q.t()
        self.register_buffer("scales", s)   # [N] dtype
        self.kernel = ("aten::_int_mm" if path == "kernel"
                       else f"python dequant int8→{DTYPE_NAMES[dtype]} + fake-quant activations + aten::mm")
        if path == "kernel" and self.device_type == "cuda":
            self.notes = ("w8a8 on cuda: torch._int_mm needs M > 16, so decode rows are zero-padded to 32",)

    def ours(self):
        runs = self.path == "kernel" and self.device_type == "cpu" and self.dtype in OURS_DTYPES
        return vk.rows_label("w8a8_mm") if runs else None

    def _mm(self, x):
        if _ours_for("w8a8_mm", x):
            return vk.w8a8_mm(x, self.qweight, self.scales)
        xq, a = qp.quantize_int8_per_token(x)
        acc = int_mm(xq, self.qweight.t())
        return (acc * a * self.scales.float()).to(x.dtype)

    def _mm_python(self, x):
        w = qp.dequantize_int8_per_channel(self.qweight, self.scales, x.dtype)
        return F.linear(qp.fake_quantize_int8_per_token(x), w)


class _GroupWise(QuantLinear):
    """Common to int4 group-wise modules: group size, zero-padding of K to a multiple of it, and symmetric
    int4 (a scale per group and no zero point, llama.cpp's Q4_0: quant_packing), stored without zeros."""

    symmetric = False   # an artifact from before records none: asymmetric

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, path: str, group_size: int,
                 symmetric: bool = False) -> None:
        super().__init__(linear, dtype, path)
        self.group_size = group_size
        self.symmetric = symmetric
        self.k_pad = -self.in_features % group_size  # > 0 only when the recipe allowed pad_to_group

    def _quantize(self, linear: nn.Linear, n_pad: int = 0):
        """(q, s, z) of the padded weight; z is zeros when symmetric."""
        return qp.quantize_int4_groupwise(self._padded_weight(linear, n_pad), self.group_size, self.dtype,
                                          self.symmetric)

    def _nibbles(self, q, s, z) -> dict:
        """The stored form: nibbles [N, K'/2], scales [N, G] and, unless symmetric, zeros [N, G]."""
        out = {"qpacked": qp.pack_nibbles(q), "scales": s.contiguous()}
        return out if self.symmetric else out | {"zeros": z.contiguous()}

    def _padded_weight(self, linear: nn.Linear, n_pad: int = 0) -> torch.Tensor:
        return F.pad(linear.weight.detach(), (0, self.k_pad, 0, n_pad))

    def _pad_x(self, x):
        return F.pad(x, (0, self.k_pad)) if self.k_pad else x

    def _python_weight(self, dtype):
        q = qp.unpack_nibbles(self.qpacked)
        z = torch.zeros_like(self.scales) if self.zeros is None else self.zeros
        w = qp.dequantize_int4_groupwise(q, self.scales, z, self.group_size, dtype)
        return w[:, :self.in_features]

    def _store_python(self, linear: nn.Linear) -> None:
        stored = self._nibbles(*self._quantize(linear))
        self.register_buffer("qpacked", stored["qpacked"])  # [N, K'/2] uint8, two weights a byte
        self.register_buffer("scales", stored["scales"])    # [N, G] dtype
        self.register_buffer("zeros", stored.get("zeros"))  # [N, G] dtype; None when symmetric

    def _unpack_stored(self, stored: dict) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The stored nibbles, scales and zeros taken out of `stored`: (the rest, q [N, K'], s, z); notes reset.
        Symmetric int4 stores no zeros: z is zeros."""
        out = dict(stored)
        p, s = out.pop("qpacked"), out.pop("scales")
        z = out.pop("zeros", None)
        self.notes = self._pad_note()
        return out, qp.unpack_nibbles(p), s, torch.zeros_like(s) if z is None else z

    def _ours_resident(self, out: dict, q, s, z, label: str) -> dict:
        """W4A8's packed layout (kernels/packing.py) of q, s, z, read by our VNNI kernels; symmetric: the
        scales alone."""
        self.kernel = label
        sz = kp.pack_scales_zeros(s, None if self.symmetric else z)
        return out | {"packed": kp.pack_int4_vnni(q), "scales_zeros": sz}

    def _pad_note(self) -> tuple[str, ...]:
        if not self.k_pad:
            return ()
        return (f"in_features {self.in_features} zero-padded to {self.in_features + self.k_pad} "
                f"(group_size {self.group_size}); activations are padded on every call",)


class Int4WeightOnly(_GroupWise):
    """W4A16: int4 group-wise asymmetric weights (scale + zero per group), activations in the compute dtype.

    The kernel path holds one of two resident layouts, chosen when the module is built or loaded: where our
    kernels run and the activations are bf16, W4A8's packed layout (`packed` + `scales_zeros`, 4 bits a weight)
    read by our int4_digits_mm at every M (the activations enter VNNI dot products as two int8 digits a value:
    16-bit fixed point per row, whose error is below bf16's own rounding; kernels/gemv_*.cpp); elsewhere
    aten's int4pack layout (`packed` + `scales_and_zeros`) for aten::_weight_int4pack_mm(_for_cpu). Ours stores
    the nibbles, scales and zeros (the python path's tensors) and makes its layout at load; aten's layout is
    stored as it is, and an artifact that holds it (built where ours do not run, or before) keeps aten's kernel."""

    OURS_LABELS = tuple(f"variantlab int4_digits_mm ({isa.int_label}) on int4 read packed, at every M" for isa in vk.ISAS)
    OURS_LABEL = OURS_LABELS[vk.ISAS.index(vk.ISA)] if vk.ISA else OURS_LABELS[0]   # this machine's
    stored_as = "aten"   # or "nibbles": what state_dict() holds (an artifact from before records neither: aten)

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, path: str = "kernel", group_size: int = 64,
                 symmetric: bool = False) -> None:
        super().__init__(linear, dtype, path, group_size, symmetric)
        name = DTYPE_NAMES[dtype]
        self.notes = self._pad_note()
        if path == "python":
            self._store_python(linear)
            self.kernel = f"python dequant int4→{name} + aten::mm ({name})"
            return
        self.n_pad = -self.out_features % 16  # the packing kernels need N divisible by 16 (CPU) / 8 (CUDA)
        if self._ours_layout():
            self.stored_as = "nibbles"
            for key, t in self._resident_form(self._nibbles(*self._quantize(linear))).items():
                self.register_buffer(key, t)
            return
        self._register_aten(*self._quantize(linear, self.n_pad))

    def _ours_layout(self) -> bool:
        return (self.device_type == "cpu" and self.dtype == torch.bfloat16 and self.group_size % 8 == 0
                and vk.available())

    def _register_aten(self, q, s, z) -> None:
        if self.device_type == "cpu":
            packed, self.kernel = qp.pack_int4_for_cpu(q), "aten::_weight_int4pack_mm_for_cpu"
        else:
            k = q.shape[1]
            tiles = 8 if k % 128 == 0 else 4 if k % 64 == 0 else 2
            packed, self.kernel = qp.pack_int4_for_cuda(q, tiles), "aten::_weight_int4pack_mm"
        self.register_buffer("packed", packed)                             # opaque kernel layout, 4 bits a weight
        self.register_buffer("scales_and_zeros", qp.scales_and_zeros(s, z))  # [G, N', 2] dtype
        if self.n_pad:
            self.notes += (f"out_features {self.out_features} padded to {self.out_features + self.n_pad} "
                           "for the int4 kernel's layout",)

    def _stored_form(self, resident):
        """What `stored_as` says, from either resident layout, losslessly: nibbles [N, K'/2] and scales, zeros
        [N, G] (from ours, or read back from aten's through its kernel), or aten's layout as it runs. The python
        path: as it runs."""
        if self.path == "python" or self.stored_as != "nibbles":
            return resident
        out = dict(resident)
        if "scales_zeros" in out:
            p, sz = out.pop("packed"), out.pop("scales_zeros")
            s, z = kp.unpack_scales_zeros(sz, self.out_features)
            q = kp.unpack_int4_vnni(p, self.out_features)
        else:
            k = self.in_features + self.k_pad
            q, s, z = qp.unpack_int4_from_cpu(out.pop("packed"), out.pop("scales_and_zeros"), self.group_size,
                                              self.out_features, k)
        return out | self._nibbles(q, s, z)

    def _resident_form(self, stored):
        """Nibbles, scales and zeros → ours where it runs, else aten's layout (padded to 16 rows); aten's layout
        as it is. Sets the kernel label and notes to match."""
        if self.path == "python" or "qpacked" not in stored:
            return stored
        out, q, s, z = self._unpack_stored(stored)
        if self._ours_layout():
            return self._ours_resident(out, q, s, z, self.OURS_LABEL)
        if self.n_pad:   # padded rows: weight 0 (q = 8 with scale and zero 0), never read back
            q = F.pad(q, (0, 0, 0, self.n_pad), value=8)
            s, z = F.pad(s, (0, 0, 0, self.n_pad)), F.pad(z, (0, 0, 0, self.n_pad))
        saved = dict(self._buffers)
        self._register_aten(q, s, z)
        resident = {"packed": self._buffers.pop("packed"), "scales_and_zeros": self._buffers.pop("scales_and_zeros")}
        self._buffers.clear()
        self._buffers.update(saved)
        return out | resident

    def _mm(self, x):
        x = self._pad_x(x)
        if "scales_zeros" in self._buffers:
            return vk.int4_digits_mm(x, self.packed, self.scales_zeros, self.group_size, self.out_features)
        if self.device_type == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm(x, self.packed, self.group_size, self.scales_and_zeros)
        return y[:, :self.out_features] if self.n_pad else y

    def _mm_python(self, x):
        return F.linear(x, self._python_weight(x.dtype))


class W4A8(_GroupWise):
    """int4 group-wise asymmetric weights × int8 per-token symmetric activations (the analysis's "Flash").

    The kernel path holds one of two resident layouts, chosen when the module is built or loaded:
    where our kernels run (an AVX-512 VNNI or AVX2 CPU), `packed` + `scales_zeros` (kernels/packing.py:
    4 bits a weight, as stored) read by our w4a8_mm at every M; elsewhere, the int4 values unpacked
    as int8 per group [G, N, gs] for one torch._int_mm per group (8 bits a weight resident)."""

    OURS_LABELS = tuple(f"variantlab w4a8_mm ({isa.int_label}) on int4 read packed, at every M" for isa in vk.ISAS)
    OURS_LABEL = OURS_LABELS[vk.ISAS.index(vk.ISA)] if vk.ISA else OURS_LABELS[0]   # this machine's
    GROUP_MAJOR_LABEL = "ours: torch._int_mm per int4 group (int8 activations)"
    GROUP_MAJOR_NOTE = ("w4a8 has no aten kernel here: ours runs one torch._int_mm per group "
                        "(in_features / group_size calls a layer) and holds the int4 values unpacked as int8: "
                        "stored packed at 4 bits a weight (+ scales and zeros), resident at 8")

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, path: str = "kernel", group_size: int = 64,
                 symmetric: bool = False) -> None:
        super().__init__(linear, dtype, path, group_size, symmetric)
        self.notes = self._pad_note()
        if path == "python":
            self._store_python(linear)
            self.kernel = f"python dequant int4→{DTYPE_NAMES[dtype]} + fake-quant activations + aten::mm"
            return
        for name, t in self._resident_form(self._nibbles(*self._quantize(linear))).items():
            self.register_buffer(name, t)

    def _vnni_layout(self) -> bool:
        return (self.device_type == "cpu" and self.dtype in OURS_DTYPES and self.group_size % 8 == 0
                and vk.available())

    def _stored_form(self, resident):
        """Kernel path: either resident layout → nibbles [N, K'/2] and scales, zeros [N, G], the python
        path's tensors. Lossless; the python path stores what it runs."""
        if self.path == "python":
            return resident
        out = dict(resident)
        if "packed" in out:
            p, sz = out.pop("packed"), out.pop("scales_zeros")
            s, z = kp.unpack_scales_zeros(sz, self.out_features)
            return out | self._nibbles(kp.unpack_int4_vnni(p, self.out_features), s, z)
        q, s, z = out.pop("qweight"), out.pop("scales"), out.pop("zeros")
        return out | self._nibbles(qp.int4_from_group_major(q), s.t(), z.t())

    def _resident_form(self, stored):
        """Kernel path: the layout `_mm` reads on this machine (class docstring), made once at build or
        load; inverse of `_stored_form`. Sets the kernel label and notes to match."""
        if self.path == "python":
            return stored
        out, q, s, z = self._unpack_stored(stored)
        if self._vnni_layout():
            return self._ours_resident(out, q, s, z, self.OURS_LABEL)
        self.kernel = self.GROUP_MAJOR_LABEL
        self.notes += (self.GROUP_MAJOR_NOTE,)
        return out | {"qweight": qp.int4_group_major(q, self.group_size),
                      "scales": s.t().contiguous(), "zeros": z.t().contiguous()}

    def _mm(self, x):
        if "packed" in self._buffers:
            return vk.w4a8_mm(self._pad_x(x), self.packed, self.scales_zeros, self.group_size, self.out_features)
        xq, a = qp.quantize_int8_per_token(self._pad_x(x))
        m = xq.shape[0]
        groups = self.qweight.shape[0]
        xg = xq.reshape(m, groups, self.group_size).transpose(0, 1).contiguous()  # [G, M, gs]
        s = self.scales.float()
        acc = xg.sum(dim=-1, dtype=torch.int32).t().float() @ self.zeros.float()  # zero-point term, [M, N]
        for g in range(groups):
            acc.addcmul_(int_mm(xg[g], self.qweight[g].t()), s[g])
        return (acc * a).to(x.dtype)

    def _mm_python(self, x):
        return F.linear(qp.fake_quantize_int8_per_token(x), self._python_weight(x.dtype))


class Sparse24Int8(QuantLinear):
    """2:4 semi-structured pruned weights in int8 (per channel) × int8 per-token activations. CUDA only."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, path: str = "kernel") -> None:
        super().__init__(linear, dtype, path)
        q, s = qp.quantize_int8_per_channel(qp.prune_2_4(linear.weight.detach().float()), dtype)
        self.register_buffer("scales", s)
        if path == "python":
            self.register_buffer("qweight", q)  # dense int8 with zeros: the reference
            self.kernel = f"python dequant 2:4 int8→{DTYPE_NAMES[dtype]} + aten::mm (dense)"
        else:
            self.register_buffer("compressed", torch._cslt_compress(q))  # values + metadata, cuSPARSELt layout
            self.kernel = "aten::_cslt_sparse_mm (cuSPARSELt, int8)"

    def _mm(self, x):
        xq, a = qp.quantize_int8_per_token(x)
        m = xq.shape[0]
        pad = -m % 16
        xt = F.pad(xq, (0, 0, 0, pad)).t().contiguous()  # [K, M'] dense operand
        acc = torch._cslt_sparse_mm(self.compressed, xt, out_dtype=torch.int32)[:, :m].t()
        return (acc * a * self.scales.float()).to(x.dtype)

    def _mm_python(self, x):
        w = qp.dequantize_int8_per_channel(self.qweight, self.scales, x.dtype)
        return F.linear(qp.fake_quantize_int8_per_token(x), w)
