"""Chinese in matplotlib on any machine: the shipped CJK font, registered once.

The font is a subset of Noto Sans CJK SC (``data/fonts/``, built by ``python -m kvlib.tools.fonts``);
its file is checked against the manifest before matplotlib reads it.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib import font_manager, rcParams
from matplotlib.ft2font import FT2Font

from ..tools.fonts import FONT_FILE
from ..tools.integrity import verified_path

FONT_SIZE = 13  # points: legible on a projector
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
