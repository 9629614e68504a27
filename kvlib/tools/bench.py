"""Timing and counting decode loops: medians with warm-up, ATen calls per step, the compute floor.

``run_bench`` is what ``python -m kvlib bench`` prints: greedy decoding after a 16-token prompt,
timed for the fast path, the plain cached loop (the teaching model and its KVCache), the recompute
loop and, when it is installed, Hugging Face ``transformers`` running the same weights.
Every time includes the prefill. Tests check the report's structure, never its timings.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from functools import partial

import torch

from ..checks import check_int, check_model, check_real
from .compiled_step import compiled_report, compiler_available, format_compiled
from .ct2_peer import CT2_EXTRA, CT2Peer, batch_rows, ctranslate2_available, format_batch
from .op_counts import CountOps, aten_calls, aten_calls_per_step  # noqa: F401  (notebooks 5 and 8 use them here)
from ..decoding import generate, generate_uncached
from ..model import GPT, GPTConfig
from ..verify import greedy_agreement
from .timing import MAX_THREADS, Timing, describe_machine, interleaved, machine, verdict
from .timing import threads as thread_count

BENCH_EXTRA = "pip install -e .[bench]"
SHIPPED_SHAPE = GPTConfig(vocab_size=7184)  # tang-char: 4 layers, 4 heads, 128 channels, block 128
PROMPT = "白日依山尽，黄河入海流。欲穷千里"  # 16 characters, 16 tokens of tang-char
NEW_TOKENS = (32, 64, 100, 112)  # 16 + 112 = 128: every run fits the block
PATHS = ("fast", "model", "recompute", "transformers", "ctranslate2")
PATH_NAMES = {"fast": "fast path (FastDecoder)", "model": "cached loop (model + KVCache)",
              "recompute": "recompute loop (head on last position)", "transformers": "transformers generate",
              "ctranslate2": "CTranslate2 generate_batch (C++)"}
TARGETS = {"vs_recompute": 8.0, "vs_transformers": 4.0, "aten_calls": 60}


def median_seconds(fn, min_run_time: float = 0.5, threads: int = 1) -> float:
    """Median seconds per call of ``fn()``: :func:`kvlib.tools.timing.interleaved` with one function, three rounds."""
    return interleaved({"fn": fn}, 3, n_threads=threads, min_run_time=min_run_time / 3)["fn"].median


def recompute_forward(model: GPT):
    """The recompute loop's forward: the whole window, the head for the last position only (as nanoGPT does)."""
    return partial(model, last_only=True)


def compare(model: GPT, idx: torch.Tensor, max_new_tokens: int, min_run_time: float = 0.3, threads: int = 1) -> dict:
    """Greedy cached ``generate`` against the recompute loop on the same prompt (1, P), taking turns for three
    rounds; both write the same ``max_new_tokens``, which must fit the block (the cached loop stops at its end)."""
    check_model(model)
    block = model.config.block_size
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.shape[0] != 1 or not 1 <= idx.shape[1] <= block:
        got = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
        raise ValueError(f"idx must be one prompt of shape (1, P) with 1 <= P <= {block}, got {got}")
    room = block - idx.shape[1] + 1
    check_int("max_new_tokens", max_new_tokens, 1, room, f"an int in [1, {room}]: what fits the block after a "
              f"{idx.shape[1]}-token prompt, so that both loops write the same tokens")
    uncached_f = recompute_forward(model)
    t = interleaved({"cached": lambda: generate(model, idx, max_new_tokens, temperature=0.0),
                     "recompute": lambda: generate_uncached(uncached_f, idx, max_new_tokens, block_size=block,
                                                            temperature=0.0)},
                    3, n_threads=threads, min_run_time=min_run_time / 3)
    cached, uncached = t["cached"], t["recompute"]
    return {"new_tokens": max_new_tokens, "cached_ms": cached.median * 1e3, "uncached_ms": uncached.median * 1e3,
            "cached_spread_ms": [cached.low * 1e3, cached.high * 1e3],
            "uncached_spread_ms": [uncached.low * 1e3, uncached.high * 1e3],
            "speedup": uncached.median / cached.median, "verdict": verdict(cached, uncached)}


# ---------------------------------------------------------------------------------------------
# transformers: the same weights in GPT2LMHeadModel (an optional dependency: the bench extra)
# ---------------------------------------------------------------------------------------------

def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def to_transformers(model: GPT):
    """Our weights in a ``transformers.GPT2LMHeadModel`` (eval mode): same shape, exact GELU, no dropout.

    GPT-2's ``Conv1D`` stores its weight as (in, out), the transpose of ``nn.Linear``; everything
    else, the fused q/k/v order included, maps one to one.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.config
    hf_config = GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, activation_function="gelu", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        tie_word_embeddings=True)
    hf = GPT2LMHeadModel(hf_config)
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    state = {k: (v.t() if k.endswith(conv1d) else v) for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weights do not map onto GPT2LMHeadModel: missing {missing}, unexpected {unexpected}")
    return hf.eval()


def transformers_generate(hf, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy ``generate`` with the default (dynamic) cache that cannot stop early: (1, T + n) tokens."""
    with torch.inference_mode():
        return hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=max_new_tokens,
                           min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)


# ---------------------------------------------------------------------------------------------
# The compute floor
# ---------------------------------------------------------------------------------------------

def decode_flops(config: GPTConfig, prompt_length: int, new_tokens: int) -> float:
    """Floating-point operations to generate ``new_tokens`` after the prompt, per new token.

    One prefill of the prompt (the head on its last position only), then a decode step for every new
    token but the last, which is never fed back: :func:`forward_flops` of each.
    """
    check_int("prompt_length", prompt_length, 1)
    check_int("new_tokens", new_tokens, 1)
    total = forward_flops(config, prompt_length, 0, head_rows=1)
    total += sum(forward_flops(config, 1, prompt_length + i) for i in range(new_tokens - 1))
    return total / new_tokens


def forward_flops(config: GPTConfig, new_tokens: int, cached: int = 0, head_rows: int | None = None) -> int:
    """Floating-point operations of one forward of ``new_tokens`` after ``cached`` tokens of one sequence.

    Per new token: 2 x the layers' matmul weights (12 C^2 a layer) and attention over the keys it sees
    (``cached`` + its own position + 1; 2 C for q.k and 2 C for the weighted values, per key and layer);
    then 2 V C for each of ``head_rows`` rows of the head (all new tokens unless fewer are asked for, as the
    recompute loop's ``last_only`` asks for one). Layer norms, GELU and softmax are left out: a few per cent.
    """
    check_int("new_tokens", new_tokens, 1)
    check_int("cached", cached, 0)
    head_rows = new_tokens if head_rows is None else check_int("head_rows", head_rows, 0, new_tokens)
    C, L, V = config.n_embd, config.n_layer, config.vocab_size
    keys = sum(cached + i + 1 for i in range(new_tokens))  # what the new tokens attend to, all together
    return new_tokens * 2 * 12 * C * C * L + 4 * C * L * keys + head_rows * 2 * V * C


def weight_bytes(model: GPT) -> int:
    """Bytes of weights one step reads, whatever the batch: every parameter once (the tied head counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


@dataclass(frozen=True)
class CostModel:
    """A time predicted from counts: ``calls`` operator calls at ``per_call`` seconds each, plus ``flops``
    at ``peak`` FLOP/s (this machine's large-matmul speed). ``fit`` takes ``per_call`` from one measurement."""
    per_call: float
    peak: float

    @classmethod
    def fit(cls, seconds: float, calls: float, flops: float, peak: float) -> "CostModel":
        """The per-call cost that makes one measured time (``calls`` calls, ``flops``) come out exactly."""
        for name, v in (("seconds", seconds), ("calls", calls), ("peak", peak)):
            check_real(name, v, 0, open_min=True, allowed="a finite number > 0")
        check_real("flops", flops, 0, allowed="a finite number >= 0")
        return cls(max(seconds - flops / peak, 0.0) / calls, peak)

    def predict(self, calls: float, flops: float) -> float:
        return calls * self.per_call + flops / self.peak


def peak_matmul(threads: int = 1, n: int = 1024, rounds: int = 5, min_run_time: float = 0.05) -> Timing:
    """FLOP/s of one large fp32 matrix product (n x n x n) on this machine, the compute ceiling, over
    ``rounds`` rounds (a :class:`~kvlib.tools.timing.Timing` of FLOP/s: its median, low and high)."""
    g = torch.Generator().manual_seed(0)  # its own generator: the global RNG is left alone
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    seconds = interleaved({"mm": lambda: torch.mm(a, b)}, rounds, n_threads=threads, min_run_time=min_run_time)["mm"]
    return Timing(f"{n}x{n} matmul FLOP/s", tuple(2 * n ** 3 / s for s in seconds.rounds))


def peak_matmul_flops(threads: int = 1, n: int = 1024, min_run_time: float = 0.3) -> float:
    """The median of :func:`peak_matmul` over three rounds of ``min_run_time / 3`` seconds each."""
    return peak_matmul(threads, n, 3, min_run_time / 3).median


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------

def _machine() -> dict:
    info = {**machine(), "transformers": None}
    if transformers_available():
        import transformers
        info["transformers"] = transformers.__version__
    return info


def bench_model():
    """(model, 16-token prompt (1, 16), note): the shipped tang-char when present, else random weights."""
    return bench_model_and_tokenizer()[:3]


def bench_model_and_tokenizer():
    """:func:`bench_model`'s three, and the shipped tokenizer (None with random weights): CTranslate2's export needs it."""
    from . import integrity
    from .loading import load_pretrained

    if (integrity.DATA_DIR / "tang-char.pt").exists() and "tang-char.pt" in integrity.read_manifest():
        model, tokenizer = load_pretrained("tang-char")
        idx = torch.tensor([tokenizer.encode(PROMPT)])
        return model, idx, f"shipped tang-char model, prompt {PROMPT}", tokenizer
    model = _seeded_model(SHIPPED_SHAPE)
    idx = torch.randint(SHIPPED_SHAPE.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    return model, idx, ("data/tang-char.pt is missing: random weights in the shipped shape, a random "
                        "16-token prompt (the timings hold for any weights)"), None


def batch_prompts(model: GPT, idx: torch.Tensor, rows: int = 8) -> list[list[int]]:
    """``rows`` prompts of ``idx``'s length for the batch comparison: the prompt, rotated by 0 … rows - 1 tokens."""
    return [idx[0].roll(k).tolist() for k in range(rows)]


def _transformers_info(hf) -> dict:
    info = {"used": hf is not None, "installed": transformers_available()}
    if hf is not None:
        info.update(cache="dynamic", attention=getattr(hf.config, "_attn_implementation", None) or "default")
    if not info["installed"]:
        info["install"] = BENCH_EXTRA
    return info


def _seeded_model(config: GPTConfig, seed: int = 0) -> GPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(config).eval()


def _loops(model: GPT, idx: torch.Tensor, hf, peer=None) -> dict:
    """One callable per path: ``loop(n)`` decodes n greedy tokens and returns all tokens (1, T + n)."""
    recompute = recompute_forward(model)
    block = model.config.block_size
    loops = {
        "fast": lambda n: generate(model, idx, n, temperature=0.0, decoder="fast").tokens,
        "model": lambda n: generate(model, idx, n, temperature=0.0, decoder="model").tokens,
        "recompute": lambda n: generate_uncached(recompute, idx, n, block_size=block, temperature=0.0).tokens,
    }
    if hf is not None:
        loops["transformers"] = lambda n: transformers_generate(hf, idx, n)
    if peer is not None:
        loops["ctranslate2"] = lambda n: peer.greedy(idx.tolist(), n)
    return loops


def run_bench(threads=(1, 2), progress: bool = True, *, model: GPT | None = None,
              idx: torch.Tensor | None = None, prompt_length: int = 16, new_tokens=NEW_TOKENS, rounds: int = 5,
              max_seconds: float = 6.0, peak_seconds: float = 0.3, peak_n: int = 1024,
              with_transformers: bool = True, tokenizer=None, with_compiled: bool = True) -> dict:
    """Time greedy decoding on every path, for each thread count and number of new tokens.

    Returns a JSON-serialisable report (``format_report`` prints it as tables); the progress bar
    goes to stderr. ``model`` and ``idx`` default to :func:`bench_model`; a caller's ``model``
    without ``idx`` gets a seeded random prompt of ``prompt_length`` tokens. For each thread count
    and number of new tokens the paths are timed in turn, ``rounds`` times (fewer, but at least
    three, once ``max_seconds`` have passed), and each time is the median.
    """
    threads, new_tokens = _counts("threads", threads, MAX_THREADS), _counts("new_tokens", new_tokens, 10**6)
    for name, value in (("rounds", rounds), ("prompt_length", prompt_length), ("peak_n", peak_n)):
        check_int(name, value, 1)
    if model is None:
        model, default_idx, note, shipped = bench_model_and_tokenizer()
        idx = default_idx if idx is None else idx
        tokenizer = tokenizer or shipped
    else:
        check_model(model)
        note = "model given by the caller"
        if idx is None:
            idx = torch.randint(model.config.vocab_size, (1, prompt_length),
                                generator=torch.Generator().manual_seed(0))
    if model.lm_head.weight.dtype != torch.float32:
        raise ValueError(f"run_bench times float32 models (its matmul peak and the transformers copy are float32), "
                         f"got {model.lm_head.weight.dtype}: pass a float32 copy (copy.deepcopy(model).float())")
    cfg = model.config
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.shape[0] != 1 or idx.dtype != torch.long:
        raise ValueError(f"idx must be one int64 prompt of shape (1, P), got "
                         f"{tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__}")
    P = idx.shape[1]
    if P + max(new_tokens) > cfg.block_size:
        raise ValueError(f"a {P}-token prompt and {max(new_tokens)} new tokens do not fit "
                         f"the block of {cfg.block_size}")
    training = model.training
    model.eval()
    try:
        return _run_bench(model, idx, note, threads, new_tokens, progress, rounds, max_seconds, peak_seconds,
                          peak_n, with_transformers, tokenizer, with_compiled)
    finally:
        model.train(training)


def _counts(name: str, values, most: int) -> tuple[int, ...]:
    """A non-empty tuple or list of ints in [1, most]."""
    if not isinstance(values, (tuple, list)) or not values:
        raise TypeError(f"{name} must be a non-empty tuple of ints in [1, {most}], got {values!r:.60}")
    return tuple(check_int(f"{name}[{i}]", v, 1, most) for i, v in enumerate(values))


def _run_bench(model, idx, note, threads, new_tokens, progress, rounds, max_seconds, peak_seconds, peak_n,
               with_transformers, tokenizer, with_compiled) -> dict:
    """:func:`run_bench`'s work, on checked arguments."""
    from tqdm.auto import tqdm

    cfg, P = model.config, idx.shape[1]
    hf = to_transformers(model) if with_transformers and transformers_available() else None
    peer = CT2Peer(model, tokenizer) if with_transformers and tokenizer is not None and ctranslate2_available() else None
    loops = _loops(model, idx, hf, peer)
    paths = [p for p in PATHS if p in loops]

    # Same tokens on every path (up to near-ties), and ATen calls per step (the same for any thread count).
    with thread_count(1):
        reference = loops["fast"](max(new_tokens))[0, P:]
        tokens_equal = {p: greedy_agreement(model, idx[0], loops[p](max(new_tokens))[0, P:], reference) != "differ"
                        for p in paths}
        calls = {p: aten_calls_per_step(loops[p]) for p in paths if p != "ctranslate2"}  # C++: no ATen calls
        peer_check = peer.check(idx[0].tolist(), max(new_tokens)) if peer else None

    rows, peaks = [], {}
    bar = tqdm(total=len(threads) * (1 + len(new_tokens) * rounds), desc="bench", unit="step",
               disable=not progress, file=sys.stderr, leave=False)
    try:
        for t in threads:
            bar.set_postfix_str(f"{t} thread(s): peak matmul")
            peaks[t] = peak_matmul_flops(t, peak_n, peak_seconds)
            bar.update()
            for n in new_tokens:
                bar.set_postfix_str(f"{t} thread(s), {n} new tokens")
                done = bar.n
                timed = interleaved({p: (lambda p=p: loops[p](n)) for p in paths}, rounds, n_threads=t,
                                    min_run_time=1e-6, max_seconds=max_seconds, on_round=bar.update)
                bar.update(done + rounds - bar.n)  # rounds that stopped early still count as done
                floor_us = decode_flops(cfg, P, n) / peaks[t] * 1e6
                for p in paths:
                    seconds = timed[p].median
                    hf_t, ct2_t = timed.get("transformers"), timed.get("ctranslate2")
                    rows.append({"threads": t, "new_tokens": n, "path": p, "median_s": seconds,
                                 "low_s": timed[p].low, "high_s": timed[p].high, "rounds": len(timed[p].rounds),
                                 "tokens_per_s": n / seconds, "us_per_token": seconds / n * 1e6,
                                 "floor_us_per_token": floor_us, "x_floor": seconds / n * 1e6 / floor_us,
                                 "speedup_vs_recompute": timed["recompute"].median / seconds,
                                 "verdict_vs_recompute": verdict(timed[p], timed["recompute"]),
                                 "speedup_vs_transformers": hf_t.median / seconds if hf_t else None,
                                 "verdict_vs_transformers": verdict(timed[p], hf_t) if hf_t else None,
                                 "speedup_vs_ctranslate2": ct2_t.median / seconds if ct2_t else None,
                                 "verdict_vs_ctranslate2": verdict(timed[p], ct2_t) if ct2_t else None})
    finally:
        bar.close()

    report = {
        "model": {"note": note, "config": {k: getattr(cfg, k) for k in
                                           ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")},
                  "parameters": model.num_params()},
        "machine": _machine(),
        "prompt_tokens": P,
        "new_tokens": list(new_tokens),
        "threads": list(threads),
        "paths": paths,
        "transformers": _transformers_info(hf),
        "ctranslate2": {"used": peer is not None, "version": peer.version if peer else None, "check": peer_check,
                        "install": None if ctranslate2_available() else CT2_EXTRA,
                        "batch": batch_rows(model, peer, batch_prompts(model, idx), max(new_tokens), rounds, 1)
                        if peer else None},
        "compiled": compiled_report(model, idx, max(new_tokens), rounds, peer)
        if with_compiled and compiler_available() else None,
        "tokens_equal": tokens_equal,
        "aten_calls_per_step": calls,
        "aten_mode": ("TorchDispatchMode under torch.inference_mode(), the whole loop step "
                      "(decoder, sampling, bookkeeping)"),
        "peak_matmul_gflops": {str(t): peaks[t] / 1e9 for t in threads},
        "floor_note": "2 x matmul parameters + attention FLOPs per new token, prompt included, at the peak",
        "rows": rows,
    }
    report["targets"] = _targets(report)
    return report


def _targets(report: dict) -> dict | None:
    """The three goals at 1 thread and 100 new tokens (or the nearest measured setting)."""
    rows = report["rows"]
    if not rows:
        return None
    t = 1 if 1 in report["threads"] else report["threads"][0]
    n = min(report["new_tokens"], key=lambda k: abs(k - 100))
    fast = next(r for r in rows if r["threads"] == t and r["new_tokens"] == n and r["path"] == "fast")
    vs_hf = fast["speedup_vs_transformers"]
    calls = report["aten_calls_per_step"]["fast"]
    return {
        "threads": t, "new_tokens": n,
        "vs_recompute": {"value": fast["speedup_vs_recompute"], "goal": TARGETS["vs_recompute"],
                         "met": fast["speedup_vs_recompute"] >= TARGETS["vs_recompute"]},
        "vs_transformers": {"value": vs_hf, "goal": TARGETS["vs_transformers"],
                            "met": None if vs_hf is None else vs_hf >= TARGETS["vs_transformers"]},
        "aten_calls": {"value": calls, "goal": TARGETS["aten_calls"], "met": calls <= TARGETS["aten_calls"]},
    }


def format_report(report: dict) -> str:
    """The report as text tables."""
    m, mach = report["model"], report["machine"]
    cfg = m["config"]
    lines = [
        f"kvlib bench: greedy decoding after a {report['prompt_tokens']}-token prompt (prefill included); each "
        f"path timed in interleaved rounds: median ms and the range over the rounds; verdicts compare ranges",
        f"model: {m['note']}",
        f"       {cfg['n_layer']} layers, {cfg['n_embd']} channels, {cfg['n_head']} heads, vocab "
        f"{cfg['vocab_size']}, block {cfg['block_size']}, {m['parameters']:,} parameters",
        describe_machine(mach),
    ]
    hf = report["transformers"]
    missing = None if hf["used"] else (f"not installed: {hf['install']}" if not hf["installed"] else "not measured")
    if hf["used"]:
        lines.append(f"transformers: GPT2LMHeadModel with our weights, {hf['attention']} attention, "
                     f"{hf['cache']} cache, do_sample=False, min_new_tokens = max_new_tokens")
    else:
        lines.append(f"transformers: {missing}")
    ct2 = report.get("ctranslate2") or {}
    if ct2.get("used"):
        c = ct2["check"]
        lines.append(f"CTranslate2 {ct2['version']}: our weights exported and converted; logits within "
                     f"{c['max_abs_logit_diff']:.1e} of ours, greedy tokens against the fast path's: {c['greedy_tokens']}")
    else:
        lines.append("CTranslate2: " + (f"not installed: {ct2['install']}" if ct2.get("install") else "not measured"))
    for t in report["threads"]:
        peak = report["peak_matmul_gflops"][str(t)]
        lines += ["", f"{t} thread(s); peak fp32 matmul {peak:.0f} GFLOP/s",
                  f"  {'path':40s} {'new':>4s} {'ms':>8s} {'range':>13s} {'tok/s':>7s} {'µs/tok':>7s} {'floor':>6s} "
                  f"{'x floor':>7s} {'vs recompute':>25s} {'vs transformers':>25s} {'vs CTranslate2':>25s}"]
        for n in report["new_tokens"]:
            for r in (r for r in report["rows"] if r["threads"] == t and r["new_tokens"] == n):
                vs_hf = ("" if r["speedup_vs_transformers"] is None or r["path"] == "transformers" else
                         f"{r['speedup_vs_transformers']:.2f}x {r['verdict_vs_transformers']}")
                vs_re = "" if r["path"] == "recompute" else f"{r['speedup_vs_recompute']:.2f}x {r['verdict_vs_recompute']}"
                vs_ct = ("" if r.get("speedup_vs_ctranslate2") is None or r["path"] == "ctranslate2" else
                         f"{r['speedup_vs_ctranslate2']:.2f}x {r['verdict_vs_ctranslate2']}")
                spread = f"{r['low_s'] * 1e3:.1f}-{r['high_s'] * 1e3:.1f}"
                lines.append(
                    f"  {PATH_NAMES[r['path']]:40s} {n:4d} {r['median_s'] * 1e3:8.1f} {spread:>13s} "
                    f"{r['tokens_per_s']:7.0f} {r['us_per_token']:7.0f} {r['floor_us_per_token']:6.0f} "
                    f"{r['x_floor']:7.1f} {vs_re:>25s} {vs_hf:>25s} {vs_ct:>25s}")
            if missing:
                lines.append(f"  {PATH_NAMES['transformers']:40s} {n:4d}  {missing}")
    if ct2.get("batch"):
        lines += ["", format_batch(ct2["batch"])]
    if report.get("compiled"):
        t1 = [r for r in report["rows"] if r["threads"] == report["threads"][0] and r["path"] == "fast"][-1]
        lines += ["", format_compiled(report["compiled"], t1["floor_us_per_token"])]
    lines += ["", f"ATen calls per decode step ({report['aten_mode']}):"]
    for p, same in report["tokens_equal"].items():
        c = report["aten_calls_per_step"].get(p)
        same = "same tokens as the fast path (up to near-ties)" if same else "TOKENS DIFFER from the fast path"
        lines.append(f"  {PATH_NAMES[p]:40s} {'C++' if c is None else f'{c:6.1f}':>6s}   {same}")
    tg = report.get("targets")
    if tg:
        def met_word(x):
            return "n/a" if x["met"] is None else ("met" if x["met"] else "NOT met")
        lines += ["", f"the project's targets for the fast path on this machine class ({tg['threads']} thread, "
                      f"{tg['new_tokens']} new tokens), as measured in this run:",
                  f"  vs the recompute loop  {tg['vs_recompute']['value']:6.2f}x   target >= "
                  f"{tg['vs_recompute']['goal']:g}x   {met_word(tg['vs_recompute'])}",
                  "  vs transformers        "
                  + ("not measured" if tg["vs_transformers"]["value"] is None else
                     f"{tg['vs_transformers']['value']:6.2f}x   target >= {tg['vs_transformers']['goal']:g}x")
                  + f"   {met_word(tg['vs_transformers'])}",
                  f"  ATen calls per step    {tg['aten_calls']['value']:6.0f}    target <= {tg['aten_calls']['goal']}"
                  f"    {met_word(tg['aten_calls'])}",
                  "  (ratios of loops timed side by side; a busy or different machine can miss a target by noise)"]
    return "\n".join(lines)
