"""The command line's parsers: numbers as people type them, each bounded and named with its range, an
argparse that answers a usage error in one line, and the JSON the commands print (used by :mod:`kvlib.tools.cli`)."""
from __future__ import annotations

import argparse
import json
import math

from .traces import MAX_RATE, MIN_RATE

def written_plainly(text: str, what: str) -> str:
    """A number as people type it: ASCII digits, no spaces or underscores (which Python's int() and float()
    would accept: ' 5', '1_000', full-width '５')."""
    if not text.isascii() or text.strip() != text or "_" in text:
        raise argparse.ArgumentTypeError(f"expected {what} in plain digits, got {text!r}")
    return text


def seed(text: str) -> int:
    try:
        value = int(written_plainly(text, "a whole number"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value <= 2**64 - 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**64 - 1], got {value}")
    return value


def bounded(kind, low, high, what):
    def parse(text: str):
        try:
            value = kind(written_plainly(text, what))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not low <= value <= high:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be {what} in [{low:,}, {high:,}], got {text}")
        return value
    return parse


def real(allowed, ok):
    """A parser of a number for which ``ok(value)`` holds (nan fails every comparison), ``allowed`` in words."""
    def parse(text: str) -> float:
        try:
            value = float(written_plainly(text, "a number"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {value}")
        return value
    return parse


MAX_NEW_TOKENS = 100_000  # --no-cache slides past the block, so only this bounds a run's memory and time
token_count = bounded(int, 1, MAX_NEW_TOKENS, "a whole number of tokens")
temperature = real("a finite number >= 0 (0: greedy)", lambda t: 0 <= t < math.inf)
top_p = real("a number in (0, 1] (1: no top-p filter)", lambda p: 0 < p <= 1)
top_k = bounded(int, 0, 1_000_000, "a whole number (0: no top-k filter)")
MAX_POEMS = 1_000  # evaluate writes its poems as one batch: about 0.5 MiB of cache each
poems = bounded(int, 1, MAX_POEMS, "a whole number of poems")
shown = bounded(int, 0, MAX_POEMS, "a whole number of poems")
MAX_STEPS, MAX_BATCH, MAX_THREADS = 1_000_000, 1_024, 256  # far past every recipe (4,000 steps of 32 windows)
steps = bounded(int, 1, MAX_STEPS, "a whole number of steps")
batch_size = bounded(int, 1, MAX_BATCH, "a whole number of windows")
threads = bounded(int, 1, MAX_THREADS, "a whole number of threads")
lr = real("a number in (0, 10] (AdamW's step size)", lambda lr: 0 < lr <= 10)
MAX_REQUESTS = 10_000  # serve's trace, at most
requests = bounded(int, 1, MAX_REQUESTS, "a whole number")
rate = bounded(float, MIN_RATE, MAX_RATE, "a number of arrivals per second")
spec_tokens = bounded(int, 1, 100, "a whole number of tokens")
rounds = bounded(int, 1, 20, "a whole number of rounds")
MAX_TEXTS, SHRINK_LENGTHS = 256, (16, 128)  # shrink_bench.MAX_TEXTS; MIN_LENGTH to tang-char's block, without torch
texts = bounded(int, 1, MAX_TEXTS, "a whole number of texts")
length = bounded(int, *SHRINK_LENGTHS, "a whole number of tokens")


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, once: not where the help already says it, nor a bare None."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage block above it), status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsFormatter)  # every help shows its default, once
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
port = bounded(int, 1, 65_535, "a port number")
MAX_IN_FLIGHT = 1_000  # requests a server holds at once (waiting and running); beyond it, 503
in_flight = bounded(int, 1, MAX_IN_FLIGHT, "a whole number of requests")


def rounded(obj, digits: int = 4):
    """``obj`` with every float rounded to ``digits`` significant digits, for reading (lists, tuples, dicts inside)."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


def to_json(obj, indent: int | None = 2) -> str:
    """The commands' JSON: floats to 4 significant digits, Chinese as it is, anything else as its str."""
    return json.dumps(rounded(obj), indent=indent, ensure_ascii=False, default=str)


MAX_STUDENTS = 300  # python -m kvlib class: threads on one machine; more is a load test, not a classroom
students = bounded(int, 1, MAX_STUDENTS, "a whole number of students")
