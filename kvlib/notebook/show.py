"""Putting results on screen: messages, a live widget beside its static copy, PNG images.

Shared by the widgets of every notebook, so that the same mistake gets the same message everywhere.
"""
from __future__ import annotations

import html

from ..tokenizer import UnknownCharacterError
from .fonts import char_label


def unknown_message(err: UnknownCharacterError) -> str:
    """A friendly sentence naming the characters the model has no id for."""
    names = {" ": "a space", "\t": "a tab", "\u3000": "a wide space"}
    shown = "、".join(names.get(ch, f"「{ch}」") for ch in err.chars[:12])
    more = f" and {len(err.chars) - 12} more" if len(err.chars) > 12 else ""
    return (f"The model does not know {shown}{more}. Its vocabulary holds only the characters that "
            "occur at least twice in the Tang poems; try other characters.")


def format_top(text: str, pairs, decimals: int = 1) -> str:
    """One line: 「text」→ each candidate with its probability in %, most likely first."""
    cands = "  ".join(f"{char_label(ch)} {100 * p:.{decimals}f}%" for ch, p in pairs)
    return f"「{text}」→ {cands}"


def message_html(text: str) -> str:
    """A message in place of a result (a typing mistake, something that does not fit)."""
    return f'<p style="font-size:15px;color:#a34000">{html.escape(text)}</p>'


def require_str(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str of Chinese characters, got {value!r}")
    return value


def display(*objs) -> None:
    from IPython.display import display as ipython_display

    ipython_display(*objs)


def png_image(png: bytes):
    from IPython.display import Image

    return Image(data=png, format="png")
