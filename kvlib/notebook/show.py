"""Putting results on screen: messages, HTML bars, and a live widget that carries its static copy.

Shared by the widgets of every notebook, so that the same mistake gets the same message everywhere.
Live charts are HTML drawn by the browser (crisp at any zoom, a fixed size, no image to encode); a
widget is displayed through :class:`LiveWidget`, whose output also holds a static HTML copy of its
current state: JupyterLab shows the live widget, a reader without a kernel (GitHub, nbviewer) sees
the copy, and never both at once.
"""
from __future__ import annotations

import html

from ..tokenizer import UnknownCharacterError
from .fonts import char_label

BAR_COLOR, HIGHLIGHT_COLOR = "#8fb3d9", "#e07b39"


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


def check_setting(name: str, value, low, high, integer: bool = False):
    """A widget's starting value must lie on its control's range; a widget never clamps silently."""
    import numbers

    kind = numbers.Integral if integer else numbers.Real
    what = "an int" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {what} in [{low}, {high}] (the range of its control), got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be {what} in [{low}, {high}] (the range of its control), got {value!r}")
    return value


def require_str(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str of Chinese characters, got {value!r}")
    return value


def display(*objs) -> None:
    from IPython.display import display as ipython_display

    ipython_display(*objs)


def html_label(token: str) -> str:
    """A token as the browser shows it: visible stand-ins for a newline and a space."""
    return html.escape({"\n": "⏎", " ": "␣"}.get(token, token))


def bars_html(labels, probs, highlight=(), title: str = "", width: int = 440) -> str:
    """Horizontal bars in %, largest first, as HTML of a fixed ``width`` in pixels.

    ``highlight`` labels are orange, the rest blue; bars of probability 0 are left out.
    """
    pct = [100 * float(p) for p in probs]
    if len(pct) != len(labels):
        raise ValueError(f"{len(labels)} labels but {len(pct)} probabilities")
    rows = sorted((p, i) for i, p in enumerate(pct) if p > 0)[::-1]
    top = max((p for p, _ in rows), default=1.0)
    highlight = set(highlight)
    body = []
    for p, i in rows:
        color = HIGHLIGHT_COLOR if labels[i] in highlight else BAR_COLOR
        body.append(
            f'<div style="display:flex;align-items:center;height:30px">'
            f'<span style="width:44px;font-size:20px;text-align:center">{html_label(labels[i])}</span>'
            f'<span style="width:{width - 120}px"><span style="display:inline-block;height:22px;'
            f'width:{max(1.0, 100 * p / top):.1f}%;background:{color}"></span></span>'
            f'<span style="width:70px;font-size:16px;padding-left:6px">{p:.1f} %</span></div>')
    head = f'<div style="font-size:17px;font-weight:600;margin-bottom:4px">{html.escape(title)}</div>' if title else ""
    return f'<div style="width:{width}px;font-family:sans-serif">{head}{"".join(body)}</div>'


STATIC_NOTE = "A static copy of the widget in its default state: run the notebook to use it live."


class LiveWidget:
    """Displays ``widget`` live, with ``static_html`` as what renderers without widgets show instead."""

    def __init__(self, widget, static_html: str):
        self.widget, self.static_html = widget, static_html

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        bundle["text/html"] = (f'<div><p style="font-size:13px;color:#777">{html.escape(STATIC_NOTE)}</p>'
                               f"{self.static_html}</div>")
        return bundle
