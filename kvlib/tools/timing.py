"""Timing that teaches the same lesson on any machine: interleaved rounds, medians with their spread.

A single measurement says little on a shared laptop: another program, a frequency change or a cold
cache moves it. So every timing in kvlib (the benchmarks and the notebooks' timing cells) is taken
the same way: each function gets one warm-up call, then the functions take turns, round after
round (A B C, A B C, ...), so that a change in the machine's load hits all of them alike. Each
round's figure is the time per call over a block of calls lasting about ``min_run_time``; a
:class:`Timing` keeps one figure per round and reports their median and their range. Two timings are compared by
:func:`verdict`: "faster" or "slower" only when their ranges do not overlap over at least three rounds
each, else "within noise". The order of the turns rotates from round to round (A B C, B C A, ...), so
that no function always goes first.
A call that needs fresh state every time (a prefill into an empty cache) is passed as :class:`Prepared`:
the state is built before each call, untimed.
"""
from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

VERDICTS = ("faster", "slower", "within noise")
MIN_VERDICT_ROUNDS = 3  # fewer rounds a side cannot tell a difference from noise
MAX_THREADS = 256
UNITS = {"s": 1.0, "ms": 1e3, "µs": 1e6}


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one function: one figure per round."""

    name: str
    rounds: tuple[float, ...]

    def __post_init__(self):
        rounds = self.rounds
        if isinstance(rounds, (str, bytes)) or not isinstance(rounds, (tuple, list)) or not rounds:
            raise ValueError(f"Timing {self.name!r} needs at least one round's seconds per call, got {rounds!r:.60}")
        for r in rounds:
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r < float("inf"):
                raise ValueError(f"Timing {self.name!r}: every round must be a finite number of seconds >= 0, got {r!r}")
        object.__setattr__(self, "rounds", tuple(float(r) for r in rounds))

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def low(self) -> float:
        return min(self.rounds)

    @property
    def high(self) -> float:
        return max(self.rounds)

    def describe(self, unit: str = "ms", per: int = 1) -> str:
        """E.g. ``"12.3 ms (11.9-13.0 over 5 rounds)"``; ``per`` divides by a count (ms per token)."""
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
        if isinstance(per, bool) or not isinstance(per, int) or per < 1:
            raise ValueError(f"per must be an int >= 1 (a count to divide by), got {per!r}")
        scale = UNITS[unit] / per
        return (f"{self.median * scale:,.1f} {unit} ({self.low * scale:,.1f}-{self.high * scale:,.1f} "
                f"over {len(self.rounds)} rounds)")


@dataclass(frozen=True)
class Prepared:
    """A call to time that needs fresh state each time: ``prepare()``, not timed, returns the zero-argument
    call that is timed (e.g. a prefill into a cache that ``prepare`` has just made)."""

    prepare: Callable[[], Callable[[], object]]

    def __post_init__(self):
        if not callable(self.prepare):
            raise TypeError(f"Prepared needs a callable that returns the call to time, got {type(self.prepare).__name__}")

    def make(self) -> Callable[[], object]:
        """A fresh call to time (``prepare()``), checked."""
        call = self.prepare()
        if not callable(call):
            raise TypeError(f"Prepared's prepare() must return a zero-argument callable to time, got "
                            f"{type(call).__name__}")
        return call


def verdict(a: Timing, b: Timing) -> str:
    """"faster" if every round of ``a`` beat every round of ``b``, "slower" if the reverse, else "within noise";
    always "within noise" with fewer than three rounds on a side (one or two figures cannot show a spread)."""
    for t in (a, b):
        if not isinstance(t, Timing):
            raise TypeError(f"verdict compares two Timings, got {type(t).__name__}")
    if min(len(a.rounds), len(b.rounds)) < MIN_VERDICT_ROUNDS:
        return "within noise"
    if a.high < b.low:
        return "faster"
    if a.low > b.high:
        return "slower"
    return "within noise"


def compare(a: Timing, b: Timing, unit: str = "ms", per: int = 1) -> str:
    """One line: ``a`` against ``b`` with both spreads, how many times as fast ``a`` ran (``b``'s median over
    ``a``'s) and the verdict."""
    return (f"{a.name}: {a.describe(unit, per)} against {b.name}: {b.describe(unit, per)}; "
            f"{a.name} ran {b.median / a.median:.2f}x as fast (ratio of medians) and is {verdict(a, b)}")


TOO_BUSY = ("the machine was too busy to measure this: {whole} was timed faster than {part}, a part of its own "
            "work, which no machine can do; close other programs and run the cell again, or read the reference run")


def contradicts(part: Timing, whole: Timing) -> bool:
    """True when ``whole``, work that includes all of ``part``'s, was timed faster beyond noise: an impossible reading.

    Doing more cannot take less time, so when every round of ``whole`` beat every round of ``part``
    (:func:`verdict`'s "faster") the machine's load moved between the rounds; a notebook prints :data:`TOO_BUSY`
    then, never a ratio that its prose says cannot happen. Two timings within noise of each other are not a
    contradiction: their ratio is printed with its spread.
    """
    for t in (part, whole):
        if not isinstance(t, Timing):
            raise TypeError(f"contradicts compares two Timings, got {type(t).__name__}")
    return verdict(whole, part) == "faster"


def too_busy(part: Timing, whole: Timing) -> str:
    """The line a notebook prints instead of an impossible figure (see :func:`contradicts`)."""
    return TOO_BUSY.format(whole=whole.name, part=part.name)


@contextmanager
def threads(n: int):
    """Run the block with ``n`` intra-op threads, restoring the count afterwards."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
        raise ValueError(f"threads must be an int in [1, {MAX_THREADS}] (this machine has {os.cpu_count()} CPUs), "
                         f"got {n!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def interleaved(fns: dict, rounds: int = 5, *, n_threads: int = 1, min_run_time: float = 0.05,
                max_seconds: float | None = None, on_round=None) -> dict[str, Timing]:
    """Time each of ``fns`` (name -> zero-argument callable, or :class:`Prepared`) in turns, ``rounds`` times.

    Every function is called once, timed but not kept, before the first round (the warm-up); that
    call sizes its block: the number of calls that last about ``min_run_time``, found once (a
    second timed call when the warm-up was too quick to judge). Each round runs every function's
    block once, in an order that rotates from round to round, and keeps its time per call. ``max_seconds`` stops early (after at least three rounds)
    once that much time has passed; ``on_round()`` is called after each.
    """
    _check_settings(fns, rounds, min_run_time, max_seconds, on_round)
    figures: dict[str, list[float]] = {name: [] for name in fns}
    with threads(n_threads):
        calls = {name: _calls_per_block(fn, min_run_time) for name, fn in fns.items()}
        start = time.perf_counter()
        names = list(fns)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:  # round r starts with the r-th
                figures[name].append(_block(fns[name], calls[name]))
            if on_round is not None:
                on_round()
            if max_seconds is not None and r + 1 >= 3 and time.perf_counter() - start > max_seconds:
                break
    return {name: Timing(name, tuple(f)) for name, f in figures.items()}


def _check_settings(fns, rounds, min_run_time, max_seconds, on_round) -> None:
    """:func:`interleaved`'s arguments, each with a clear error."""
    if not isinstance(fns, dict):
        raise TypeError(f"fns must be a dict (name -> function to time), got {type(fns).__name__}")
    if not fns:
        raise ValueError("interleaved needs at least one function to time")
    for name, fn in fns.items():
        if not (callable(fn) or isinstance(fn, Prepared)):
            raise TypeError(f"fns[{name!r}] must be a zero-argument callable or a Prepared, got {type(fn).__name__}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    for name, value in (("min_run_time", min_run_time), ("max_seconds", max_seconds)):
        if value is None and name == "max_seconds":
            continue  # no time limit
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    if on_round is not None and not callable(on_round):
        raise TypeError(f"on_round must be a callable (called after each round) or None, got {type(on_round).__name__}")


def _block(fn, n: int) -> float:
    """Seconds per call over ``n`` calls in a row, with the garbage collector paused (as ``timeit`` does).

    A :class:`Prepared` call is prepared before each call and only the call is timed."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        if isinstance(fn, Prepared):
            spent = 0.0
            for _ in range(n):
                call = fn.make()
                t = time.perf_counter()
                call()
                spent += time.perf_counter() - t
            return spent / n
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n
    finally:
        if collecting:
            gc.enable()


def _calls_per_block(fn, min_run_time: float) -> int:
    """Calls of ``fn`` that last about ``min_run_time``: the warm-up call times it (and, when it was too
    quick to judge, one more call does), so a slow function costs no extra call."""
    t = _block(fn, 1)
    if t < min_run_time:  # quick, and a first call may carry one-time costs: time a second one
        t = _block(fn, 1)
    if t <= 0:
        raise RuntimeError("time.perf_counter did not advance over a call: this clock cannot time it")
    return max(1, min(1_000_000, round(min_run_time / max(t, 1e-9))))


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linear between the closest ranks."""
    if isinstance(values, (str, bytes, torch.Tensor)) or not hasattr(values, "__iter__"):
        raise TypeError(f"values must be a list of numbers, got {type(values).__name__}")
    xs = list(values)
    if not xs:
        raise ValueError("percentile of no values")
    for x in xs:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or abs(x) == float("inf"):
            raise ValueError(f"values must be finite numbers, got {x!r}")
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 100:
        raise ValueError(f"q must be a number in [0, 100], got {q!r}")
    xs.sort()
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def machine() -> dict:
    """What the timings ran on: processor, cores, Python, PyTorch and its threads."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "mkl": torch.backends.mkl.is_available(), "threads": torch.get_num_threads(), "load": load()}


def load() -> float | None:
    """Runnable processes over the last minute, on average (``os.getloadavg``), or None where the system does not
    say (Windows). Near the number of CPUs or above it, other work competes with the timings for the cores."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def describe_machine(info: dict) -> str:
    """One line from :func:`machine`'s dict (and any versions added to it, such as ``transformers``)."""
    line = f"machine: {info['cpu']}, {info['cpus']} CPU(s); torch {info['torch']}, python {info['python']}"
    line += f", transformers {info['transformers']}" if info.get("transformers") else ""
    return line + (f"; load {info['load']:g} (processes running or waiting for a CPU, this one included; 1-minute average)"
                   if info.get("load") is not None else "")
