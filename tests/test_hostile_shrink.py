"""Hostile input to the cache-shrinking modules: quantised and evicting caches, conversions, quality, the shrink tool.

As in tests/test_hostile_newer.py (whose helpers this file reuses): every case calls one public entry
point with one bad argument and checks the exception class (TypeError for a wrong type, ValueError for a
wrong value, ContextLimitError past the room, RuntimeError for a call the object's state refuses), that
the message is one line naming the parameter (one name, matched as a whole word and case-sensitively;
never the wording, so a message can be reworded freely), and, for a method, that the object is exactly
as it was before (lengths, positions, stored codes, scales, keys, scores). The command-line cases check
the exit status 2, one line and the option named the same way.

Everything runs on ``tiny_gpt`` (64 ids, a 16-token block, 2 layers, 2 heads of 16) and
``tiny_char_tokenizer``. The count test prints the number of cases per module.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, replace

import pytest
import torch

from kvlib import ContextLimitError, KVCache
from kvlib.compress import grouped, latent
from kvlib.decoding import CacheDecoder, cache_decoder, generate
from kvlib.evict import HeavyHitterCache, SinkCache, SlidingWindowCache, forward_with_cache
from kvlib.quality import attention_weights, cache_cost, stepwise_logits
from kvlib.quantized import (QuantizedKVCache, QuantizedStore, dequantize, pack, quantize,
                             quantized_bytes_per_token, unpack)
from kvlib.tools import cli, shrink_bench
from kvlib.tools.shrink_bench import PAPERS, converted, format_table, settings, shrink_table, texts

from .conftest import SHIPPED_SHAPE, TINY_SHAPE, seeded_gpt
from .test_hostile_newer import BLOCK, HUGE, INF, NAN, V, Case, bad_ints, names, refused_clearly

L, H, D = TINY_SHAPE.n_layer, TINY_SHAPE.n_head, TINY_SHAPE.head_size
BATCH_TOP = 2**31 // (2 * L * TINY_SHAPE.n_embd * BLOCK)  # a cache of at most 2**31 numbers
CASES: list[Case] = []


def add(module, entry, param, pairs, make_call, setup=None, state=None, exc=None, label=None):
    for value, error in pairs:
        CASES.append(Case(module, entry, param, exc or error,
                          (lambda v: lambda w, obj=None: make_call(w, obj, v))(value), setup, state, label))


def no_none(pairs):
    return [(v, e) for v, e in pairs if v is not None]


def t(*shape, dtype=torch.float32, fill=0.0, device="cpu"):
    return torch.full(shape, fill, dtype=dtype, device=device)


def pick(w, v):
    """The world's model named ``v`` ("other", "gqa", "nan"), else ``v`` itself."""
    return getattr(w, v) if isinstance(v, str) and v in ("other", "gqa", "nan") else v


class World:
    def __init__(self, model, tok):
        self.model, self.tok, self.cfg = model, tok, model.config
        self.gqa = seeded_gpt(replace(TINY_SHAPE, n_kv_head=1), seed=1)
        self.other = seeded_gpt(replace(TINY_SHAPE, vocab_size=32), seed=2)
        nan = seeded_gpt(TINY_SHAPE, seed=3)
        with torch.no_grad():
            nan.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
        self.nan = nan

    def ids(self, T, B=2, seed=0):
        return torch.randint(V, (B, T), generator=torch.Generator().manual_seed(seed))


# ---- state snapshots ----------------------------------------------------------------------------

def _clone(x):
    return None if x is None else x.clone()


def quant_state(c: QuantizedKVCache):
    return (c.length, [(_clone(s.codes), _clone(s.scale), _clone(s.zero), _clone(s.residual))
                       for s in c.keys + c.values])


def store_state(s: QuantizedStore):
    return _clone(s.codes), _clone(s.scale), _clone(s.zero), _clone(s.residual)


def evict_state(c):
    return (c.length, c.position, [_clone(x) for x in c.k + c.v + c.positions],
            [_clone(x) for x in getattr(c, "scores", [])], [_clone(x) for x in getattr(c, "queries", [])])


# ---- quantized ------------------------------------------------------------------------------------

def _quant(w):
    cache = QuantizedKVCache(w.cfg, 2, bits=4, group_size=4, window=2)
    with torch.inference_mode():
        w.model(w.ids(6), cache=cache)
    return cache


BITS = [(3, ValueError), (16, ValueError), (0, ValueError), (-2, ValueError), (True, TypeError), (4.0, TypeError),
        ("4", TypeError), (None, TypeError)]
add("quantized", "QuantizedKVCache", "bits", BITS, lambda w, o, v: QuantizedKVCache(w.cfg, 1, bits=v))
add("quantized", "quantized_bytes_per_token", "bits", BITS, lambda w, o, v: quantized_bytes_per_token(w.cfg, v, 4))
add("quantized", "quantize", "bits", BITS, lambda w, o, v: quantize(t(1, 2, 8, 16), v, 2, 4))
add("quantized", "pack", "bits", BITS, lambda w, o, v: pack(t(2, 8, dtype=torch.uint8), v))
add("quantized", "unpack", "bits", BITS, lambda w, o, v: unpack(t(2, 8, dtype=torch.uint8), v))
add("quantized", "QuantizedStore", "bits", BITS[:4], lambda w, o, v: QuantizedStore(v, 4, 2, 0))

qc = lambda w, **kw: QuantizedKVCache(w.cfg, **{"batch_size": 1, **kw})  # noqa: E731
add("quantized", "QuantizedKVCache", "batch_size", bad_ints(1, BATCH_TOP), lambda w, o, v: qc(w, batch_size=v))
add("quantized", "QuantizedKVCache", "max_len", no_none(bad_ints(1, BLOCK)), lambda w, o, v: qc(w, max_len=v))
add("quantized", "QuantizedKVCache", "group_size", bad_ints(1, D) + [(3, ValueError), (5, ValueError)],
    lambda w, o, v: qc(w, group_size=v))
add("quantized", "QuantizedKVCache", "window", bad_ints(0, BLOCK), lambda w, o, v: qc(w, window=v))
add("quantized", "QuantizedKVCache", "window", [(9, ValueError)], lambda w, o, v: qc(w, max_len=8, window=v))
add("quantized", "QuantizedKVCache", "config", [("cfg", TypeError), ({"vocab_size": V}, TypeError), (None, TypeError)],
    lambda w, o, v: QuantizedKVCache(v, 1))
add("quantized", "QuantizedKVCache", "config", [(8, ValueError), (4, ValueError)],  # a latent: no heads to quantise
    lambda w, o, v: QuantizedKVCache(replace(TINY_SHAPE, kv_latent=v), 1))

chunk = lambda T=1, **kw: t(2, H, T, D, **kw)  # noqa: E731
BAD_CHUNKS = [(chunk(1)[0], ValueError), (t(2, H, 1, 8), ValueError), (t(1, H, 1, D), ValueError),
              (t(2, 1, 1, D), ValueError), (chunk(dtype=torch.float64), TypeError), (chunk(dtype=torch.long), TypeError),
              ([[0.0]], TypeError), (None, TypeError), (chunk(fill=NAN), ValueError), (chunk(fill=INF), ValueError),
              (chunk(device="meta"), ValueError)]
add("quantized", "QuantizedKVCache.write", "layer", bad_ints(0, L - 1),
    lambda w, o, v: o.write(v, chunk(), chunk()), _quant, quant_state)
add("quantized", "QuantizedKVCache.write", "k", BAD_CHUNKS, lambda w, o, v: o.write(0, v, chunk()), _quant, quant_state)
add("quantized", "QuantizedKVCache.write", "v", BAD_CHUNKS[:6] + [(chunk(2), ValueError), ("v", TypeError)],
    lambda w, o, v: o.write(1, chunk(), v), _quant, quant_state)
add("quantized", "QuantizedKVCache.write", "cache", [(11, ContextLimitError), (HUGE % 1009 + 11, ContextLimitError)],
    lambda w, o, v: o.write(0, chunk(v), chunk(v)), _quant, quant_state, label="cache holds")
add("quantized", "QuantizedKVCache.advance", "n", [("1", TypeError), (1.5, TypeError), (True, TypeError),
                                                   (-1, ValueError), (None, TypeError)],
    lambda w, o, v: o.advance(v), _quant, quant_state)
add("quantized", "QuantizedKVCache.advance", "n", [(1, ValueError), (3, ValueError)],
    lambda w, o, v: o.advance(v), _quant, quant_state, label="advance")
add("quantized", "QuantizedKVCache.truncate", "n", bad_ints(0, 6), lambda w, o, v: o.truncate(v), _quant, quant_state)

x4 = lambda **kw: t(1, 2, 8, 16, **kw)  # noqa: E731
add("quantized", "quantize", "x", [([[0.0]], TypeError), (x4(dtype=torch.long), TypeError), (torch.tensor(1.0), TypeError),
                                   (x4(fill=NAN), ValueError), (x4(fill=-INF), ValueError), (None, TypeError)],
    lambda w, o, v: quantize(v, 4, 2, 4))
add("quantized", "quantize", "dim", bad_ints(-4, 3), lambda w, o, v: quantize(x4(), 4, v, 4))
add("quantized", "quantize", "group", [(0, ValueError), (3, ValueError), (HUGE, ValueError), (True, TypeError),
                                       (1.5, TypeError), (None, TypeError)],
    lambda w, o, v: quantize(x4(), 4, 3, v))
codes = lambda: t(1, 2, 8, 16, dtype=torch.uint8)  # noqa: E731
params = lambda: t(1, 2, 8, 4, dtype=torch.float16)  # noqa: E731
add("quantized", "dequantize", "codes", [(x4(), TypeError), ([1], TypeError), (torch.tensor(1, dtype=torch.uint8), TypeError)],
    lambda w, o, v: dequantize(v, params(), params(), 3, 4))
add("quantized", "dequantize", "scale", [(t(1, 2, 8, 2), ValueError), (params().long(), TypeError), (None, TypeError)],
    lambda w, o, v: dequantize(codes(), v, params(), 3, 4))
add("quantized", "dequantize", "zero", [(t(1, 2, 2, 16), ValueError), ("0", TypeError)],
    lambda w, o, v: dequantize(codes(), params(), v, 3, 4))
add("quantized", "dequantize", "dim", [(4, ValueError), (-5, ValueError), (3.0, TypeError)],
    lambda w, o, v: dequantize(codes(), params(), params(), v, 4))
add("quantized", "dequantize", "group", [(0, ValueError), (5, ValueError), (False, TypeError)],
    lambda w, o, v: dequantize(codes(), params(), params(), 3, v))
add("quantized", "dequantize", "dtype", [(None, TypeError), (torch.long, TypeError), ("float32", TypeError)],
    lambda w, o, v: dequantize(codes(), params(), params(), 3, 4, v))
add("quantized", "pack", "codes", [(t(2, 8), TypeError), ([1, 2], TypeError), (t(2, 3, dtype=torch.uint8), ValueError),
                                   (t(2, 8, dtype=torch.uint8, fill=4), ValueError)],
    lambda w, o, v: pack(v, 2))
add("quantized", "unpack", "packed", [(t(2, 8), TypeError), ([1, 2], TypeError), (torch.tensor(3, dtype=torch.uint8), TypeError)],
    lambda w, o, v: unpack(v, 4))
add("model", "GPTConfig.kv_bytes_per_token", "dtype", [(None, TypeError), (torch.int64, TypeError), ("float32", TypeError)],
    lambda w, o, v: w.cfg.kv_bytes_per_token(v))
add("quantized", "quantized_bytes_per_token", "group_size", bad_ints(1, D) + [(3, ValueError)],
    lambda w, o, v: quantized_bytes_per_token(w.cfg, 4, v))

add("quantized", "QuantizedStore", "dim", [(1, ValueError), (4, ValueError), (2.0, TypeError), (None, TypeError)],
    lambda w, o, v: QuantizedStore(4, 4, v, 0))
add("quantized", "QuantizedStore", "group", [(0, ValueError), ("4", TypeError)], lambda w, o, v: QuantizedStore(4, v, 2, 0))
add("quantized", "QuantizedStore", "window", [(-1, ValueError), (1.5, TypeError)], lambda w, o, v: QuantizedStore(4, 4, 2, v))


def _store(w):
    s = QuantizedStore(4, 4, 3, 1)
    s.append(chunk(6, fill=1.0))
    s.flush()
    return s


add("quantized", "QuantizedStore.append", "x", BAD_CHUNKS, lambda w, o, v: o.append(v), _store, store_state)
add("quantized", "QuantizedStore.append", "x", [(t(1, 1, 1, 6), ValueError), (t(1, 1, 1, 3), ValueError)],
    lambda w, o, v: QuantizedStore(4, 4, 3, 0).append(v), label="last dimension")
add("quantized", "QuantizedStore.truncate", "n", bad_ints(0, 6), lambda w, o, v: o.truncate(v), _store, store_state)
add("quantized", "QuantizedStore.read", "read", [(None, RuntimeError)], lambda w, o, v: QuantizedStore(4, 4, 2, 0).read(),
    label="empty")


# ---- evict ----------------------------------------------------------------------------------------

MAKERS = {"SlidingWindowCache": lambda cfg, *a, **kw: SlidingWindowCache(cfg, *a, **{"window": 3, **kw}),
          "SinkCache": lambda cfg, *a, **kw: SinkCache(cfg, *a, **{"sinks": 1, "window": 3, **kw}),
          "HeavyHitterCache": lambda cfg, *a, **kw: HeavyHitterCache(cfg, *a, **{"budget": 4, "recent": 2, **kw})}
for name, make in MAKERS.items():
    add("evict", name, "batch_size", bad_ints(1, BATCH_TOP), lambda w, o, v, m=make: m(w.cfg, v))
    add("evict", name, "max_len", no_none(bad_ints(1, BLOCK)), lambda w, o, v, m=make: m(w.cfg, 1, v))
    add("evict", name, "config", [("cfg", TypeError), (None, TypeError), ({"vocab_size": V}, TypeError)],
        lambda w, o, v, m=make: m(v, 1))
    add("evict", name, "config", [(replace(TINY_SHAPE, n_kv_head=1), ValueError), (replace(TINY_SHAPE, kv_latent=8), ValueError)],
        lambda w, o, v, m=make: m(v, 1))
add("evict", "SlidingWindowCache", "window", bad_ints(1, BLOCK), lambda w, o, v: SlidingWindowCache(w.cfg, 1, window=v))
add("evict", "SlidingWindowCache", "window", [(9, ValueError)], lambda w, o, v: SlidingWindowCache(w.cfg, 1, 8, window=v))
add("evict", "SinkCache", "sinks", bad_ints(0, BLOCK - 1), lambda w, o, v: SinkCache(w.cfg, 1, sinks=v, window=1))
add("evict", "SinkCache", "window", bad_ints(1, BLOCK - 4), lambda w, o, v: SinkCache(w.cfg, 1, sinks=4, window=v))
add("evict", "HeavyHitterCache", "budget", bad_ints(1, BLOCK), lambda w, o, v: HeavyHitterCache(w.cfg, 1, budget=v, recent=0))
add("evict", "HeavyHitterCache", "recent", bad_ints(0, 8), lambda w, o, v: HeavyHitterCache(w.cfg, 1, budget=8, recent=v))


def _sink(w):
    cache = SinkCache(w.cfg, 2, sinks=1, window=3)
    with torch.inference_mode():
        forward_with_cache(w.model, w.ids(7), cache)
    return cache


def _h2o(w):
    cache = HeavyHitterCache(w.cfg, 2, budget=4, recent=2)
    with torch.inference_mode():
        forward_with_cache(w.model, w.ids(7), cache)
    return cache


for name, setup in (("SinkCache", _sink), ("HeavyHitterCache", _h2o)):
    add("evict", f"{name}.write", "layer", bad_ints(0, L - 1)[:6],
        lambda w, o, v: o.write(v, chunk(), chunk()), setup, evict_state)
    add("evict", f"{name}.write", "k", BAD_CHUNKS, lambda w, o, v: o.write(0, v, chunk()), setup, evict_state)
    add("evict", f"{name}.write", "v", BAD_CHUNKS[:5] + [(chunk(2), ValueError)],
        lambda w, o, v: o.write(1, chunk(), v), setup, evict_state)
    add("evict", f"{name}.advance", "n", [("1", TypeError), (True, TypeError), (-1, ValueError), (2.0, TypeError)],
        lambda w, o, v: o.advance(v), setup, evict_state)
    add("evict", f"{name}.advance", "n", [(1, ValueError)], lambda w, o, v: o.advance(v), setup, evict_state,
        label="advance")
    add("evict", f"{name}.truncate", "n", bad_ints(0, 4), lambda w, o, v: o.truncate(v), setup, evict_state)
    add("evict", f"{name}.next_positions", "T", [(-1, ValueError), (1.0, TypeError), (True, TypeError), ("2", TypeError)],
        lambda w, o, v: o.next_positions(v), setup, evict_state)
    add("evict", f"{name}.next_positions", "T", [(10, ContextLimitError), (HUGE, ContextLimitError)],
        lambda w, o, v: o.next_positions(v), setup, evict_state, label="at most 16")
    add("evict", f"{name}.next_positions", "device", [(5, TypeError), ("nope", ValueError)],
        lambda w, o, v: o.next_positions(1, v), setup, evict_state)
add("evict", "SinkCache.write", "k", [(10, ContextLimitError)],
    lambda w, o, v: o.write(0, chunk(v), chunk(v)), _sink, evict_state, label="at most 16")
add("evict", "HeavyHitterCache.write", "queries", [(1, RuntimeError), (2, RuntimeError)],
    lambda w, o, v: o.write(0, chunk(v), chunk(v)), _h2o, evict_state)
add("evict", "HeavyHitterCache.observe", "q", BAD_CHUNKS, lambda w, o, v: o.observe(0, v), _h2o, evict_state)
add("evict", "HeavyHitterCache.observe", "layer", [(2, ValueError), (-1, ValueError), ("0", TypeError)],
    lambda w, o, v: o.observe(v, chunk()), _h2o, evict_state)

for name, setup in (("sink", _sink), ("h2o", _h2o)):
    add("evict", f"forward_with_cache({name})", "idx",
        [([[1], [2]], TypeError), (torch.tensor([[1.0], [2.0]]), TypeError), (torch.tensor([1, 2]), TypeError),
         (torch.tensor([[1], [2]], dtype=torch.int32), TypeError), (torch.zeros(2, 0, dtype=torch.long), ValueError),
         (torch.tensor([[1]]), ValueError), (torch.tensor([[1], [V]]), ValueError), (torch.tensor([[-1], [1]]), ValueError),
         (torch.ones(2, 10, dtype=torch.long), ContextLimitError)],
        lambda w, o, v: forward_with_cache(w.model, v, o), setup, evict_state)
    add("evict", f"forward_with_cache({name})", "model", [("m", TypeError), (None, TypeError), (torch.nn.Linear(2, 2), TypeError)],
        lambda w, o, v: forward_with_cache(v, torch.ones(2, 1, dtype=torch.long), o), setup, evict_state)
    add("evict", f"forward_with_cache({name})", "model", [("other", ValueError), ("gqa", ValueError)],
        lambda w, o, v: forward_with_cache(getattr(w, v), torch.ones(2, 1, dtype=torch.long), o), setup, evict_state)
    add("evict", f"forward_with_cache({name})", "last_only", [(1, TypeError), ("yes", TypeError), (None, TypeError)],
        lambda w, o, v: forward_with_cache(w.model, torch.ones(2, 1, dtype=torch.long), o, last_only=v), setup, evict_state)
add("evict", "forward_with_cache", "cache", [("c", TypeError), (None, TypeError), ("quantized", TypeError)],
    lambda w, o, v: forward_with_cache(w.model, torch.ones(1, 1, dtype=torch.long),
                                       QuantizedKVCache(w.cfg, 1) if v == "quantized" else v))


# ---- compress -------------------------------------------------------------------------------------

for entry, fn, top in (("grouped", grouped, H), ("latent", latent, TINY_SHAPE.n_embd)):
    param = "n_kv_head" if entry == "grouped" else "rank"
    add("compress", entry, param, bad_ints(1, top), lambda w, o, v, f=fn: f(w.model, v))
    add("compress", entry, "model", [("m", TypeError), (None, TypeError), (torch.nn.Linear(2, 2), TypeError)],
        lambda w, o, v, f=fn: f(v, 1))
    add("compress", entry, "model", [("gqa", ValueError), ("nan", ValueError)],
        lambda w, o, v, f=fn: f(getattr(w, v), 1))


# ---- quality --------------------------------------------------------------------------------------

def _used(w):
    cache = KVCache(w.cfg, 2)
    with torch.inference_mode():
        w.model(w.ids(3), cache=cache)
    return cache


kv_state = lambda c: (c.length, c.k.clone(), c.v.clone())  # noqa: E731
fresh = lambda w: KVCache(w.cfg, 2)  # noqa: E731
add("quality", "stepwise_logits", "idx",
    [([[1, 2]], TypeError), (torch.ones(2, 3), TypeError), (torch.ones(3, dtype=torch.long), TypeError),
     (torch.zeros(2, 0, dtype=torch.long), ValueError), (torch.ones(3, 2, dtype=torch.long), ValueError),
     (torch.full((2, 2), V), ValueError), (torch.full((2, 2), -1), ValueError), (torch.ones(2, 17, dtype=torch.long), ContextLimitError)],
    lambda w, o, v: stepwise_logits(w.model, v, o), fresh, kv_state)
add("quality", "stepwise_logits", "cache", [("c", TypeError), (None, TypeError), (KVCache, TypeError), ([], TypeError)],
    lambda w, o, v: stepwise_logits(w.model, w.ids(2), v))
add("quality", "stepwise_logits", "cache", [(None, ValueError)], lambda w, o, v: stepwise_logits(w.model, w.ids(2), o),
    _used, kv_state)
other_caches = {"quantized": lambda w: QuantizedKVCache(w.other.config, 2), "gqa": lambda w: w.gqa.new_cache(2),
                "sink": lambda w: SinkCache(w.other.config, 2, sinks=1, window=2)}
add("quality", "stepwise_logits", "cache", [(k, ValueError) for k in other_caches],
    lambda w, o, v: stepwise_logits(w.model, w.ids(2), other_caches[v](w)))
add("quality", "stepwise_logits", "model", [("m", TypeError), (None, TypeError), ("nan", ValueError)],
    lambda w, o, v: stepwise_logits(pick(w, v), w.ids(2), KVCache(w.cfg, 2)))
ref = lambda **kw: t(2, 3, V, **kw)  # noqa: E731
tgt = lambda: torch.zeros(2, 3, dtype=torch.long)  # noqa: E731
BAD_LOGITS = [([[0.0]], TypeError), (ref(dtype=torch.long), TypeError), (t(2, V), TypeError), (None, TypeError),
              (ref(fill=NAN), ValueError), (ref(fill=INF), ValueError), (ref(fill=-INF), ValueError),
              (t(2, 0, V), ValueError)]
add("quality", "cache_cost", "reference", BAD_LOGITS, lambda w, o, v: cache_cost(v, ref(), tgt()))
add("quality", "cache_cost", "logits", BAD_LOGITS[:6] + [(t(2, 3, V + 1), ValueError), (t(1, 3, V), ValueError)],
    lambda w, o, v: cache_cost(ref(), v, tgt()))
add("quality", "cache_cost", "targets", [(tgt().float(), TypeError), ([[0]], TypeError), (torch.zeros(2, 4, dtype=torch.long), ValueError),
                                         (torch.full((2, 3), V), ValueError), (torch.full((2, 3), -1), ValueError)],
    lambda w, o, v: cache_cost(ref(), ref(), v))
add("quality", "attention_weights", "idx", [([[1]], TypeError), (torch.ones(1, 2), TypeError), (torch.full((1, 2), V), ValueError),
                                            (torch.ones(1, 17, dtype=torch.long), ContextLimitError),
                                            (torch.zeros(0, 2, dtype=torch.long), ValueError)],
    lambda w, o, v: attention_weights(w.model, v))
add("quality", "attention_weights", "model", [("m", TypeError), (None, TypeError), ("gqa", ValueError), ("nan", ValueError)],
    lambda w, o, v: attention_weights(pick(w, v), torch.ones(1, 2, dtype=torch.long)))


# ---- decoding: cache_decoder and CacheDecoder ------------------------------------------------------

add("decoding", "cache_decoder", "cache_class", [("QuantizedKVCache", TypeError), (5, TypeError), (int, TypeError),
                                                 (None, TypeError)],
    lambda w, o, v: cache_decoder(v))
add("decoding", "cache_decoder", "settings", [({"bitz": 4}, TypeError), ({"max_len": 4}, TypeError),
                                              ({"config": None}, TypeError)],
    lambda w, o, v: cache_decoder(QuantizedKVCache, **v))
add("decoding", "cache_decoder", "settings", [({"sinks": 1}, TypeError)], lambda w, o, v: cache_decoder(SinkCache, **v))
add("decoding", "generate(cache_decoder)", "bits", [(3, ValueError), (4.0, TypeError)],
    lambda w, o, v: generate(w.model, w.ids(2), 2, decoder=cache_decoder(QuantizedKVCache, bits=v)))
add("decoding", "generate(cache_decoder)", "window", [(0, ValueError), (BLOCK + 1, ValueError), (True, TypeError)],
    lambda w, o, v: generate(w.model, w.ids(2), 2, decoder=cache_decoder(SlidingWindowCache, window=v)))
add("decoding", "CacheDecoder", "cache", [("c", TypeError), (None, TypeError), (QuantizedKVCache, TypeError)],
    lambda w, o, v: CacheDecoder(w.model, v))
add("decoding", "CacheDecoder", "cache", [(k, ValueError) for k in other_caches],
    lambda w, o, v: CacheDecoder(w.model, other_caches[v](w)))
add("decoding", "CacheDecoder", "model", [("m", TypeError), (None, TypeError), ("other", ValueError), ("nan", ValueError)],
    lambda w, o, v: CacheDecoder(pick(w, v), QuantizedKVCache(w.cfg, 1)))
add("decoding", "CacheDecoder.__call__", "key_mask", [(torch.ones(2, 1, dtype=torch.bool), ValueError)],
    lambda w, o, v: CacheDecoder(w.model, o)(torch.ones(2, 1, dtype=torch.long), key_mask=v),
    lambda w: SinkCache(w.cfg, 2, sinks=1, window=3), evict_state)
add("decoding", "CacheDecoder", "cache", [(None, ValueError)],
    lambda w, o, v: CacheDecoder(w.model, o), _sink, evict_state, label="cache must be empty")


# ---- shrink_bench and the shrink view -----------------------------------------------------------------

def table(length=BLOCK, **changes):
    rows = [{"family": s.family, "setting": s.name, "label": s.label, "bytes_per_token": 4096.0 / (i + 1),
             "memory_cut": 1 - 1 / (i + 1), "nats_per_token": 4.0, "kl": i / 1000, "top1_agreement": 1.0}
            for i, s in enumerate(settings(BLOCK))]
    return {"texts": 4, "length": length, "full_bytes_per_token": 4096, "rows": rows, "papers": PAPERS,
            "config": asdict(TINY_SHAPE), **changes}  # the world's model


def _row(**changes):
    t = table()
    t["rows"][1] = t["rows"][1] | changes
    return t


BAD_TABLES = [(None, TypeError), ([], TypeError), ({}, TypeError), (table(rows=[]), TypeError), (table(rows="r"), TypeError),
              (table(texts=0), ValueError), (table(texts=2.0), TypeError), (table(length=8), ValueError),
              (table(full_bytes_per_token=NAN), ValueError), (_row(kl=NAN), ValueError), (_row(kl="0"), TypeError),
              (_row(memory_cut=INF), ValueError), (_row(label=5), TypeError), (table(rows=[1]), TypeError)]
add("shrink_bench", "format_table", "table", BAD_TABLES, lambda w, o, v: format_table(v))
add("shrink_bench", "settings", "length", no_none(bad_ints(16)), lambda w, o, v: settings(v))
add("shrink_bench", "converted", "spec", [(5, TypeError), (None, TypeError), ("pooled", ValueError), ("pooled:x", ValueError),
                                          ("pooled:0", ValueError), ("latent:", ValueError), ("gqa:2", ValueError),
                                          ("tang-bpe", ValueError), ("latent:-1", ValueError), ("pooled:２", ValueError)],
    lambda w, o, v: converted(w.model, v))
add("shrink_bench", "converted", "n_kv_head", [("pooled:3", ValueError), ("pooled:99", ValueError)],
    lambda w, o, v: converted(w.model, v))
add("shrink_bench", "converted", "rank", [("latent:33", ValueError), ("latent:999999", ValueError)],
    lambda w, o, v: converted(w.model, v))
add("shrink_bench", "converted", "model", [("m", TypeError), (None, TypeError)], lambda w, o, v: converted(v, "pooled:1"))
add("shrink_bench", "texts", "n_texts", bad_ints(1, shrink_bench.MAX_TEXTS), lambda w, o, v: texts(w.tok, v, 16))
add("shrink_bench", "texts", "length", bad_ints(16, shrink_bench.MAX_LENGTH), lambda w, o, v: texts(w.tok, 2, v))
add("shrink_bench", "texts", "tokenizer", [("t", TypeError), (None, TypeError)], lambda w, o, v: texts(v, 2, 16))
add("shrink_bench", "shrink_table", "length", bad_ints(16, BLOCK), lambda w, o, v: shrink_table(w.model, w.tok, 2, v))
add("shrink_bench", "shrink_table", "n_texts", bad_ints(1, shrink_bench.MAX_TEXTS),
    lambda w, o, v: shrink_table(w.model, w.tok, v, 16))
add("shrink_bench", "shrink_table", "model", [("m", TypeError), (None, TypeError)], lambda w, o, v: shrink_table(v, w.tok, 2, 16))
add("shrink_bench", "shrink_table", "tokenizer", [("other", ValueError), ("t", TypeError)],
    lambda w, o, v: shrink_table(w.other if v == "other" else w.model, w.tok if v == "other" else v, 2, 16))


def view(w, **kw):
    from kvlib.notebook.shrink_view import ShrinkView

    return ShrinkView(**{"model": w.model, "tokenizer": w.tok, "table": table(), "n_chars": 8, **kw})


add("shrink_view", "ShrinkView", "table", BAD_TABLES + [(table(length=BLOCK + 1), ValueError),
                                                        (_row(label="quantised: 3-bit"), ValueError)],
    lambda w, o, v: view(w, table=v))
add("shrink_view", "ShrinkView", "prompt", [(5, TypeError), (None, TypeError), (["春"], TypeError), (b"\xe6\x98\xa5", TypeError)],
    lambda w, o, v: view(w, prompt=v))
add("shrink_view", "ShrinkView", "prompt", [("春X", ValueError), ("夏", ValueError)], lambda w, o, v: view(w, prompt=v),
    label="vocabulary")
add("shrink_view", "ShrinkView", "n_chars", bad_ints(1, BLOCK - 3 + 1), lambda w, o, v: view(w, n_chars=v))
add("shrink_view", "ShrinkView", "seed", bad_ints(0, 2**63 - 1), lambda w, o, v: view(w, seed=v))
add("shrink_view", "ShrinkView", "model", [("m", TypeError), (None, TypeError), ("other", ValueError), ("nan", ValueError)],
    lambda w, o, v: view(w, model=pick(w, v)))
add("shrink_view", "ShrinkView", "tokenizer", [("t", TypeError), (None, TypeError)], lambda w, o, v: view(w, tokenizer=v))


# ---- the sweep ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world(tiny_gpt, tiny_char_tokenizer):
    return World(tiny_gpt, tiny_char_tokenizer)


@pytest.mark.parametrize("case", CASES, ids=[f"{i:03d}-{c.id}" for i, c in enumerate(CASES)])
def test_hostile_input_is_refused_clearly_and_changes_nothing(case, world):
    refused_clearly(case, world)


def test_a_refused_call_leaves_each_cache_giving_the_same_answers(world):
    """After refused calls, a cache decodes the next token exactly as an untouched twin does."""
    idx = torch.ones(2, 1, dtype=torch.long)
    for setup, run in ((_quant, lambda c: world.model(idx, cache=c)[0]), (_sink, lambda c: forward_with_cache(world.model, idx, c)[0]),
                       (_h2o, lambda c: forward_with_cache(world.model, idx, c)[0])):
        a, b = setup(world), setup(world)
        for bad in (lambda: a.write(0, chunk(fill=NAN), chunk()), lambda: a.advance(-1), lambda: a.truncate(99),
                    lambda: a.write(1, chunk(11), chunk(11))):
            with pytest.raises(ValueError):
                bad()
        with torch.inference_mode():
            assert torch.equal(run(a), run(b))


# ---- the command line ---------------------------------------------------------------------------

CLI_CASES = [("--texts", v) for v in ("0", "257", "-1", "x", "1.5", "", "1e3", "nan")] + \
            [("--length", v) for v in ("15", "129", "0", "nan", "x", "16.0", "-16", str(HUGE))] + \
            [("--json", "=1")]


@pytest.mark.parametrize("option, value", CLI_CASES, ids=[f"{o}={v}" for o, v in CLI_CASES])
def test_every_bad_shrink_option_exits_2_in_one_line_naming_it(option, value, capsys):
    argv = ["shrink", option + value] if value.startswith("=") else ["shrink", option, value]
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err and names(err, option), err


def test_the_command_lines_bounds_are_the_tools():
    assert cli.parse.MAX_TEXTS == shrink_bench.MAX_TEXTS
    assert cli.parse.SHRINK_LENGTHS == (shrink_bench.MIN_LENGTH, SHIPPED_SHAPE.block_size)


# ---- the count ----------------------------------------------------------------------------------

def test_case_count_per_module(capsys):
    counts = Counter(c.module for c in CASES) + Counter({"cli": len(CLI_CASES)})
    with capsys.disabled():
        print("\nhostile shrink cases per module: " + ", ".join(f"{m} {n}" for m, n in sorted(counts.items()))
              + f"; {sum(counts.values())} in all")
    assert sum(counts.values()) >= 150
    assert set(counts) == {"quantized", "evict", "compress", "quality", "decoding", "model", "shrink_bench", "shrink_view", "cli"}
