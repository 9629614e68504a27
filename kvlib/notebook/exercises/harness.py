"""The checks' shared harness: calling the learner's code, reading what it gave back, one ✓/✗ line a case.

Each ``check_*`` function calls the learner's function on a few inputs (or takes the learner's number), compares
with the library's own result, and prints one line per case: ✓, or the input, what was expected and what came
back, with a hint where the answer matches a known mistake (a percentage for a fraction, GiB for GB, an
off-by-one). A function that is still the placeholder (it raises NotImplementedError, or returns None) is
reported, not raised; most checks then stop after that one line.
It never raises for a wrong answer (the learner reads the message and tries again); it returns
whether every case passed, so a notebook can show the worked solution's result too.
"""
from __future__ import annotations

import functools
import math
import numbers
import types

import torch

from ...tokenizer import decode_complete


def show(ids, tokenizer) -> str:
    return "「" + decode_complete(tokenizer, ids).replace("\n", "⏎") + "」"


def brief(value) -> str:
    """A short description of whatever the learner's code gave back."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '…' if len(text) > 60 else text}"


class NotWritten(Exception):
    """The learner's function is still the placeholder: one line says so, and the check stops."""


def stops_at_placeholder(check):
    """A check that returns False, after one line, when the learner's function raises NotImplementedError."""
    @functools.wraps(check)
    def run(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except NotWritten:
            return False
    return run


def call(fn, *args, label: str):
    """(True, what ``fn`` returned), or (False, None) after saying what it raised."""
    try:
        result = fn(*args)
        if isinstance(result, types.GeneratorType):  # a generator runs the learner's code only when read
            result = list(result)
    except NotImplementedError as e:
        print(f"✗ {label}: your function raised NotImplementedError ({e}): write it, then run this cell again")
        raise NotWritten from None
    except Exception as e:  # the learner's code: say what it raised, and go on
        print(f"✗ {label}: your function raised {type(e).__name__}: {e}")
        return False, None
    if result is None:
        print(f"✗ {label}: your function returned None: does it end with a return statement?")
        raise NotWritten
    return True, result


def as_number(value, name: str) -> float | None:
    """``value`` as a float, or None after saying why it is not a number (yet)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if value is None:
        print(f"✗ {name} is still None: put your answer there and run the cell again")
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        print(f"✗ {name} must be a finite number, got {brief(value)}")
        return None
    return float(value)


def as_int(value) -> int | None:
    """``value`` as an int if it is a whole number (an int, a whole float, a one-element integer tensor)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    return int(value) if float(value) == int(value) else None


def as_bool(value) -> bool | None:
    """``value`` as a bool (True/False, a numpy bool, a one-element boolean tensor), or None."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype == torch.bool:
        return bool(value.item())
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")):
        return bool(value)
    return None


def _as_list(value) -> list | None:
    """A list, tuple, one-dimensional tensor or numpy array as a list; None for anything else."""
    if isinstance(value, torch.Tensor):
        return value.tolist() if value.dim() == 1 else None
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 1:
        return value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else None


def as_ints(value) -> list[int | None] | None:
    """A list, tuple, tensor or array as a list of whole numbers (None for an item that is not one), or None."""
    items = value.flatten().tolist() if isinstance(value, torch.Tensor) else _as_list(value)
    return None if items is None else [as_int(x) for x in items]


def sorted_ints(value) -> list[int] | None:
    """Any collection of whole numbers (a list, set, range, tensor, ...), sorted; None if it is not one."""
    try:
        items = value.flatten().tolist() if isinstance(value, torch.Tensor) else list(value)
    except TypeError:
        return None
    ints = [as_int(x) for x in items]
    return None if None in ints else sorted(ints)


def pair_of_ints(value) -> tuple | None:
    """Two whole numbers as a tuple (None for an item that is not one), or None if ``value`` is not a pair."""
    ints = as_ints(value)
    return tuple(ints) if ints is not None and len(ints) == 2 else None


def matching_hints(got: float, candidates, close) -> str:
    """Every hint whose mistaken value ``got`` matches, as sentences ("" if none does)."""
    return sentences(dict.fromkeys(h for value, h in candidates if close(got, value)))


def close(got: float, want: float, rel: float = 1e-4, abs_: float = 1e-6) -> bool:
    return abs(got - want) <= abs_ + rel * abs(want)



def number_case(fn, args: tuple, label: str, name: str, close, said: str, expected: str, hint) -> bool:
    """One case whose answer is a number: ✓ with ``said``, or ✗ with the expected, the actual and ``hint(got)``."""
    ok, got = call(fn, *args, label=label)
    if not ok:
        return False
    got = as_number(got, f"{label}: {name}")
    if got is None:
        return False
    if close(got):
        print(f"✓ {label}: {said}")
        return True
    print(f"✗ {label}: expected {expected}, got {got:,.6g}" + hint(got))
    return False


def exact_case(fn, args: tuple, label: str, want, convert, said, slip) -> bool:
    """One case with one right answer: ✓ with ``said(answer)``, or ✗ with ``slip(answer, got)``, where ``got`` is what
    ``fn`` returned and ``answer`` is ``convert(got)`` (None, or holding None, where ``got`` has the wrong form)."""
    ok, got = call(fn, *args, label=label)
    if not ok:
        return False
    answer = convert(got)
    if answer == want:
        print(f"✓ {label}: {said(answer)}")
        return True
    print(f"✗ {label}: {slip(answer, got)}")
    return False


def sentences(hints) -> str:
    """Hints as sentences after a message: ". Hint one. Hint two" ("" for none)."""
    return "".join(f". {h[0].upper()}{h[1:]}" for h in hints if h)
