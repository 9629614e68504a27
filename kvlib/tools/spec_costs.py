"""What a speculative round costs, from measured pieces: the cost model behind ``python -m kvlib speculate``
and notebook 8 (``costs`` as :func:`kvlib.tools.spec_bench.piece_costs` measures them)."""
from __future__ import annotations

from ..checks import check_int, check_real
from ..speculative import expected_tokens_per_round

# ``costs`` holds ``step_us`` (one decode step) and ``verify_us`` (a verify pass of T tokens, by T), as
# ``kvlib.tools.spec_bench.piece_costs`` measures them; ``guess_us`` is one guess of the draft.


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
