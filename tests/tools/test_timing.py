"""One way to measure: interleaved rounds, medians with their range, verdicts that respect the noise."""
from __future__ import annotations

import pytest
import torch

from kvlib.tools.timing import Prepared, Timing, compare, describe_machine, interleaved, machine, percentile, threads, verdict


def test_interleaved_times_every_function_once_per_round_after_a_warm_up():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    out = interleaved(fns, rounds=4, min_run_time=1e-6)
    assert set(out) == {"a", "b"} and all(len(t.rounds) == 4 for t in out.values())
    assert set(calls[:2]) == {"a"} or calls[:2] == ["a", "b"]  # a's warm-up (and sizing) before b's
    assert all(t.low <= t.median <= t.high for t in out.values())


def test_a_block_lasts_about_min_run_time_and_a_slow_function_is_called_once_a_round():
    import time

    counts = {"quick": 0, "slow": 0}

    def quick():
        counts["quick"] += 1

    def slow():
        counts["slow"] += 1
        time.sleep(0.02)

    out = interleaved({"quick": quick, "slow": slow}, rounds=3, min_run_time=0.01)
    assert counts["slow"] == 1 + 3                   # the warm-up sizes its block: one call a round
    assert counts["quick"] > 100                     # many calls a block, each round
    assert 0.015 < out["slow"].median < 0.2 and out["quick"].median < 1e-3


def test_a_prepared_call_gets_fresh_state_each_time_and_only_the_call_is_timed():
    import time

    made, used = [], []

    def prepare():
        time.sleep(0.01)          # slow to prepare: must not count
        state = [len(made)]
        made.append(state)
        return lambda: used.append(state)

    out = interleaved({"fresh": Prepared(prepare)}, rounds=3, min_run_time=1e-6)
    assert len(made) == len(used) >= 1 + 3 and all(a is b for a, b in zip(made, used))  # one state per call
    assert out["fresh"].high < 0.005
    with pytest.raises(TypeError, match="Prepared needs a callable that returns the call to time, got int"):
        Prepared(3)
    with pytest.raises(TypeError, match=r"prepare\(\) must return a zero-argument callable to time, got NoneType"):
        interleaved({"x": Prepared(lambda: None)}, rounds=1)


def test_interleaved_restores_the_thread_count_and_refuses_nonsense():
    before = torch.get_num_threads()
    interleaved({"x": lambda: None}, rounds=1, n_threads=2, min_run_time=1e-6)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="rounds"):
        interleaved({"x": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="at least one"):
        interleaved({})
    with pytest.raises(TypeError, match=r"fns\['x'\] must be a zero-argument callable or a Prepared, got int"):
        interleaved({"x": 3})
    for bad in (-1, float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match="min_run_time must be a finite number of seconds >= 0"):
            interleaved({"x": lambda: None}, min_run_time=bad)
        with pytest.raises(ValueError, match="max_seconds must be a finite number of seconds >= 0"):
            interleaved({"x": lambda: None}, max_seconds=bad)
    with pytest.raises(TypeError, match=r"fns must be a dict \(name -> function to time\), got list"):
        interleaved([lambda: None])
    with pytest.raises(TypeError, match="on_round must be a callable"):
        interleaved({"x": lambda: None}, on_round=5)
    with pytest.raises(ValueError, match="threads"):
        with threads(0):
            pass


def test_a_verdict_needs_ranges_that_do_not_overlap():
    fast, slow = Timing("fast", (1.0, 1.1, 1.2)), Timing("slow", (2.0, 2.1, 2.5))
    noisy = Timing("noisy", (1.15, 1.9, 3.0))
    assert (verdict(fast, slow), verdict(slow, fast)) == ("faster", "slower")
    assert verdict(fast, noisy) == verdict(noisy, slow) == "within noise"
    line = compare(fast, slow)
    assert "1,100.0 ms (1,000.0-1,200.0 over 3 rounds)" in line and "1.91x" in line and line.endswith("faster")


def test_percentile_interpolates_between_ranks():
    assert percentile([3, 1, 2, 4], 50) == 2.5
    assert percentile([5], 95) == 5
    assert percentile(range(101), 95) == 95
    with pytest.raises(ValueError):
        percentile([], 50)


def test_machine_names_what_the_timings_ran_on():
    info = machine()
    assert info["cpus"] >= 1 and info["torch"] == torch.__version__ and info["threads"] >= 1


def test_every_report_names_the_machine_in_one_line():
    info = machine()
    line = describe_machine(info)
    assert line.startswith(f"machine: {info['cpu']}, {info['cpus']} CPU(s); torch {info['torch']}")
    quiet = {**info, "load": None}
    assert "transformers" not in line and describe_machine({**quiet, "transformers": "9.9"}).endswith(", transformers 9.9")


def test_the_machine_line_says_how_busy_the_machine_was_where_the_system_tells(monkeypatch):
    import os

    from kvlib.tools import timing

    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 0.5), raising=False)
    assert timing.load() == 1.5 and "; load 1.5 (processes running" in describe_machine(machine())
    monkeypatch.delattr(os, "getloadavg")  # as on Windows
    assert timing.load() is None and "load" not in describe_machine(machine())


# ---- what a hostile caller can hand the timing tools ----------------------------------------------------------

def test_one_or_two_rounds_never_give_a_verdict():
    fast, slow = Timing("a", (1.0, 1.0)), Timing("b", (2.0, 2.0))
    assert verdict(fast, slow) == "within noise" and verdict(Timing("a", (1.0,)), Timing("b", (1.0001,))) == "within noise"
    assert verdict(Timing("a", (1.0, 1.1, 1.2)), Timing("b", (2.0, 2.1, 2.2))) == "faster"


def test_the_turns_rotate_from_round_to_round():
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "ABC"}
    interleaved(fns, rounds=3, min_run_time=0.0)
    timed = order[-9:]  # after the warm-ups: one block of one call each, three rounds
    assert timed == list("ABC") + list("BCA") + list("CAB")


@pytest.mark.parametrize("rounds", [(), (float("nan"), 1.0), (-1.0,), (float("inf"),), (True,), "abc"])
def test_a_timing_refuses_rounds_that_are_no_times(rounds):
    with pytest.raises(ValueError, match="Timing 'x'"):
        Timing("x", rounds)


def test_describe_names_its_units_and_counts():
    t = Timing("x", (0.001, 0.002, 0.003))
    assert t.describe("µs", per=2) == "1,000.0 µs (500.0-1,500.0 over 3 rounds)"
    with pytest.raises(ValueError, match="unit must be one of s, ms, µs"):
        t.describe("us")
    for per in (0, -1, 1.5):
        with pytest.raises(ValueError, match="per must be an int >= 1"):
            t.describe("ms", per)


@pytest.mark.parametrize("n", [0, 257, 10**6, True, 2.0])
def test_thread_counts_beyond_reason_are_refused_before_torch_sees_them(n):
    with pytest.raises(ValueError, match=r"threads must be an int in \[1, 256\]"):
        with threads(n):
            pass
    with pytest.raises(ValueError, match=r"\[1, 256\]"):
        interleaved({"x": lambda: None}, 3, n_threads=n)


@pytest.mark.parametrize("values, q, said", [
    ([float("nan"), 3, 1, 2], 50, "finite"), ([float("-inf"), float("inf")], 50, "finite"), ([1, 2], True, "q must"),
    (torch.tensor([1.0, 2.0]), 50, "list of numbers"), ([], 50, "no values"), ([1, 2], 101, "q must")])
def test_percentile_refuses_what_has_no_percentile(values, q, said):
    with pytest.raises((TypeError, ValueError), match=said):
        percentile(values, q)


def test_a_clock_that_stands_still_is_refused_instead_of_sizing_a_huge_block(monkeypatch):
    import kvlib.tools.timing as timing_module

    monkeypatch.setattr(timing_module.time, "perf_counter", lambda: 5.0)
    with pytest.raises(RuntimeError, match="did not advance"):
        interleaved({"x": lambda: None}, 3)


def test_a_whole_timed_faster_than_its_part_is_an_impossible_reading():
    from kvlib.tools.timing import contradicts, too_busy
    step, token = Timing("one step", (1.0, 1.1, 1.2)), Timing("a token", (0.6, 0.57, 0.7))
    assert contradicts(step, token) and not contradicts(token, step)
    close = Timing("a verify pass", (0.99, 1.15, 1.05))           # within noise of the step: not impossible
    assert not contradicts(step, close)
    assert "too busy" in too_busy(step, token) and "a token" in too_busy(step, token)
    with pytest.raises(TypeError):
        contradicts(1.0, step)
