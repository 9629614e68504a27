"""Plots for the notebooks and the training log.

The functions build ``Figure`` objects directly (no pyplot state), so they work under any backend,
in a notebook or a script. Importing this module registers the shipped CJK font (:mod:`.fonts`).
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..tools.integrity import write_bytes
from .fonts import FONT_SIZE, char_label, use_cjk_font

from .show import BAR_COLOR, HIGHLIGHT_COLOR

# Figures at most this wide (inches, at 100 dpi: 900 px) keep their text at full size in a notebook at
# 1280x720, where JupyterLab's output area is about 900 px wide; wider figures would be shrunk.
MAX_WIDTH = 9.0

use_cjk_font()


def figure_png(fig: Figure, dpi: int = 90) -> bytes:
    """A figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def bar_top_k(chars, probs, title: str | None = None, ax=None, highlight=None) -> Figure:
    """Horizontal bars of next-character probabilities in %, largest on top; ``highlight`` chars in orange."""
    if hasattr(probs, "detach"):
        probs = probs.detach().cpu()
    chars = list(chars)
    pct = 100 * np.asarray(probs, dtype=float).reshape(-1)
    if len(chars) != len(pct):
        raise ValueError(f"{len(chars)} characters but {len(pct)} probabilities")
    order = np.argsort(-pct, kind="stable")
    chars, pct = [chars[i] for i in order], pct[order]
    highlight = set(highlight or ())
    if ax is None:
        fig = Figure(figsize=(6, 1.2 + 0.42 * len(chars)), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    y = np.arange(len(chars))
    colors = [HIGHLIGHT_COLOR if c in highlight else BAR_COLOR for c in chars]
    bars = ax.barh(y, pct, color=colors)
    ax.bar_label(bars, labels=[f"{p:.1f} %" for p in pct], padding=3, fontsize=FONT_SIZE - 2)
    ax.set_yticks(y, [char_label(c) for c in chars])
    ax.invert_yaxis()  # the most likely character on top
    ax.set_xlim(0, max(pct.max(initial=0) * 1.18, 1))
    ax.set_xlabel("probability (%)")
    ax.spines[["top", "right"]].set_visible(False)
    if title:
        ax.set_title(title)
    return fig


def plot_loss_curve(history: list[dict], path: str | os.PathLike, title: str = "") -> Path:
    """Draw train loss (light line) and validation loss (markers) against step; save a PNG atomically."""
    path = Path(path)
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    steps = [row["step"] for row in history]
    ax.plot(steps, [row["train_loss"] for row in history], color="tab:blue", alpha=0.5, lw=1, label="train")
    val = [(row["step"], row["val_loss"]) for row in history if row.get("val_loss") is not None]
    if val:
        ax.plot(*zip(*val), "o-", color="tab:orange", ms=5, label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    write_bytes(path, figure_png(fig, dpi=110))
    return path



# ---------------------------------------------------------------------------------------------
# Several bar charts side by side, and a bar chart that a slider can redraw quickly
# ---------------------------------------------------------------------------------------------

def bar_panels(panels, title: str | None = None, panel_width: float = 4.4) -> Figure:
    """``bar_top_k`` charts side by side, one per panel: ``(chars, probs[, title[, highlight]])``."""
    panels = [tuple(p) + (None,) * (4 - len(p)) for p in panels]
    n_bars = max(len(p[0]) for p in panels)
    width = min(panel_width * len(panels), MAX_WIDTH)
    fig = Figure(figsize=(width, 1.4 + 0.45 * n_bars), layout="constrained")
    for ax, (chars, probs, sub, highlight) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        bar_top_k(chars, probs, title=sub, ax=ax, highlight=highlight)
    if title:
        fig.suptitle(title)
    return fig


# ---- notebooks 4-6: the cache, its timing, batches ---------------------------------------------

def plot_token_forwards(ns, uncached, cached, prompt_length: int, measured=None) -> Figure:
    """Token-forwards against new tokens N: the recompute loop's sum of P + t, the cache's P + N - 1.

    ``measured`` optionally maps N -> (uncached, cached) counts taken from a real run (drawn as dots).
    """
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(ns, uncached, color="tab:blue", lw=2.5, label="recompute every step")
    ax.plot(ns, cached, color=HIGHLIGHT_COLOR, lw=2.5, label="KV cache: prefill once, then 1 per step")
    for i, (n, (u, c)) in enumerate(sorted((measured or {}).items())):
        ax.plot([n, n], [u, c], "o", color="black", ms=6, label="counted in a real run" if i == 0 else None)
    ax.set_xlabel("new tokens N")
    ax.set_ylabel("token-forwards")
    ax.set_title(f"positions pushed through the network, prompt P = {prompt_length}")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def plot_masks(masks: dict, row_labels: dict | None = None, col_labels=None,
               xlabel: str = "key position", ylabel: str = "query (new token)") -> Figure:
    """Boolean attention masks side by side: True (may attend) dark, False light; queries are rows."""
    fig = Figure(figsize=(min(4.2 * len(masks), MAX_WIDTH), 3.8), layout="constrained")
    axes = fig.subplots(1, len(masks), squeeze=False)[0]
    for ax, (title, mask) in zip(axes, masks.items()):
        m = np.asarray(mask, dtype=float)
        T, S = m.shape
        ax.imshow(m, cmap="Blues", vmin=-0.25, vmax=1.1, interpolation="nearest")
        every = 1 if S <= 10 else 2  # more columns: label every other one, so the numbers never run together
        labels = list(col_labels[:S]) if col_labels is not None else list(range(S))
        ax.set_xticks(range(0, S, every), labels[::every])
        rows = (row_labels or {}).get(title)
        ax.set_yticks(range(T), rows if rows is not None else range(T))
        ax.set_xticks(np.arange(-0.5, S), minor=True)
        ax.set_yticks(np.arange(-0.5, T), minor=True)
        ax.grid(which="minor", color="white", lw=1.5)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel(xlabel)
        ax.set_title(title)
    axes[0].set_ylabel(ylabel)
    return fig


def plot_cache_check(report) -> Figure:
    """A ``verify_cache`` report: the largest logit difference per step, and the top-1 minus top-2 margin."""
    steps = np.arange(1, report.steps + 1)
    diffs = np.maximum(np.asarray(report.step_diffs), 1e-9)  # log scale: show exact zeros at the floor
    margins = np.asarray(report.margins)
    fig = Figure(figsize=(MAX_WIDTH, 4.4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    ax1.semilogy(steps, diffs, "o-", ms=3, color="tab:blue", label="max |cached − recomputed|")
    ax1.axhline(report.atol, color="tab:red", ls="--", label=f"tolerance {report.atol:g}")
    ax1.set_xlabel("decode step")
    ax1.set_ylabel("logit difference")
    ax1.set_title("cached against recomputed logits")
    ax1.legend(loc="center right", fontsize=FONT_SIZE - 2)  # between the tolerance line and the differences
    ax1.grid(alpha=0.3)
    ax2.semilogy(steps, np.maximum(margins, 1e-9), "o-", ms=3, color=HIGHLIGHT_COLOR, label="top-1 − top-2 margin")
    ax2.axhline(report.max_abs_logit_diff, color="tab:blue", ls=":", label="largest difference")
    ax2.set_xlabel("decode step")
    ax2.set_ylabel("logit margin")
    ratio = min(margins) / max(report.max_abs_logit_diff, 1e-12)
    ax2.set_title(f"greedy margins: smallest / largest difference ≈ {ratio:,.0f}")
    ax2.legend(loc="lower right", fontsize=FONT_SIZE - 2)
    ax2.grid(alpha=0.3)
    return fig


def plot_timing(ns, series: dict, baseline: str | None = None, title: str = "") -> Figure:
    """Median times (ms) of several loops against new tokens, and each loop's speed-up over ``baseline``.

    ``series`` maps a loop's name to its times, one per entry of ``ns``. The baseline (the first
    series unless named) gets a quadratic fit, the others straight lines.
    """
    ns = np.asarray(ns, dtype=float)
    series = {name: np.asarray(ms, dtype=float) for name, ms in series.items()}
    baseline = baseline or next(iter(series))
    colors = ["tab:blue", HIGHLIGHT_COLOR, "tab:green", "tab:purple", "tab:brown"]
    fig = Figure(figsize=(MAX_WIDTH, 4.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    grid = np.linspace(0, ns.max(), 100)
    for color, (name, ms) in zip(colors, series.items()):
        degree = 2 if name == baseline else 1
        if degree == 2:  # a n + b n^2, through the origin: no tokens, no time (a free constant can dip below 0)
            coef = np.linalg.lstsq(np.stack([ns, ns**2], 1), ms, rcond=None)[0]
            curve = coef[0] * grid + coef[1] * grid**2
        else:
            curve = np.polyval(np.polyfit(ns, ms, 1), grid)
        ax1.plot(ns, ms, "o", color=color, label=name)
        ax1.plot(grid, np.clip(curve, 0, None), "-", color=color, alpha=0.6,  # a time is never negative
                 label="quadratic fit" if degree == 2 else None)
        if name != baseline:
            ax2.plot(ns, series[baseline] / ms, "o-", color=color, label=name)
    ax1.set_xlabel("new tokens")
    ax1.set_ylabel("median time (ms)")
    ax1.set_title(title or "time to generate (lines: fits)")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=FONT_SIZE - 2)
    ax2.set_xlabel("new tokens")
    ax2.set_ylabel(f"speed-up over {baseline}")
    ax2.set_title(f"speed-up = {baseline} time / cached time")
    ax2.set_ylim(0, None)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=FONT_SIZE - 2)
    return fig


def plot_token_grid(labels, key_mask, title: str = "") -> Figure:
    """A left-padded batch: one row per prompt, real tokens labelled, padding shaded grey."""
    mask = np.asarray(key_mask, dtype=bool)
    B, T = mask.shape
    fig = Figure(figsize=(min(0.62 * T + 2, MAX_WIDTH), 0.62 * B + 1.3), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(np.where(mask, 1.0, 0.25), cmap="Blues", vmin=0, vmax=2.2, aspect="equal", interpolation="nearest")
    for b in range(B):
        for t in range(T):
            ax.text(t, b, char_label(labels[b][t]) if mask[b, t] else "pad", ha="center", va="center",
                    fontsize=FONT_SIZE if mask[b, t] else FONT_SIZE - 2, color="black" if mask[b, t] else "grey")
    ax.set_xticks(range(T))
    ax.set_yticks(range(B), [f"row {b}" for b in range(B)])
    ax.set_xticks(np.arange(-0.5, T), minor=True)
    ax.set_yticks(np.arange(-0.5, B), minor=True)
    ax.grid(which="minor", color="white", lw=2)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("column")
    if title:
        ax.set_title(title)
    return fig
