"""What a speculative round costs: the cost model behind ``python -m kvlib speculate`` and notebook 8.

Two ways to price a round of γ guesses and one verify pass of γ + 1 tokens:

- **counted** (:func:`least_round_steps`, :func:`counted_ceiling`): from what the passes do, the same on every
  machine (:func:`kvlib.tools.spec_bench.pass_counts`: operator calls, weights read, FLOPs);
- **timed** (:func:`round_us`, :func:`perfect_draft_speedup`, :func:`alpha_needed`): from the pieces as
  :func:`kvlib.tools.spec_bench.piece_costs` timed them on this machine, a reading that moves with its load
  (:func:`costs_by_round` gives one costs dict per interleaved round, for the spread).
"""
from __future__ import annotations

import math
import statistics

from ..checks import check_int, check_real
from ..speculative import expected_tokens_per_round

# ``costs`` holds ``step_us`` (one decode step) and ``verify_us`` (a verify pass of T tokens, by T), as
# ``kvlib.tools.spec_bench.piece_costs`` measures them; ``guess_us`` is one guess of the draft.
COUNTED = ("aten_calls", "weight_bytes", "flops")  # what a pass does, whatever the machine


def check_costs(costs, guess_us, gamma: int | None = None) -> None:
    """Measured costs in µs: ``costs`` a dict with "step_us" (one plain decode step, > 0) and "verify_us" (a dict from
    tokens per verify pass, 1, 2, ..., to its cost, each > 0); a guess's cost ``guess_us`` >= 0; γ >= 1 when given."""
    if not (isinstance(costs, dict) and "step_us" in costs and isinstance(costs.get("verify_us"), dict)
            and costs["verify_us"]):
        raise TypeError(f"costs must be a dict with 'step_us' and 'verify_us' (µs per verify pass, by tokens "
                        f"verified), as the speculate command measures them, got {costs!r:.80}")
    check_real("costs['step_us']", costs["step_us"], 0, open_min=True, allowed="a finite time in µs > 0")
    for tokens, us in costs["verify_us"].items():
        check_int("a token count of costs['verify_us']", tokens, 1)
        check_real(f"costs['verify_us'][{tokens}]", us, 0, allowed="a finite time in µs >= 0")
    check_real("guess_us", guess_us, 0, allowed="a finite time in µs >= 0")
    if gamma is not None:
        check_int("gamma", gamma, 1)


def round_us(costs: dict, guess_us: float, gamma: int) -> float:
    """What one round costs: γ guesses and one verify pass of γ + 1 tokens."""
    check_costs(costs, guess_us, gamma)
    if gamma + 1 not in costs["verify_us"]:
        raise ValueError(f"costs hold verify passes of {sorted(costs['verify_us'])} tokens, not the {gamma + 1} that "
                         f"γ = {gamma} needs: measure them (piece_costs) or use a γ up to {max(costs['verify_us']) - 1}")
    return gamma * guess_us + costs["verify_us"][gamma + 1]


def perfect_draft_speedup(costs: dict, guess_us: float, gammas=tuple(range(1, 9))) -> float:
    """The speed-up over plain decode steps of a draft that is always right (α = 1), at its best γ:
    γ + 1 steps' worth of tokens a round for the price of the round."""
    return max((g + 1) * costs["step_us"] / round_us(costs, guess_us, g) for g in gammas)


def alpha_needed(costs: dict, guess_us: float, gamma: int, speedup: float = 1.3) -> float | None:
    """The smallest α whose expected tokens a round, (1 − α^(γ+1)) / (1 − α), make a round ``speedup``
    times cheaper per token than plain decode steps; None when even α = 1 cannot."""
    check_real("speedup", speedup, 0, open_min=True, allowed="a finite number > 0")
    need = speedup * round_us(costs, guess_us, gamma) / costs["step_us"]  # tokens a round must write
    if need > gamma + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):  # bisection: the expected tokens grow with α
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_round(mid, gamma) < need else (lo, mid)
    return hi


def costs_by_round(costs: dict) -> list[dict]:
    """One costs dict per interleaved round of ``piece_costs`` (its ``"rounds_us"``): a figure computed from each
    shows how far the machine's load moved it, as a spread beside the median's."""
    per = costs["rounds_us"]
    return [{"step_us": per["step"][r], "verify_us": {T: v[r] for T, v in per["verify"].items()},
             "guess_us": {name: g[r] for name, g in per["guess"].items()}} for r in range(len(per["step"]))]


def least_round_steps(counts: dict, guess: dict, gamma: int) -> float:
    """The least a round can cost, in decode steps, on any machine where a pass's time is its operator calls, its
    weight reads and its arithmetic, each at some price >= 0: the smallest of the round's three ratios to the step's.

    ``counts`` are :func:`~kvlib.tools.spec_bench.pass_counts`'s (a pass of T tokens, by T; T = 1 is the step),
    ``guess`` the same three counts for one guess (all 0 for a table look-up). A sum of parts, each at least r times
    the step's part, is at least r times the step: so the round costs at least the smallest ratio.
    """
    gamma = check_int("gamma", gamma, 1, max(counts) - 1, f"an int in [1, {max(counts) - 1}] (passes counted)")
    step = counts[1]
    return min((gamma * guess[k] + counts[gamma + 1][k]) / step[k] for k in COUNTED)


def counted_ceiling(counts: dict, guess: dict, tokens_per_round: dict) -> dict:
    """The most a draft's rounds can gain over bare decode steps, by the counts alone: at each γ, the tokens a round
    of γ guesses wrote (``tokens_per_round``, γ -> tokens, counted in a run) over :func:`least_round_steps`.
    Returns the best γ's ``{"gamma", "tokens", "least_steps", "ceiling"}``."""
    best = max(tokens_per_round, key=lambda g: tokens_per_round[g] / least_round_steps(counts, guess, g))
    least = least_round_steps(counts, guess, best)
    return {"gamma": best, "tokens": tokens_per_round[best], "least_steps": least,
            "ceiling": tokens_per_round[best] / least}


def draft_costs(costs: dict, counts: dict, guess: dict | None, name: str, rows: list, target: float = 1.3) -> dict:
    """One draft's cost model beside its measured ``rows`` (``run_spec_bench``'s, one per γ).

    Counted (``"counted"``): the ceiling at the tokens a full round wrote (None when ``guess``, its counts, is
    unknown). Timed, from the pieces' medians: at the γ with the best median a round in decode steps, and over
    every γ the α that ``target`` needs and a perfect draft's speed-up. ``"timed"`` holds the same three as
    readings, (median, low, high) over the rounds of ``costs`` (the α with how many rounds found it out of reach
    at every γ), leaving out a round in which a pass was timed faster than the step inside it: its figures would
    be impossible ones, a reading of the machine's load rather than of the pieces.
    """
    gammas = [r["gamma"] for r in rows]
    tokens = {r["gamma"]: r["tokens_per_full_round"] for r in rows if r["full_rounds"]}  # rounds that asked for γ
    counted = counted_ceiling(counts, guess, tokens) if guess is not None and tokens else None
    guess_us = costs["guess_us"][name]
    needs = {g: a for g in gammas if (a := alpha_needed(costs, guess_us, g, target)) is not None}
    easiest = min(needs, key=needs.get) if needs else None  # over every γ: the smallest α that reaches the target
    best = min(rows, key=lambda r: r["us_per_token"])["gamma"]
    every = costs_by_round(costs)
    kept = [c for c in every if all(v >= c["step_us"] for v in c["verify_us"].values())]

    def least_alpha(c):  # this round's pieces: the smallest α that reaches the target at any γ (None: none can)
        return min((a for g in gammas if (a := alpha_needed(c, c["guess_us"][name], g, target)) is not None),
                   default=None)
    needed = [least_alpha(c) for c in kept]
    return {"counted": counted, "alpha_needed": needs.get(easiest), "alpha_needed_gamma": easiest,
            "perfect_draft_speedup": perfect_draft_speedup(costs, guess_us, gammas),
            "round_steps": round_us(costs, guess_us, best) / costs["step_us"], "best_gamma": best,
            # The model rests on every pass it prices: one timed faster than the step inside it voids the lot.
            "round_too_busy": next((line for g in gammas if (line := costs.get("too_busy", {}).get(f"verify/{g + 1}"))),
                                   None),
            "timed": {"rounds": (len(kept), len(every)),
                      "round_steps": _reading([round_us(c, c["guess_us"][name], best) / c["step_us"] for c in kept]),
                      "perfect": _reading([perfect_draft_speedup(c, c["guess_us"][name], gammas) for c in kept]),
                      "alpha_needed": _reading(needed), "alpha_out_of_reach": needed.count(None)}}


def _reading(values: list) -> tuple | None:
    """(median, low, high) of a figure computed round by round; None without a round. For an α, None in a round
    where even α = 1 could not reach the target: the median is None when most rounds found so, and low and high
    are taken over the others."""
    if not values:
        return None
    finite = [v for v in values if v is not None]
    middle = statistics.median([math.inf if v is None else v for v in values])
    return (None if middle == math.inf else middle, min(finite, default=None), max(finite, default=None))


def describe_counted(res: dict, target: float = 1.3) -> str:
    """A draft's counted ceiling (:func:`draft_costs`'s ``"counted"``) in one line: the same on every machine."""
    k = res["counted"]
    if k is None:
        return "not counted (a draft of another kind, or no round that asked for γ guesses)"
    return (f"at most {k['ceiling']:.2f}x over bare decode steps (γ = {k['gamma']}: {k['tokens']:.2f} tokens a round for "
            f"at least {k['least_steps']:.2f} steps): " + (f"{target}x is out of reach at the α it reaches"
                                                            if k["ceiling"] < target else
                                                            f"{target}x needs a round to cost at most "
                                                            f"{k['tokens'] / target:.2f} steps"))


def describe_timed(res: dict, target: float = 1.3) -> str:
    """A draft's timed cost model in one line (:func:`draft_costs`'s ``"timed"``): a round at its best γ in decode
    steps, the α ``target`` needs and a perfect draft's speed-up, each a median with its spread over the rounds;
    the too-busy line instead when a pass it prices was timed faster than the decode step inside it."""
    t = res["timed"]
    kept, every = t["rounds"]
    if res["round_too_busy"] or not kept:
        return res["round_too_busy"] or ("the machine was too busy to measure this: in every round a verify pass was "
                                         "timed faster than the decode step inside it, which no machine can do")
    show = lambda r, unit="": f"{r[0]:.2f}{unit} ({r[1]:.2f}-{r[2]:.2f})"  # noqa: E731
    out, need = t["alpha_out_of_reach"], t["alpha_needed"]
    needs = (f"is out of reach at every γ, even at α = 1, in {out} of {kept} rounds" if need[0] is None else
             f"needs α >= {show(need)}" + (f", out of reach in {out} of {kept} rounds" if out else ""))
    return (f"a round at γ = {res['best_gamma']} cost {show(t['round_steps'])} decode steps; over bare decode steps "
            f"{target}x {needs}; a draft always right could give {show(t['perfect'], 'x')}"
            + (f" (over the {kept} of {every} rounds in which no pass was timed faster than the step inside it)"
               if kept < every else ""))
