"""Preallocated KV caches for the engine's decode loop: one per (batch size, length bucket), reused.

transformers' DynamicCache grows by concatenation: every decode step copies each layer's whole
K and V into new tensors (at 2,048 tokens of a 16-layer, 768-wide model, about 100 MB a step, more
than the weights). A StaticCache is allocated once at its full length and written in place, so a
decode step allocates no cache memory, and its shapes stay fixed (what torch.compile needs).

`KVCaches.acquire(batch, tokens)` hands out a StaticCache of at least `tokens` positions (rounded
up to a bucket, so that a few shapes serve every request), rewound to empty: only its position
counters are reset. The stale keys and values left from the previous request stay in memory and
are never read, because every query's causal mask stops at its own position (the engine's tests
reuse a cache and compare token for token with a fresh one). Zeroing them instead would cost a
full pass over the cache per request.

Models whose attention modules keep their own cache layers (variantlab's linear and sliding kinds,
variants/attention_module.py) get a DynamicCache: their layers are constant-size already.
"""
from __future__ import annotations

import math
from collections import OrderedDict

BUCKET = 128     # cache lengths are multiples of this many positions
KEEP = 2         # caches kept between requests (least recently used go)


def static_cache_fits(model) -> bool:
    """Whether the model's attention works with a preallocated transformers StaticCache: not when its
    attention modules keep cache layers of their own (they register variantlab's implementation)."""
    from transformers import PretrainedConfig

    from ..variants.attention_module import IMPLEMENTATION
    config = getattr(model, "config", None)
    return isinstance(config, PretrainedConfig) and getattr(config, "_attn_implementation", None) != IMPLEMENTATION


def rewind(cache) -> None:
    """Empty a StaticCache without touching its tensors: every layer's position counters back to 0."""
    for layer in cache.layers:
        counter = getattr(layer, "cumulative_length", None)
        if counter is not None and hasattr(counter, "zero_"):
            counter.zero_()
        elif counter is not None:
            layer.cumulative_length = 0
        if hasattr(layer, "cumulative_length_int"):
            layer.cumulative_length_int = 0


class KVCaches:
    """StaticCaches by (batch, bucket), rewound on reuse; DynamicCache for models that need it."""

    def __init__(self, model, bucket: int = BUCKET, keep: int = KEEP, static: bool = True):
        self.model = model
        self.bucket = bucket
        self.keep = keep
        self.static = static and static_cache_fits(model)
        self._pool: OrderedDict[tuple[int, int], object] = OrderedDict()

    def length_for(self, tokens: int) -> int:
        """The cache length that holds `tokens` positions: the next multiple of the bucket."""
        return self.bucket * max(1, math.ceil(tokens / self.bucket))

    def acquire(self, batch: int, tokens: int):
        """An empty cache for `batch` rows of up to `tokens` positions each."""
        from transformers import DynamicCache, StaticCache
        if not self.static:
            return DynamicCache()
        key = (batch, self.length_for(tokens))
        cache = self._pool.pop(key, None)
        if cache is None:
            cache = StaticCache(config=self.model.config, max_cache_len=key[1])
            while len(self._pool) >= self.keep:
                self._pool.popitem(last=False)
        else:
            rewind(cache)
        self._pool[key] = cache
        return cache
