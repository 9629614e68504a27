"""Shrinking the cache (notebook 9): quantised keys and values, and eviction within the block.

``quantized`` stores keys and values as 2-, 4- or 8-bit codes (KIVI's layout); ``evict`` keeps a
bounded set of positions (a sliding window, sinks plus a window, H2O's heavy hitters); ``decoder``
runs ``generate`` over any of them. Every cache here implements :class:`kvlib.model.Cache`.
"""
from .decoder import CacheDecoder, cache_decoder
from .evict import EvictingCache, HeavyHitterCache, SinkCache, SlidingWindowCache, forward_with_cache
from .quantized import (QuantizedKVCache, dequantize, fp_bytes_per_token, pack, quantize, quantized_bytes_per_token,
                        unpack)

__all__ = [
    "QuantizedKVCache", "quantize", "dequantize", "pack", "unpack", "fp_bytes_per_token",
    "quantized_bytes_per_token",
    "EvictingCache", "SlidingWindowCache", "SinkCache", "HeavyHitterCache", "forward_with_cache",
    "CacheDecoder", "cache_decoder",
]
