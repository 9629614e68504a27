"""Timing and counting decode loops: medians with warm-up, and ATen calls per decode step."""
from __future__ import annotations

import torch
import torch.utils.benchmark as benchmark
from torch.utils._python_dispatch import TorchDispatchMode

from .generate import generate, generate_uncached
from .model import GPT


def median_seconds(fn, min_run_time: float = 0.5, threads: int = 1) -> float:
    """Median wall time of ``fn()`` after a warm-up call, by ``torch.utils.benchmark.Timer``."""
    fn()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    return timer.blocked_autorange(min_run_time=min_run_time).median


def last_position_only(model: GPT):
    """The recompute loop's forward, computing the head for the last position only (as nanoGPT does)."""
    def f(idx):
        x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(idx.shape[1]))
        for block in model.transformer.h:
            x = block(x)
        return model.lm_head(model.transformer.ln_f(x[:, -1:])), None
    return f


def compare(model: GPT, idx: torch.Tensor, max_new_tokens: int, min_run_time: float = 0.3, threads: int = 1) -> dict:
    """Greedy cached ``generate`` against the recompute loop on the same prompt, side by side."""
    uncached_f = last_position_only(model)
    block = model.config.block_size
    cached = median_seconds(lambda: generate(model, idx, max_new_tokens, temperature=0.0), min_run_time, threads)
    uncached = median_seconds(
        lambda: generate_uncached(uncached_f, idx, max_new_tokens, block_size=block, temperature=0.0),
        min_run_time, threads)
    return {"new_tokens": max_new_tokens, "cached_ms": cached * 1e3, "uncached_ms": uncached * 1e3,
            "speedup": uncached / cached}


class CountOps(TorchDispatchMode):
    """Counts the ATen operators dispatched inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))
