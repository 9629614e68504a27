"""Prefix caching measured: the same requests served with it off and on (counts, the same on every machine), and
one batched prefill of requests sharing a prefix, timed without and with it. Notebook 7's section on a class
sharing one couplet reads both.
"""
from __future__ import annotations

import torch

from ..model import GPT
from ..paged import KV_BLOCK_SIZE, PagedKVCache, ceil_div
from ..serving import StepClock
from .serve_bench import token_agreement
from .serving_runs import run_continuous
from .timing import Prepared, interleaved, verdict


def prefix_cache_report(model: GPT, requests: list, *, kv_block_size: int = KV_BLOCK_SIZE,
                        kv_positions: int = 1024) -> dict:
    """The same requests with prefix caching off and on: prefill tokens computed and prompt tokens found.

    Counts only: what the saving is worth in time is :func:`prefill_ms`'s, timed in interleaved rounds.

    The pool holds ``kv_positions`` positions (as many blocks of ``kv_block_size`` as fit), whatever the block size.
    Arrivals count in steps (a :class:`~kvlib.serving.StepClock`), so which requests share a prefill, and
    so what each finds in the pool, is the same on every machine.
    """
    num_blocks = max(kv_positions // kv_block_size, ceil_div(model.config.block_size, kv_block_size))

    def serve(**options):
        clock = StepClock()
        return run_continuous(model, requests, num_blocks, kv_block_size=kv_block_size, clock=clock,
                              on_step=lambda engine, record: clock.tick(), **options)

    off, on = serve(), serve(enable_prefix_caching=True)
    return {"requests": len(requests), "kv_block_size": kv_block_size,
            "prompt_tokens": sum(len(r.prompt) for r in requests),
            "prefill_tokens_without": off.prefill_tokens, "prefill_tokens_with": on.prefill_tokens,
            "prefix_hit_tokens": on.prefix_hit_tokens, **token_agreement(model, requests, [on], off),
            "preemptions": [off.preemptions, on.preemptions]}


@torch.inference_mode()
def prefill_ms(model: GPT, shared: list[int], suffixes: list[list[int]], repeats: int = 5) -> dict:
    """One batched prefill of requests that share a prefix, without and with prefix caching, in
    ``repeats`` interleaved rounds (:func:`kvlib.tools.timing.interleaved`): medians, spreads and the verdict.

    The first request (``shared + suffixes[0]``) is prefilled alone and fills the pool, untimed; the
    others (``shared + suffix`` each) are then prefilled together, in one forward, and timed: every
    prompt token without prefix caching, only what follows each one's cached full blocks with it.
    """
    prompts = [shared + s for s in suffixes]
    first, rest = prompts[0], prompts[1:]
    if not rest:
        raise ValueError("suffixes must hold at least two suffixes: one request fills the cache, the others hit it")
    blocks = sum(ceil_div(len(p), KV_BLOCK_SIZE) for p in prompts)
    sids = list(range(1, len(prompts)))
    computed = {}

    def prefill(use: bool) -> Prepared:
        def prepare():
            cache = PagedKVCache(model.config, blocks, enable_prefix_caching=use)
            cache.add_sequence(0, first)
            cache.forward(model, [0], [first])
            cached = [cache.add_sequence(i, p) for i, p in zip(sids, rest)]
            new = [p[c:] for p, c in zip(rest, cached)]
            computed[use] = sum(len(t) for t in new)
            return lambda: cache.forward(model, sids, new)
        return Prepared(prepare)

    timed = interleaved({"without": prefill(False), "with prefix caching": prefill(True)}, repeats, min_run_time=0.02)
    off, on = timed["without"], timed["with prefix caching"]
    return {"requests_timed": len(rest), "shared_tokens": len(shared), "prompt_tokens": sum(len(p) for p in rest),
            "computed_without": computed[False], "computed_with": computed[True],
            "ms_without": 1e3 * off.median, "ms_with": 1e3 * on.median,
            "spread_ms_without": (1e3 * off.low, 1e3 * off.high),
            "spread_ms_with": (1e3 * on.low, 1e3 * on.high), "verdict": verdict(on, off)}
