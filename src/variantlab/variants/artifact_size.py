"""What a variant's artifact will take on disk, estimated before anything is built: from the checkpoint's
safetensors headers (every tensor's shape, read without loading a weight) and the variant's recipe.

Each recipe answers for its own layout (`artifact_bytes(options, weights)` on the recipe: variants/dtype.py,
quant.py, mixed.py), a GGUF type for llama.cpp's (gguf_convert.estimate), through the stored forms here, as
quant_linear.py's table lays them out:

    a float tensor          numel × its width (fp32 4 bytes, bf16 and fp16 2)
    int8 per channel        int8 [N, K] + a scale per row [N], in the compute dtype (Int8WeightOnly, W8A8,
                            Int8Embedding; Sparse24Int8 stores less)
    int4 group-wise         two weights a byte, K padded to the group, rows padded to 16 (aten's layout), and a
                            scale and a zero per group in the compute dtype (the nibbles path stores no more)

Which tensors a recipe quantizes is told from the shapes, as quant.py's `_targets` finds them on the model:
the 2-D weights (nn.Linear, GPT-2's Conv1D), but the tables with a row per token (the input embedding and
the LM head) and the tables only looked up (position embeddings); every other tensor (norms, biases, anything
of more dimensions) is kept at the compute width. A tied LM head is stored once, as the artifact stores it
(artifact._unique_tensors), unless a recipe quantizes one side of the tie (then both are stored). An
attention kind changes no more than the K/V projections, which gqa makes smaller: the estimate keeps them.

These are estimates of the weights file alone: the backend kind adds what its folder holds beside it (the
checkpoint's tokenizer files, variant.json), the disk budget (measure/disk_budget.py) its margin.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..models.loading import check_safetensors

FLOAT_WIDTHS = {"fp32": 4, "bf16": 2, "fp16": 2}   # bytes an element, by the recipes' dtype names
ROW_PAD = 16                                      # int4's aten layout pads out_features to a multiple of it
LOOKED_UP = ("embed", "wte", "wpe", "position")   # name parts of tables that are looked up, never multiplied
HEADS = ("lm_head.", "embed_out.")                # name starts of a separate LM head (Llama/Qwen/GPT-2, NeoX)
META_BYTES = 1 << 20                              # variant.json and config.json, at most (a mixed plan's included)

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ArtifactSize:
    """A variant's artifact, estimated: the bytes it keeps, and the bytes its build holds beside them for a
    while (a GGUF's F32 intermediate, deleted when the quantizer is done)."""

    bytes: int
    transient: int = 0


@dataclass(frozen=True)
class CheckpointWeights:
    """A checkpoint's tensors, as its safetensors headers give them (no weight read), sorted by role."""

    shapes: dict[str, Shape]        # every tensor stored, a tied head once
    embedding: str | None           # the input embedding table (a row per token)
    head: str | None                # the LM head's own tensor; None where the head is the embedding (tied)
    config: dict = field(default_factory=dict)

    @property
    def tied(self) -> bool:
        return self.head is None and self.embedding is not None

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())

    def linears(self) -> dict[str, Shape]:
        """The 2-D weights a quantizing recipe swaps: not a table with a row per token, not one looked up."""
        tables = {self.embedding, self.head}
        return {n: s for n, s in self.shapes.items()
                if len(s) == 2 and n.endswith(".weight") and n not in tables
                and not any(part in n for part in LOOKED_UP)}

    def at_width(self, width: int) -> int:
        """Every tensor at `width` bytes an element (a dtype recipe)."""
        return self.parameters * width

    def quantized(self, linear: Callable[[Shape], int], width: int, *, lm_head: bool = False,
                  embeddings: bool = False) -> int:
        """Bytes with every linear stored as `linear(shape)` says, the LM head too when `lm_head`, the input
        embedding in int8 rows when `embeddings`, everything else at `width`. One side of a tie quantized stores
        both: the quantized copy and the table the other side keeps (quant.py's notes)."""
        linears = self.linears()
        total = sum(linear(s) for s in linears.values())
        total += sum(math.prod(s) * width for n, s in self.shapes.items()
                     if n not in linears and n not in (self.embedding, self.head))
        emb = self.shapes.get(self.embedding) if self.embedding else None
        head = self.shapes.get(self.head) if self.head else emb
        if emb is not None:
            total += int8_bytes(emb, width) if embeddings else math.prod(emb) * width
        if head is not None and not (self.tied and not lm_head and not embeddings):
            total += linear(head) if lm_head else math.prod(head) * width
        return total


def int8_bytes(shape: Shape, scale_width: int) -> int:
    """int8 [N, K] and one scale per row."""
    return math.prod(shape) + shape[0] * scale_width


def int4_bytes(shape: Shape, group_size: int, scale_width: int) -> int:
    """Two weights a byte, K padded up to the group and N to ROW_PAD, a scale and a zero per group (at most:
    symmetric int4 stores no zeros in the nibbles form)."""
    n = -(-shape[0] // ROW_PAD) * ROW_PAD
    k = -(-math.prod(shape[1:]) // group_size) * group_size
    return n * k // 2 + n * (k // group_size) * 2 * scale_width


def read_weights(path: str | Path) -> CheckpointWeights:
    """The tensors of the checkpoint folder `path` (its *.safetensors headers, every shard) and its config.json."""
    path = Path(path)
    shapes: dict[str, Shape] = {}
    for f in sorted(path.glob("*.safetensors")):
        shapes |= check_safetensors(f)[1]
    config_file = path / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    return sort_roles(shapes, config)


def sort_roles(shapes: dict[str, Shape], config: dict) -> CheckpointWeights:
    """Which tensor is the input embedding and which the LM head: the 2-D tables with a row per token
    (config.json's vocab_size; else the tensor named as an LM head and the largest looked-up table). A head
    tied to the embedding (tie_word_embeddings, or none in the checkpoint) is stored once."""
    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    tables = [n for n, s in shapes.items() if len(s) == 2 and (s[0] == vocab or n.startswith(HEADS))]
    heads = [n for n in tables if n.startswith(HEADS)]
    rest = [n for n in tables if n not in heads] or sorted(
        (n for n, s in shapes.items() if len(s) == 2 and any(p in n for p in LOOKED_UP)),
        key=lambda n: -math.prod(shapes[n]))[:1]
    embedding = rest[0] if rest else None
    head = heads[0] if heads else None
    if head is not None and embedding is not None and config.get("tie_word_embeddings"):
        shapes = {n: s for n, s in shapes.items() if n != head}     # one storage: written once
        head = None
    if embedding is None and head is not None:                      # only a head: it counts as the table
        embedding, head = head, None
    return CheckpointWeights(shapes, embedding, head, config)
