"""kvlib: how a small GPT writes Tang poems one token at a time, and why the KV cache makes it fast.

The package root holds the ideas, in reading order: ``tokenizer`` -> ``model`` (the GPT and its
caches) -> ``sampling`` -> ``decoding`` (the loops) -> ``fast`` (the lean decode step) ->
``constraints`` and ``verify``; ``text`` turns strings into calls, ``stepper`` and ``memory`` hold
what notebooks 4 and 5 show, ``paged`` and ``serving`` notebook 7's many users, ``quantized`` and
``evict`` notebook 9's smaller caches. ``kvlib.notebook``
draws it, ``kvlib.tools`` trains, loads and measures it.
"""
from .cache import Cache, ContextLimitError
from .constraints import acrostic, quatrain
from .decoding import GenerationResult, cache_decoder, generate, generate_uncached, pad_prompts, position_ids_from_mask
from .evict import HeavyHitterCache, SinkCache, SlidingWindowCache
from .fast import FastDecoder
from .model import GPT, GPTConfig, GrowingKVCache, KVCache
from .blocks import BlockManager
from .paged import KVPool, PagedKVCache
from .quantized import QuantizedKVCache
from .sampling import apply_temperature, probabilities, sample_next, top_k_filter, top_p_filter
from .serving import Engine, Request
from .stepper import CacheStepper
from .poems import encode_prompt, next_token_probs, top_next, write
from .tokenizer import ByteBPETokenizer, CharTokenizer, TextStream, UnknownCharacterError, stream_decode
from .tools.loading import load_pretrained
from .verify import CacheReport, check_batch_consistency, verify_cache, verify_paged

__all__ = [
    "load_pretrained",
    "GPT", "GPTConfig", "Cache", "KVCache", "GrowingKVCache", "FastDecoder",
    "CharTokenizer", "ByteBPETokenizer", "TextStream", "stream_decode", "UnknownCharacterError",
    "apply_temperature", "top_k_filter", "top_p_filter", "probabilities", "sample_next",
    "generate", "generate_uncached", "GenerationResult", "pad_prompts", "position_ids_from_mask",
    "ContextLimitError",
    "acrostic", "quatrain",
    "verify_cache", "check_batch_consistency", "CacheReport",
    "encode_prompt", "next_token_probs", "top_next", "write",
    "CacheStepper",
    "PagedKVCache", "BlockManager", "KVPool", "verify_paged", "Engine", "Request",
    "QuantizedKVCache", "SlidingWindowCache", "SinkCache", "HeavyHitterCache", "cache_decoder",
]
