"""Hostile input to the newer modules: paged cache, serving, speculative decoding, stepper, fast path, widgets.

Every case calls one public entry point with one bad argument (a wrong type, a bool for an int, NaN or
inf, a negative or huge size, an empty list, a str for a list, an id outside the vocabulary, an
unknown sequence id, a tensor of the wrong shape or dtype) and checks three things: the exception
class (TypeError for a wrong type, ValueError for a wrong value, KeyError for an unknown key,
RuntimeError for a call the object's state refuses), that the message is one line naming the parameter
(``Case.param``: one name, matched as a whole word and case-sensitively; where no parameter is at fault,
the thing that is, such as ``sequence`` or ``pool``), and, where the call is a method, that the object is
exactly as it was before (pool free counts, block tables, engine queues, cache lengths, stepper steps,
generator states). A case never pins the wording, so a message can be reworded freely as long as it
keeps naming the parameter.

Everything runs on ``tiny_gpt`` (64 ids, a 16-token block) and ``tiny_char_tokenizer``. The last test
prints the number of cases per module (at the time of writing: paged 308, serving 195, traces 87, speculative 238,
stepper 71, fast 49, widgets 240; 1188 in all); the two-thread tests come after the sweep.
"""
from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from kvlib.fast import FastDecoder
from kvlib.model import GPT, GPTConfig
from kvlib.blocks import block_hash
from kvlib.paged import KVPool, PagedBatch, PagedKVCache
from kvlib.verify import verify_paged
from kvlib.tools.traces import class_trace, make_trace
from kvlib.serving import Engine, Request
from kvlib.tools.serving_runs import run_continuous, run_one_at_a_time, run_static_batching
from kvlib.paged import parallel_sample
from kvlib.speculative import (NeuralDraft, NgramDraft, SpeculativeDecoder, accept_greedy, accept_sampled,
                               expected_tokens_per_round, speculative_generate)
from kvlib.stepper import CacheStepper

V, BLOCK = 64, 16
NAN, INF = float("nan"), float("inf")
HUGE = 10**30
CHARS = "春风白日依山尽黄河入海流床前明月光疑是地上霜举头望低思故乡"


@dataclass
class Case:
    module: str
    entry: str
    param: str            # what the message must name: the parameter (or the thing) that was wrong
    exc: type
    call: Callable        # call(world) -> None; raises
    setup: Callable | None = None  # setup(world) -> an object whose state must not change
    state: Callable | None = None  # state(obj) -> a comparable snapshot
    label: str | None = None       # the id's third part where it is not param (ids kept from before)

    @property
    def id(self) -> str:
        return f"{self.module}:{self.entry}:{self.label or self.param}:{self.exc.__name__}"


class World:
    def __init__(self, model, tok):
        self.model, self.tok = model, tok
        self.poems = [f"{CHARS[i % 8:i % 8 + 5]}，{CHARS[8:13]}。{CHARS[13:18]}，{CHARS[18:23]}。" for i in range(6)]

    def ngram(self):
        return NgramDraft.from_ids(list(range(V)) * 2, V)


# ---- bad-value banks ----------------------------------------------------------------------------

def bad_ints(lo: int | None = None, hi: int | None = None, none_ok: bool = False):
    """(value, exception) pairs that an int parameter in [lo, hi] must refuse."""
    out = [(True, TypeError), (1.5, TypeError), ("3", TypeError), ([3], TypeError)]
    if not none_ok:
        out.append((None, TypeError))
    if lo is not None:
        out.append((lo - 1, ValueError))
        out.append((-HUGE, ValueError))
    if hi is not None:
        out.append((hi + 1, ValueError))
        out.append((HUGE, ValueError))
    return out


def bad_reals(lo_bad: float | None = None, hi_bad: float | None = None):
    out = [(NAN, ValueError), (INF, ValueError), (-INF, ValueError), ("0.5", TypeError), (True, TypeError),
           (None, TypeError), (1j, TypeError)]
    if lo_bad is not None:
        out.append((lo_bad, ValueError))
    if hi_bad is not None:
        out.append((hi_bad, ValueError))
    return out


def bad_id_lists(vocab: int = V, empty_ok: bool = False):
    out = [("春风", TypeError), (5, TypeError), (None, TypeError), ([1.5], TypeError), ([True], TypeError),
           ([-1], ValueError), ([vocab], ValueError), ([HUGE], ValueError), ([1, "2"], TypeError)]
    if not empty_ok:
        out.append(([], ValueError))
    return out


CASES: list[Case] = []


def add(module, entry, param, pairs, make_call, setup=None, state=None, label=None):
    for value, exc in pairs:
        CASES.append(Case(module, entry, param, exc,
                          (lambda v: lambda w, obj=None: make_call(w, obj, v))(value), setup, state, label))


# ---- state snapshots ----------------------------------------------------------------------------

def cache_state(cache: PagedKVCache):
    pool = cache.block_manager
    return (pool.num_free, list(pool.free_fresh), list(pool.free_cached), dict(pool.by_hash), pool.evictions,
            [(b.ref_count, b.hash, b.token_ids) for b in pool.blocks],
            {sid: (list(t.blocks), list(t.token_ids)) for sid, t in pool.tables.items()},
            cache.prefix_hit_tokens, cache.copies_on_write)


def engine_state(engine: Engine):
    return ([s.id for s in engine.waiting], [s.id for s in engine.running], [s.id for s in engine.finished],
            [list(s.output) for s in (*engine.waiting, *engine.running)], len(engine.history),
            cache_state(engine.cache))


def stepper_state(s: CacheStepper):
    return (s.steps, list(s.tokens), s.cache.length, s.settings, s._shown_settings, s.chosen,
            bytes(s.generator.get_state().tolist()), s.logits.clone().tolist())


def fast_state(d: FastDecoder):
    return d.cache.length, d.kv.clone()


def spec_state(d: SpeculativeDecoder):
    return (list(d.tokens), len(d.rounds), d.target.cache.length, d.stop_reason, d.gamma, d.settings)


def draft_state(d: NeuralDraft):
    return list(d.fed), d.decoder.cache.length


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool((a == b).all())
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


# ---- paged --------------------------------------------------------------------------------------

def _cache(w, prefix=True, blocks=8):
    cache = PagedKVCache(w.model.config, blocks, kv_block_size=4, enable_prefix_caching=prefix)
    cache.add_sequence(0, [1, 2, 3, 4, 5])
    cache.forward(w.model, [0], [[1, 2, 3, 4, 5]])
    cache.fork(0, 1)
    return cache


cfg = lambda w: w.model.config  # noqa: E731
for name, pairs in (("num_blocks", bad_ints(1, 2**22 // 4)), ("kv_block_size", bad_ints(1, BLOCK))):
    add("paged", "KVPool", name, pairs,
        lambda w, o, v, n=name: KVPool(cfg(w), **{"num_blocks": 4, "kv_block_size": 4, n: v}))
    add("paged", "PagedKVCache", name, pairs,
        lambda w, o, v, n=name: PagedKVCache(cfg(w), **{"num_blocks": 4, "kv_block_size": 4, n: v}))
for v, e in (("nope", ValueError), (5, TypeError), ([0], TypeError)):
    add("paged", "KVPool", "device", [(v, e)], lambda w, o, v: KVPool(cfg(w), 4, 4, device=v))
for v, e in ((torch.long, TypeError), ("float32", TypeError), (torch.bool, TypeError)):
    add("paged", "PagedKVCache", "dtype", [(v, e)], lambda w, o, v: PagedKVCache(cfg(w), 4, 4, dtype=v))
for v in ("config", {"vocab_size": 64}, None, 3):
    add("paged", "PagedKVCache", "config", [(v, TypeError)], lambda w, o, v: PagedKVCache(v, 4, 4))
add("paged", "PagedKVCache", "enable_prefix_caching", [(1, TypeError), ("yes", TypeError), (None, TypeError)],
    lambda w, o, v: PagedKVCache(cfg(w), 4, 4, enable_prefix_caching=v))

for entry in ("blocks_needed", "can_allocate"):
    add("paged", f"PagedKVCache.{entry}", "n_tokens", bad_ints(0), lambda w, o, v, e=entry: getattr(o, e)(v),
        _cache, cache_state)
add("paged", "PagedKVCache.add_sequence", "prompt", bad_id_lists() + [([1] * (BLOCK + 1), ValueError)],
    lambda w, o, v: o.add_sequence(7, v), _cache, cache_state)
add("paged", "PagedKVCache.add_sequence", "sid",
    [([1], TypeError), ({}, TypeError), (NAN, TypeError), (True, TypeError), (0.0, TypeError)],
    lambda w, o, v: o.add_sequence(v, [1, 2]), _cache, cache_state)
add("paged", "PagedKVCache.add_sequence", "sequence", [(0, ValueError), (1, ValueError)],
    lambda w, o, v: o.add_sequence(v, [1, 2]), _cache, cache_state, label="already")
add("paged", "PagedKVCache.table", "sequence", [(9, KeyError), ("0", KeyError), (None, KeyError)],
    lambda w, o, v: o.table(v), _cache, cache_state, label="no sequence")
add("paged", "PagedKVCache.table", "sid", [([0], TypeError), ({0: 1}, TypeError)],
    lambda w, o, v: o.table(v), _cache, cache_state)
add("paged", "PagedKVCache.fork", "sequence", [(9, KeyError), (-1, KeyError)],
    lambda w, o, v: o.fork(v, 5), _cache, cache_state, label="no sequence")
add("paged", "PagedKVCache.fork", "child", [([5], TypeError), (NAN, TypeError), (True, TypeError)],
    lambda w, o, v: o.fork(0, v), _cache, cache_state)
add("paged", "PagedKVCache.fork", "sequence", [(0, ValueError), (1, ValueError)],
    lambda w, o, v: o.fork(0, v), _cache, cache_state, label="already")
add("paged", "PagedKVCache.free", "sequence", [(9, KeyError), ("x", KeyError), (2.5, KeyError)],
    lambda w, o, v: o.free(v), _cache, cache_state, label="no sequence")
add("paged", "PagedKVCache.free", "sid", [([0], TypeError), (set(), TypeError)],
    lambda w, o, v: o.free(v), _cache, cache_state)
add("paged", "PagedKVCache.truncate", "n", bad_ints(0, 5), lambda w, o, v: o.truncate(0, v), _cache, cache_state)
add("paged", "PagedKVCache.truncate", "sequence", [(9, KeyError)], lambda w, o, v: o.truncate(v, 1), _cache,
    cache_state, label="no sequence")
add("paged", "PagedKVCache.slots_needed", "n_new", bad_ints(0), lambda w, o, v: o.slots_needed(0, v), _cache,
    cache_state)
for entry in ("batch", "forward"):
    call = (lambda e: (lambda o, w, s, t: o.batch(s, t)) if e == "batch" else
            (lambda o, w, s, t: o.forward(w.model, s, t)))(entry)
    add("paged", f"PagedKVCache.{entry}", "new_tokens[0]",
        [(v, e) for v, e in bad_id_lists() if v != 5 and v != "春风" and v is not None]
        + [("春风", TypeError), (None, TypeError), (5, TypeError)],
        lambda w, o, v, c=call: c(o, w, [0], [v]), _cache, cache_state)
    add("paged", f"PagedKVCache.{entry}", "sids", [("01", TypeError), (0, TypeError), (None, TypeError),
                                                   ([], ValueError), ([0, 0], ValueError), ([[0]], TypeError)],
        lambda w, o, v, c=call: c(o, w, v, [[1]] * (len(v) if isinstance(v, list) else 1)), _cache, cache_state)
    add("paged", f"PagedKVCache.{entry}", "new_tokens", [("1", TypeError), (1, TypeError), ([[1], [2]], ValueError)],
        lambda w, o, v, c=call: c(o, w, [0], v), _cache, cache_state)
    add("paged", f"PagedKVCache.{entry}", "sequence", [([9], KeyError), ([0, 9], KeyError)],
        lambda w, o, v, c=call: c(o, w, v, [[1]] * len(v)), _cache, cache_state, label="no sequence")
    add("paged", f"PagedKVCache.{entry}", "sequence", [(12, ValueError), (HUGE % 997 + 12, ValueError)],
        lambda w, o, v, c=call: c(o, w, [0, 1], [[1], [2] * v]), _cache, cache_state, label="block holds")
    add("paged", f"PagedKVCache.{entry}", "pool", [(11, RuntimeError), (4, RuntimeError)],
        lambda w, o, v, c=call: c(o, w, [0, 1], [[1] * v, [2] * v]), lambda w: _cache(w, blocks=4), cache_state,
        label="pool is full")
add("paged", "PagedKVCache.forward", "model", [("gpt", TypeError), (None, TypeError), (torch.nn.Linear(2, 2), TypeError)],
    lambda w, o, v: o.forward(v, [0], [[1]]), _cache, cache_state)
add("paged", "PagedKVCache.forward", "model", [(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32),
                                                ValueError)],
    lambda w, o, v: o.forward(GPT(v), [0], [[1]]), _cache, cache_state)

add("paged", "BlockManager.allocate", "pool", [(None, RuntimeError)],
    lambda w, o, v: o.block_manager.allocate(), lambda w: _full(w), cache_state, label="pool is full")


def _full(w):
    cache = PagedKVCache(w.model.config, 2, kv_block_size=4)
    cache.add_sequence(0, [1])
    cache.batch([0], [[1] * 8])
    return cache


for entry in ("share", "release"):
    add("paged", f"BlockManager.{entry}", "bid", bad_ints(0, 7), lambda w, o, v, e=entry: getattr(o.block_manager, e)(v),
        _cache, cache_state)
    add("paged", f"BlockManager.{entry}", "bid", [(7, ValueError)], lambda w, o, v, e=entry: getattr(o.block_manager, e)(v),
        _cache, cache_state)
add("paged", "BlockManager.register", "bid", bad_ints(0, 7) + [(7, ValueError)],
    lambda w, o, v: o.block_manager.register(v, 1, [1, 2, 3, 4]), _cache, cache_state)
add("paged", "BlockManager.register", "token_ids", [("1234", TypeError), (5, TypeError), (None, TypeError),
                                                 ([1.5] * 4, TypeError), ([True] * 4, TypeError), ([-1] * 4, ValueError), ([1, 2], ValueError), ([1] * 5, ValueError)],
    lambda w, o, v: o.block_manager.register(0, 1, v), _cache, cache_state)
add("paged", "BlockManager.register", "h", [("h", TypeError), (None, TypeError), (1.5, TypeError), (True, TypeError)],
    lambda w, o, v: o.block_manager.register(0, v, [1, 2, 3, 4]), _cache, cache_state)
add("paged", "BlockManager.lookup", "h", [("h", TypeError), (None, TypeError), ([1], TypeError)],
    lambda w, o, v: o.block_manager.lookup(v, [1, 2, 3, 4]), _cache, cache_state)
add("paged", "BlockManager.lookup", "token_ids", [("1234", TypeError), (1, TypeError), ([1] * 5, ValueError)],
    lambda w, o, v: o.block_manager.lookup(block_hash(None, [1, 2, 3, 4]), v), _cache, cache_state)
add("paged", "KVPool.copy", "src", bad_ints(0, 7), lambda w, o, v: o.pool.copy(v, 3), _cache, cache_state)
add("paged", "KVPool.copy", "dst", bad_ints(0, 7), lambda w, o, v: o.pool.copy(0, v), _cache, cache_state)

add("paged", "PagedBatch", "cache", [("cache", TypeError), (None, TypeError)],
    lambda w, o, v: PagedBatch(v, [0], [[1]]), _cache, cache_state)
add("paged", "PagedBatch", "sids", [((0,), ValueError), ([], ValueError), ("0", ValueError)],
    lambda w, o, v: PagedBatch(o, v, [[1]]), _cache, cache_state)
add("paged", "PagedBatch", "PagedKVCache.batch", [(8, ValueError)],
    lambda w, o, v: PagedBatch(o, [0], [[1] * v]), _cache, cache_state, label="no blocks reserved")
add("paged", "PagedBatch", "sequence", [(9, KeyError)], lambda w, o, v: PagedBatch(o, [v], [[1]]), _cache,
    cache_state, label="no sequence")


def _batch(w):
    cache = _cache(w)
    return cache, cache.batch([0, 1], [[1], [2, 3]])


def _batch_state(ob):
    return cache_state(ob[0]), ob[1].advanced


kv = lambda *shape, dtype=torch.float32: torch.zeros(*shape, dtype=dtype)  # noqa: E731
add("paged", "PagedBatch.write", "layer", bad_ints(0, 1),
    lambda w, o, v: o[1].write(v, kv(2, 2, 2, 16), kv(2, 2, 2, 16)), _batch, _batch_state)
add("paged", "PagedBatch.write", "k", [(kv(2, 2, 1, 16), ValueError), (kv(2, 2, 2, 16, dtype=torch.float64), TypeError),
                                       ([[0.0]], TypeError), (None, TypeError), (kv(2, 2, 2), ValueError)],
    lambda w, o, v: o[1].write(0, v, kv(2, 2, 2, 16)), _batch, _batch_state)
add("paged", "PagedBatch.write", "v", [(kv(1, 2, 2, 16), ValueError), ("v", TypeError)],
    lambda w, o, v: o[1].write(0, kv(2, 2, 2, 16), v), _batch, _batch_state)
add("paged", "PagedBatch.advance", "n", [(1, ValueError), (3, ValueError), (True, TypeError), (2.0, TypeError)],
    lambda w, o, v: o[1].advance(v), _batch, _batch_state)
add("paged", "PagedBatch.truncate", "n", bad_ints(0, 5), lambda w, o, v: o[1].truncate(v), _batch, _batch_state)

add("paged", "verify_paged", "steps", bad_ints(1, BLOCK - 3 + 1), lambda w, o, v: verify_paged(w.model, [[1, 2, 3]], v))
add("paged", "verify_paged", "prompts", [("春风", TypeError), ([], ValueError)], lambda w, o, v: verify_paged(w.model, v, 1),
    label="prompt")
add("paged", "verify_paged", "prompt", [([[]], ValueError), ([[1.5]], TypeError), ([[-1]], ValueError), ([[V]], ValueError),
                                        ([[1] * 17], ValueError)],
    lambda w, o, v: verify_paged(w.model, v, 1))
add("paged", "verify_paged", "num_blocks", [(0, ValueError), (1, ValueError), (True, TypeError), ("8", TypeError)],
    lambda w, o, v: verify_paged(w.model, [[1, 2, 3], [4, 5]], 4, num_blocks=v, kv_block_size=4))
add("paged", "verify_paged", "kv_block_size", bad_ints(1, BLOCK),
    lambda w, o, v: verify_paged(w.model, [[1]], 2, kv_block_size=v))
add("paged", "verify_paged", "atol", bad_reals(-1e-3), lambda w, o, v: verify_paged(w.model, [[1]], 2, atol=v))
add("paged", "verify_paged", "model", [("m", TypeError), (None, TypeError)], lambda w, o, v: verify_paged(v, [[1]], 2))


# ---- serving ------------------------------------------------------------------------------------

add("serving", "Request", "id", bad_ints(0), lambda w, o, v: Request(v, [1, 2], 3))
add("serving", "Request", "prompt", bad_id_lists(vocab=HUGE + 1)[:6] + [([], ValueError), ((), ValueError)],
    lambda w, o, v: Request(0, v, 3))
add("serving", "Request", "max_new_tokens", bad_ints(1), lambda w, o, v: Request(0, [1], v))
add("serving", "Request", "arrival", bad_reals(-0.5), lambda w, o, v: Request(0, [1], 3, v))

trace = lambda w, **kw: make_trace(w.tok, w.poems, **{"n_requests": 3, "block_size": BLOCK, "max_new_tokens": 4,  # noqa: E731
                                                      "prompt_chars": (4, 8), **kw})
for name, pairs in (("n_requests", bad_ints(1, 100_000)), ("max_new_tokens", bad_ints(1)),
                    ("seed", bad_ints(0, 2**64 - 1)), ("block_size", bad_ints(2))):
    add("traces", "make_trace", name, pairs, lambda w, o, v, n=name: trace(w, **{n: v}))
add("traces", "make_trace", "rate", bad_reals(0.0, -1.0), lambda w, o, v: trace(w, rate=v))
add("traces", "make_trace", "prompt_chars", [([4, 8], TypeError), ((4,), TypeError), ((4.0, 8), TypeError),
                                              ((0, 8), ValueError), ((8, 4), ValueError), ((True, 8), TypeError),
                                              ((4, 40), ValueError)],
    lambda w, o, v: trace(w, prompt_chars=v))
add("traces", "make_trace", "poems", [("春风", TypeError), (None, TypeError), ([], ValueError), ([1, 2], TypeError),
                                       (["a\ud800b"], ValueError), (["春风"], ValueError)],
    lambda w, o, v: make_trace(w.tok, v, 2, block_size=BLOCK, max_new_tokens=4, prompt_chars=(4, 8)))
add("traces", "make_trace", "tokenizer", [("tok", TypeError), (None, TypeError)],
    lambda w, o, v: make_trace(v, w.poems, 2))
add("traces", "class_trace", "n_requests", bad_ints(1, 100_000), lambda w, o, v: class_trace(w.tok, w.poems, "床前", v))
add("traces", "class_trace", "answer_tokens", bad_ints(1), lambda w, o, v: class_trace(w.tok, w.poems, "床前", 2, v))
add("traces", "class_trace", "gap", bad_reals(-1.0), lambda w, o, v: class_trace(w.tok, w.poems, "床前", 2, 3, v))
add("traces", "class_trace", "prefix", [(5, TypeError), (None, TypeError), (["床"], TypeError)],
    lambda w, o, v: class_trace(w.tok, w.poems, v))
add("traces", "class_trace", "poems", [("春风", TypeError), ([], ValueError), ([None], TypeError), (["春风"], ValueError)],
    lambda w, o, v: class_trace(w.tok, v, "床前"))

engine = lambda w, **kw: Engine(w.model, **{"num_blocks": 16, "kv_block_size": 4, **kw})  # noqa: E731
for name, pairs in (("num_blocks", bad_ints(4, 2**22 // 4)), ("kv_block_size", bad_ints(1, BLOCK)),
                    ("max_num_seqs", bad_ints(1)), ("max_num_batched_tokens", bad_ints(BLOCK))):
    add("serving", "Engine", name, pairs, lambda w, o, v, n=name: engine(w, **{n: v}))
add("serving", "Engine", "watermark", bad_reals(-0.1, 1.0), lambda w, o, v: engine(w, watermark=v))
add("serving", "Engine", "enable_prefix_caching", [(1, TypeError), ("no", TypeError), (None, TypeError)],
    lambda w, o, v: engine(w, enable_prefix_caching=v))
add("serving", "Engine", "clock", [(5, TypeError), ("clock", TypeError), (object(), TypeError)],
    lambda w, o, v: engine(w, clock=v))
add("serving", "Engine", "model", [("m", TypeError), (None, TypeError)], lambda w, o, v: Engine(v, 16))


def _engine(w):
    e = engine(w)
    e.add(Request(0, [1, 2, 3], 4))
    e.add(Request(1, [4, 5], 3))
    e.step()
    return e


add("serving", "Engine.add", "request", [((3, [1], 1), TypeError), ("r", TypeError), (None, TypeError),
                                         ({"id": 3}, TypeError)],
    lambda w, o, v: o.add(v), _engine, engine_state)


def _mutated(**kw):
    r = Request(5, [1, 2], 2)
    for k, v in kw.items():
        setattr(r, k, v)
    return r


add("serving", "Engine.add", "request", [(0, ValueError), (1, ValueError)],
    lambda w, o, v: o.add(Request(v, [1], 1)), _engine, engine_state, label="already in this engine")
add("serving", "Engine.add", "max_new_tokens", [(BLOCK, ValueError), (HUGE % 1009 + BLOCK, ValueError)],
    lambda w, o, v: o.add(Request(5, [1] * 3, v)), _engine, engine_state, label="block of 16")
add("serving", "Engine.add", "prompt", [(V, ValueError), (HUGE, ValueError)],
    lambda w, o, v: o.add(Request(5, [1, v], 1)), _engine, engine_state, label="token id")
add("serving", "Engine.add", "prompt", [("春风", TypeError), ([], ValueError), ([1.5], TypeError), ([-1], ValueError)],
    lambda w, o, v: o.add(_mutated(prompt=v)), _engine, engine_state)
add("serving", "Engine.add", "max_new_tokens", [(0, ValueError), (2.0, TypeError)],
    lambda w, o, v: o.add(_mutated(max_new_tokens=v)), _engine, engine_state)


def _finished_engine(w):
    e = engine(w)
    e.add(Request(0, [1], 1))
    e.step()
    return e


add("serving", "Engine.step", "Engine.step", [(None, RuntimeError)], lambda w, o, v: o.step(), _finished_engine,
    engine_state, label="no work")

reqs = lambda: [Request(0, [1, 2], 3), Request(1, [3], 2, 0.01)]  # noqa: E731
bad_requests = [("r", TypeError), (None, TypeError), ([], ValueError), ([(0, [1], 1)], TypeError),
                ([Request(0, [1], 1), Request(0, [2], 1)], ValueError)]
add("serving", "run_continuous", "requests", bad_requests,
    lambda w, o, v: run_continuous(w.model, v, 16, kv_block_size=4))
add("serving", "run_continuous", "num_blocks", bad_ints(4),
    lambda w, o, v: run_continuous(w.model, reqs(), v, kv_block_size=4))
add("serving", "run_continuous", "on_step", [(5, TypeError), ("print", TypeError)],
    lambda w, o, v: run_continuous(w.model, reqs(), 16, kv_block_size=4, on_step=v))
add("serving", "run_continuous", "max_new_tokens", [(BLOCK, ValueError)],
    lambda w, o, v: run_continuous(w.model, [Request(0, [1], v)], 16, kv_block_size=4), label="block of 16")
add("serving", "run_static_batching", "requests", bad_requests
    + [([Request(0, [1], BLOCK)], ValueError), ([Request(0, [V], 1)], ValueError)],
    lambda w, o, v: run_static_batching(w.model, v))
add("serving", "run_static_batching", "batch_size", bad_ints(1), lambda w, o, v: run_static_batching(w.model, reqs(), v))
add("serving", "run_static_batching", "model", [("m", TypeError)], lambda w, o, v: run_static_batching(v, reqs()))
add("serving", "run_one_at_a_time", "requests", bad_requests + [([Request(0, [1], BLOCK)], ValueError)],
    lambda w, o, v: run_one_at_a_time(w.model, v))

ps = lambda w, **kw: parallel_sample(w.model, **{"prompt": [0, 1, 2], "n": 2, "max_new_tokens": 3, **kw})  # noqa: E731
add("serving", "parallel_sample", "prompt", bad_id_lists() + [([1] * BLOCK, ValueError)], lambda w, o, v: ps(w, prompt=v))
add("serving", "parallel_sample", "n", bad_ints(1, 1024), lambda w, o, v: ps(w, n=v))
add("serving", "parallel_sample", "max_new_tokens", bad_ints(1, BLOCK - 3), lambda w, o, v: ps(w, max_new_tokens=v))
add("serving", "parallel_sample", "temperature", bad_reals(-1.0), lambda w, o, v: ps(w, temperature=v))
add("serving", "parallel_sample", "top_k", [(0, ValueError), (True, TypeError), ("4", TypeError)],
    lambda w, o, v: ps(w, top_k=v))
add("serving", "parallel_sample", "seed", bad_ints(0, 2**64 - 1), lambda w, o, v: ps(w, seed=v))
add("serving", "parallel_sample", "kv_block_size", bad_ints(1, BLOCK), lambda w, o, v: ps(w, kv_block_size=v))
add("serving", "parallel_sample", "banned", [("春", TypeError), (5, TypeError), ((V,), ValueError), ((1.5,), TypeError),
                                             (tuple(range(V)), ValueError)],
    lambda w, o, v: ps(w, banned=v))


# ---- speculative --------------------------------------------------------------------------------

add("speculative", "NgramDraft", "vocab_size", bad_ints(1), lambda w, o, v: NgramDraft({}, {}, 0, v))
add("speculative", "NgramDraft", "fallback", bad_ints(0, V - 1), lambda w, o, v: NgramDraft({}, {}, v, V))
add("speculative", "NgramDraft", "lookup", [(1, TypeError), ("yes", TypeError), (None, TypeError)],
    lambda w, o, v: NgramDraft({}, {}, 0, V, lookup=v))
for name in ("trigram", "bigram"):
    add("speculative", "NgramDraft", name, [([], TypeError), ("t", TypeError), ({1: "a"}, TypeError),
                                            ({1: V}, ValueError), ({-1: 2}, ValueError), ({1.5: 2}, TypeError)],
        lambda w, o, v, n=name: NgramDraft(**{"trigram": {}, "bigram": {}, n: v}, fallback=0, vocab_size=V))
add("speculative", "NgramDraft.from_ids", "ids", [("春风秋月", TypeError), (5, TypeError), ([1.5, 2.0, 3.0], TypeError),
                                                  (torch.ones(5), TypeError), ([True, False, True], TypeError),
                                                  ([1, 2], ValueError), ([[1, 2, 3]], ValueError), ([1, 2, V], ValueError),
                                                  ([-1, 2, 3], ValueError), (None, TypeError)],
    lambda w, o, v: NgramDraft.from_ids(v, V))
add("speculative", "NgramDraft.from_ids", "vocab_size", bad_ints(1, 2**31), lambda w, o, v: NgramDraft.from_ids([1, 2, 3], v))
add("speculative", "NgramDraft.copied", "seq", [("春风", TypeError), (5, TypeError), ([1.5], TypeError)],
    lambda w, o, v: NgramDraft.copied(v))
add("speculative", "NgramDraft.next_token", "b", bad_ints(0, V - 1), lambda w, o, v: w.ngram().next_token(None, v))
add("speculative", "NgramDraft.next_token", "a", [(v, e) for v, e in bad_ints(0, V - 1) if v is not None],
    lambda w, o, v: w.ngram().next_token(v, 1))
add("speculative", "NgramDraft.propose", "tokens", bad_id_lists(), lambda w, o, v: w.ngram().propose(v, 2))
add("speculative", "NgramDraft.propose", "gamma", bad_ints(0, 1024), lambda w, o, v: w.ngram().propose([1], v))
add("speculative", "NgramDraft.propose", "settings", [(None, TypeError), ((0.0,), TypeError), ("greedy", TypeError)],
    lambda w, o, v: w.ngram().propose([1], 2, v))
add("speculative", "NgramDraft.propose", "temperature", [((NAN, None, None), ValueError), ((-1.0, None, None), ValueError)],
    lambda w, o, v: w.ngram().propose([1], 2, v))
add("speculative", "NgramDraft.propose", "generator", [(5, TypeError), ("g", TypeError)],
    lambda w, o, v: w.ngram().propose([1], 2, generator=v))

add("speculative", "NeuralDraft", "model", [("m", TypeError), (None, TypeError)], lambda w, o, v: NeuralDraft(v))
add("speculative", "NeuralDraft", "name", [(5, TypeError), ("", TypeError), (["n"], TypeError)],
    lambda w, o, v: NeuralDraft(w.model, v))


def _neural(w):
    d = NeuralDraft(w.model)
    d.propose([0, 1, 2, 3, 4], 3)
    return d


add("speculative", "NeuralDraft.propose", "tokens", bad_id_lists(), lambda w, o, v: o.propose(v, 2), _neural, draft_state)
add("speculative", "NeuralDraft.propose", "gamma", bad_ints(0, 1024), lambda w, o, v: o.propose([0, 1], v), _neural,
    draft_state)
add("speculative", "NeuralDraft.propose", "top_p", [((1.0, None, 0.0), ValueError), ((1.0, None, NAN), ValueError),
                                                    ((1.0, None, "1"), TypeError)],
    lambda w, o, v: o.propose([0, 1], 2, v), _neural, draft_state)

logits = lambda n, v=V: torch.randn(n, v, generator=torch.Generator().manual_seed(0))  # noqa: E731
add("speculative", "accept_greedy", "drafted", [("12", TypeError), ([1.5], TypeError), ([V], ValueError), ([-1], ValueError),
                                                (None, TypeError)],
    lambda w, o, v: accept_greedy(v, logits(2)))
add("speculative", "accept_greedy", "target_logits", [(logits(3), ValueError), (logits(1), ValueError),
                                                      (torch.ones(2, V, dtype=torch.long), TypeError),
                                                      (torch.ones(V), TypeError), ([[0.0] * V] * 2, TypeError),
                                                      (torch.full((2, V), NAN), ValueError)],
    lambda w, o, v: accept_greedy([1], v))
probs = lambda n: torch.full((n, V), 1.0 / V)  # noqa: E731
add("speculative", "accept_sampled", "drafted", [("12", TypeError), ([V], ValueError), ([True], TypeError)],
    lambda w, o, v: accept_sampled(v, None, probs(2), None))
add("speculative", "accept_sampled", "p", [(probs(3), ValueError), (torch.ones(2, V), ValueError), (-probs(2), ValueError),
                                           (torch.full((2, V), NAN), ValueError), ("p", TypeError),
                                           (torch.ones(2, V, dtype=torch.long), TypeError)],
    lambda w, o, v: accept_sampled([1], None, v, None))
add("speculative", "accept_sampled", "q", [(probs(0), ValueError), (torch.ones(1, V), ValueError), ("q", TypeError),
                                           (torch.full((1, V + 1), 1.0 / (V + 1)), ValueError)],
    lambda w, o, v: accept_sampled([1], v, probs(2), None))
add("speculative", "accept_sampled", "generator", [(0, TypeError), ("g", TypeError)],
    lambda w, o, v: accept_sampled([1], None, probs(2), v))
add("speculative", "expected_tokens_per_round", "alpha", bad_reals(-0.1, 1.5), lambda w, o, v: expected_tokens_per_round(v, 4))
add("speculative", "expected_tokens_per_round", "gamma", bad_ints(0), lambda w, o, v: expected_tokens_per_round(0.5, v))

idx = lambda *ids: torch.tensor([list(ids or (0, 1, 2))])  # noqa: E731
spec = lambda w, **kw: SpeculativeDecoder(w.model, **{"draft": w.ngram(), "idx": idx(), "max_new_tokens": 4, **kw})  # noqa: E731
add("speculative", "SpeculativeDecoder", "gamma", bad_ints(1, BLOCK), lambda w, o, v: spec(w, gamma=v))
add("speculative", "SpeculativeDecoder", "max_new_tokens", bad_ints(0), lambda w, o, v: spec(w, max_new_tokens=v))
add("speculative", "SpeculativeDecoder", "temperature", bad_reals(-1.0), lambda w, o, v: spec(w, temperature=v))
add("speculative", "SpeculativeDecoder", "top_k", [(0, ValueError), (True, TypeError), (2.0, TypeError)],
    lambda w, o, v: spec(w, top_k=v))
add("speculative", "SpeculativeDecoder", "top_p", [(0.0, ValueError), (1.5, ValueError), (NAN, ValueError), ("1", TypeError)],
    lambda w, o, v: spec(w, top_p=v))
add("speculative", "SpeculativeDecoder", "generator", [(5, TypeError), ("g", TypeError)], lambda w, o, v: spec(w, generator=v))
add("speculative", "SpeculativeDecoder", "eos_id", bad_ints(0, V - 1, none_ok=True), lambda w, o, v: spec(w, eos_id=v))
add("speculative", "SpeculativeDecoder", "banned", [("春", TypeError), (5, TypeError), ([V], ValueError), ([1.5], TypeError),
                                                    (list(range(V)), ValueError), ([True], TypeError)],
    lambda w, o, v: spec(w, banned=v))
add("speculative", "SpeculativeDecoder", "draft", [("bigram", TypeError), (None, TypeError)], lambda w, o, v: spec(w, draft=v))
add("speculative", "SpeculativeDecoder", "draft", [(NgramDraft({}, {}, 0, 32), ValueError)], lambda w, o, v: spec(w, draft=v))
add("speculative", "SpeculativeDecoder", "idx", [([[0, 1]], TypeError), (torch.tensor([[0.0, 1.0]]), TypeError),
                                                 (torch.tensor([0, 1]), TypeError), (torch.zeros(2, 3, dtype=torch.long), ValueError),
                                                 (torch.zeros(1, 0, dtype=torch.long), ValueError),
                                                 (torch.tensor([[0, V]]), ValueError),
                                                 (torch.zeros(1, BLOCK + 1, dtype=torch.long), ValueError)],
    lambda w, o, v: spec(w, idx=v))
add("speculative", "SpeculativeDecoder", "model", [("m", TypeError), (None, TypeError)],
    lambda w, o, v: SpeculativeDecoder(v, w.ngram(), idx(), 4))


def _spent(w):
    d = spec(w, max_new_tokens=2)
    while not d.done:
        d.round()
    return d


add("speculative", "SpeculativeDecoder.round", "SpeculativeDecoder", [(None, RuntimeError)],
    lambda w, o, v: o.round(), _spent, spec_state, label="decoding has stopped")
add("speculative", "speculative_generate", "on_context_limit", [("crop", ValueError), (1, TypeError), (None, TypeError)],
    lambda w, o, v: speculative_generate(w.model, w.ngram(), idx(), 2, on_context_limit=v))
add("speculative", "speculative_generate", "gamma", bad_ints(1, BLOCK),
    lambda w, o, v: speculative_generate(w.model, w.ngram(), idx(), 2, gamma=v))


class BadDraft(NgramDraft):
    def propose(self, tokens, gamma, settings=(0.0, None, None), generator=None):
        return [V + 5] * gamma, None


def _spec_bad_draft(w):
    d = spec(w, temperature=1.0, generator=torch.Generator().manual_seed(3), max_new_tokens=8)
    d.round()
    d.draft = BadDraft({}, {}, 0, V)
    return d


add("speculative", "SpeculativeDecoder.round", "draft", [(None, ValueError)],
    lambda w, o, v: o.round(), _spec_bad_draft, lambda d: (spec_state(d), bytes(d.generator.get_state().tolist())),
    label="the draft's guesses")


# ---- stepper ------------------------------------------------------------------------------------

stepper = lambda w, **kw: CacheStepper(w.model, w.tok, **{"prompt": "春风", **kw})  # noqa: E731
add("stepper", "CacheStepper", "temperature", bad_reals(-0.5), lambda w, o, v: stepper(w, temperature=v))
add("stepper", "CacheStepper", "top_k", [(0, ValueError), (True, TypeError), ("3", TypeError)], lambda w, o, v: stepper(w, top_k=v))
add("stepper", "CacheStepper", "top_p", [(0.0, ValueError), (NAN, ValueError), ("1", TypeError)], lambda w, o, v: stepper(w, top_p=v))
add("stepper", "CacheStepper", "seed", bad_ints(0, 2**64 - 1), lambda w, o, v: stepper(w, seed=v))
add("stepper", "CacheStepper", "top", bad_ints(1, V), lambda w, o, v: stepper(w, top=v))
add("stepper", "CacheStepper", "max_len", [(v, e) for v, e in bad_ints(1, BLOCK) if v is not None], lambda w, o, v: stepper(w, max_len=v))
add("stepper", "CacheStepper", "prompt", [(5, TypeError), (["春"], TypeError), (None, TypeError), (b"x", TypeError),
                                          ("a\ud800", ValueError), ("春" * BLOCK, ValueError)],
    lambda w, o, v: stepper(w, prompt=v))
add("stepper", "CacheStepper", "model", [("m", TypeError), (None, TypeError)], lambda w, o, v: CacheStepper(v, w.tok, "春"))
add("stepper", "CacheStepper", "tokenizer", [("t", TypeError), (None, TypeError)], lambda w, o, v: CacheStepper(w.model, v, "春"))


def _stepper(w):
    s = stepper(w, seed=5)
    s.step()
    return s


def _full_stepper(w):
    s = stepper(w, max_len=4)
    while s.can_step:
        s.step()
    return s


add("stepper", "CacheStepper.set_sampling", "temperature", [(v, e) for v, e in bad_reals(-0.5) if v is not None],
    lambda w, o, v: o.set_sampling(temperature=v), _stepper, stepper_state)
add("stepper", "CacheStepper.set_sampling", "top_k", [(0, ValueError), (True, TypeError), (1.5, TypeError)],
    lambda w, o, v: o.set_sampling(top_k=v), _stepper, stepper_state)
add("stepper", "CacheStepper.set_sampling", "top_p", [(0.0, ValueError), (2.0, ValueError), ("x", TypeError)],
    lambda w, o, v: o.set_sampling(1.0, 3, v), lambda w: stepper(w), stepper_state)
add("stepper", "CacheStepper.run", "n", bad_ints(0), lambda w, o, v: o.run(v), _stepper, stepper_state)
add("stepper", "CacheStepper.step", "cache", [(None, ValueError)], lambda w, o, v: o.step(), _full_stepper,
    stepper_state, label="cache is full")


# ---- fast ---------------------------------------------------------------------------------------

add("fast", "FastDecoder", "batch_size", [(v, e) for v, e in bad_ints(1, 2**31 // (2 * 2 * 32 * BLOCK))], lambda w, o, v: FastDecoder(w.model, v))
add("fast", "FastDecoder", "max_len", [(v, e) for v, e in bad_ints(1, BLOCK) if v is not None],
    lambda w, o, v: FastDecoder(w.model, 1, v))
add("fast", "FastDecoder", "model", [("m", TypeError), (None, TypeError)], lambda w, o, v: FastDecoder(v, 1))


def _fast(w):
    d = FastDecoder(w.model, 2, 8)
    d(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    return d


bad_idx = [([[1], [2]], TypeError), (torch.tensor([[1.0], [2.0]]), TypeError), (torch.tensor([1, 2]), TypeError),
           (torch.tensor([[True], [False]]), TypeError), (torch.zeros(2, 0, dtype=torch.long), ValueError),
           (torch.tensor([[1], [V]]), ValueError), (torch.tensor([[-1], [0]]), ValueError),
           (torch.tensor([[1]]), ValueError), (torch.zeros(3, 1, dtype=torch.long), ValueError),
           (torch.zeros(2, 6, dtype=torch.long), ValueError), (None, TypeError)]
add("fast", "FastDecoder.__call__", "idx", bad_idx, lambda w, o, v: o(v), _fast, fast_state)
add("fast", "FastDecoder.extend", "idx", bad_idx, lambda w, o, v: o.extend(v), _fast, fast_state)
add("fast", "FastDecoder.__call__", "key_mask", [([[True] * 4] * 2, TypeError), (torch.ones(2, 3, dtype=torch.bool), ValueError),
                                                 (torch.ones(1, 4, dtype=torch.bool), ValueError)],
    lambda w, o, v: o(torch.tensor([[1], [2]]), key_mask=v), _fast, fast_state)
add("fast", "FastDecoder.__call__", "position_ids", [([[3]], TypeError), (torch.tensor([[3.0], [3.0]]), ValueError),
                                                     (torch.tensor([[-1], [3]]), ValueError),
                                                     (torch.tensor([[3, 4], [3, 4]]), ValueError),
                                                     (torch.tensor([[BLOCK], [3]]), ValueError)],
    lambda w, o, v: o(torch.tensor([[1], [2]]), position_ids=v), _fast, fast_state)


# ---- widgets ------------------------------------------------------------------------------------

def widgets():
    from kvlib.notebook import acrostic_writer, cache_stepper, memory_calculator, next_character, sampling_explorer
    from kvlib.notebook import serving_view, speculative_view
    return dict(next=next_character, explore=sampling_explorer, acrostic=acrostic_writer, stepper=cache_stepper,
                memory=memory_calculator, serving=serving_view, spec=speculative_view)


W = widgets
add("widgets", "next_view", "k", bad_ints(1, V), lambda w, o, v: W()["next"].next_view(w.model, w.tok, "春", v))
add("widgets", "next_view", "text", [(5, TypeError), (None, TypeError), (["春"], TypeError)],
    lambda w, o, v: W()["next"].next_view(w.model, w.tok, v))
add("widgets", "next_view", "tokenizer", [("t", TypeError)], lambda w, o, v: W()["next"].next_view(w.model, v, "春"))
add("widgets", "PromptBox", "k", bad_ints(3, 20), lambda w, o, v: W()["next"].PromptBox(w.model, w.tok, "春", v))
add("widgets", "PromptBox", "text", [(5, TypeError), (None, TypeError)], lambda w, o, v: W()["next"].PromptBox(w.model, w.tok, v))
add("widgets", "PromptBox", "model", [("m", TypeError)], lambda w, o, v: W()["next"].PromptBox(v, w.tok))

ex = lambda w, **kw: W()["explore"].explore(w.model, w.tok, **{"prompt": "春", "n_chars": 4, "n_bars": 4, **kw})  # noqa: E731
add("widgets", "explore", "n_chars", bad_ints(1, BLOCK), lambda w, o, v: ex(w, n_chars=v))
add("widgets", "explore", "n_bars", bad_ints(1, V), lambda w, o, v: ex(w, n_bars=v))
add("widgets", "explore", "seed", bad_ints(0, 2**63 - 1), lambda w, o, v: ex(w, seed=v))
add("widgets", "explore", "temperature", [(v, e) for v, e in bad_reals(-1.0, 101.0) if v != 1j], lambda w, o, v: ex(w, temperature=v))
add("widgets", "explore", "top_k", [("0", TypeError), (True, TypeError), (2.5, TypeError), (0, ValueError), (-1, ValueError), (V + 1, ValueError)],
    lambda w, o, v: ex(w, top_k=v))
add("widgets", "explore", "top_p", [("1", TypeError), (True, TypeError), (0.0, ValueError), (NAN, ValueError), (1.5, ValueError)],
    lambda w, o, v: ex(w, top_p=v))
add("widgets", "explore", "prompt", [(5, TypeError), (["春"], TypeError)], lambda w, o, v: ex(w, prompt=v))
sx = lambda w, **kw: W()["explore"].SliderExplorer(w.model, w.tok, **{"n_chars": 4, "n_bars": 4, **kw})  # noqa: E731
for name, pairs in (("temperature", [(2.5, ValueError), ("1", TypeError), (NAN, ValueError)]),
                    ("top_k", [(101, ValueError), (0, ValueError), (1.5, TypeError), (True, TypeError)]),
                    ("top_p", [(0.0, ValueError), (None, TypeError)]), ("seed", [(100, ValueError), (-1, ValueError)]),
                    ("n_chars", [(0, ValueError), (BLOCK + 1, ValueError), ("4", TypeError)]),
                    ("n_bars", [(0, ValueError), (V + 1, ValueError)]), ("prompt", [(5, TypeError), (None, TypeError)])):
    add("widgets", "SliderExplorer", name, pairs, lambda w, o, v, n=name: sx(w, **{n: v}))

av = lambda w, **kw: W()["acrostic"].acrostic_view(w.model, w.tok, **{"heads": "春风", "chars_per_line": 5, **kw})  # noqa: E731
add("widgets", "acrostic_view", "chars_per_line", [(6, ValueError), (5.0, TypeError), (True, TypeError), ("5", TypeError)],
    lambda w, o, v: av(w, chars_per_line=v))
add("widgets", "acrostic_view", "temperature", [(v, e) for v, e in bad_reals(-1.0) if v != 1j], lambda w, o, v: av(w, temperature=v))
add("widgets", "acrostic_view", "seed", bad_ints(0, 2**63 - 1), lambda w, o, v: av(w, seed=v))
add("widgets", "acrostic_view", "heads", [(5, TypeError), (["春"], TypeError), (None, TypeError)], lambda w, o, v: av(w, heads=v))
aw = lambda w, **kw: W()["acrostic"].AcrosticWriter(w.model, w.tok, **{"heads": "春风", "chars_per_line": 5, **kw})  # noqa: E731
add("widgets", "AcrosticWriter", "chars_per_line", [(6, ValueError), (7.0, TypeError), (False, TypeError)],
    lambda w, o, v: aw(w, chars_per_line=v))
add("widgets", "AcrosticWriter", "temperature", [(0.0, ValueError), (2.0, ValueError), ("x", TypeError)],
    lambda w, o, v: aw(w, temperature=v))
add("widgets", "AcrosticWriter", "seed", [(2001, ValueError), (-1, ValueError), (1.5, TypeError)], lambda w, o, v: aw(w, seed=v))
add("widgets", "AcrosticWriter", "heads", [(5, TypeError), (None, TypeError)], lambda w, o, v: aw(w, heads=v))
sw = lambda w, **kw: W()["stepper"].StepperWidget(w.model, w.tok, **{"prompt": "春风", **kw})  # noqa: E731
add("widgets", "StepperWidget", "temperature", [(v, e) for v, e in bad_reals(-1.0, 5.0) if v != 1j],
    lambda w, o, v: sw(w, temperature=v))
add("widgets", "StepperWidget", "seed", bad_ints(0, 2**64 - 1), lambda w, o, v: sw(w, seed=v))
add("widgets", "StepperWidget", "prompt", [(5, TypeError), (None, TypeError), (["春"], TypeError)], lambda w, o, v: sw(w, prompt=v))
add("widgets", "StepperWidget", "tokenizer", [("t", TypeError)], lambda w, o, v: W()["stepper"].StepperWidget(w.model, v))
mc = lambda w, **kw: W()["memory"].MemoryCalculator(**kw)  # noqa: E731
add("widgets", "MemoryCalculator", "model", [(["GPT-2 small"], TypeError), (None, TypeError), ("GPT-9", ValueError)],
    lambda w, o, v: mc(w, model=v))
add("widgets", "MemoryCalculator", "batch", bad_ints(1, 256), lambda w, o, v: mc(w, batch=v))
add("widgets", "MemoryCalculator", "tokens", [(1024.0, TypeError), (True, TypeError), (1000, ValueError), ("1024", TypeError),
                                              (-1, ValueError)],
    lambda w, o, v: mc(w, tokens=v))
add("widgets", "MemoryCalculator", "dtype", [(torch.float32, TypeError), ("float99", ValueError), (["bfloat16"], TypeError)],
    lambda w, o, v: mc(w, dtype=v))
add("widgets", "MemoryCalculator", "extra", [([1], TypeError), ({"x": 1}, TypeError), ("x", TypeError)],
    lambda w, o, v: mc(w, extra=v))
sv = lambda w, **kw: W()["serving"].ServingView(w.model, **{"requests": reqs(), "kv_block_size": 4, **kw})  # noqa: E731
add("widgets", "ServingView", "requests", bad_requests, lambda w, o, v: sv(w, requests=v))
add("widgets", "ServingView", "num_blocks", bad_ints(4), lambda w, o, v: sv(w, num_blocks=v))
add("widgets", "ServingView", "kv_block_size", bad_ints(1, BLOCK), lambda w, o, v: sv(w, kv_block_size=v))
add("widgets", "ServingView", "max_num_seqs", bad_ints(1), lambda w, o, v: sv(w, max_num_seqs=v))
add("widgets", "ServingView", "enable_prefix_caching", [(1, TypeError), (None, TypeError)],
    lambda w, o, v: sv(w, enable_prefix_caching=v))
add("widgets", "ServingView", "start_steps", bad_ints(0), lambda w, o, v: sv(w, start_steps=v))
add("widgets", "ServingView", "max_new_tokens", [(BLOCK, ValueError)], lambda w, o, v: sv(w, requests=[Request(0, [1], v)]),
    label="block of 16")
spv = lambda w, **kw: W()["spec"].SpeculativeView(w.model, w.tok, **{"drafts": {"n": w.ngram()}, "max_new_tokens": 4, **kw})  # noqa: E731
add("widgets", "SpeculativeView", "drafts", [({}, ValueError), ([1], TypeError), ({"n": 5}, TypeError), ({1: None}, TypeError),
                                             (None, TypeError)],
    lambda w, o, v: spv(w, drafts=v))
add("widgets", "SpeculativeView", "gamma", bad_ints(1, 8), lambda w, o, v: spv(w, gamma=v))
add("widgets", "SpeculativeView", "max_new_tokens", bad_ints(1, BLOCK), lambda w, o, v: spv(w, max_new_tokens=v))
add("widgets", "SpeculativeView", "start_rounds", bad_ints(0), lambda w, o, v: spv(w, start_rounds=v))
add("widgets", "SpeculativeView", "prompt", [(5, TypeError), (None, TypeError)], lambda w, o, v: spv(w, prompt=v))
add("widgets", "SpeculativeView", "tokenizer", [("t", TypeError)],
    lambda w, o, v: W()["spec"].SpeculativeView(w.model, v, {"n": w.ngram()}))


# ---- the sweep ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world(tiny_gpt, tiny_char_tokenizer):
    return World(tiny_gpt, tiny_char_tokenizer)


@pytest.mark.parametrize("case", CASES, ids=[f"{i:03d}-{c.id}" for i, c in enumerate(CASES)])
def test_hostile_input_is_refused_clearly_and_changes_nothing(case, world):
    refused_clearly(case, world)


def names(message: str, param: str) -> bool:
    """Whether ``message`` holds ``param`` as a whole name (not inside a longer one), case-sensitively."""
    return re.search(r"(?<![\w-])" + re.escape(param) + r"(?![\w-])", message) is not None


def refused_clearly(case: Case, world) -> None:
    """The case's call raises its class (a ValueError may be a subclass), with a one-line message naming
    the parameter, and leaves the object's state as it was. The wording is not checked."""
    obj = case.setup(world) if case.setup else None
    before = case.state(obj) if case.state else None
    with pytest.raises(case.exc) as info:
        case.call(world, obj)
    assert type(info.value) is case.exc or (case.exc is ValueError and isinstance(info.value, ValueError)), \
        f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    assert names(message, case.param), f"the message does not name {case.param!r}: {message}"
    assert "\n" not in message.strip()
    if case.state:
        assert same(case.state(obj), before), "a refused call changed the object's state"


def test_a_refused_call_leaves_the_object_usable(world):
    """After a burst of refused calls, the cache, engine and decoders still give the same answers."""
    cache = _cache(world)
    for bad in ([9], [0, 0]):
        with pytest.raises((KeyError, ValueError)):
            cache.forward(world.model, bad, [[1]] * len(bad))
    fresh = _cache(world)
    assert torch.equal(cache.forward(world.model, [0, 1], [[7], [8]]), fresh.forward(world.model, [0, 1], [[7], [8]]))
    s, t = _stepper(world), _stepper(world)
    with pytest.raises(ValueError):
        s.set_sampling(top_p=0.0)
    assert s.run(3) == t.run(3)


def test_the_batch_check_counts_copies_on_write_exactly(world):
    """n forks writing into one shared, partly filled block take n - 1 copies: a pool of exactly that fits."""
    cache = PagedKVCache(world.model.config, 4, kv_block_size=4)
    cache.add_sequence(0, [1, 2])
    cache.forward(world.model, [0], [[1, 2]])
    for child in (1, 2, 3):
        cache.fork(0, child)
    assert cache.num_free_blocks == 3
    cache.forward(world.model, [0, 1, 2, 3], [[5]] * 4)
    assert cache.num_free_blocks == 0 and cache.copies_on_write == 3


# ---- two threads --------------------------------------------------------------------------------

def _second_thread_is_refused(obj, inner: str, call_first, call_second, match: str):
    original = getattr(obj, inner)
    inside, release = threading.Event(), threading.Event()

    def slow(*args, **kwargs):
        inside.set()
        release.wait(5)
        return original(*args, **kwargs)

    setattr(obj, inner, slow)
    errors = []
    first = threading.Thread(target=lambda: errors.append(None) if call_first() is None else None)
    first.start()
    assert inside.wait(5)
    try:
        with pytest.raises(RuntimeError, match=match):
            call_second()
    finally:
        release.set()
        first.join(10)
        setattr(obj, inner, original)
    call_second()  # one at a time works again


def test_two_threads_on_one_speculative_decoder_are_refused(world):
    d = spec(world, max_new_tokens=8)
    _second_thread_is_refused(d.target, "extend", d.round, d.round, "SpeculativeDecoder.round")


def test_two_threads_on_one_cache_stepper_are_refused(world):
    s = stepper(world)
    _second_thread_is_refused(s, "_feed", s.step, s.step, "CacheStepper.step")
    _second_thread_is_refused(s, "_feed", s.step, lambda: s.set_sampling(0.5), "CacheStepper.set_sampling")
    _second_thread_is_refused(s, "_feed", s.step, s.reset, "CacheStepper.reset")


def test_two_threads_on_one_fast_decoder_are_refused(world):
    d = FastDecoder(world.model, 1, 16)
    d(torch.tensor([[1, 2]]))
    _second_thread_is_refused(d, "_check", lambda: d(torch.tensor([[3]])), lambda: d(torch.tensor([[4]])),
                              "FastDecoder.__call__")
    _second_thread_is_refused(d, "_check", lambda: d.extend(torch.tensor([[3, 4]])), lambda: d.extend(torch.tensor([[5]])),
                              "FastDecoder.extend")


def test_two_threads_adding_to_one_engine_are_refused(world):
    e = engine(world)
    e.add(Request(0, [1, 2], 3))
    _second_thread_is_refused(e, "schedule", e.step, lambda: e.add(Request(1, [1], 1)), "Engine.add")


def test_a_guarded_method_may_call_another_of_the_same_object_in_one_thread():
    from kvlib.guards import one_thread_at_a_time

    class Twice:
        @one_thread_at_a_time
        def outer(self):
            return self.inner() + 1

        @one_thread_at_a_time
        def inner(self):
            return 1

    assert Twice().outer() == 2


# ---- the count ----------------------------------------------------------------------------------

def test_case_count_per_module(capsys):
    counts = Counter(c.module for c in CASES)
    with capsys.disabled():
        print("\nhostile cases per module: " + ", ".join(f"{m} {n}" for m, n in sorted(counts.items()))
              + f"; {len(CASES)} in all")
    assert len(CASES) >= 450
    assert set(counts) == {"paged", "serving", "traces", "speculative", "stepper", "fast", "widgets"}
    assert min(counts.values()) >= 30
