"""``python -m kvlib demo``: the walkthrough's six sections, printed in the terminal."""
from __future__ import annotations

import time

import torch

from ..checks import check_int
from ..constraints import acrostic
from ..decoding import generate, generate_uncached
from ..poems import count_followers, top_next, write
from .timing import Timing, compare, describe_machine, machine, threads
from .corpus import load_poems

SEED = 1337
FAMOUS = ["白日依山尽，黄河入海", "床前明月光，疑是地上", "春风"]
OPENINGS = ["床前明月光", "大漠孤烟直", "人工智能好"]
TIMING_RUNS = 3  # each loop; a verdict needs every run of one to beat every run of the other


def timed(run):
    """``run(on_token)`` with a stopwatch: (its result, seconds from the start to each new token)."""
    stamps = []
    t0 = time.perf_counter()
    result = run(lambda step, new: stamps.append(time.perf_counter() - t0))
    return result, stamps


def sections(model, tok, timing_runs: int = TIMING_RUNS):
    """Yield the demo's lines one at a time; section 6 times ``timing_runs`` runs of each loop."""
    timing_runs = check_int("timing_runs", timing_runs, 1)
    yield "== 1. All the model gives is probabilities: the top 8 characters after a piece of text"
    yield "  (each text is read without the poem separator in front, as a piece from anywhere in a poem;"
    yield "   notebook 1 reads them as poem openings, after the separator, so its top 8 differ)"
    for text in FAMOUS:
        bars = "  ".join(f"{ch} {100 * p:4.1f}%" for ch, p in top_next(model, tok, text, 8, opening=False))
        yield f"  「{text}」→ {bars}"
    followers = count_followers(load_poems(), "春风")
    yield (f"  In the corpus 春风 is followed by 。 {followers['。']:,} times in {sum(followers.values()):,} "
           f"({100 * followers['。'] / sum(followers.values()):.1f} %)")

    yield "\n== 2. Temperature: three poems at each temperature, one seed"
    for t in (0.3, 1.0, 1.5):
        yield f"  temperature {t}:"
        for poem in write(model, tok, "", temperature=t, seed=SEED, n=3):
            yield f"    {poem}"

    yield "\n== 3. Temperature 1.5, choosing only among the 20 most likely characters (top-k 20)"
    for poem in write(model, tok, "", temperature=1.5, top_k=20, seed=SEED, n=3):
        yield f"    {poem}"

    yield "\n== 4. Continuing an opening line (temperature 0.8)"
    for poem in write(model, tok, OPENINGS, temperature=0.8, seed=SEED):
        yield f"    {poem}"

    yield "\n== 5. Acrostics: the program fixes each line's first character and its punctuation"
    for heads, n in (("春眠不觉", 7), ("学无止境", 5)):
        poem = acrostic(model, tok, heads, n, temperature=0.8, generator=torch.Generator().manual_seed(SEED))
        yield f"    {heads} ({n} characters): {poem}"

    yield "\n== 6. The KV cache: the same text, timed with it and without it"
    # One timeline per run: on_token stamps the moment each new token is chosen, so a single run of
    # 120 characters also gives the time to the 32nd and the 64th. The two loops take turns, 1 thread.
    start = torch.tensor([[tok.eos_id]])
    with threads(1):
        cached_runs, plain_runs = [], []
        for _ in range(timing_runs):
            cached, stamps = timed(lambda on_token: generate(
                model, start, 120, temperature=0.8, generator=torch.Generator().manual_seed(SEED), on_token=on_token))
            cached_runs.append(stamps)
            plain, stamps = timed(lambda on_token: generate_uncached(
                model, start, 120, block_size=model.config.block_size, temperature=0.8,
                generator=torch.Generator().manual_seed(SEED), on_token=on_token))
            plain_runs.append(stamps)
    same = torch.equal(cached.tokens, plain.tokens)
    yield f"  120 characters from the poem-start token, same seed: cached {'equals' if same else 'DIFFERS FROM'} uncached"
    yield (f"  time until the n-th character is chosen, {timing_runs} runs of each taking turns, 1 thread "
           "(recompute runs the whole model over the text so far at every step):")
    yield f"  {describe_machine(machine())}"
    for n in (32, 64, 120):
        fast = Timing("cached", tuple(r[n - 1] for r in cached_runs))
        slow = Timing("recompute", tuple(r[n - 1] for r in plain_runs))
        yield f"  {n:3d} characters: {compare(fast, slow)}"
    cache = model.new_cache(1)
    cfg = model.config
    yield (f"  cache per token: 2 (k, v) x {cfg.n_layer} layers x {cfg.n_embd} dims x 4 bytes = "
           f"{cache.bytes_per_token:,} bytes; {cfg.block_size} tokens take {cache.nbytes // 1024} KiB")


def run_demo(name: str = "tang-char") -> None:
    from .loading import load_pretrained

    # One thread: on a small model, more threads mostly wait for each other (the demo took 2-4x as long
    # with the default count on a busy 2-core machine), and the timings match `bench`'s single thread.
    with threads(1):
        model, tok = load_pretrained(name)
        for line in sections(model, tok):
            print(line, flush=True)
