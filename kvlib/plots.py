"""Plots for the notebooks and the training log, with Chinese drawn on any machine.

Importing this module registers the shipped Noto Sans CJK SC subset (``data/fonts/``) with
matplotlib. The functions build ``Figure`` objects directly (no pyplot state), so they work under
any backend, in a notebook or a script.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from matplotlib import font_manager, rcParams
from matplotlib.figure import Figure
from matplotlib.ft2font import FT2Font

from .fonts import FONT_FILE
from .integrity import verified_path, write_bytes

FONT_SIZE = 13  # points: legible on a projector
BAR_COLOR, HIGHLIGHT_COLOR = "#8fb3d9", "#e07b39"
_font_chars: frozenset[int] = frozenset()


def use_cjk_font() -> str:
    """Register the shipped CJK font and make it matplotlib's first sans-serif; return its family name."""
    global _font_chars
    path = verified_path(FONT_FILE)
    if not any(Path(f.fname) == path for f in font_manager.fontManager.ttflist):
        font_manager.fontManager.addfont(str(path))
    family = font_manager.FontProperties(fname=path).get_name()
    if not _font_chars:
        _font_chars = frozenset(FT2Font(str(path)).get_charmap())
    rcParams["font.family"] = ["sans-serif"]
    rcParams["font.sans-serif"] = [family, "DejaVu Sans"]  # DejaVu fills in the rare symbol Noto lacks
    rcParams["axes.unicode_minus"] = False
    rcParams["font.size"] = FONT_SIZE
    return family


def char_label(c: str) -> str:
    """How a token is shown on an axis: visible stand-ins for blanks, a code point for a missing glyph."""
    if c == "\n":
        return "⏎"
    if c == " ":
        return "␣"
    if len(c) == 1 and ord(c) not in _font_chars and not c.isascii():
        return f"U+{ord(c):04X}"  # e.g. a rare Extension B character that Noto Sans CJK does not draw
    return c


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
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes(path, buf.getvalue())
    return path


use_cjk_font()
