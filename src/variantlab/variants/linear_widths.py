"""The in_features of every linear layer a quantized recipe swaps, told from config.json alone (no torch).

A group-wise recipe (int4, w4a8, mixed's 4-bit layers) needs its group size to divide each layer's
in_features; a Qwen2-style intermediate of 688 with `group_size: 64` used to be found only when the variant
was built. Planning reads the widths here instead, for the families whose layer shapes we know (the ones
variants/attention.py converts), exactly as transformers 5 builds them:

    Llama, Mistral, Qwen2   q/k/v_proj, gate/up_proj: hidden_size; o_proj: heads × head_dim; down_proj:
                            intermediate_size (head_dim: config.json's, else hidden_size // heads)
    Gemma, Gemma2, Gemma3   the same, but head_dim defaults to 256 (their configs' default), not hidden // heads
    Phi-3                   qkv_proj, gate_up_proj: hidden_size; o_proj: heads × head_dim; down_proj:
                            intermediate_size
    GPT-2                   c_attn, attn.c_proj, c_fc: n_embd; mlp.c_proj: n_inner, else 4 × n_embd (Conv1D)
    GPT-NeoX                query_key_value, dense, dense_h_to_4h: hidden_size; dense_4h_to_h: intermediate_size

and the LM head (hidden_size) where the recipe quantizes it. Attention kinds change none of these: gqa pools
the K/V projections' rows (out_features), linear and sliding keep the projections. An architecture not in
the table, or a config.json without a size the table needs, gives None: nothing is refused from a guess
(tests/variants/test_linear_widths.py checks the table against the models transformers builds).
"""
from __future__ import annotations

from typing import Callable

Widths = dict[str, int]   # layer name inside a decoder layer ('mlp.down_proj'), or 'lm_head' → in_features
LM_HEAD = "lm_head"


def _int(config: dict, key: str) -> int | None:
    v = config.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _head_dim(config: dict, hidden: int, heads: int, absent: int | None, null: bool) -> int | None:
    """config.json's head_dim; where it is absent, `absent` (None: hidden // heads, as the attention computes it);
    where it is null, hidden // heads if `null` (the config class derives it), else None (the model cannot build)."""
    if "head_dim" not in config:
        return absent if absent is not None else hidden // heads
    if config["head_dim"] is None:
        return hidden // heads if null else None
    return _int(config, "head_dim")


def _separate(absent: int | None = None, null: bool = False) -> Callable[[dict], Widths | None]:
    def widths(config: dict) -> Widths | None:
        hidden, heads, inter = (_int(config, k) for k in ("hidden_size", "num_attention_heads", "intermediate_size"))
        if not (hidden and heads and inter) or not (head_dim := _head_dim(config, hidden, heads, absent, null)):
            return None
        return {"self_attn.q_proj": hidden, "self_attn.k_proj": hidden, "self_attn.v_proj": hidden,
                "self_attn.o_proj": heads * head_dim, "mlp.gate_proj": hidden, "mlp.up_proj": hidden,
                "mlp.down_proj": inter, LM_HEAD: hidden}
    return widths


def _phi3(config: dict) -> Widths | None:
    hidden, heads, inter = (_int(config, k) for k in ("hidden_size", "num_attention_heads", "intermediate_size"))
    if not (hidden and heads and inter) or not (head_dim := _head_dim(config, hidden, heads, None, False)):
        return None
    return {"self_attn.qkv_proj": hidden, "self_attn.o_proj": heads * head_dim, "mlp.gate_up_proj": hidden,
            "mlp.down_proj": inter, LM_HEAD: hidden}


def _gpt2(config: dict) -> Widths | None:
    hidden = _int(config, "n_embd")
    if not hidden:
        return None
    inner = _int(config, "n_inner") if config.get("n_inner") is not None else 4 * hidden
    if not inner:
        return None
    return {"attn.c_attn": hidden, "attn.c_proj": hidden, "mlp.c_fc": hidden, "mlp.c_proj": inner, LM_HEAD: hidden}


def _neox(config: dict) -> Widths | None:
    hidden, inter = _int(config, "hidden_size"), _int(config, "intermediate_size")
    if not (hidden and inter):
        return None
    return {"attention.query_key_value": hidden, "attention.dense": hidden, "mlp.dense_h_to_4h": hidden,
            "mlp.dense_4h_to_h": inter, LM_HEAD: hidden}


FAMILIES: dict[str, Callable[[dict], Widths | None]] = {
    "LlamaForCausalLM": _separate(null=True),      # LlamaConfig and MistralConfig derive a null head_dim
    "MistralForCausalLM": _separate(null=True),
    "Qwen2ForCausalLM": _separate(),                # Qwen2Config declares none: the attention's getattr decides
    "GemmaForCausalLM": _separate(absent=256),      # GemmaConfig's default (and Gemma2's, Gemma3's)
    "Gemma2ForCausalLM": _separate(absent=256),
    "Gemma3ForCausalLM": _separate(absent=256),
    "Phi3ForCausalLM": _phi3,
    "GPT2LMHeadModel": _gpt2,
    "GPTNeoXForCausalLM": _neox,
}


def architecture(config: dict) -> str:
    archs = config.get("architectures") or []
    return str(archs[0]) if isinstance(archs, list) and archs else "(no architectures in config.json)"


def quantized_in_features(config: dict, *, lm_head: bool) -> Widths | None:
    """{layer: in_features} of every linear layer a quantized recipe swaps in each decoder layer, and of the LM
    head when `lm_head` (the recipe quantizes it); None where the architecture's layer shapes are not known here."""
    family = FAMILIES.get(architecture(config))
    widths = family(config) if family is not None else None
    if widths is None:
        return None
    return widths if lm_head else {k: v for k, v in widths.items() if k != LM_HEAD}


def undivided(widths: Widths, group_size: int) -> Widths:
    """The layers of `widths` whose in_features `group_size` does not divide."""
    return {name: k for name, k in widths.items() if k % group_size}


def by_width(widths: Widths) -> str:
    """'64 (self_attn.q_proj, mlp.up_proj) and 688 (mlp.down_proj)': each width once, with its layers."""
    return " and ".join(f"{k} ({', '.join(n for n, w in widths.items() if w == k)})"
                        for k in sorted(set(widths.values())))
