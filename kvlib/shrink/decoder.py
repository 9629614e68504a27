"""``generate(..., decoder=cache_decoder(QuantizedKVCache, bits=4))``: decoding over a shrinking cache.

``generate`` builds its decoder from a factory ``(model, batch_size, max_len) -> decoder`` and calls
it as ``dec(idx, key_mask=None, position_ids=None) -> (B, V)``, the last position's logits.
:func:`cache_decoder` makes such a factory for any cache class of this package.
"""
from __future__ import annotations

from ..checks import check_model
from .evict import EvictingCache, forward_with_cache

__all__ = ["CacheDecoder", "cache_decoder"]


class CacheDecoder:
    """Runs the teaching model over ``cache``; returns the last position's logits (B, V)."""

    def __init__(self, model, cache):
        check_model(model)
        self.model, self.cache = model, cache

    def __call__(self, idx, key_mask=None, position_ids=None):
        if isinstance(self.cache, EvictingCache):
            if key_mask is not None or position_ids is not None:
                raise ValueError(f"{type(self.cache).__name__} decodes rows of equal length: padded prompts "
                                 f"(a key_mask) are not supported")
            logits, _ = forward_with_cache(self.model, idx, self.cache, last_only=True)
        else:
            logits, _ = self.model(idx, cache=self.cache, key_mask=key_mask, position_ids=position_ids,
                                   last_only=True)
        return logits[:, -1]  # (B, V)


def cache_decoder(cache_class: type, **settings):
    """A factory ``(model, batch_size, max_len) -> CacheDecoder`` over ``cache_class(config, batch_size, max_len, **settings)``."""
    if not isinstance(cache_class, type):
        raise TypeError(f"cache_class must be a cache class (e.g. QuantizedKVCache), got {cache_class!r:.60}")

    def make(model, batch_size: int, max_len: int) -> CacheDecoder:
        return CacheDecoder(model, cache_class(model.config, batch_size, max_len, **settings))

    return make
