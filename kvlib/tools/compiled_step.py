"""The fast decode step compiled by ``torch.compile`` (Inductor, C++ code on the CPU), beside the eager one.

Learners read the eager step (:class:`kvlib.fast.FastDecoder`); this module asks whether a compiler
removes what notebook 5 found a step is made of: operator calls rather than arithmetic. The compiled
step is the same arithmetic on the same weights (``FastDecoder``'s layout), written without ``out=``
buffers so that the compiler can fuse it, and with fixed shapes so that it compiles once: each new
token attends to every slot of the cache with an additive mask that hides the slots not yet written.
One token a row; everything else (the prefill, padded batches) goes to the eager decoder, whose cache
the compiled step writes into. Where no C++ compiler is found, :func:`compiled_decoder` returns the
eager decoder and says so; the bench reports the compile time and the per-step times side by side.
"""
from __future__ import annotations

import shutil
import time

import torch
import torch.nn.functional as F

from ..fast import FastDecoder
from ..model import GPT


def compiler_available() -> bool:
    """Inductor's CPU backend needs a C++ compiler on the PATH."""
    return any(shutil.which(c) for c in ("g++", "c++", "clang++", "cl"))


def decode_step(dec: FastDecoder):
    """One token a row through ``dec``'s weights into ``dec``'s cache: ``step(idx (B, 1), pos (1,)) -> (B, V)``."""
    w, cfg = dec.weights, dec.config
    B, L, C, H = dec.batch_size, dec.max_len, cfg.n_embd, cfg.n_head
    D, eps, kv = C // H, w.eps, dec.kv                              # kv: (2, layers, B, H, L, D)
    mask = torch.zeros(L, L, dtype=kv.dtype).masked_fill_(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    layers = [(lw.ln_1, lw.w_qkv, lw.b_qkv, lw.w_proj1, lw.ln_2, lw.w_fc, lw.b_fc, lw.w_out1) for lw in w.layers]

    def step(idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = w.wte[idx[:, 0]] + w.wpe[pos]                               # (B, C)
        seen = mask[pos].view(1, 1, 1, L)                               # slots written so far, this one included
        for i, (ln1, wqkv, bqkv, wproj1, ln2, wfc, bfc, wout1) in enumerate(layers):
            qkv = torch.addmm(bqkv, F.layer_norm(x, (C,), *ln1, eps), wqkv).view(B, 3, H, D)
            kv[:, i].index_copy_(3, pos, qkv[:, 1:].permute(1, 0, 2, 3).unsqueeze(3))   # this token's k and v
            y = F.scaled_dot_product_attention(qkv[:, 0].unsqueeze(2), kv[0, i], kv[1, i], attn_mask=seen)
            x = x + torch.addmm(wproj1[C], y.reshape(B, C), wproj1[:C])
            u = torch.addmm(bfc, F.layer_norm(x, (C,), *ln2, eps), wfc)  # a / sqrt(2), as in the eager step
            x = x + torch.addmm(wout1[4 * C], u * (1 + torch.erf(u)), wout1[:4 * C])
        return torch.mm(F.layer_norm(x, (C,), *w.ln_f, eps), w.head)   # (B, V)
    return step


class CompiledDecoder:
    """``FastDecoder`` with its one-token step compiled: the same contract, ``dec(idx, key_mask, position_ids)``.

    ``compile_seconds`` is what the first step cost (the compilation); later decoders of the same shape
    reuse the compiled code (PyTorch keeps it for the process).
    """

    def __init__(self, model: GPT, batch_size: int, max_len: int | None = None):
        import torch._inductor.config as inductor

        inductor.cpp_wrapper = True        # the compiled code is called from C++, not through Python per kernel
        self.eager = FastDecoder(model, batch_size, max_len)
        self.cache = self.eager.cache
        self.step = torch.compile(decode_step(self.eager), dynamic=False, fullgraph=True)
        self.compile_seconds: float | None = None

    def takes(self, idx, key_mask, position_ids) -> bool:
        """Whether the compiled step runs this call: one valid token a row, unpadded, after a prefill, with room."""
        return (isinstance(idx, torch.Tensor) and idx.dtype == torch.long and tuple(idx.shape) == (self.eager.batch_size, 1)
                and key_mask is None and position_ids is None and 0 < self.cache.length < self.eager.max_len
                and 0 <= int(idx.min()) and int(idx.max()) < self.eager.config.vocab_size)

    @torch.inference_mode()
    def __call__(self, idx: torch.Tensor, key_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if not self.takes(idx, key_mask, position_ids):
            return self.eager(idx, key_mask, position_ids)  # the prefill, a padded batch, or input it refuses
        start = time.perf_counter() if self.compile_seconds is None else None
        logits = self.step(idx, torch.tensor([self.cache.length], device=idx.device))
        if start is not None:
            self.compile_seconds = time.perf_counter() - start
        self.cache.advance(1)
        return logits


def compiled_decoder(model: GPT, batch_size: int, max_len: int | None = None):
    """A decoder for ``generate(..., decoder=compiled_decoder)``: compiled where a C++ compiler exists, else eager."""
    if not compiler_available():
        return FastDecoder(model, batch_size, max_len)
    return CompiledDecoder(model, batch_size, max_len)


def step_profile(dec, prompt: torch.Tensor, steps: int = 50, top: int = 6) -> list[tuple[str, float]]:
    """Where one decode step's time goes: the ``top`` entries by own CPU time, (name, µs a step), over ``steps``
    one-token steps after ``prompt`` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    nxt = prompt[:, -1:]
    with torch.inference_mode():
        dec(prompt)
        length = dec.cache.length
        for _ in range(5):                                   # warm, compiled where it compiles
            dec(nxt)
            dec.cache.truncate(length)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                dec(nxt)
                dec.cache.truncate(length)
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [(e.key if len(e.key) < 48 else e.key[:45] + "...", e.self_cpu_time_total / steps) for e in rows]


def operators_compiled_alone(model: GPT, calls: int = 500) -> dict[str, tuple[float, float]]:
    """The step's main operators at one row, each eager and compiled alone: {name: (eager µs, compiled µs)} a call.

    The head's product, one block's query/key/value product, and attention over a full cache: if Inductor's code
    for a one-row product is slower than the BLAS call the eager step makes, no fusion around it wins that back."""
    cfg, w = model.config, FastDecoder(model, 1).weights
    C, H, L = cfg.n_embd, cfg.n_head, cfg.block_size
    x = torch.randn(1, C, generator=torch.Generator().manual_seed(0))
    q, k = x.view(1, H, 1, C // H), torch.zeros(1, H, L, C // H)
    parts = {"head product (1 row)": (lambda: torch.mm(x, w.head)),
             "query/key/value product (1 row)": (lambda: torch.addmm(w.layers[0].b_qkv, x, w.layers[0].w_qkv)),
             f"attention over {L} keys": (lambda: F.scaled_dot_product_attention(q, k, k))}
    out = {}
    with torch.inference_mode():
        for name, fn in parts.items():
            compiled = torch.compile(fn, dynamic=False, fullgraph=True)
            compiled()
            out[name] = tuple(_us_a_call(f, calls) for f in (fn, compiled))
    return out


def _us_a_call(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def compiled_report(model: GPT, idx: torch.Tensor, new_tokens: int, rounds: int, ct2=None) -> dict:
    """The compiled step against the eager fast path (and CTranslate2, when given), one stream, interleaved rounds:
    the compile time, the same tokens, times with their spread and verdicts, and where each step's time goes."""
    from ..decoding import generate
    from .timing import interleaved, verdict

    start = time.perf_counter()
    compiled = generate(model, idx, new_tokens, temperature=0.0, decoder=compiled_decoder).tokens  # compiles
    compile_s = time.perf_counter() - start
    eager = generate(model, idx, new_tokens, temperature=0.0).tokens
    ways = {"compiled": lambda: generate(model, idx, new_tokens, temperature=0.0, decoder=compiled_decoder),
            "eager": lambda: generate(model, idx, new_tokens, temperature=0.0)}
    if ct2 is not None:
        ways["ctranslate2"] = lambda: ct2.greedy(idx.tolist(), new_tokens)
    timed = interleaved(ways, rounds, min_run_time=1e-6)
    ms = {k: (t.median * 1e3, t.low * 1e3, t.high * 1e3) for k, t in timed.items()}
    return {"compiler": compiler_available(), "compile_s": compile_s, "new_tokens": new_tokens,
            "same_tokens": bool(torch.equal(compiled, eager)), "ms": ms,
            "verdicts": {k: verdict(timed["compiled"], t) for k, t in timed.items() if k != "compiled"},
            "profile": {"compiled": step_profile(CompiledDecoder(model, 1), idx),
                        "eager": step_profile(FastDecoder(model, 1), idx)},
            "operators": operators_compiled_alone(model)}


def format_compiled(d: dict, floor_us: float | None = None) -> str:
    """The compiled step's lines of ``python -m kvlib bench``, with the goals judged and the measured reason."""
    n, ms = d["new_tokens"], d["ms"]
    lines = [f"the fast step compiled (torch.compile, Inductor's C++ wrapper), one stream, {n} new tokens; compiled in "
             f"{d['compile_s']:.0f} s; same tokens as the eager step: {d['same_tokens']}"]
    for k, (med, lo, hi) in ms.items():
        than = "" if k == "compiled" else f"   compiled ran {med / ms['compiled'][0]:.2f}x its speed: {d['verdicts'][k]}"
        lines.append(f"  {k:12s} {med:7.1f} ms ({lo:.1f}-{hi:.1f}), {1e3 * med / n:6.0f} µs a token{than}")
    if "ctranslate2" in ms:
        lines.append(f"  goal: compiled at least CTranslate2's speed: {ms['ctranslate2'][0] / ms['compiled'][0]:.2f}x, "
                     + ("met" if ms["ctranslate2"][0] >= ms["compiled"][0] else "NOT met"))
    if floor_us:
        x = 1e3 * ms["compiled"][0] / n / floor_us
        lines.append(f"  goal: within 3x of the FLOP floor ({floor_us:.0f} µs a token): {x:.0f}x, "
                     + ("met" if x <= 3 else "NOT met"))
    lines.append("  where a step's time goes (own CPU time a step, torch.profiler):")
    for k, rows in d["profile"].items():
        lines.append(f"    {k}: " + "; ".join(f"{name} {us:.0f} µs" for name, us in rows))
    if d.get("operators"):
        lines.append("  the step's main operators alone, eager against compiled (µs a call, the compiled one's call included):")
        lines += [f"    {name:34s} {eager:7.1f}  {compiled:7.1f}" for name, (eager, compiled) in d["operators"].items()]
    return "\n".join(lines)
