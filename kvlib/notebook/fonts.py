"""Chinese in matplotlib on any machine: the shipped CJK font, registered once.

The font is a subset of Noto Sans CJK SC (``data/fonts/``, built by ``python -m kvlib.tools.fonts``),
with two small fallback subsets for the rare ideographs Noto lacks; each file is checked against the
manifest before matplotlib reads it. matplotlib takes each glyph from the first family that has it.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib import font_manager, rcParams
from matplotlib.ft2font import FT2Font

from ..tools.fonts import FALLBACK_FILES, FONT_FILE
from ..tools.integrity import verified_path

FONT_SIZE = 14  # points: legible on a projector; the smallest text in a plot is FONT_SIZE - 2
_font_chars: frozenset[int] = frozenset()


def use_cjk_font() -> str:
    """Register the shipped CJK fonts and make them matplotlib's first sans-serifs; return the main family."""
    global _font_chars
    families, chars = [], set()
    for name in (FONT_FILE, *FALLBACK_FILES.values()):
        path = verified_path(name)
        if not any(Path(f.fname) == path for f in font_manager.fontManager.ttflist):
            font_manager.fontManager.addfont(str(path))
        families.append(font_manager.FontProperties(fname=path).get_name())
        chars |= set(FT2Font(str(path)).get_charmap())
    _font_chars = frozenset(chars)
    # Named families, not the generic "sans-serif" (which resolves to its first font only), so that a
    # glyph missing from one font is taken from the next; DejaVu fills in the rare symbol Noto lacks.
    rcParams["font.family"] = [*families, "DejaVu Sans"]
    rcParams["font.sans-serif"] = [*families, "DejaVu Sans"]
    rcParams["axes.unicode_minus"] = False
    rcParams["font.size"] = FONT_SIZE
    return families[0]


def glyph_coverage(tokens) -> tuple[int, list[str]]:
    """(how many of ``tokens`` the registered fonts draw, the single characters they cannot draw)."""
    use_cjk_font()
    missing = [t for t in tokens if len(t) == 1 and not t.isspace() and ord(t) not in _font_chars]
    return len(tokens) - len(missing), missing


def char_label(c: str) -> str:
    """How a token is shown on an axis: visible stand-ins for blanks, a code point for a missing glyph."""
    if c == "\n":
        return "⏎"
    if c == " ":
        return "␣"
    if len(c) == 1 and ord(c) not in _font_chars and not c.isascii():
        return f"U+{ord(c):04X}"  # e.g. a private-use character of the corpus that no free font draws
    return c
