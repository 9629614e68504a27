"""Notebook 7's checks: the memory share of a paged pool, prefix hits."""
from __future__ import annotations

import math

from .harness import as_ints, brief, exact_case, number_case, sentences, stops_at_placeholder


@stops_at_placeholder
def check_memory_shares(fn, model, requests, sizes=(4, 8, 16, 32), kv_positions: int = 1024) -> bool:
    """``fn(kv_block_size) -> memory share``: ``requests`` served continuously in ``kv_positions`` positions
    cut into blocks of that size; compared with the engine's own count for each size."""
    from ...tools.serving_runs import run_continuous

    passed = True
    for size in sizes:
        want = run_continuous(model, requests, num_blocks=kv_positions // size, kv_block_size=size).memory_share
        hint = lambda got, want=want: (  # noqa: E731
            ". A share is a fraction of 1, not a percentage" if math.isclose(got, 100 * want, rel_tol=1e-6) else
            ". Close, but not the engine's count: it adds up, over every decode step, the positions reserved "
            "(read before finished sequences give their blocks back) and the tokens they hold, preempted and "
            "recomputed sequences included" if math.isclose(got, want, rel_tol=0.02) else "")
        passed &= number_case(fn, (size,), f"blocks of {size}", "share",
                               lambda got, want=want: math.isclose(got, want, rel_tol=1e-6),
                               f"memory share {100 * want:.1f} %", f"a memory share of {want:,.6g}", hint)
    return passed


@stops_at_placeholder
def check_prefix_hits(fn, model, prompts, sizes=(4, 8)) -> bool:
    """``fn(prompts, kv_block_size) -> list``: the prompt tokens each prompt finds in one pool with prefix
    caching, the prompts arriving one after another (each prefilled before the next arrives); for each of ``sizes``."""
    from ...paged import PagedKVCache

    passed = True
    for kv_block_size in sizes:
        pool, want = PagedKVCache(model.config, 256, kv_block_size=kv_block_size), []
        for i, p in enumerate(prompts):
            want.append(pool.add_sequence(i, p))
            pool.forward(model, [i], [p[want[-1]:]])

        def slip(found, got):
            if found is None or None in found:
                return f"expected {want}, got {brief(got)}"
            return f"expected {want}, got {found}" + sentences([
                "a prompt finds only what earlier prompts left in the pool: prefill each before adding the next"
                if found[:1] == want[:1] and all(g == 0 for g in found) else ""])
        passed &= exact_case(fn, (prompts, kv_block_size), f"{len(prompts)} prompts, blocks of {kv_block_size}", want,
                              as_ints, str, slip)
    return passed
