"""Counting what PyTorch does: the ATen operator calls a piece of code dispatches, and per decode step of a loop.

A ``TorchDispatchMode`` is a context manager that PyTorch calls on every ATen call made while it is active;
:class:`CountOps` counts them. The counts are the same on every machine (for one PyTorch version), which is
why notebooks 5 and 8 start from them before any clock.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..checks import check_int


class CountOps(TorchDispatchMode):
    """Counts the ATen operators dispatched inside the ``with`` block (and keeps their names).

    Under ``torch.inference_mode()`` composite operators such as ``layer_norm`` or
    ``scaled_dot_product_attention`` arrive as one call each; outside it autograd splits some of them.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Nothing is compiled inside this mode, so its handler needs no torch.compile guard;
        # without this, the first count imports torch._dynamo, which takes seconds.
        return False

    def __init__(self):
        super().__init__()
        self.count = 0
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.names.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def aten_calls(fn) -> int:
    """ATen calls made by ``fn()``, counted under ``torch.inference_mode()``."""
    with torch.inference_mode(), CountOps() as ops:
        fn()
    return ops.count


def aten_calls_per_step(loop, steps: int = 8) -> float:
    """ATen calls per decode step of ``loop(n)`` (greedy decoding of n new tokens), loop included.

    The difference between ``steps + 1`` and 1 new tokens, divided by ``steps``: the prefill, the
    set-up and the first token cancel out; sampling and bookkeeping of each step stay in. One
    uncounted run first builds what is built once per model (the fast path's step weights). The
    ``steps + 1`` tokens must fit the loop's block: a loop that stops early makes fewer steps than it is
    divided by.
    """
    check_int("steps", steps, 1, 10_000)
    with torch.inference_mode():
        loop(1)
    return (aten_calls(lambda: loop(steps + 1)) - aten_calls(lambda: loop(1))) / steps
