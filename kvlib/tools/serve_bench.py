"""``python -m kvlib serve``: one trace served three ways, side by side in one run, and a decode step timed.

The three ways get the same requests at the same arrival times and write the same greedy tokens
(the report says whether they did). Continuous batching gets the KV memory the static batch
reserves (``batch_size`` rows of ``block_size`` positions), cut into blocks of 16 and, in a fourth
run, of 8. The runs take turns ``repeats`` times and each way keeps its fastest run: on a shared
machine the slower ones include waiting for a core, and taking turns spreads a change of load over
all of them. The targets are printed beside this machine's measurement, never asserted: timings
move from run to run.
"""
from __future__ import annotations

import time

import torch

from ..model import GPT
from ..paged import BLOCK_SIZE, PagedKVCache, ceil_div
from ..serving import (RunResult, make_trace, run_continuous, run_one_at_a_time,
                       run_static_batching)
from ..timing import machine, percentile, threads

SMALL_BLOCK = 8  # the fourth run's block size: less of the last block left empty

# What the notebook and the paper lead one to expect (printed against, never asserted).
TARGETS = {
    "continuous_vs_static_tokens_per_s": 2.0,    # at least
    "continuous_vs_one_at_a_time_tokens_per_s": 5.0,
    "paged_memory_share": 0.90,                  # at least (vLLM paper: about 96 %)
    "paged_memory_share_block_8": 0.90,
    "static_memory_share": 0.40,                 # at most (the paper: earlier servers 20-38 %)
    "paged_vs_static_decode_step": 1.5,          # at most
}


def summarize(run: RunResult) -> dict:
    lat, ttft = run.latencies(), run.ttfts()
    return {"name": run.name, "generated_tokens": run.generated, "seconds": run.makespan,
            "tokens_per_s": run.tokens_per_s,
            "mean_latency_s": sum(lat) / len(lat), "p95_latency_s": percentile(lat, 95),
            "mean_ttft_s": sum(ttft) / len(ttft), "p95_ttft_s": percentile(ttft, 95),
            "memory_share": run.memory_share, "forward_passes": run.steps,
            "computed_tokens": run.computed_tokens, "preemptions": run.preemptions}


@torch.inference_mode()
def decode_step_ms(model: GPT, batch_size: int = 8, context: int = 64, steps: int = 16, repeats: int = 5,
                   seed: int = 0) -> dict:
    """Median milliseconds of one decode step at equal batch: the static ``KVCache`` against the paged cache."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (batch_size, context), generator=gen)
    step_tokens = torch.randint(0, model.config.vocab_size, (batch_size, 1), generator=gen)
    sids = list(range(batch_size))
    static, paged = [], []
    for _ in range(repeats):
        cache = model.new_cache(batch_size)
        model(prompt, cache=cache, last_only=True)
        t = time.perf_counter()
        for _ in range(steps):
            model(step_tokens, cache=cache, last_only=True)
        static.append((time.perf_counter() - t) / steps)

        blocks = batch_size * ceil_div(context + steps, BLOCK_SIZE)
        pc = PagedKVCache(model.config, blocks, enable_prefix_caching=False)
        for s in sids:
            pc.add_sequence(s, prompt[s].tolist())
        pc.forward(model, sids, prompt.tolist())
        new = step_tokens.tolist()
        t = time.perf_counter()
        for _ in range(steps):
            pc.forward(model, sids, new)
        paged.append((time.perf_counter() - t) / steps)
    s, p = 1e3 * sorted(static)[repeats // 2], 1e3 * sorted(paged)[repeats // 2]
    return {"batch_size": batch_size, "context": context, "static_ms": s, "paged_ms": p, "ratio": p / s}


def run_serve_bench(model: GPT, tokenizer, poems: list[str], *, n_requests: int = 64, rate: float = 100.0,
                    seed: int = 0, batch_size: int = 8, max_num_seqs: int = 32, max_new_tokens: int = 64,
                    repeats: int = 3, runs: dict | None = None) -> dict:
    """The side-by-side report (JSON-able), on one thread. ``runs`` may pass results already computed on this trace."""
    with threads(1):  # fastest at this size, and a busy second core makes every step wait
        return _report(model, tokenizer, poems, n_requests, rate, seed, batch_size, max_num_seqs, max_new_tokens,
                       repeats, runs)


def fastest_runs(ways: dict, repeats: int) -> dict[str, RunResult]:
    """Run every way ``repeats`` times, taking turns; keep each way's run with the shortest makespan."""
    best: dict[str, RunResult] = {}
    for _ in range(repeats):
        for name, run in ways.items():
            result = run()
            if name not in best or result.makespan < best[name].makespan:
                best[name] = result
    return best


def _report(model, tokenizer, poems, n_requests, rate, seed, batch_size, max_num_seqs, max_new_tokens, repeats,
            runs):
    trace = make_trace(tokenizer, poems, n_requests, rate, seed, max_new_tokens=max_new_tokens)
    block = model.config.block_size
    num_blocks = batch_size * block // BLOCK_SIZE  # the static batch's memory, in blocks
    if runs is None:
        ways = {"one_at_a_time": lambda: run_one_at_a_time(model, trace),
                "static": lambda: run_static_batching(model, trace, batch_size),
                "continuous": lambda: run_continuous(model, trace, num_blocks, max_num_seqs=max_num_seqs),
                "continuous_block_8": lambda: run_continuous(model, trace, batch_size * block // SMALL_BLOCK,
                                                             block_size=SMALL_BLOCK, max_num_seqs=max_num_seqs)}
        runs = fastest_runs(ways, repeats)
    ref = runs["one_at_a_time"].tokens
    same = all(r.tokens == ref for r in runs.values())
    summary = {k: summarize(r) for k, r in runs.items()}
    step = decode_step_ms(model, batch_size)
    c, s, o = (summary[k]["tokens_per_s"] for k in ("continuous", "static", "one_at_a_time"))
    lengths = [len(r.prompt) + r.max_new_tokens for r in trace]
    measured = {
        "continuous_vs_static_tokens_per_s": c / s,
        "continuous_vs_one_at_a_time_tokens_per_s": c / o,
        "paged_memory_share": summary["continuous"]["memory_share"],
        "paged_memory_share_block_8": summary["continuous_block_8"]["memory_share"] if "continuous_block_8" in summary
        else float("nan"),
        "static_memory_share": summary["static"]["memory_share"],
        "paged_vs_static_decode_step": step["ratio"],
    }
    at_most = {"static_memory_share", "paged_vs_static_decode_step"}
    targets = {k: {"target": TARGETS[k], "kind": "at most" if k in at_most else "at least", "measured": v,
                   "met": v <= TARGETS[k] if k in at_most else v >= TARGETS[k]} for k, v in measured.items()}
    return {
        "trace": {"requests": len(trace), "rate_per_s": rate, "seed": seed,
                  "prompt_tokens": [len(r.prompt) for r in trace],
                  "answer_tokens": [r.max_new_tokens for r in trace],
                  "mean_final_length": sum(lengths) / len(lengths),
                  "last_arrival_s": trace[-1].arrival},
        "settings": {"static_batch_size": batch_size, "block_size": BLOCK_SIZE, "num_blocks": num_blocks,
                     "kv_positions": num_blocks * BLOCK_SIZE, "max_num_seqs": max_num_seqs, "repeats": repeats},
        "memory_share_bound": {b: expected_share(trace, b) for b in (BLOCK_SIZE, SMALL_BLOCK)},
        "runs": summary, "same_tokens": same, "decode_step": step, "targets": targets,
        "machine": machine(),
    }


def expected_share(requests: list, block_size: int) -> float:
    """The share of a paged cache's positions that hold a token, over every request's decode steps.

    After its prefill a request holds n = P + 1 … P + A tokens (prompt P, answer A) in ceil(n / b)
    blocks, and only the last block is partly empty; each step of each request counts once. This is
    what paging leaves empty on these lengths, whatever the schedule.
    """
    real = used = 0
    for r in requests:
        for n in range(len(r.prompt) + 1, len(r.prompt) + r.max_new_tokens + 1):
            real += n
            used += ceil_div(n, block_size) * block_size
    return real / used


def prefix_cache_report(model: GPT, requests: list, *, block_size: int = BLOCK_SIZE, kv_positions: int = 1024) -> dict:
    """The same requests with prefix caching off and on: prefill tokens computed, time to first token.

    The pool holds ``kv_positions`` positions (as many blocks of ``block_size`` as fit), whatever the block size.
    """
    num_blocks = max(kv_positions // block_size, ceil_div(model.config.block_size, block_size))
    run_continuous(model, requests[:1], num_blocks, block_size=block_size)  # warm-up, not counted
    off = run_continuous(model, requests, num_blocks, block_size=block_size)
    on = run_continuous(model, requests, num_blocks, block_size=block_size, enable_prefix_caching=True)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"requests": len(requests), "block_size": block_size, "prompt_tokens": sum(len(r.prompt) for r in requests),
            "prefill_tokens_without": off.prefill_tokens, "prefill_tokens_with": on.prefill_tokens,
            "prefix_hit_tokens": on.prefix_hit_tokens, "same_tokens": on.tokens == off.tokens,
            "mean_ttft_ms_without": 1e3 * mean(off.ttfts()), "mean_ttft_ms_with": 1e3 * mean(on.ttfts()),
            "preemptions": [off.preemptions, on.preemptions]}


@torch.inference_mode()
def prefill_ms(model: GPT, shared: list[int], suffixes: list[list[int]], repeats: int = 5) -> dict:
    """Median time of one batched prefill of requests that share a prefix, without and with prefix caching.

    The first request (``shared + suffixes[0]``) is prefilled alone and fills the pool; the others
    (``shared + suffix`` each) are then prefilled together, in one forward, and timed: every prompt
    token without prefix caching, only what follows each one's cached full blocks with it.
    """
    prompts = [shared + s for s in suffixes]
    first, rest = prompts[0], prompts[1:]
    if not rest:
        raise ValueError("suffixes must hold at least two suffixes: one request fills the cache, the others hit it")
    blocks = sum(ceil_div(len(p), BLOCK_SIZE) for p in prompts)
    times, computed = {False: [], True: []}, {}
    sids = list(range(1, len(prompts)))
    for _ in range(repeats):
        for use in (False, True):
            cache = PagedKVCache(model.config, blocks, enable_prefix_caching=use)
            cache.add_sequence(0, first)
            cache.forward(model, [0], [first])
            cached = [cache.add_sequence(i, p) for i, p in zip(sids, rest)]
            new = [p[c:] for p, c in zip(rest, cached)]
            computed[use] = sum(len(t) for t in new)
            t = time.perf_counter()
            cache.forward(model, sids, new)
            times[use].append(time.perf_counter() - t)
    med = {k: 1e3 * sorted(v)[repeats // 2] for k, v in times.items()}
    return {"requests_timed": len(rest), "shared_tokens": len(shared), "prompt_tokens": sum(len(p) for p in rest),
            "computed_without": computed[False], "computed_with": computed[True],
            "ms_without": med[False], "ms_with": med[True]}


def format_report(report: dict) -> str:
    t, st = report["trace"], report["settings"]
    lines = [f"{t['requests']} requests arriving at {t['rate_per_s']:g}/s (seed {t['seed']}), "
             f"{t['mean_final_length']:.1f} tokens each on average (prompt and answer); KV memory "
             f"{st['kv_positions']} positions = {st['static_batch_size']} static rows or {st['num_blocks']} blocks "
             f"of {st['block_size']}; "
             + ("each way run once" if st["repeats"] == 1 else f"each way's fastest of {st['repeats']} runs, taking turns"),
             f"{'':36} {'tokens/s':>9} {'latency mean':>13} {'p95':>7} {'TTFT mean':>10} {'p95':>7} "
             f"{'KV share':>9} {'preempt':>8}"]
    names = {"continuous_block_8": f"continuous, paged, blocks of {SMALL_BLOCK}"}
    for key, r in report["runs"].items():
        lines.append(f"{names.get(key, r['name']):36} {r['tokens_per_s']:9.0f} {r['mean_latency_s']:12.3f}s "
                     f"{r['p95_latency_s']:6.3f}s {r['mean_ttft_s']:9.3f}s {r['p95_ttft_s']:6.3f}s "
                     f"{100 * r['memory_share']:8.1f}% {r['preemptions']:8d}")
    lines.append(f"same tokens in every run: {report['same_tokens']}")
    bound = report["memory_share_bound"]
    lines.append("KV share that paging leaves on these lengths (each request's last block partly empty): "
                 + ", ".join(f"{100 * v:.1f}% at blocks of {b}" for b, v in bound.items()))
    d = report["decode_step"]
    lines.append(f"decode step, batch {d['batch_size']} at {d['context']} cached tokens: static cache "
                 f"{d['static_ms']:.2f} ms, paged {d['paged_ms']:.2f} ms")
    lines.append("targets (this machine's measurement):")
    for k, v in report["targets"].items():
        lines.append(f"  {k:42} {v['measured']:7.2f}  target {v['kind']} {v['target']:.2f}  "
                     f"{'met' if v['met'] else 'not met'}")
    return "\n".join(lines)
