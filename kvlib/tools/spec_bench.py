"""Measuring speculative decoding: acceptance, tokens per target call, time per token, best γ.

``run_spec_bench`` is what ``python -m kvlib speculate`` prints. For each draft and γ = 1 … 8 it
decodes the same prompts greedily with ``speculative_generate`` and with plain ``generate`` (the
fast path), side by side in one run, checks that the tokens are the same, and reports

- α, the share of drafted tokens the target kept, and the tokens per target call next to
  (1 − α^(γ+1)) / (1 − α), which assumes each guess is kept independently with probability α;
- time per token, the best γ and the speed-up over plain greedy;
- the cost of one draft step and of one verify pass of γ + 1 tokens, which with α explain the speed-up;
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
from .timing import Timing, describe_machine, interleaved, machine, verdict
from .timing import threads as thread_count
from ..verify import greedy_agreement, near_tie_note
from .bench import aten_calls, forward_flops, to_transformers, transformers_available, weight_bytes
from .spec_costs import alpha_needed, check_costs, perfect_draft_speedup, round_us

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
                min_run_time: float = 0.02) -> dict:
    """µs of one fast-path decode step, one verify pass of T = 2 … 9 tokens, the head's matrix product
    alone over T rows, and one guess of each draft: medians of ``rounds`` interleaved rounds
    (:func:`kvlib.tools.timing.interleaved`), each with its spread (low, high) under ``"spread"``; a guess
    also in decode steps, round by round, under ``"guess_steps_spread"`` (low, high). A guess is the
    difference of two timings of the same round (γ = 2 minus γ = 1), floored at 0 (one too quick to tell
    from noise is 0); its figure is the median of those differences.
    ``"verify_per_token_vs_step"`` holds, for T = 2 … 9, the verdict of a verify pass's cost per token
    against the decode step, taken over the rounds (:func:`kvlib.tools.timing.verdict`); ``"verify_vs_step"`` the
    verdict of the whole pass against one step.

    A verify pass of one token is the decode step itself: ``verify_us[1]`` is the step's figure, not a
    second measurement of the same computation. The cost model divides these by ``step_us``: costs in
    decode steps stay comparable when the machine's speed moves between two measurements.
    """
    dec, step = decode_step(model, context)
    context = dec.cache.length

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
    fns = {"step": step, **{("verify", T): verify(T) for T in range(2, 10)},
           **{("head", T): head(T) for T in range(1, 10)}}
    for name, d in drafts.items():
        # One more guess after the tokens so far costs one feed and one pick: propose γ = 2, minus γ = 1.
        fns["guess", name, 2] = lambda d=d: d.propose(tokens, 2)
        fns["guess", name, 1] = lambda d=d: d.propose(tokens, 1)
    t = interleaved(fns, rounds, min_run_time=min_run_time)
    t["verify", 1] = t["step"]  # the same computation: one figure
    us = lambda key: 1e6 * t[key].median  # noqa: E731
    spread = {str(k if isinstance(k, str) else "/".join(map(str, k))): (1e6 * v.low, 1e6 * v.high)
              for k, v in t.items()}

    def guess(name):  # one more guess, round by round: (µs, in decode steps of the same round)
        return [(max(a - b, 0.0), max(a - b, 0.0) / c) for a, b, c in
                zip(t["guess", name, 2].rounds, t["guess", name, 1].rounds, t["step"].rounds)]

    def guess_steps(name):  # (low, high) over the rounds
        per_round = [steps for _, steps in guess(name)]
        return min(per_round), max(per_round)

    def per_token(T):  # a verify pass of T tokens, per token, round by round
        return Timing(f"verify {T}, per token", tuple(x / T for x in t["verify", T].rounds))

    return {"step_us": us("step"),
            "verify_us": {T: us(("verify", T)) for T in range(1, 10)},
            "head_us": {T: us(("head", T)) for T in range(1, 10)},
            "guess_us": {name: 1e6 * statistics.median(g for g, _ in guess(name)) for name in drafts},
            "guess_steps_spread": {name: guess_steps(name) for name in drafts},
            "verify_per_token_vs_step": {T: verdict(per_token(T), t["step"]) for T in range(2, 10)},
            "verify_vs_step": {T: verdict(t["verify", T], t["step"]) for T in range(2, 10)},
            "rounds": rounds, "context": context, "spread": spread}


def pass_counts(model: GPT, context: int = 40) -> dict:
    """What a verify pass of T = 1 … 9 tokens does after ``context`` cached tokens, whatever the machine:
    ATen calls (counted under inference mode; T = 1 is the decode step), FLOPs, and bytes of weights read."""
    dec, _ = decode_step(model, context)
    context = dec.cache.length
    weights = weight_bytes(model)
    out = {}
    for T in range(1, MAX_VERIFY + 1):
        chunk = torch.zeros(1, T, dtype=torch.long)

        def run():
            dec.cache.truncate(context)
            dec(chunk) if T == 1 else dec.extend(chunk)
        run()  # once uncounted: what is built once per decoder (the causal mask) is not part of a pass
        out[T] = {"aten_calls": aten_calls(run), "flops": forward_flops(model.config, T, context),
                  "weight_bytes": weights}
    return out


# ---- the cost model -------------------------------------------------------------------------------

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
                   progress: bool = True, threads: int = 1, costs: dict | None = None) -> dict:
    """Greedy speculative decoding against plain greedy ``generate``, for every draft and γ, side by side.

    Each round times plain decoding of every prompt, then every (draft, γ), so a change in the
    machine's load hits all alike (``kvlib.tools.timing``'s rule); a time per token is the median over the
    rounds, with its spread, and each speed-up comes with a verdict: faster, slower or within noise.
    ``costs`` from :func:`piece_costs` on this machine may be passed in (one measurement of each piece per
    notebook); otherwise they are measured after the rounds. Runs with ``threads`` threads (1 is
    fastest at this size; a second thread waiting for a busy core slows every step), restored after.
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
        missing = [name for name in (drafts or {}) if name not in costs.get("guess_us", {})]
        if missing:
            raise ValueError(f"costs has no guess cost for draft(s) {missing}: measure them with piece_costs(model, "
                             f"drafts)")
    with thread_count(threads):
        return _measure(model, tokenizer, drafts, prompts, gammas, new_tokens, rounds, with_transformers, progress, costs)


MAX_VERIFY = 9  # piece_costs measures verify passes of 1 … 9 tokens: rounds of up to 8 guesses


def _check_bench_model(model: GPT) -> None:
    """A block with room for a verify pass of MAX_VERIFY tokens after a short context."""
    if model.config.block_size < 2 * MAX_VERIFY:
        raise ValueError(f"the speculative bench needs a block of at least {2 * MAX_VERIFY} positions (a verify pass of "
                         f"{MAX_VERIFY} after a context), got {model.config.block_size}")


def _measure(model, tokenizer, drafts, prompts, gammas, new_tokens, rounds, with_transformers, progress, costs) -> dict:
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
    prompt_lengths = [idx.shape[1] for idx in prompts]

    def plain_greedy():
        for idx in prompts:
            generate(model, idx, new_tokens, temperature=0.0)

    def spec(d, g):
        return [speculative_generate(model, d, idx, new_tokens, gamma=g) for idx in prompts]

    keys = [(name, g) for name in drafts for g in gammas]
    stats, same = {}, {}

    def spec_timed(key):
        def run():
            results = spec(drafts[key[0]], key[1])
            if key not in stats:  # the counts are the same every call: take them from the first (the warm-up)
                judged = sum(res.judged for res in results)
                alpha = sum(res.accepted for res in results) / max(1, judged)
                calls = sum(len(res.rounds) for res in results)
                # The formula counts a round that asks for γ guesses; near the end of a text a round asks for
                # fewer (only what can still be written), so it is checked on the full rounds alone.
                full = [r for res in results for r in res.rounds if len(r.drafted) == key[1]]
                stats[key] = {"alpha": alpha, "judged": judged, "tokens_per_call": total / calls,
                              "full_rounds": len(full),
                              "tokens_per_full_round": sum(r.accepted + 1 for r in full) / max(1, len(full)),
                              "formula": expected_tokens_per_round(alpha, key[1])}
                seen = [greedy_agreement(model, ref[0, :P], res.tokens[0, P:], ref[0, P:])
                        for res, ref, P in zip(results, reference, prompt_lengths)]
                same[key] = {"same_tokens": "differ" not in seen, "near_ties": seen.count("near-tie")}
        return run

    # One decode step takes its turn in the same rounds: plain greedy's time per token is a step plus the
    # loop around it, and the cost model below is scaled to this run's step.
    context = bench_context(prompts, new_tokens)
    fns = {"plain": plain_greedy, "step": decode_step(model, context)[1], **{key: spec_timed(key) for key in keys}}
    bar = tqdm(total=rounds * len(fns), desc="speculate", disable=not progress, file=sys.stderr, leave=False)
    timed = interleaved(fns, rounds, min_run_time=0.05, on_round=lambda: bar.update(len(fns)))
    bar.close()
    per_token = {key: Timing(str(key), tuple(x / total for x in timed[key].rounds)) for key in ["plain"] + keys}
    plain_us, step = 1e6 * per_token["plain"].median, timed["step"]
    if costs is None:
        costs = piece_costs(model, drafts, context)
    scale = 1e6 * step.median / costs["step_us"]  # the pieces' costs, in this run's decode steps
    step_rounds = [1e6 * x / costs["step_us"] for x in step.rounds]  # the same, round by round

    report_drafts = {}
    for name in drafts:
        per_gamma = []
        for g in gammas:
            t = per_token[name, g]
            us = 1e6 * t.median
            s = stats[name, g]
            # The cost model: γ guesses and one verify pass of γ + 1 tokens per round, over the tokens it writes.
            in_steps = round_us(costs, costs["guess_us"][name], g) / s["tokens_per_call"]
            modelled = Timing(f"model {name} {g}", tuple(1e-6 * k * in_steps for k in step_rounds))
            against_model = verdict(t, modelled)  # the measured time per token against the model's, round by round
            per_gamma.append({"gamma": g, **s, "us_per_token": us, "low_us": 1e6 * t.low, "high_us": 1e6 * t.high,
                              "speedup": plain_us / us, "verdict": verdict(t, per_token["plain"]),
                              "modelled_us_per_token": scale * in_steps,
                              "vs_model": {"faster": "below", "slower": "above"}.get(against_model, against_model),
                              **same[name, g]})
        best = min(per_gamma, key=lambda r: r["us_per_token"])
        guess = costs["guess_us"][name]
        # Over every γ, as the perfect draft's ceiling: the smallest α that reaches the target, and its γ.
        needs = {g: a for g in gammas if (a := alpha_needed(costs, guess, g, TARGET_SPEEDUP)) is not None}
        easiest = min(needs, key=needs.get) if needs else None
        report_drafts[name] = {"rows": per_gamma, "best_gamma": best["gamma"], "best_speedup": best["speedup"],
                               "best_verdict": best["verdict"],
                               "alpha_needed": needs.get(easiest), "alpha_needed_gamma": easiest,
                               "perfect_draft_speedup": perfect_draft_speedup(costs, guess, gammas)}
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
        "plain_us_per_token": plain_us,
        "plain_spread_us": (1e6 * per_token["plain"].low, 1e6 * per_token["plain"].high),
        "step_us": 1e6 * step.median, "step_spread_us": (1e6 * step.low, 1e6 * step.high),
        "plain_vs_step": verdict(per_token["plain"], step),
        "costs": costs,
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
    """The report as text tables."""
    lines = [f"kvlib speculate: greedy, {len(report['prompts'])} prompts x {report['new_tokens']} new tokens, "
             f"medians of {report['rounds']} rounds, taking turns",
             f"{describe_machine(report['machine'])}; timed on {report['machine']['threads']} thread(s)",
             f"plain greedy on the fast path: {report['plain_us_per_token']:.0f} µs/token "
             f"({report['plain_spread_us'][0]:.0f}-{report['plain_spread_us'][1]:.0f}); one decode step in the same "
             f"rounds: {report['step_us']:.0f} µs ({report['step_spread_us'][0]:.0f}-{report['step_spread_us'][1]:.0f}), "
             f"so plain greedy costs {report['plain_us_per_token'] / report['step_us']:.2f} steps a token (the step, "
             f"the loop around it, the prompt's prefill shared out; against the step: {report['plain_vs_step']})",
             ""]
    c = report["costs"]
    step = c["step_us"]
    at = f"after {c['context']} cached tokens" if "context" in c else "at a context not recorded"
    lines.append(f"costs {at} (the runs' mean: {report['context']}), in decode steps of "
                 f"their own {c['rounds']} interleaved rounds (the model column multiplies them by this run's step; "
                 f"'vs model' compares the rounds' times with the model's, round by round): verify pass of T tokens: "
                 + ", ".join(f"T={T} {us / step:.2f}" for T, us in c["verify_us"].items()))
    lines.append("       the head's product alone over T rows, in one-row products: "
                 + ", ".join(f"T={T} {us / c['head_us'][1]:.1f}" for T, us in c["head_us"].items()))
    lines.append("       one guess: " + ", ".join(f"{n} {us / step:.2f}" for n, us in c["guess_us"].items()))
    for name, res in report["results"].items():
        lines += ["", f"draft: {name} {report['drafts'][name]}",
                  f"  {'γ':>2s} {'α':>5s} {'tok/call':>8s} {'full':>5s} {'formula':>7s} {'µs/tok':>7s} {'model':>7s} "
                  f"{'vs model':>12s} {'speed-up':>8s} {'verdict':>12s} same tokens"]
        for r in res["rows"]:
            lines.append(f"  {r['gamma']:2d} {r['alpha']:5.2f} {r['tokens_per_call']:8.2f} {r['tokens_per_full_round']:5.2f} "
                         f"{r['formula']:7.2f} "
                         f"{r['us_per_token']:7.0f} {r['modelled_us_per_token']:7.0f} {r['vs_model']:>12s} "
                         f"{r['speedup']:7.2f}x "
                         f"{r['verdict']:>12s} {r['same_tokens']}" + (f" ({r['near_ties']} near-tie)" if r["near_ties"] else ""))
        need = res["alpha_needed"]
        goal = (f"{report['target_speedup']}x is out of reach at every γ swept, even at α = 1" if need is None else
                f"{report['target_speedup']}x needs α >= {need:.2f} (at γ = {res['alpha_needed_gamma']}, the γ swept "
                f"that needs least)")
        steps = round_us(c, c["guess_us"][name], res["best_gamma"]) / c["step_us"]
        lines.append(f"  best γ = {res['best_gamma']}: {res['best_speedup']:.2f}x over plain greedy "
                     f"({res['best_verdict']}); a round there costs {steps:.2f} decode steps")
        lines.append(f"  over bare decode steps: {goal}; a draft always right could give "
                     f"{res['perfect_draft_speedup']:.2f}x at the best γ swept")
    ties = sum(r["near_ties"] for res in report["results"].values() for r in res["rows"])
    lines += [f"near-ties:{near_tie_note(ties)}"] if ties else []
    better = report["better_draft"]
    lines += ["", f"draft with the best median: {better}, {report['results'][better]['best_speedup']:.2f}x over plain "
                  f"greedy (against the next draft's best: {report['better_vs_next']}); target >= "
                  f"{report['target_speedup']}x and faster than plain greedy in every round: "
                  f"{'met' if report['target_met'] else 'NOT met'} "
                  f"in this run"]
    hf = report["transformers"]
    if hf.get("used"):
        lines.append(f"transformers {hf['version']}, the same weights, in interleaved rounds of their own:")
        for name, r in hf["rows"].items():
            at = "" if r["gamma"] is None else f", γ = {r['gamma']}"
            lines.append(f"  {name}{at}: " + (r["error"] if "error" in r else
                         f"{r['us_per_token']:.0f} µs/token ({r['spread_us'][0]:.0f}-{r['spread_us'][1]:.0f}), "
                         f"same tokens {r['same_tokens']}"
                         + (f"; against its plain generate: {r['vs_plain']}" if "vs_plain" in r else "")))
    else:
        lines.append("transformers: " + ("not measured" if hf["installed"] else "not installed"))
    return "\n".join(lines)
