"""Text that fits its panel: sizes in points, widths of mixed Chinese and Latin text, wrapping at
the places a line may break, and titles wrapped to the width of their panel (used by :mod:`.plots`)."""
from __future__ import annotations

import unicodedata

from matplotlib import rcParams
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import text_to_path

BREAK_AFTER = "，。、；：！？"  # a line may end after these, as after a space
NO_LINE_START = "，。、；：！？」』）》〉"
NO_LINE_END = "「『（《〈"


def points(size) -> float:
    """A font size ("large", 14, ...) in points."""
    return FontProperties(size=size).get_size_in_points()


def text_width(text: str, size) -> float:
    """Width in inches of the widest line of ``text`` at font size ``size``."""
    prop = FontProperties(size=points(size))
    return max(text_to_path.get_text_width_height_descent(line, prop, ismath=False)[0]
               for line in text.split("\n")) / 72


def wide(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in "WF"


def units(chunk: str) -> list[str]:
    """A chunk without spaces cut where a line may break inside it: before and after each wide (CJK)
    character, but never before closing punctuation nor after an opening bracket."""
    units = []
    for ch in chunk:
        prev = units[-1][-1] if units else ""
        if prev and (ch in NO_LINE_START or prev in NO_LINE_END or not (wide(ch) or wide(prev))):
            units[-1] += ch
        else:
            units.append(ch)
    return units


def wrap(text: str, width: float, size) -> str:
    """``text`` broken into lines of at most ``width`` inches: at spaces and CJK punctuation first, and
    between CJK characters only inside a run too long for a line."""
    lines = []
    for paragraph in text.split("\n"):
        chunks, current = [], ""
        for ch in paragraph:
            current += ch
            if ch.isspace() or ch in BREAK_AFTER:
                chunks.append(current)
                current = ""
        if current:
            chunks.append(current)
        line = ""
        for chunk in chunks:
            for unit in ([chunk] if text_width(chunk.rstrip(), size) <= width else units(chunk)):
                if line.strip() and text_width((line + unit).rstrip(), size) > width:
                    lines.append(line.rstrip())
                    line = unit.lstrip()
                else:
                    line += unit
        lines.append(line.rstrip())
    return "\n".join(lines)


def set_title(ax, title: str | None, width: float) -> None:
    """An axes title wrapped to ``width`` inches (the panel's width), so it stays above its own panel."""
    if title:
        ax.set_title(wrap(title, width, rcParams["axes.titlesize"]))


def suptitle(fig: Figure, title: str | None) -> None:
    if title:
        fig.suptitle(wrap(title, fig.get_figwidth() - 0.3, rcParams["figure.titlesize"]))


def tick_width(labels) -> float:
    """Inches taken left of an axes by y tick labels ``labels`` and their ticks."""
    labels = [str(label) for label in labels]
    return max((text_width(label, rcParams["ytick.labelsize"]) for label in labels), default=0.0) + 0.15


def room_per_panel(fig_width: float, left: list[float]) -> float:
    """The width of each of ``len(left)`` equal panels side by side under constrained layout, where
    ``left[i]`` inches of tick labels (and axis label) sit left of panel i: the rest of the figure,
    less the layout's padding around every panel, shared equally."""
    pad = 2 * 3 / 72  # constrained layout's w_pad, on both sides of each panel
    return (fig_width - sum(left) - pad * (len(left) + 1)) / len(left)
