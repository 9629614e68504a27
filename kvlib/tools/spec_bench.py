"""Measuring speculative decoding: acceptance, tokens per target call, time per token, best γ.

``run_spec_bench`` is what ``python -m kvlib speculate`` prints. For each draft and γ = 1 … 8 it
decodes the same prompts greedily with ``speculative_generate`` and with plain ``generate`` (the
fast path), side by side in one run, checks that the tokens are the same, and reports

- α, the share of judged guesses the target kept, and the tokens per target call (counts, the same on any
  machine), next to (1 − α^(γ+1)) / (1 − α), which assumes each guess is kept independently with probability α;
- time per token against plain greedy, with its spread and verdict, and a timing that contradicts the work it
  holds (faster than the decode step inside it) replaced by the line saying the machine was too busy;
- the cost model (:mod:`kvlib.tools.spec_costs`): counted, what a round does; timed, what its pieces cost here;
- transformers' assisted generation (and prompt lookup) with the same weights, when installed.

It also builds the corpus n-gram draft. (The statistics of notebook 8's sampling check live in
:mod:`kvlib.verify`.) Tests check the report's structure, never its timings.
"""
from __future__ import annotations

import statistics

import numpy as np
import torch

from ..checks import check_int, check_model
from ..decoding import generate
from ..fast import FastDecoder, head_logits
from ..model import GPT
from ..speculative import Draft, NeuralDraft, NgramDraft, expected_tokens_per_round, speculative_generate
from ..poems import encode_prompt
from .timing import Timing, contradicts, describe_machine, interleaved, machine, too_busy, verdict
from .timing import threads as thread_count
from ..verify import greedy_agreement, near_tie_note
from .bench import aten_calls, forward_flops, to_transformers, transformers_available, weight_bytes
from .spec_costs import (COUNTED, alpha_needed, check_costs, describe_counted, describe_timed, draft_costs,  # noqa: F401
                         perfect_draft_speedup, round_us)

GAMMAS = tuple(range(1, 9))
TARGET_SPEEDUP = 1.3
PROMPT_CHARS = (2, 5, 7, 12)  # prompts: the first characters of validation poems


# ---- the drafts -----------------------------------------------------------------------------------

_ngram_drafts: dict[int, NgramDraft] = {}


def corpus_ids(tokenizer, poems: list[str]) -> torch.Tensor:
    """``tokenizer.encode_corpus(poems)`` as a tensor; for the char tokenizer by a code-point table (fast)."""
    itos = getattr(tokenizer, "itos", None)
    if getattr(tokenizer, "kind", None) != "char" or itos is None:
        return torch.tensor(tokenizer.encode_corpus(poems), dtype=torch.long)
    text = "".join("\n" + p for p in poems)  # the separator before every poem, as encode_corpus
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    table = np.full(int(points.max()) + 1, tokenizer.unk_id, dtype=np.int64)
    for i, ch in enumerate(itos):
        if len(ch) == 1 and ord(ch) < len(table):
            table[ord(ch)] = i
    table[ord("\n")] = tokenizer.eos_id
    return torch.from_numpy(table[points])


def corpus_ngram_draft(tokenizer) -> NgramDraft:
    """The n-gram draft of the training split's counts (built once per process, a few seconds)."""
    from .corpus import load_poems, split

    key = tokenizer.vocab_size
    if key not in _ngram_drafts:
        train, _ = split(load_poems())
        _ngram_drafts[key] = NgramDraft.from_ids(corpus_ids(tokenizer, train), tokenizer.vocab_size)
    return _ngram_drafts[key]


def load_drafts(tokenizer) -> dict[str, Draft]:
    """The drafts compared: corpus counts, counts plus look-up in the text so far, the shipped network."""
    from . import integrity
    from .loading import load_pretrained

    ngram = corpus_ngram_draft(tokenizer)
    drafts: dict[str, Draft] = {"n-gram": ngram, "n-gram + lookup": ngram.with_lookup()}
    if "tang-char-draft.pt" in integrity.read_manifest():
        small, _ = load_pretrained("tang-char-draft")
        drafts["neural"] = NeuralDraft(small, name="neural")
    return drafts


def bench_prompts(tokenizer, n: int = 4) -> list[torch.Tensor]:
    """``n`` prompts (1, T): the first 2, 5, 7, 12 … characters of validation poems."""
    from .corpus import load_poems, split

    check_int("n", n, 1, 1000)
    _, val = split(load_poems())
    return [torch.tensor([encode_prompt(tokenizer, poem[:PROMPT_CHARS[i % len(PROMPT_CHARS)]])])
            for i, poem in enumerate(val[:n])]


def bench_context(prompts, new_tokens: int) -> int:
    """The mean number of cached tokens while the prompts are decoded: each prompt's length plus half of
    the new tokens, averaged. The pieces are timed after this many tokens, as the runs they model."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError(f"prompts must be a non-empty list of (1, P) int64 tensors, got {prompts!r:.60}")
    new_tokens = check_int("new_tokens", new_tokens, 1)
    return max(1, round(sum(p.shape[-1] for p in prompts) / len(prompts) + (new_tokens - 1) / 2))


# ---- costs of the pieces --------------------------------------------------------------------------

@torch.inference_mode()
def decode_step(model: GPT, context: int = 40):
    """(decoder, step): a fast-path decoder holding ``context`` tokens (fewer if the block leaves no room
    for a verify pass of 9 after them), and one decode step after them (the cache cut back first, so
    every call does the same work)."""
    _check_bench_model(model)
    check_int("context", context, 1)
    context = min(context, model.config.block_size - MAX_VERIFY)
    dec = FastDecoder(model, 1)
    dec(torch.zeros(1, context, dtype=torch.long))
    one = torch.zeros(1, 1, dtype=torch.long)

    def step():
        dec.cache.truncate(context)
        dec(one)
    return dec, step


def piece_costs(model: GPT, drafts: dict[str, Draft], context: int = 40, rounds: int = 5,
                min_run_time: float = 0.02, passes=tuple(range(2, 10))) -> dict:
    """µs of one fast-path decode step, a verify pass of each T in ``passes``, the head's matrix product over one
    row and over the most rows, and one guess of each draft: medians of ``rounds`` interleaved rounds
    (:func:`kvlib.tools.timing.interleaved`), every round's figure under ``"rounds_us"``. A guess is the difference
    of two timings of the same round (γ = 2 minus γ = 1), floored at 0; its figure is the median of those
    differences, its spread in decode steps, round by round, under ``"guess_steps_spread"``. A verify pass of one
    token is the decode step itself (one figure). ``"too_busy"`` holds, for each pass ("verify/T") and for the
    head's widest product ("head/T"), the line to print instead of its figure when it was timed faster than the
    step (or the one-row product) that is part of its work (:func:`kvlib.tools.timing.contradicts`), else None.
    """
    if not isinstance(passes, (tuple, list, range)) or not passes:
        raise TypeError(f"passes must be a non-empty tuple of token counts in [2, {MAX_VERIFY}], got {passes!r:.60}")
    passes = sorted({check_int("a count of passes", T, 2, MAX_VERIFY) for T in passes})
    dec, step = decode_step(model, context)
    context, widest = dec.cache.length, passes[-1]

    def verify(T):
        chunk = torch.zeros(1, T, dtype=torch.long)

        def run():
            dec.cache.truncate(context)
            dec.extend(chunk)
        return run

    def head(T):
        x = torch.randn(T, model.config.n_embd, generator=torch.Generator().manual_seed(T))
        return lambda: head_logits(x, dec.weights)  # (T, C) @ (C, V): the largest product of a pass

    tokens = list(range(1, context + 1))
    fns = {"step": step, **{("verify", T): verify(T) for T in passes}, ("head", 1): head(1), ("head", widest): head(widest)}
    for name, d in drafts.items():
        # One more guess after the tokens so far costs one feed and one pick: propose γ = 2, minus γ = 1.
        fns["guess", name, 2] = lambda d=d: d.propose(tokens, 2)
        fns["guess", name, 1] = lambda d=d: d.propose(tokens, 1)
    t = interleaved(fns, rounds, min_run_time=min_run_time)
    named = {"step": "one decode step", **{("verify", T): f"a verify pass of {T} tokens" for T in passes},
             ("head", 1): "the head's product over one row", ("head", widest): f"the head's product over {widest} rows"}
    t = {key: Timing(named[key], v.rounds) if key in named else v for key, v in t.items()}
    t["verify", 1] = t["step"]  # the same computation: one figure
    us = lambda key: 1e6 * t[key].median  # noqa: E731
    guess = {name: [max(a - b, 0.0) * 1e6 for a, b in zip(t["guess", name, 2].rounds, t["guess", name, 1].rounds)]
             for name in drafts}  # one more guess, µs, round by round
    in_steps = {name: [g / (1e6 * s) for g, s in zip(guess[name], t["step"].rounds)] for name in drafts}
    busy = {f"verify/{T}": too_busy(t["step"], t["verify", T]) if contradicts(t["step"], t["verify", T]) else None
            for T in passes}
    busy[f"head/{widest}"] = (too_busy(t["head", 1], t["head", widest]) if contradicts(t["head", 1], t["head", widest])
                              else None)
    return {"step_us": us("step"),
            "verify_us": {T: us(("verify", T)) for T in [1, *passes]},
            "head_us": {T: us(("head", T)) for T in (1, widest)},
            "guess_us": {name: statistics.median(g) for name, g in guess.items()},
            "guess_steps_spread": {name: (min(s), max(s)) for name, s in in_steps.items()},
            "too_busy": busy, "rounds": rounds, "context": context,
            "rounds_us": {"step": [1e6 * x for x in t["step"].rounds],
                          "verify": {T: [1e6 * x for x in t["verify", T].rounds] for T in [1, *passes]},
                          "guess": guess}}


def pass_counts(model: GPT, context: int = 40, max_tokens: int = 9) -> dict:
    """What a verify pass of T = 1 … ``max_tokens`` tokens does after ``context`` cached tokens, whatever the machine:
    ATen calls (counted under inference mode; T = 1 is the decode step), FLOPs, and bytes of weights read."""
    max_tokens = check_int("max_tokens", max_tokens, 1, MAX_VERIFY)
    dec, _ = decode_step(model, context)
    context = dec.cache.length
    weights = weight_bytes(model)
    out = {}
    for T in range(1, max_tokens + 1):
        chunk = torch.zeros(1, T, dtype=torch.long)

        def run():
            dec.cache.truncate(context)
            dec(chunk) if T == 1 else dec.extend(chunk)
        run()  # once uncounted: what is built once per decoder (the causal mask) is not part of a pass
        out[T] = {"aten_calls": aten_calls(run), "flops": forward_flops(model.config, T, context),
                  "weight_bytes": weights}
    return out


def guess_counts(draft: Draft, context: int = 40) -> dict | None:
    """One guess, counted as :func:`pass_counts` counts a pass: a table look-up (n-gram) does no operator call, reads no
    weight and does no arithmetic; a neural guess is a decode step of its model. None for another kind of draft."""
    if isinstance(draft, NgramDraft):
        return {k: 0 for k in COUNTED}
    if isinstance(draft, NeuralDraft) and draft.model.config.block_size >= 2 * MAX_VERIFY:
        return pass_counts(draft.model, context, 1)[1]
    return None


# ---- the benchmark --------------------------------------------------------------------------------

def _hf_assisted(hf, hf_draft, idx, n, gamma):
    kwargs = dict(attention_mask=torch.ones_like(idx), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                  pad_token_id=0)
    with torch.inference_mode():
        if hf_draft is None:
            return hf.generate(idx, prompt_lookup_num_tokens=gamma, **kwargs)
        hf_draft.generation_config.num_assistant_tokens = gamma
        hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
        return hf.generate(idx, assistant_model=hf_draft, **kwargs)


def run_spec_bench(model: GPT, tokenizer, drafts: dict[str, Draft] | None = None, prompts=None, *,
                   gammas=GAMMAS, new_tokens: int = 64, rounds: int = 3, with_transformers: bool = True,
                   progress: bool = True, threads: int = 1, costs: dict | None = None,
                   counts: dict | None = None) -> dict:
    """Greedy speculative decoding against plain greedy ``generate``, for every draft and γ, side by side.

    The ways take turns, round after round (``kvlib.tools.timing``'s rule); a time per token is the median over
    the rounds, with its spread and a verdict against plain greedy: faster, slower or within noise. ``costs``
    (:func:`piece_costs`) and ``counts`` (:func:`pass_counts`) may be passed in, else they are measured after the
    rounds. Runs with ``threads`` threads (1 is fastest at this size), restored after.
    """
    check_model(model)
    _check_bench_model(model)
    new_tokens = check_int("new_tokens", new_tokens, 1)
    check_int("rounds", rounds, 1)
    if not isinstance(gammas, (tuple, list)) or not gammas:
        raise TypeError(f"gammas must be a non-empty tuple of ints in [1, {MAX_VERIFY - 1}], got {gammas!r:.60}")
    gammas = tuple(check_int(f"gammas[{i}]", g, 1, MAX_VERIFY - 1, f"an int in [1, {MAX_VERIFY - 1}]: the cost model "
                             f"has verify passes of up to {MAX_VERIFY} tokens") for i, g in enumerate(gammas))
    if drafts is not None and (not isinstance(drafts, dict) or not drafts
                               or not all(isinstance(d, Draft) for d in drafts.values())):
        raise TypeError(f"drafts must be a non-empty dict of name -> Draft, got {drafts!r:.80}")
    if prompts is not None:
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise TypeError(f"prompts must be a non-empty list of (1, P) int64 tensors, got {prompts!r:.60}")
        for i, idx in enumerate(prompts):
            if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.shape[0] != 1 or idx.dtype != torch.long:
                raise TypeError(f"prompts[{i}] must be a (1, P) int64 tensor (as bench_prompts makes), got {idx!r:.60}")
    if costs is not None:
        check_costs(costs, 0.0)
        missing = ([f"a guess of {name}" for name in (drafts or {}) if name not in costs.get("guess_us", {})]
                   + [f"a verify pass of {g + 1}" for g in gammas if g + 1 not in costs["verify_us"]])
        if missing or "rounds_us" not in costs:
            raise ValueError(f"costs has no figure for {missing or 'each round'}: measure them with piece_costs(model, "
                             f"drafts, passes=[γ + 1 for each γ])")
    if counts is not None and not (isinstance(counts, dict) and set(counts) >= {1, *(g + 1 for g in gammas)}):
        raise TypeError(f"counts must be pass_counts(model, context) with passes of 1 … {max(gammas) + 1} tokens, "
                        f"got {counts!r:.60}")
    with thread_count(threads):
        return _measure(model, tokenizer, drafts, prompts, gammas, new_tokens, rounds, with_transformers, progress,
                        costs, counts)


MAX_VERIFY = 9  # piece_costs measures verify passes of 1 … 9 tokens: rounds of up to 8 guesses


def _check_bench_model(model: GPT) -> None:
    """A block with room for a verify pass of MAX_VERIFY tokens after a short context."""
    if model.config.block_size < 2 * MAX_VERIFY:
        raise ValueError(f"the speculative bench needs a block of at least {2 * MAX_VERIFY} positions (a verify pass of "
                         f"{MAX_VERIFY} after a context), got {model.config.block_size}")


def _measure(model, tokenizer, drafts, prompts, gammas, new_tokens, rounds, with_transformers, progress, costs,
             counts) -> dict:
    from tqdm.auto import tqdm
    import sys

    model.eval()
    drafts = load_drafts(tokenizer) if drafts is None else drafts
    prompts = bench_prompts(tokenizer) if prompts is None else prompts
    for idx in prompts:
        if idx.shape[1] + new_tokens > model.config.block_size + 1:
            raise ValueError(f"a {idx.shape[1]}-token prompt and {new_tokens} new tokens do not fit the block "
                             f"of {model.config.block_size}")
    total = sum(min(new_tokens, model.config.block_size - p.shape[1] + 1) for p in prompts)
    reference = [generate(model, idx, new_tokens, temperature=0.0).tokens for idx in prompts]

    def plain_greedy():
        for idx in prompts:
            generate(model, idx, new_tokens, temperature=0.0)

    keys = [(name, g) for name in drafts for g in gammas]
    stats, same = {}, {}

    def spec_timed(key):
        def run():
            results = [speculative_generate(model, drafts[key[0]], idx, new_tokens, gamma=key[1]) for idx in prompts]
            if key not in stats:  # the counts are the same every call: take them from the first (the warm-up)
                judged = sum(res.judged for res in results)
                calls = sum(len(res.rounds) for res in results)
                # The formula counts a round that asks for γ guesses; near the end of a text a round asks for
                # fewer (only what can still be written), so it is checked on the full rounds alone.
                full = [r for res in results for r in res.rounds if len(r.drafted) == key[1]]
                alpha = sum(res.accepted for res in results) / max(1, judged)
                stats[key] = {"alpha": alpha, "judged": judged, "target_calls": calls, "tokens_per_call": total / calls,
                              "full_rounds": len(full),
                              "tokens_per_full_round": sum(r.accepted + 1 for r in full) / max(1, len(full)),
                              "formula": expected_tokens_per_round(alpha, key[1])}
                seen = [greedy_agreement(model, ref[0, :P], res.tokens[0, P:], ref[0, P:])
                        for res, ref, P in zip(results, reference, (p.shape[1] for p in prompts))]
                same[key] = {"same_tokens": "differ" not in seen, "near_ties": seen.count("near-tie")}
        return run

    # One decode step takes its turn in the same rounds: a greedy token is a step plus the loop around it, and a
    # round holds a verify pass, which holds a step; a timing faster than the step it holds is not reported.
    context = bench_context(prompts, new_tokens)
    fns = {"plain": plain_greedy, "step": decode_step(model, context)[1], **{key: spec_timed(key) for key in keys}}
    bar = tqdm(total=rounds * len(fns), desc="speculate", disable=not progress, file=sys.stderr, leave=False)
    timed = interleaved(fns, rounds, min_run_time=0.05, on_round=lambda: bar.update(len(fns)))
    bar.close()
    step = Timing("one decode step", timed["step"].rounds)
    plain = Timing("a plain greedy token", tuple(x / total for x in timed["plain"].rounds))
    per_token = {key: Timing(str(key), tuple(x / total for x in timed[key].rounds)) for key in keys}
    if costs is None:
        costs = piece_costs(model, drafts, context, passes=[g + 1 for g in gammas])
    counts = pass_counts(model, context) if counts is None else counts

    report_drafts = {}
    for name in drafts:
        per_gamma = []
        for g in gammas:
            t, s = per_token[name, g], stats[name, g]
            per_round = Timing(f"a round of the {name} draft at γ = {g}",
                               tuple(x / s["target_calls"] for x in timed[name, g].rounds))
            per_gamma.append({"gamma": g, **s, "us_per_token": 1e6 * t.median, "low_us": 1e6 * t.low,
                              "high_us": 1e6 * t.high, "speedup": plain.median / t.median, "verdict": verdict(t, plain),
                              "too_busy": too_busy(step, per_round) if contradicts(step, per_round) else None,
                              **same[name, g]})
        best = min(per_gamma, key=lambda r: r["us_per_token"])
        report_drafts[name] = {"rows": per_gamma, "best_gamma": best["gamma"], "best_speedup": best["speedup"],
                               "best_verdict": best["verdict"],
                               **draft_costs(costs, counts, guess_counts(drafts[name], context), name, per_gamma,
                                                TARGET_SPEEDUP)}
    ranked = sorted(report_drafts, key=lambda n: -report_drafts[n]["best_speedup"])
    better = ranked[0]
    best_timing = lambda n: per_token[n, report_drafts[n]["best_gamma"]]  # noqa: E731
    better_vs_next = verdict(best_timing(better), best_timing(ranked[1])) if len(ranked) > 1 else "no other draft"

    hf_info = {"installed": transformers_available(), "used": False}
    if with_transformers and hf_info["installed"]:
        with torch.random.fork_rng(devices=[]):  # building GPT2LMHeadModel draws initial weights: keep the global RNG
            hf_info.update(_transformers_rows(model, drafts, prompts, new_tokens, report_drafts, reference, total,
                                              rounds))

    return {
        "machine": machine(),
        "model": {"n_layer": model.config.n_layer, "parameters": model.num_params()},
        "drafts": {name: _describe(d) for name, d in drafts.items()},
        "prompts": [tokenizer.decode(p[0, 1:].tolist()) for p in prompts],
        "new_tokens": new_tokens, "total_tokens": total, "rounds": rounds, "gammas": list(gammas), "context": context,
        "plain_us_per_token": 1e6 * plain.median, "plain_spread_us": (1e6 * plain.low, 1e6 * plain.high),
        "step_us": 1e6 * step.median, "step_spread_us": (1e6 * step.low, 1e6 * step.high),
        "plain_vs_step": verdict(plain, step),
        "plain_too_busy": too_busy(step, plain) if contradicts(step, plain) else None,
        "costs": costs,
        "counts": counts,
        "results": report_drafts,
        "better_draft": better,
        "better_vs_next": better_vs_next,
        "target_speedup": TARGET_SPEEDUP,
        "target_met": (report_drafts[better]["best_speedup"] >= TARGET_SPEEDUP
                       and report_drafts[better]["best_verdict"] == "faster"),
        "transformers": hf_info,
    }


def _describe(d: Draft) -> dict:
    if isinstance(d, NeuralDraft):
        c = d.model.config
        return {"kind": "neural", "n_layer": c.n_layer, "n_embd": c.n_embd, "parameters": d.model.num_params(),
                "val_loss_per_token": getattr(d.model, "metrics", {}).get("val_loss_per_token")}
    if isinstance(d, NgramDraft):
        return {"kind": "n-gram", "lookup": d.lookup, "trigram_contexts": len(d.trigram), "bigram_contexts": len(d.bigram)}
    return {"kind": type(d).__name__}


def _transformers_rows(model, drafts, prompts, new_tokens, report_drafts, reference, total, rounds) -> dict:
    """transformers' plain generate, its assisted generation with the neural draft and its prompt lookup
    (each at our best γ), timed in interleaved rounds of their own: medians per token with their spread.

    The first call of each case (the warm-up) checks its tokens; a case that raises (an API change in
    transformers) is reported with its error, not timed.
    """
    hf = to_transformers(model)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    cases = {"plain generate": (None, None)}
    if "neural" in drafts:
        cases["assisted (neural draft)"] = (to_transformers(drafts["neural"].model), report_drafts["neural"]["best_gamma"])
    if "n-gram + lookup" in drafts:
        cases["prompt lookup"] = (None, report_drafts["n-gram + lookup"]["best_gamma"])
    rows = {name: {"gamma": g} for name, (_, g) in cases.items()}

    def timed(name):
        hf_draft, g = cases[name]

        @torch.inference_mode()
        def run():
            if "error" in rows[name]:
                return
            try:
                outs = [hf.generate(idx, attention_mask=torch.ones_like(idx), **kwargs) if g is None
                        else _hf_assisted(hf, hf_draft, idx, new_tokens, g) for idx in prompts]
            except Exception as e:  # an API change in transformers: reported, not fatal
                rows[name]["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                return
            rows[name].setdefault("same_tokens", all(torch.equal(o[:, : ref.shape[1]], ref)
                                                     for o, ref in zip(outs, reference)))
        return run

    times = interleaved({name: timed(name) for name in cases}, rounds, min_run_time=0.0)
    for name, t in times.items():
        if "error" not in rows[name]:
            rows[name].update(us_per_token=1e6 * t.median / total, spread_us=(1e6 * t.low / total, 1e6 * t.high / total))
            if name != "plain generate" and "error" not in rows["plain generate"]:
                rows[name]["vs_plain"] = verdict(t, times["plain generate"])  # against the library's own loop
    import transformers

    return {"used": True, "version": transformers.__version__, "rows": rows}


def format_report(report: dict) -> str:
    """The report as text: what was seen first (α, tokens a round, time per token against plain greedy), then the
    cost model that explains it, counted (the same on every machine) and timed (this machine's reading)."""
    r, c = report, report["costs"]
    spread = lambda lo_hi: f"{lo_hi[0]:.0f}-{lo_hi[1]:.0f}"  # noqa: E731
    lines = [f"kvlib speculate: greedy, {len(r['prompts'])} prompts x {r['new_tokens']} new tokens, every draft at γ = "
             f"{', '.join(map(str, r['gammas']))} and plain greedy, medians of {r['rounds']} rounds, taking turns",
             f"{describe_machine(r['machine'])}; timed on {r['machine']['threads']} thread(s)",
             "plain greedy: " + (r["plain_too_busy"] or
                                 f"{r['plain_us_per_token']:.0f} µs a token ({spread(r['plain_spread_us'])}); one decode "
                                 f"step in the same rounds: {r['step_us']:.0f} µs ({spread(r['step_spread_us'])}): a "
                                 f"greedy token cost {r['plain_us_per_token'] / r['step_us']:.2f} decode steps"),
             "", f"{'draft':16s} {'γ':>2s} {'α':>5s} {'tokens/round':>12s}  {'µs/token (spread)':>18s}  against plain greedy"]
    for name, res in r["results"].items():
        for i, row in enumerate(res["rows"]):
            timed = row["too_busy"] or (f"{row['us_per_token']:6.0f} ({row['low_us']:.0f}-{row['high_us']:.0f})".rjust(18)
                                        + f"  {row['speedup']:.2f}x, {row['verdict']}")
            lines.append(f"{name if i == 0 else '':16s} {row['gamma']:2d} {row['alpha']:5.2f} {row['tokens_per_call']:12.2f}"
                         f"  {timed}" + ("" if row["same_tokens"] else "  (tokens differ from plain greedy)"))
    ties = sum(row["near_ties"] for res in r["results"].values() for row in res["rows"])
    differ = any(not row["same_tokens"] for res in r["results"].values() for row in res["rows"])
    lines.append(("some runs wrote other tokens than plain greedy" if differ else
                  "every run wrote plain greedy's tokens") + (f"; near-ties:{near_tie_note(ties)}" if ties else ""))
    lines += ["", "counted, the same on every machine: a round (γ guesses, one verify pass of γ + 1 tokens) costs at least "
                  "the smallest of its ratios to a decode step in operator calls, weights read and FLOPs"]
    lines += [f"  {name:16s} {describe_counted(res, r['target_speedup'])}" for name, res in r["results"].items()]
    busy = next((line for line in c["too_busy"].values() if line), None)
    passes = ", ".join(f"T={T} {us / c['step_us']:.2f}" for T, us in c["verify_us"].items() if T > 1)
    lines += ["", f"timed, this machine: pieces after {c['context']} cached tokens, medians of {c['rounds']} rounds: "
                  + (busy or f"a verify pass of T tokens cost {passes} decode steps") + "; one more guess: "
                  + ", ".join(f"{n} {us / c['step_us']:.2f}" for n, us in c["guess_us"].items()) + " steps"]
    lines += [f"  {name:16s} best γ = {res['best_gamma']}: {res['best_speedup']:.2f}x plain greedy ({res['best_verdict']}); "
              + describe_timed(res, r["target_speedup"]) for name, res in r["results"].items()]
    better = r["better_draft"]
    lines += ["", f"draft with the best median: {better}, {r['results'][better]['best_speedup']:.2f}x over plain "
                  f"greedy (against the next draft's best: {r['better_vs_next']}); target >= {r['target_speedup']}x "
                  f"and faster than plain greedy in every round: {'met' if r['target_met'] else 'NOT met'} in this run"]
    hf = r["transformers"]
    if hf.get("used"):
        lines.append(f"transformers {hf['version']}, the same weights, in interleaved rounds of their own:")
        for name, row in hf["rows"].items():
            at = "" if row["gamma"] is None else f", γ = {row['gamma']}"
            lines.append(f"  {name}{at}: " + (row["error"] if "error" in row else
                         f"{row['us_per_token']:.0f} µs/token ({spread(row['spread_us'])}), same tokens {row['same_tokens']}"
                         + (f"; against its plain generate: {row['vs_plain']}" if "vs_plain" in row else "")))
    else:
        lines.append("transformers: " + ("not measured" if hf["installed"] else "not installed"))
    return "\n".join(lines)
