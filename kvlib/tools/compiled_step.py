"""The fast decode step compiled to C++ by Inductor, beside the eager one.

Learners read the eager step (:class:`kvlib.fast.FastDecoder`); this module asks whether a compiler
removes what notebook 5 found a step is made of: operator calls rather than arithmetic. The compiled
step is the same arithmetic on the same weights (``FastDecoder``'s layout), written as a pure function
so that the compiler can fuse it: it reads the cache and returns the logits with the new token's keys
and values, which the caller stores (a compiled graph that wrote into its input would copy the whole
cache back at every step). Shapes are fixed, so it compiles once: the new token attends to every slot
of the cache, with the slots not yet written hidden. One token a row; everything else (the prefill,
padded batches) goes to the eager decoder, whose cache the compiled step reads.

Two ways to compile are measured: ``torch.compile`` ("inductor": Inductor with its C++ wrapper, called
through Dynamo's guards) and AOTInductor ("aoti": the graph exported once, built into a shared library
and called without guards). Where no C++ compiler is found, :func:`compiled_decoder` returns the eager
decoder.
"""
from __future__ import annotations

import math
import shutil
import tempfile
import time
import warnings
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F

from ..checks import check_choice, check_int
from ..fast import FastDecoder, StepWeights
from ..model import GPT
from ..weights import weights_key

WAYS = ("aoti", "inductor")  # AOTInductor's library, or torch.compile


def compiler_available() -> bool:
    """Inductor's CPU backend needs a C++ compiler on the PATH."""
    return any(shutil.which(c) for c in ("g++", "c++", "clang++", "cl"))


def attend_past_and_new(q, keys, values, hidden, k, v):
    """One new query a row over the cached keys and its own: ``q, k, v`` (B, H, D), the cache's ``keys, values``
    (B, H, S, D), ``hidden`` (B or 1, 1, S) True on slots not to be read. The softmax is written out so that a
    compiler fuses it into loops over the cache, reading it in place; (B, H, D)."""
    scale = 1 / math.sqrt(q.shape[-1])
    past = (q.unsqueeze(2) * keys).sum(-1).mul(scale).masked_fill(hidden, float("-inf"))  # (B, H, S)
    own = (q * k).sum(-1, keepdim=True).mul(scale)                                       # (B, H, 1)
    top = torch.maximum(past.amax(-1, keepdim=True), own)
    e_past, e_own = (past - top).exp(), (own - top).exp()
    return ((e_past.unsqueeze(-1) * values).sum(2) + e_own * v) / (e_past.sum(-1, keepdim=True) + e_own)


def one_token_forward(w: StepWeights, n_head: int, idx, pos, attend):
    """The step's arithmetic for one token a row: ``idx, pos`` (B,), ``attend(layer, q, k, v) -> (B, H, D)``.
    Returns the logits (B, V) and the new keys and values (layers, B, 2, H, D), for the caller to store."""
    B, C = idx.shape[0], w.wpe.shape[1]
    x = w.wte[idx] + w.wpe[pos]                                                         # (B, C)
    new = []
    for i, lw in enumerate(w.layers):
        qkv = torch.addmm(lw.b_qkv, F.layer_norm(x, (C,), *lw.ln_1, w.eps), lw.w_qkv).view(B, 3, n_head, -1)
        new.append(qkv[:, 1:])                                                          # (B, 2, H, D)
        y = attend(i, *qkv.unbind(1))                                                   # (B, H, D)
        x = x + torch.addmm(lw.w_proj1[C], y.reshape(B, C), lw.w_proj1[:C])
        u = torch.addmm(lw.b_fc, F.layer_norm(x, (C,), *lw.ln_2, w.eps), lw.w_fc)       # a / sqrt(2), as the eager step
        x = x + torch.addmm(lw.w_out1[4 * C], u * (1 + torch.erf(u)), lw.w_out1[:4 * C])
    return torch.mm(F.layer_norm(x, (C,), *w.ln_f, w.eps), w.head), torch.stack(new)


class DecodeStep(torch.nn.Module):
    """``(idx (B,), pos (1,), kv) -> (logits (B, V), greedy (B,))`` over ``FastDecoder``'s cache ``kv``
    (2, layers, B, H, L, D): the new token sees the slots before ``pos`` and itself, and its keys and values
    are stored at ``pos`` after every read (so that the compiler writes that one slot in place)."""

    def __init__(self, dec: FastDecoder):
        super().__init__()
        self.w, self.n_head, self.slots = dec.weights, dec.config.n_head, torch.arange(dec.max_len)

    def forward(self, idx, pos, kv):
        hidden = (self.slots >= pos).view(1, 1, -1)                                     # (1, 1, L)
        logits, new = one_token_forward(self.w, self.n_head, idx, pos, lambda i, q, k, v: attend_past_and_new(
            q, kv[0, i], kv[1, i], hidden, k, v))
        kv.index_copy_(4, pos, new.permute(2, 0, 1, 3, 4).unsqueeze(4))                # (2, layers, B, H, 1, D)
        return logits, logits.argmax(-1)


def built(build):
    """``(build(), None)``, or ``(None, why)`` where a compiler is on the PATH but Inductor cannot use it (a
    missing OpenMP or Python header, say): the bench then says so and its eager rows stand."""
    try:
        return build(), None
    except Exception as e:  # noqa: BLE001  (whatever the toolchain raised, reported, never swallowed silently)
        return None, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def compile_step(step: torch.nn.Module, example: tuple, way: str, rows_in: int = 0):
    """``step`` compiled ``way`` ("aoti" or "inductor") for inputs shaped like ``example``; the first ``rows_in``
    inputs take any number of rows (their first dimension). Returns (callable, seconds it took)."""
    import torch._inductor.config as inductor
    from torch._inductor import aoti_compile_and_package, aoti_load_package  # AOTInductor's documented entry points

    check_choice("way", way, WAYS)
    rows_in = check_int("rows_in", rows_in, 0, len(example))
    start = time.perf_counter()
    # Weights as constants (freezing) let Inductor write each product's loops itself, with the bias and what
    # follows fused in, where its timings pick that over the library call (CPP against ATen); quietly.
    tuned = dict(freezing=True, max_autotune=True, max_autotune_gemm_backends="CPP,ATEN",
                 autotune_num_choices_displayed=0, max_autotune_report_choices_stats=False)
    with torch.inference_mode(), inductor.patch({**tuned, "cpp_wrapper": way == "inductor"}), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", (FutureWarning, DeprecationWarning))  # PyTorch's own, about its internals
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
        if way == "inductor":  # with its C++ wrapper: the compiled code calls its kernels from C++
            fn = torch.compile(step, fullgraph=True, dynamic=bool(rows_in))
            fn(*example)
        else:
            rows = torch.export.Dim("rows", min=1, max=4096)
            shapes = tuple({0: rows} if i < rows_in else None for i in range(len(example))) if rows_in else None
            exported = torch.export.export(step, example, dynamic_shapes=shapes)
            with tempfile.TemporaryDirectory(prefix="kvlib-aoti-") as folder:  # the loader keeps what it needs
                package = aoti_compile_and_package(exported, package_path=str(Path(folder) / "step.pt2"))
                loader = aoti_load_package(package).loader
            # The package's own __call__ parses its input and output specs at every call; its loader's does not.
            fn = lambda *tensors: loader.boxed_run(list(tensors))  # noqa: E731
            fn(*example)
    return fn, time.perf_counter() - start


class CompiledDecoder:
    """``FastDecoder`` with its one-token step compiled: the same contract, ``dec(idx, key_mask, position_ids)``,
    and :meth:`greedy`, a loop that keeps the chosen tokens inside the compiled code.

    ``way``: "aoti" or "inductor"; ``compile_seconds`` is what building it took.
    """

    def __init__(self, model: GPT, batch_size: int, max_len: int | None = None, way: str = "aoti"):
        self.eager = FastDecoder(model, batch_size, max_len)
        self.cache, self.way = self.eager.cache, check_choice("way", way, WAYS)
        self.positions = torch.arange(self.eager.max_len)
        example = (torch.zeros(batch_size, dtype=torch.long), self.positions[1:2], self.eager.kv)
        self.step, self.compile_seconds = compile_step(DecodeStep(self.eager), example, way)
        self.cache.truncate(0)

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
        length = self.cache.length
        logits, _ = self.step(idx.view(-1), self.positions[length:length + 1], self.eager.kv)
        self.cache.advance(1)
        return logits

    @torch.inference_mode()
    def greedy(self, idx: torch.Tensor, n: int) -> torch.Tensor:
        """(B, n) greedy new tokens after the prompts ``idx`` (B, P): the prefill eager, then each token chosen by
        the compiled step and fed straight back (no logits leave it), as CTranslate2's loop does in C++."""
        n = check_int("n", n, 1, self.eager.max_len - idx.shape[1] + 1)  # the last token is never fed back
        self.cache.truncate(0)
        token = self.eager(idx).argmax(-1)                                              # (B,)
        out = [token]
        for pos in self.positions[idx.shape[1]:idx.shape[1] + n - 1].split(1):
            token = self.step(token, pos, self.eager.kv)[1]
            out.append(token)
        self.cache.advance(n - 1)
        return torch.stack(out, 1)


def compiled_decoder(model: GPT, batch_size: int, max_len: int | None = None, way: str = "aoti"):
    """A decoder for ``generate(..., decoder=compiled_decoder)``: compiled where a C++ compiler exists, else eager.

    Compiling takes seconds, so a decoder is kept per model (while its weights stay as they were), batch size,
    length and way, and a later ``generate`` of the same shape reuses it, its cache emptied."""
    if not compiler_available():
        return FastDecoder(model, batch_size, max_len)
    state, kept = weights_key(model), _decoders.get(model, {})
    kept = _decoders[model] = {k: d for k, d in kept.items() if k[0] == state}  # those over older weights are stale
    key = (state, batch_size, max_len, way)
    if key not in kept:
        kept[key] = CompiledDecoder(model, batch_size, max_len, way)
    kept[key].cache.truncate(0)
    return kept[key]


_decoders: "weakref.WeakKeyDictionary[GPT, dict]" = weakref.WeakKeyDictionary()


def weight_reader(model: GPT):
    """A function that reads every weight of ``model`` once: one sum over a copy of them all, side by side, so that
    a single call's cost is timed with the reading. The memory traffic no decode step at one row can avoid."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return flat.sum


def compiled_report(model: GPT, idx: torch.Tensor, new_tokens: int, rounds: int, ct2=None) -> dict:
    """The compiled step, both ways, against the eager fast path (and CTranslate2, when given), one stream, in
    interleaved rounds, with the same-tokens checks and the build times; and where a token's time goes: reading
    the weights once, the compiled step alone, its greedy loop, and ``generate``'s loop around it."""
    from ..decoding import generate
    from .bench import weight_bytes
    from .timing import interleaved, verdict

    eager = generate(model, idx, new_tokens, temperature=0.0).new_tokens
    decs, failed = built(lambda: {way: compiled_decoder(model, 1, way=way) for way in WAYS})
    if decs is None:
        return {"failed": failed}
    ways = {f"compiled, greedy loop ({NAMES[w]})": (lambda d=d: d.greedy(idx, new_tokens)) for w, d in decs.items()}
    ways[f"compiled step in generate ({NAMES['aoti']})"] = lambda: generate(
        model, idx, new_tokens, temperature=0.0, decoder=compiled_decoder).new_tokens
    ways["eager fast path (generate)"] = lambda: generate(model, idx, new_tokens, temperature=0.0).new_tokens
    if ct2 is not None:
        ways["ctranslate2"] = lambda: ct2.greedy(idx.tolist(), new_tokens)[:, idx.shape[1]:]
    same = {name: bool(torch.equal(fn(), eager)) for name, fn in ways.items() if name != "eager fast path (generate)"}
    dec, one = decs["aoti"], (idx[:, -1], torch.tensor([idx.shape[1]]), decs["aoti"].eager.kv)
    ways[STEP_ALONE] = lambda: [dec.step(*one) for _ in range(new_tokens)]
    read = weight_reader(model)
    ways[READ_ONCE] = lambda: [read() for _ in range(new_tokens)]
    with torch.inference_mode():
        timed = interleaved(ways, rounds, min_run_time=1e-6)
    main = next(iter(ways))
    return {"compiler": compiler_available(), "compile_s": {w: d.compile_seconds for w, d in decs.items()},
            "same_tokens": same, "new_tokens": new_tokens, "weight_bytes": weight_bytes(model),
            "main": main, "ms": {k: (t.median * 1e3, t.low * 1e3, t.high * 1e3) for k, t in timed.items()},
            "verdicts": {k: verdict(timed[main], t) for k, t in timed.items() if k != main}}


NAMES = {"aoti": "AOTInductor", "inductor": "torch.compile"}
STEP_ALONE, READ_ONCE = "the AOTInductor step alone", "reading the weights once"


def format_compiled(d: dict, floor_us: float | None = None) -> str:
    """The compiled step's lines of ``python -m kvlib bench``: both ways, the goals judged, and the measured reason
    for a goal missed (where a token's microseconds go)."""
    if "failed" in d:
        return f"the fast step compiled to C++ by Inductor: it could not be built here ({d['failed']}); the rows above stand"
    n, ms, main = d["new_tokens"], d["ms"], d["main"]
    us = {k: 1e3 * med / n for k, (med, _, _) in ms.items()}
    read = us.get(READ_ONCE)
    differ = [k for k, same in d["same_tokens"].items() if not same]
    lines = [f"the fast step compiled to C++ by Inductor, one stream, {n} new tokens; built in "
             + ", ".join(f"{s:.0f} s ({NAMES[w]})" for w, s in d["compile_s"].items()) + "; same tokens as the eager "
             "fast path: " + ("every path" if not differ else "all but " + ", ".join(differ)),
             f"  {'path':44s} {'ms':>7s} {'range':>13s} {'µs/tok':>7s} {'x read':>6s}   {main} against it"]
    for k, (med, lo, hi) in ms.items():
        than = "" if k == main else f"{med / ms[main][0]:.2f}x its speed: {d['verdicts'][k]}"
        x_read = f"{us[k] / read:6.2f}" if read else ""
        lines.append(f"  {k:44s} {med:7.1f} {f'{lo:.1f}-{hi:.1f}':>13s} {us[k]:7.0f} {x_read:>6s}   {than}")
    if "ctranslate2" in ms:
        x = ms["ctranslate2"][0] / ms[main][0]
        lines.append(f"  goal: the compiled loop at least CTranslate2's speed: {x:.2f}x ({d['verdicts']['ctranslate2']}), "
                     + ("met" if x >= 1 else "NOT met"))
    if floor_us:
        x = us[main] / floor_us
        lines.append(f"  goal: within 3x of the FLOP floor ({floor_us:.0f} µs a token): {x:.0f}x, "
                     + ("met" if x <= 3 else "NOT met"))
        if x > 3 and read:
            lines.append(f"    why: a step reads {d['weight_bytes'] / 1e6:.1f} MB of weights, and reading them once "
                         f"took {read:.0f} µs a token here, {read / floor_us:.0f}x the FLOP floor: at one row a decode "
                         "step waits on memory, not on arithmetic, whoever runs it (the 'x read' column)")
    if read and STEP_ALONE in us:
        alone = us[STEP_ALONE]
        lines.append(f"  where the compiled loop's {us[main]:.0f} µs a token go: {read:.0f} reading the weights, "
                     f"{alone - read:.0f} more inside the compiled step (attention over every slot, norms, calls), "
                     f"{us[main] - alone:.0f} in the Python loop around it")
    return "\n".join(lines)
