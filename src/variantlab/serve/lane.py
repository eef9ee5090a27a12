"""One variant's running batch over one preallocated KV cache: requests join and leave at any decode step.

Continuous (iteration-level) batching, as Orca (Yu et al., OSDI 2022) and vLLM do it, over
transformers' StaticCache. The lane cache holds `rows` sequences of `length` slots each. Every decode
step writes every row at the same slot, `cur` (the cache's shared write position), so a row's
sequence occupies slots [start, cur) and the rows are right-aligned at `cur`:

    slot:    0 1 2 3 4 5 6 7 8 9 ... cur
    row 0:   . . a a a a a a a a     (joined early)
    row 1:   . . . . . . b b b b     (joined later: its prompt copied in just before cur)
    row 2:   (free)

A row's attention mask (rows, length) keeps exactly its own slots, and its position ids count its own
tokens, so each sequence sees what it would see alone (RoPE is applied before keys are cached, so a
key's slot does not matter, only its position). Slots at and after `cur` stay 1 in every row: the
causal mask hides them until they are written, and a free row then attends to its own dummy slot
only (never to nothing, which would give NaN).

- **Join.** Newcomers are prefilled apart, as one left-padded group in a cache of their own
  (`PrefillGroup`), one chunk of `chunk` positions per engine iteration, so that a long prompt does
  not stall the running rows for more than a chunk's time (Sarathi's chunked prefill, Agrawal et al.
  2023). When a group is done, each newcomer's keys and values are copied into a free row at
  [cur - p, cur) and its first token is the prefill's. If cur < p, the running rows are shifted right.
- **Leave.** A finished or cancelled row is freed at once; its slots are ignored from then on.
- **Compaction.** When cur reaches the cache's end, everything moves left by the oldest running row's
  start. A row is at most `max_len` long and the cache is `2 * max_len` (rounded up), so this happens at
  most once every `max_len` steps: one copy of the cache, amortised.
- **Resize.** The lane runs its forward over a power-of-two number of rows (1, 2, 4 … max_rows): it
  grows when newcomers need rows and shrinks when a quarter or less is in use, copying the running
  rows into a cache of the new size. A decode step's cost follows the running rows, not the maximum.

Only models whose every cache layer is a plain StaticLayer can do this; a model with sliding-window
cache layers or variantlab's own linear/sliding attention (which keep cache layers of their own) is
refused with the reason (`continuous_batching_refusal`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends.kv_cache import BUCKET, KVCaches, static_cache_fits
from .sampling import choose


def continuous_batching_refusal(model) -> str | None:
    """Why the model cannot be batched continuously over a StaticCache, or None when it can."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer
    if not static_cache_fits(model):
        return ("its attention keeps cache layers of its own (variantlab's linear or sliding kind): "
                "continuous batching needs a shared static KV cache")
    probe = StaticCache(config=model.config, max_cache_len=BUCKET)
    kinds = {type(layer).__name__ for layer in probe.layers if type(layer) is not StaticLayer}
    if kinds:
        return f"its cache has {', '.join(sorted(kinds))} layers (sliding window): continuous batching needs plain ones"
    return None


def bucket_rows(n: int, max_rows: int) -> int:
    """The power of two at or above n (at least 1), capped at max_rows."""
    return min(max_rows, 1 << max(0, math.ceil(math.log2(max(1, n)))))


def set_length(cache, n: int) -> None:
    """The cache's write position (every layer's) to slot n."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(n)


@dataclass
class Row:
    """One running request in a lane."""

    request: Any                   # engine.ServeRequest
    stop: Any                      # backends.stopping.RequestStop
    generator: torch.Generator | None
    start: int                     # its first slot in the lane cache
    position: int                  # the position id of the token it feeds next
    last: int                      # the token it feeds next
    tokens: list[int] = field(default_factory=list)


@dataclass
class PrefillGroup:
    """Newcomers prefilled together, left-padded in a cache of their own, `chunk` positions at a time."""

    requests: list[Any]
    ids: torch.Tensor              # (n, W) left-padded prompts
    positions: torch.Tensor        # (n, W)
    mask: torch.Tensor             # (n, cache length): the padding hidden
    lengths: list[int]
    cache: Any
    done: int = 0                  # positions prefilled so far
    first: list[int] | None = None # the first token of each, when done
    generators: list | None = None # each request's sampling generator (made when its first token is drawn)

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])

    @property
    def finished(self) -> bool:
        return self.first is not None


class Lane:
    """One variant's continuous batch (module doc). `engine` is the variant's TorchEngine (its model,
    tokenizer, stop rules and prefill caches)."""

    def __init__(self, name: str, engine, *, max_rows: int = 32, max_len: int = 512, chunk: int = 256):
        refusal = continuous_batching_refusal(engine.model)
        if refusal is not None:
            raise ValueError(f"variant {name!r} cannot be served with continuous batching: {refusal}")
        self.name, self.engine, self.model = name, engine, engine.model
        self.device = engine.device
        self.max_rows, self.max_len, self.chunk = max_rows, max_len, max(1, chunk)
        self.length = BUCKET * math.ceil(2 * max_len / BUCKET)
        self.rows: list[Row | None] = []
        self.cache = None
        self.mask: torch.Tensor | None = None          # (rows, length)
        self.cur = 0
        self.group: PrefillGroup | None = None
        self.prefill_caches = KVCaches(engine.model)   # the lane's own: never shared with another thread's engine
        self._layout: tuple | None = None              # (heads, head dim, dtype) of the cache layers
        self._last = engine._last                      # {"logits_to_keep": 1} where the model takes it

    # ------------------------------------------------------------------ state

    @property
    def active(self) -> list[int]:
        return [b for b, r in enumerate(self.rows) if r is not None]

    @property
    def n_active(self) -> int:
        return sum(r is not None for r in self.rows)

    @property
    def busy(self) -> bool:
        return self.n_active > 0 or self.group is not None

    def capacity(self) -> int:
        """How many more requests the lane can take (rows not running and not being prefilled)."""
        pending = len(self.group.requests) if self.group is not None else 0
        return self.max_rows - self.n_active - pending

    # ------------------------------------------------------------------ prefill

    def start_group(self, requests: list) -> None:
        """Begin prefilling `requests` (ServeRequests) as one group; one at a time per lane."""
        assert self.group is None and requests and len(requests) <= self.capacity()
        prompts = [list(r.prompt_ids) for r in requests]
        n, width = len(prompts), max(map(len, prompts))
        pad_id = self.engine.pad_id
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], dtype=torch.long, device=self.device)
        pad = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long,
                           device=self.device)
        cache = self.prefill_caches.acquire(n, width)
        mask = pad.new_ones(n, self.prefill_caches.length_for(width))
        mask[:, :width] = pad
        positions = (pad.cumsum(-1) - 1).clamp(min=0)
        self.group = PrefillGroup(list(requests), ids, positions, mask, [len(p) for p in prompts], cache)

    def prefill_chunk(self, max_tokens: int | None = None) -> bool:
        """Run the next chunk of the group's prefill — `chunk` positions, or fewer so that the chunk holds at
        most `max_tokens` tokens over the group's rows (padding counts: it is computed) — and return True
        when the group is done (its first tokens chosen)."""
        g = self.group
        width = self.chunk if max_tokens is None else max(1, min(self.chunk, max_tokens // len(g.requests)))
        end = min(g.width, g.done + width)
        with torch.inference_mode():
            logits = self.model(input_ids=g.ids[:, g.done:end], attention_mask=g.mask,
                                position_ids=g.positions[:, g.done:end], past_key_values=g.cache, use_cache=True,
                                **self._last).logits
            g.done = end
            if end == g.width:
                params = [r.sampling for r in g.requests]
                g.generators = [p.generator() for p in params]
                g.first = choose(logits[:, -1], params, g.generators)
        return g.finished

    def join(self, make_row) -> list[tuple[Row, int]]:
        """Move the finished group into free rows. `make_row(request, generator, first_token)` gives each
        newcomer's Row (the engine's stop rules); returns (row, its first token) per newcomer, in order."""
        g, self.group = self.group, None
        if self._layout is None:
            layer = g.cache.layers[0]
            self._layout = ([l.num_heads for l in g.cache.layers], layer.k_head_dim, layer.dtype)
        self._fit(self.n_active + len(g.requests))
        if self.cur + 1 > self.length:
            self._compact()
        width = g.width
        if self.cur < width:
            self._shift_right(width - self.cur)
        free = [b for b, r in enumerate(self.rows) if r is None]
        out = []
        for i, (req, first, gen) in enumerate(zip(g.requests, g.first, g.generators)):
            b, p = free[i], g.lengths[i]
            src = slice(width - p, width)
            dst = slice(self.cur - p, self.cur)
            for lane_layer, group_layer in zip(self.cache.layers, g.cache.layers):
                lane_layer.keys[b, :, dst].copy_(group_layer.keys[i, :, src])
                lane_layer.values[b, :, dst].copy_(group_layer.values[i, :, src])
            self.mask[b, :dst.start] = 0
            self.mask[b, dst.start:] = 1
            row = make_row(req, gen, first)
            row.start, row.position, row.last = dst.start, p, first
            self.rows[b] = row
            out.append((row, first))
        return out

    # ------------------------------------------------------------------ decode

    def step(self) -> list[tuple[Row, int]]:
        """One decode step of every running row: (row, its next token) for each."""
        if self.cur + 1 > self.length:
            self._compact()
        active = self.active
        pad = self.engine.pad_id
        ids = torch.tensor([[r.last if r is not None else pad] for r in self.rows], dtype=torch.long,
                           device=self.device)                                     # (rows, 1)
        pos = torch.tensor([[r.position if r is not None else 0] for r in self.rows], dtype=torch.long,
                           device=self.device)                                     # (rows, 1)
        set_length(self.cache, self.cur)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos,
                                past_key_values=self.cache, use_cache=True, **self._last).logits[:, -1]
        self.cur += 1
        rows = [self.rows[b] for b in active]
        chosen = choose(logits[active], [r.request.sampling for r in rows], [r.generator for r in rows])
        for r, tok in zip(rows, chosen):
            r.position += 1
            r.last = tok
        return list(zip(rows, chosen))

    def clear(self) -> None:
        """Drop every row and the prefill group (the engine failed them all)."""
        self.group = None
        self.rows = [None] * len(self.rows)
        if self.mask is not None:
            self.mask[:, :self.cur] = 0
            self.mask[:, self.cur:] = 1

    def release(self, row: Row) -> None:
        """Free a finished or cancelled row; shrink the lane when a quarter or less of it runs."""
        b = self.rows.index(row)
        self.rows[b] = None
        self.mask[b, :self.cur] = 0
        self.mask[b, self.cur:] = 1
        if len(self.rows) > 1 and self.n_active <= len(self.rows) // 4 and self.group is None:
            self._fit(self.n_active)

    # ------------------------------------------------------------------ the cache's layout

    def _new_cache(self, rows: int):
        from transformers import StaticCache
        cache = StaticCache(config=self.model.config, max_cache_len=self.length)
        heads, head_dim, dtype = self._layout
        cache.early_initialization(rows, heads, head_dim, dtype, self.device)
        return cache

    def _fit(self, needed: int) -> None:
        """Resize to the power of two that holds `needed` rows, keeping the running ones (rows 0…k-1)."""
        target = bucket_rows(needed, self.max_rows)
        if self.cache is not None and target == len(self.rows):
            return
        cache = self._new_cache(target)
        mask = torch.ones(target, self.length, dtype=torch.long, device=self.device)
        mask[:, :self.cur] = 0
        keep = self.active
        for new_b, old_b in enumerate(keep):
            for new_layer, old_layer in zip(cache.layers, self.cache.layers):
                new_layer.keys[new_b, :, :self.cur].copy_(old_layer.keys[old_b, :, :self.cur])
                new_layer.values[new_b, :, :self.cur].copy_(old_layer.values[old_b, :, :self.cur])
            mask[new_b] = self.mask[old_b]
        rows = [self.rows[b] for b in keep]
        self.rows = rows + [None] * (target - len(rows))
        self.cache, self.mask = cache, mask

    def _move(self, src: slice, dst: slice) -> None:
        """Every row's slots src → dst (same length; they may overlap), keys, values and mask."""
        for layer in self.cache.layers:
            layer.keys[:, :, dst] = layer.keys[:, :, src].clone()
            layer.values[:, :, dst] = layer.values[:, :, src].clone()
        self.mask[:, dst] = self.mask[:, src].clone()

    def _compact(self) -> None:
        """Move everything left by the oldest running row's start (or empty the lane when nothing runs)."""
        starts = [r.start for r in self.rows if r is not None]
        shift = min(starts) if starts else self.cur
        n = self.cur - shift
        if n > 0:
            self._move(slice(shift, self.cur), slice(0, n))
        self.mask[:, n:] = 1
        for r in self.rows:
            if r is not None:
                r.start -= shift
        self.cur = n

    def _shift_right(self, d: int) -> None:
        """Make room before `cur` for a newcomer longer than cur: every row moves right by d slots."""
        if self.cur > 0:
            self._move(slice(0, self.cur), slice(d, d + self.cur))
        self.mask[:, :d] = 0
        for r in self.rows:
            if r is not None:
                r.start += d
        self.cur += d
