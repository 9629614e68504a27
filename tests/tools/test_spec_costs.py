"""The cost model of a speculative round: counted (the same on every machine) and timed (its spread, its guards)."""
import json
import random

import pytest

from kvlib.tools.spec_costs import (costs_by_round, counted_ceiling, describe_counted, describe_timed, draft_costs,
                                    least_round_steps)

# A step of 57 calls and 3.5 MFLOP reading 6.6 MB; a wider pass 60 calls, T times the FLOPs, the same weights.
COUNTS = {T: {"aten_calls": 57 if T == 1 else 60, "flops": 3.5e6 * T, "weight_bytes": 6.6e6} for T in range(1, 10)}
NEURAL = {"aten_calls": 24, "flops": 2.2e6, "weight_bytes": 4.5e6}
FREE = {"aten_calls": 0, "flops": 0, "weight_bytes": 0}


def test_a_round_costs_at_least_its_smallest_ratio_whatever_each_count_costs():
    """Whatever a machine charges per call, per byte and per FLOP (each >= 0), a round's time over a step's is at
    least least_round_steps: tried with random prices, and reached when only the cheapest count costs anything."""
    rng = random.Random(0)
    for gamma in (1, 2, 4, 8):
        least = least_round_steps(COUNTS, NEURAL, gamma)
        for _ in range(200):
            price = {k: rng.random() ** 3 for k in NEURAL}
            cost = lambda c: sum(price[k] * c[k] for k in price)  # noqa: E731
            assert (gamma * cost(NEURAL) + cost(COUNTS[gamma + 1])) / cost(COUNTS[1]) >= least - 1e-12
    assert least_round_steps(COUNTS, NEURAL, 1) == pytest.approx((60 + 24) / 57)  # calls: the smallest ratio
    assert least_round_steps(COUNTS, FREE, 8) == 1.0  # a free guess, and every pass reads the weights once


def test_the_counted_ceiling_is_the_best_gamma_of_tokens_over_least_cost():
    tokens = {1: 1.41, 2: 1.52, 4: 1.65, 8: 1.65}
    k = counted_ceiling(COUNTS, NEURAL, tokens)
    assert k["gamma"] == 1 and k["ceiling"] == pytest.approx(1.41 / ((60 + 24) / 57)) and k["ceiling"] < 1
    free = counted_ceiling(COUNTS, FREE, {1: 1.3, 4: 1.5})
    assert free == {"gamma": 4, "tokens": 1.5, "least_steps": 1.0, "ceiling": 1.5}
    assert "out of reach at the α it reaches" in describe_counted({"counted": k})
    assert describe_counted({"counted": free}).endswith("1.3x needs a round to cost at most 1.15 steps")
    assert describe_counted({"counted": None}).startswith("not counted")
    with pytest.raises(ValueError, match="gamma"):
        least_round_steps(COUNTS, FREE, 9)  # no pass of 10 tokens counted


def costs_with(rounds_verify2):
    """Costs of three rounds: a step of 100 µs, a pass of 2 tokens as given, round by round."""
    steps = [100.0, 100.0, 100.0]
    verify = {1: steps, 2: rounds_verify2}
    return {"step_us": 100.0, "verify_us": {T: sorted(v)[1] for T, v in verify.items()}, "guess_us": {"d": 0.0},
            "rounds_us": {"step": steps, "verify": verify, "guess": {"d": [0.0, 0.0, 0.0]}},
            "too_busy": {"verify/2": None}}


ROWS = [{"gamma": 1, "us_per_token": 80.0, "tokens_per_full_round": 1.5, "full_rounds": 10}]


def test_the_timed_model_gives_its_spread_over_the_rounds():
    costs = costs_with([110.0, 120.0, 130.0])
    assert [c["verify_us"][2] for c in costs_by_round(costs)] == [110.0, 120.0, 130.0]
    res = draft_costs(costs, COUNTS, FREE, "d", ROWS)
    assert res["round_steps"] == pytest.approx(1.2) and res["timed"]["round_steps"] == pytest.approx((1.2, 1.1, 1.3))
    assert res["timed"]["rounds"] == (3, 3) and res["counted"]["ceiling"] == 1.5 and res["best_gamma"] == 1
    line = describe_timed(res)
    assert line.startswith("a round at γ = 1 cost 1.20 (1.10-1.30) decode steps") and "rounds in which" not in line


def test_a_round_timed_faster_than_its_step_is_left_out_of_the_spread_and_a_busy_median_is_not_printed():
    costs = costs_with([90.0, 120.0, 130.0])  # the first round's pass was timed faster than the step inside it
    res = draft_costs(costs, COUNTS, FREE, "d", ROWS)
    assert res["timed"]["rounds"] == (2, 3) and res["timed"]["round_steps"] == pytest.approx((1.25, 1.2, 1.3))
    assert "0.90" not in describe_timed(res) and "over the 2 of 3 rounds" in describe_timed(res)
    costs["too_busy"]["verify/2"] = "the machine was too busy to measure this: ..."
    assert describe_timed(draft_costs(costs, COUNTS, FREE, "d", ROWS)) == "the machine was too busy to measure this: ..."
    costs = costs_with([90.0, 95.0, 99.0])  # every round: no reading left
    costs["too_busy"]["verify/2"] = None
    assert describe_timed(draft_costs(costs, COUNTS, FREE, "d", ROWS)).startswith("the machine was too busy")


def test_the_alpha_needed_is_read_round_by_round_and_out_of_reach_is_said_so():
    costs = costs_with([110.0, 120.0, 130.0])
    res = draft_costs(costs, COUNTS, FREE, "d", ROWS)  # free guesses: 1.3x at γ = 1 needs a round of 1.3 x 1.2 steps
    med, lo, hi = res["timed"]["alpha_needed"]
    assert lo <= med <= hi and res["timed"]["alpha_out_of_reach"] == 0 and "needs α >= " in describe_timed(res)
    costs["guess_us"]["d"], costs["rounds_us"]["guess"]["d"] = 200.0, [200.0, 200.0, 200.0]  # two steps a guess
    res = draft_costs(costs, COUNTS, NEURAL, "d", ROWS)
    assert res["timed"]["alpha_needed"] == (None, None, None) and res["alpha_needed"] is None
    assert "is out of reach at every γ, even at α = 1, in 3 of 3 rounds" in describe_timed(res)
    json.dumps(res, allow_nan=False)  # no inf in a report
