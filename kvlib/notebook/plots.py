"""Plots for the notebooks and the training log.

The functions build ``Figure`` objects directly (no pyplot state), so they work under any backend,
in a notebook or a script. Importing this module registers the shipped CJK font (:mod:`.fonts`).

Every figure is made for a projector at 1280x720: at most :data:`MAX_WIDTH` by :data:`MAX_HEIGHT`
inches, text of at least ``FONT_SIZE - 2`` points (legends included), titles wrapped to the width of
their panel so that neighbouring titles never run into each other, legends off the data, and panels
that are compared on one scale (``sharex``). ``tests/notebook/test_figures.py`` checks every function
here with the notebooks' own inputs.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..memory import MB, SHAPES
from ..tools.integrity import write_bytes
from .fonts import FONT_SIZE, char_label, use_cjk_font
from .show import BAR_COLOR, HIGHLIGHT_COLOR, check_setting
from .text_fit import room_per_panel, set_title, suptitle, text_width, tick_width

# Figures at most this wide (inches, at 100 dpi: 900 px) keep their text at full size in a notebook at
# 1280x720, where JupyterLab's output area is about 900 px wide; wider figures would be shrunk.
MAX_WIDTH = 9.0
# ... and at most this tall (620 px) fit the same view below the cell that draws them.
MAX_HEIGHT = 6.2
SMALL = FONT_SIZE - 2  # points: the smallest text in a figure (bar labels, annotations, legends)

use_cjk_font()


def figure_png(fig: Figure, dpi: int = 90) -> bytes:
    """A figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# ---- bar charts -----------------------------------------------------------------------------------

def _percent(chars, probs) -> tuple[list[str], np.ndarray]:
    """Characters and their probabilities in %, largest first."""
    if hasattr(probs, "detach"):
        probs = probs.detach().cpu()
    chars = list(chars)
    pct = 100 * np.asarray(probs, dtype=float).reshape(-1)
    if len(chars) != len(pct):
        raise ValueError(f"{len(chars)} characters but {len(pct)} probabilities")
    order = np.argsort(-pct, kind="stable")
    return [chars[i] for i in order], pct[order]


def _bars(ax, chars, pct, highlight) -> None:
    """Horizontal bars, largest on top, ``highlight`` in orange."""
    highlight = set(highlight or ())
    y = np.arange(len(chars))
    ax.barh(y, pct, color=[HIGHLIGHT_COLOR if c in highlight else BAR_COLOR for c in chars])
    labels = [char_label(c) for c in chars]
    ax.set_yticks(y, labels)
    ax.invert_yaxis()  # the most likely character on top
    ax.set_xlabel("probability (%)")
    ax.spines[["top", "right"]].set_visible(False)


def _label_bars(ax, values, labels, axes_width: float) -> None:
    """Value labels for horizontal bars in an axes ``axes_width`` inches wide: beside a bar where the
    label fits inside the axes, else inside the bar's end (so no label leaves its panel)."""
    x0, x1 = ax.get_xlim()
    pad = 4 / 72
    for y, (value, label) in enumerate(zip(values, labels)):
        bar = (value - x0) / (x1 - x0) * axes_width
        text = text_width(label, SMALL) + pad
        outside = bar + text + 0.15 <= axes_width or bar < text + pad  # 0.15 in: room for the estimate's error
        ax.annotate(label, (value, y), xytext=(4 if outside else -4, 0), textcoords="offset points",
                    ha="left" if outside else "right", va="center", fontsize=SMALL)


def bar_top_k(chars, probs, title: str | None = None, ax=None, highlight=None) -> Figure:
    """Horizontal bars of next-character probabilities in %, largest on top; ``highlight`` chars in orange."""
    chars, pct = _percent(chars, probs)
    labels = [char_label(c) for c in chars]
    if ax is None:
        fig = Figure(figsize=(6, min(MAX_HEIGHT, 1.2 + 0.42 * len(chars))), layout="constrained")
        ax = fig.add_subplot()
        width = room_per_panel(fig.get_figwidth(), [tick_width(labels)])
    else:
        fig = ax.figure
        width = ax.get_position().width * fig.get_figwidth()
    _bars(ax, chars, pct, highlight)
    ax.set_xlim(0, max(pct.max(initial=0) * 1.18, 1))
    set_title(ax, title, width)
    _label_bars(ax, pct, [f"{p:.1f} %" for p in pct], width)
    return fig


def bar_panels(panels, title: str | None = None, panel_width: float = 4.4) -> Figure:
    """``bar_top_k`` charts side by side, one per panel: ``(chars, probs[, title[, highlight]])``.

    The panels share one probability axis, so equal bars mean equal probabilities in every panel.
    """
    panels = [tuple(p) + (None,) * (4 - len(p)) for p in panels]
    bars = [_percent(chars, probs) for chars, probs, _, _ in panels]
    n_bars = max(len(chars) for chars, _ in bars)
    width = min(panel_width * len(panels), MAX_WIDTH)
    fig = Figure(figsize=(width, min(MAX_HEIGHT, 1.4 + 0.45 * n_bars)), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, sharex=True)[0]
    axes[0].set_xlim(0, max(max(pct.max(initial=0) for _, pct in bars) * 1.18, 1))  # one scale for all
    panel = room_per_panel(width, [tick_width([char_label(c) for c in chars]) for chars, _ in bars])
    for ax, (chars, pct), (_, _, sub, highlight) in zip(axes, bars, panels):
        _bars(ax, chars, pct, highlight)
        set_title(ax, sub, panel)
        _label_bars(ax, pct, [f"{p:.1f} %" for p in pct], panel)
    suptitle(fig, title)
    return fig


# ---- the training log ------------------------------------------------------------------------------

def loss_curve_figure(history: list[dict], title: str = "") -> Figure:
    """Train loss (light line) and validation loss (markers) against step."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    train = [(row["step"], row["train_loss"]) for row in history if "train_loss" in row]  # not a converted start's
    ax.plot(*zip(*train), color="tab:blue", alpha=0.5, lw=1, label="train")
    val = [(row["step"], row["val_loss"]) for row in history if row.get("val_loss") is not None]
    if val:
        ax.plot(*zip(*val), "o-", color="tab:orange", ms=5, label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    set_title(ax, title, fig.get_figwidth() - 1.2)
    return fig


def plot_loss_curve(history: list[dict], path: str | os.PathLike, title: str = "") -> Path:
    """Draw :func:`loss_curve_figure` and save it as a PNG atomically."""
    path = Path(path)
    write_bytes(path, figure_png(loss_curve_figure(history, title), dpi=110))
    return path


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
    set_title(ax, f"positions pushed through the network, prompt P = {prompt_length}", fig.get_figwidth() - 1.4)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")  # the curves start at the bottom left and rise to the right
    return fig


def plot_masks(masks: dict, row_labels: dict | None = None, col_labels=None,
               xlabel: str = "key position", ylabel: str = "query (new token)") -> Figure:
    """Boolean attention masks side by side: True (may attend) dark, False light; queries are rows."""
    width = min(4.2 * len(masks), MAX_WIDTH)
    fig = Figure(figsize=(width, 3.8), layout="constrained")
    axes = fig.subplots(1, len(masks), squeeze=False)[0]
    for ax, (title, mask) in zip(axes, masks.items()):
        m = np.asarray(mask, dtype=float)
        T, S = m.shape
        ax.imshow(m, cmap="Blues", vmin=-0.25, vmax=1.1, interpolation="nearest")
        every = 1 if S <= 10 else 2  # more columns: label every other one, so the numbers never run together
        labels = list(col_labels[:S]) if col_labels is not None else list(range(S))
        ax.set_xticks(range(0, S, every), labels[::every])
        rows = (row_labels or {}).get(title)
        rows = rows if rows is not None else list(range(T))
        ax.set_yticks(range(T), rows)
        ax.set_xticks(np.arange(-0.5, S), minor=True)
        ax.set_yticks(np.arange(-0.5, T), minor=True)
        ax.grid(which="minor", color="white", lw=1.5)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel(xlabel)
        set_title(ax, title, width / len(masks) - tick_width(rows) - 0.25)
    axes[0].set_ylabel(ylabel)
    return fig


def plot_cache_check(report) -> Figure:
    """A ``verify_cache`` report: the largest logit difference per step, and the top-1 minus top-2 margin.

    The suptitle gives the safety factor (smallest margin over largest difference); one legend below
    the panels names the lines of both.
    """
    steps = np.arange(1, report.steps + 1)
    diffs = np.maximum(np.asarray(report.step_diffs), 1e-9)  # log scale: show exact zeros at the floor
    margins = np.asarray(report.margins)
    fig = Figure(figsize=(MAX_WIDTH, 5.4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, sharex=True)  # both panels: the same decode steps
    ax1.semilogy(steps, diffs, "o-", ms=3, color="tab:blue", label="max |cached − recomputed|")
    ax1.axhline(report.atol, color="tab:red", ls="--", label=f"tolerance {report.atol:g}")
    ax1.set_xlabel("decode step")
    ax1.set_ylabel("logit difference")
    ax1.set_title("cached against recomputed")
    ax1.grid(alpha=0.3)
    ax2.semilogy(steps, np.maximum(margins, 1e-9), "o-", ms=3, color=HIGHLIGHT_COLOR, label="top-1 − top-2 margin")
    ax2.axhline(report.max_abs_logit_diff, color="tab:blue", ls=":", label="largest difference")
    ax2.set_xlabel("decode step")
    ax2.set_ylabel("logit margin")
    ax2.set_title("greedy margins")
    ax2.grid(alpha=0.3)
    ratio = min(margins) / max(report.max_abs_logit_diff, 1e-12)
    suptitle(fig, f"safety factor: smallest margin / largest difference ≈ {ratio:,.0f}")
    handles = [*ax1.get_lines(), *ax2.get_lines()]
    fig.legend(handles, [h.get_label() for h in handles], loc="outside lower center", ncols=2)
    return fig


def plot_timing(ns, series: dict, baseline: str | None = None, title: str = "", speedups: dict | None = None) -> Figure:
    """Median times (ms) of several loops against new tokens, and each loop's speed-up over ``baseline``.

    ``series`` maps a loop's name to its times, one per entry of ``ns``. The baseline (the first
    series unless named) gets a quadratic fit, the others straight lines. The right panel divides the
    baseline's median by each loop's, unless ``speedups`` maps the loop's name to one (median, low, high)
    per entry of ``ns``: the speed-up measured round by round in interleaved rounds (:class:`kvlib.tools.timing.Timing`
    of the rounds' ratios), drawn as its median with a bar from its low to its high: the numbers printed beside it.
    """
    ns = np.asarray(ns, dtype=float)
    series = {name: np.asarray(ms, dtype=float) for name, ms in series.items()}
    baseline = baseline or next(iter(series))
    for name, triples in (speedups or {}).items():
        triples = np.asarray(triples, dtype=float)
        if name not in series or name == baseline:
            raise ValueError(f"speedups names {name!r}; allowed are the series other than the baseline: "
                             f"{[n for n in series if n != baseline]}")
        if triples.shape != (len(ns), 3) or not np.all((triples[:, 1] <= triples[:, 0]) & (triples[:, 0] <= triples[:, 2])):
            raise ValueError(f"speedups[{name!r}] must hold one (median, low, high) with low <= median <= high per "
                             f"entry of ns ({len(ns)}), got {triples.tolist()!r:.120}")
    colors = ["tab:blue", HIGHLIGHT_COLOR, "tab:green", "tab:purple", "tab:brown"]
    fig = Figure(figsize=(MAX_WIDTH, 5.4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, sharex=True)  # both panels: the same lengths
    grid = np.linspace(0, ns.max(), 100)
    for color, (name, ms) in zip(colors, series.items()):
        degree = 2 if name == baseline else 1
        if degree == 2:  # a n + b n^2, through the origin: no tokens, no time (a free constant can dip below 0)
            coef = np.linalg.lstsq(np.stack([ns, ns**2], 1), ms, rcond=None)[0]
            curve = coef[0] * grid + coef[1] * grid**2
        else:
            curve = np.polyval(np.polyfit(ns, ms, 1), grid)
        ax1.plot(ns, ms, "o", color=color, label=name)
        ax1.plot(grid, np.clip(curve, 0, None), "-", color=color, alpha=0.6)  # a time is never negative
        if name == baseline:
            continue
        if speedups and name in speedups:
            ups, low, high = np.asarray(speedups[name], dtype=float).T
            ax2.errorbar(ns, ups, yerr=[ups - low, high - ups], fmt="none", color=color, capsize=4, alpha=0.8)
        else:
            ups = series[baseline] / ms
        ax2.plot(ns, ups, "o-", color=color, label=name)
    panel = MAX_WIDTH / 2 - 0.9
    ax1.set_xlabel("new tokens")
    ax1.set_ylabel("median time (ms)")
    set_title(ax1, title or "time to generate", panel)
    ax1.grid(alpha=0.3)
    ax2.set_xlabel("new tokens")
    ax2.set_ylabel(f"speed-up over {baseline}")
    set_title(ax2, f"speed-up = {baseline} time / cached time" + (" (median and range over rounds)" if speedups else ""),
               panel)
    ax2.set_ylim(0, None)
    ax2.grid(alpha=0.3)
    # One legend below both panels (inside, it would cover the points of one of them): a colour per loop.
    handles = [Line2D([], [], color=color, marker="o", label=name) for color, name in zip(colors, series)]
    handles.append(Line2D([], [], color="grey", alpha=0.6, label=f"fits: quadratic for {baseline}, else straight"))
    fig.legend(handles=handles, loc="outside lower center", ncols=2)
    return fig


def plot_cache_memory(shapes=None, dtype: str = "bfloat16", max_batch: int = 32,
                      highlight: str = "GPT-2 small") -> Figure:
    """Notebook 5's memory picture, from :mod:`kvlib.memory`'s numbers.

    Left: cache against batch for one model (``highlight``) at its context, with its weights as a
    line and the batch where the cache passes them. Right: KV-cache bytes per token for every model
    (blue: every head has its own k, v; orange: grouped-query attention).
    """
    if shapes is not None and not list(shapes):
        raise ValueError("shapes must name at least one model shape (kvlib.memory.SHAPES), got none")
    shapes = list(shapes or SHAPES.values())
    names = [s.name for s in shapes]
    if highlight not in names:
        raise ValueError(f"highlight must be one of the models shown ({', '.join(names)}), got {highlight!r}")
    check_setting("max_batch", max_batch, 1, 100_000, integer=True)
    main = shapes[names.index(highlight)]
    fig = Figure(figsize=(MAX_WIDTH, 5.6), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    batches = np.arange(1, max_batch + 1)
    cache_mb = [main.kv_cache_bytes(None, int(b), dtype) / MB for b in batches]
    weights_mb = main.weight_bytes(dtype) / MB
    cross = main.crossover_batch(None, dtype)
    ax.plot(batches, cache_mb, "-", color=HIGHLIGHT_COLOR, lw=2.5, label="KV cache")
    ax.axhline(weights_mb, color="tab:blue", lw=2, ls="--", label=f"weights ({weights_mb:.0f} MB)")
    if cross <= max_batch:  # the batch where the cache passes the weights, named in the legend
        ax.plot(cross, main.kv_cache_bytes(None, cross, dtype) / MB, "o", color="black", ms=8,
                label=f"batch {cross}: the cache passes the weights")
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("MB")
    ax.set_xlim(0, max_batch)
    top = max(max(cache_mb), weights_mb) * 1.05
    ax.set_ylim(0, top)
    left = tick_width([f"{top:,.0f}"]) + 0.35  # tick labels and "MB"
    panel = room_per_panel(fig.get_figwidth(), [left, tick_width(names)])
    set_title(ax, f"{main.name}, {dtype},\n{main.context:,} tokens each", panel)
    ax.grid(alpha=0.3)
    # Below the panels: inside, for some models and batches, the legend would cover a line.
    fig.legend(handles=ax.get_lines(), loc="outside lower center", ncols=3)

    per_token = [s.kv_bytes_per_token(dtype) / 1024 for s in shapes]
    # Colours of their own: the legend below gives the left panel's orange and blue another meaning.
    colors = ["#a6a6a6" if s.n_kv_head == s.n_head else "#5b8c5a" for s in shapes]  # MHA grey, fewer heads green
    y = np.arange(len(shapes))
    ax2.barh(y, per_token, color=colors)
    ax2.set_yticks(y, names)
    ax2.invert_yaxis()
    ax2.set_xlim(0, max(per_token) * 1.3)
    ax2.set_xlabel(f"KV cache per token, {dtype} (KiB)")
    set_title(ax2, "blue: k, v per head (MHA)\norange: shared k, v (GQA)", panel)
    ax2.spines[["top", "right"]].set_visible(False)
    _label_bars(ax2, per_token, [f"{v:,.0f} KiB ({s.attention})" for v, s in zip(per_token, shapes)], panel)
    return fig


def plot_token_grid(labels, key_mask, title: str = "") -> Figure:
    """A left-padded batch: one row per prompt, real tokens labelled, padding shaded grey."""
    mask = np.asarray(key_mask, dtype=bool)
    B, T = mask.shape
    fig = Figure(figsize=(min(0.62 * T + 2, MAX_WIDTH), min(0.62 * B + 1.3, MAX_HEIGHT)), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(np.where(mask, 1.0, 0.25), cmap="Blues", vmin=0, vmax=2.2, aspect="equal", interpolation="nearest")
    for b in range(B):
        for t in range(T):
            ax.text(t, b, char_label(labels[b][t]) if mask[b, t] else "pad", ha="center", va="center",
                    fontsize=FONT_SIZE if mask[b, t] else SMALL, color="black" if mask[b, t] else "grey")
    ax.set_xticks(range(T))
    rows = [f"row {b}" for b in range(B)]
    ax.set_yticks(range(B), rows)
    ax.set_xticks(np.arange(-0.5, T), minor=True)
    ax.set_yticks(np.arange(-0.5, B), minor=True)
    ax.grid(which="minor", color="white", lw=2)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("column")
    set_title(ax, title, fig.get_figwidth() - tick_width(rows) - 0.2)
    return fig


# ---- notebook 8: speculative decoding ----------------------------------------------------------------

def plot_speculation_sweep(rows_by_draft: dict, plain_us_per_token: float) -> Figure:
    """A speculative-decoding sweep over γ, one colour per draft.

    Left: tokens per round over the rounds that asked for all γ guesses, measured (dots), against the
    formula (1 − α^(γ+1)) / (1 − α) (lines). Right: time per token, with plain greedy decoding as a
    dashed line; bars span the rounds' spread (``low_us`` to ``high_us``, when given), and a row the machine was
    too busy to time (``too_busy``) is left out. ``rows_by_draft`` maps a draft's name to its rows, dicts with
    ``gamma``, ``tokens_per_full_round``, ``formula`` and ``us_per_token`` (``run_spec_bench``'s
    ``report["results"][name]["rows"]``).
    """
    fig = Figure(figsize=(MAX_WIDTH, 4.6), layout="constrained")
    ax_calls, ax_time = fig.subplots(1, 2, sharex=True)  # both panels: the same γ
    colors = ["tab:blue", HIGHLIGHT_COLOR, "tab:green", "tab:purple", "tab:brown", "tab:olive"]
    handles = []
    for color, (name, rows) in zip(colors, rows_by_draft.items()):
        gammas = [r["gamma"] for r in rows]
        ax_calls.plot(gammas, [r["tokens_per_full_round"] for r in rows], "o", color=color, ms=7)
        ax_calls.plot(gammas, [r["formula"] for r in rows], "-", color=color)
        timed = [r for r in rows if not r.get("too_busy")]  # a reading faster than the step it holds is not drawn
        ax_time.errorbar([r["gamma"] for r in timed], [r["us_per_token"] for r in timed], fmt="o-", color=color, ms=7,
                         capsize=3, yerr=[[r["us_per_token"] - r.get("low_us", r["us_per_token"]) for r in timed],
                                          [r.get("high_us", r["us_per_token"]) - r["us_per_token"] for r in timed]])
        handles.append(Line2D([], [], color=color, marker="o", ms=7, label=name))
    ax_time.axhline(plain_us_per_token, color="grey", ls="--")
    ax_calls.set(xlabel="γ (guesses per round)", ylabel="tokens per target call",
                 title="tokens per round of γ guesses")
    ax_time.set(xlabel="γ (guesses per round)", ylabel="µs per token", title="time per token (this run)")
    ax_time.set_ylim(0, None)
    for ax in (ax_calls, ax_time):
        ax.grid(alpha=0.3)
    keys = [Line2D([], [], color="black", marker="o", ls="none", ms=7, label="measured"),
            Line2D([], [], color="black", label="formula"),
            Line2D([], [], color="grey", ls="--", label="plain greedy (fast path)")]
    # Row by row: the drafts' colours, then what dots and lines mean (a legend fills column by column).
    ncols = max(len(handles), len(keys))
    rows = [handles + [Line2D([], [], ls="none", label="")] * (ncols - len(handles)), keys + [
        Line2D([], [], ls="none", label="")] * (ncols - len(keys))]
    ordered = [row[c] for c in range(ncols) for row in rows]
    fig.legend(ordered, [h.get_label() for h in ordered], loc="outside lower center", ncols=ncols)
    return fig


# ---- notebook 9: smaller caches ---------------------------------------------------------------------

FAMILY_STYLE = {"quantised": ("tab:blue", "o"), "evicted": ("tab:green", "s"), "fewer heads": (HIGHLIGHT_COLOR, "^"),
                "latent": ("tab:purple", "D")}


def plot_cache_tradeoff(table: dict) -> Figure:
    """Memory cut (x) against the KL divergence from the full cache (y, log scale), one named marker per setting.

    The full cache itself (no cut, KL 0) is the reference every point is measured against. A row's
    ``short`` name, if it has one, is written beside its marker.
    """
    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    ax = fig.add_subplot()
    named = []
    for family, (color, marker) in FAMILY_STYLE.items():
        rows = [r for r in table["rows"] if r["family"] == family]
        if rows:
            xy = [(100 * r["memory_cut"], max(r["kl"], 1e-7)) for r in rows]
            ax.plot(*zip(*xy), marker, color=color, ms=MARKER_PT, ls="none", label=family)
            named += [(x, y, r["short"]) for (x, y), r in zip(xy, rows) if r.get("short")]
    ax.set_yscale("log")
    ax.set_xlim(0, 100)
    ax.set_xlabel("memory cut against the float32 cache (%)")
    ax.set_ylabel("KL from the full cache (nats)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left")
    set_title(ax, f"quality lost against memory saved, {table['texts']} texts × {table['length']} tokens",
               fig.get_figwidth() - 1.4)
    _name_points(ax, named)
    return fig


MARKER_PT = 9  # marker size of the scatter plots, points
# Where a point's name may go, in points from the marker, tried in this order: right, left, then rows one line
# up and down on either side (for markers that crowd), then centred above and below.
_NAME_PLACES = ([((7, 0), "left", "center"), ((-7, 0), "right", "center")]
                + [((dx, dy), "left" if dx > 0 else "right", "center")
                   for k in (1, 2, 3) for dy in (14 * k, -14 * k) for dx in (7, -7)]
                + [((0, 7), "center", "bottom"), ((0, -7), "center", "top")])


def _name_points(ax, points: list[tuple[float, float, str]]) -> None:
    """Write each name beside its marker at the first place (``_NAME_PLACES``) where it stays inside the axes and
    meets no marker, legend or name placed before it; where none is free, at the place it overlaps least."""
    if not points:
        return
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = ax.figure
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()  # the final layout: where every marker and the legend are
    half = MARKER_PT / 2 * fig.dpi / 72 + 1  # a marker's half width in pixels, and a pixel to spare
    markers = [(x - half, y - half, x + half, y + half) for x, y in ax.transData.transform([(x, y) for x, y, _ in points])]
    taken = list(markers)
    legend = ax.get_legend()
    if legend is not None:
        b = legend.get_window_extent(renderer)
        taken.append((b.x0, b.y0, b.x1, b.y1))
    box = ax.bbox

    def overlap(b, others) -> float:
        return sum(max(0.0, min(b[2], o[2]) - max(b[0], o[0])) * max(0.0, min(b[3], o[3]) - max(b[1], o[1]))
                   for o in others)

    for (x, y, name), own in zip(points, markers):
        best = None
        for offset, ha, va in _NAME_PLACES:
            text = ax.annotate(name, (x, y), xytext=offset, textcoords="offset points", ha=ha, va=va, fontsize=SMALL)
            text.set_in_layout(False)  # placed on the final layout: it must not move the axes
            b = text.get_window_extent(renderer)
            b = (b.x0, b.y0, b.x1, b.y1)
            outside = max(0.0, box.x0 - b[0]) + max(0.0, b[2] - box.x1) + max(0.0, box.y0 - b[1]) + max(0.0, b[3] - box.y1)
            cost = overlap(b, [t for t in taken if t != own]) + 1e6 * outside
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, text, b)
            else:
                text.remove()
            if cost == 0:
                break
        taken.append(best[2])
