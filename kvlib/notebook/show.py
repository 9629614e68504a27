"""Putting results on screen: messages, HTML bars, and a live widget followed by its static copy.

Shared by the widgets of every notebook, so that the same mistake gets the same message everywhere.
Live charts are HTML drawn by the browser (crisp at any zoom, no image to encode); a widget is
displayed through :class:`LiveWidget`: the live widget, then, as an ordinary HTML output of its own,
a static copy of its current state. A reader without a kernel or without widget scripts (an HTML
export, nbviewer, GitHub) sees the copy; in JupyterLab the classroom CSS hides the copy under a
widget that was drawn, so the two never show at once.

Every widget fits any width from about 800 px (JupyterLab with its file browser open, or zoomed to
150 %) to 1920 px: rows of controls wrap onto more lines, widths are ``max-width`` / ``flex`` /
percentages rather than fixed pixels, and pictures scale. Its smallest text is :data:`MIN_FONT_PX`.
Controls that have no font-size style of their own (sliders, dropdowns, toggle buttons) get it from
:data:`WIDGET_CSS`, one ``<style>`` scoped to the class :data:`WIDGET_CLASS` that :func:`frame` puts
on every widget.
"""
from __future__ import annotations

import html
import re

from ..tokenizer import UnknownCharacterError, invisible_name
from .fonts import char_label

BAR_COLOR, HIGHLIGHT_COLOR = "#8fb3d9", "#e07b39"
MESSAGE_COLOR = "#a34000"

MIN_FONT_PX = 16          # the smallest text anywhere inside a widget or its static copy
FONT = f"font-size:{MIN_FONT_PX}px"
WIDGET_CLASS = "kvlib-widget"
# ipywidgets 8 sizes labels, readouts, inputs, menus and buttons by --jp-widgets-font-size (13 px in
# JupyterLab); the floor keeps presentation mode's larger size where it is larger.
_SIZE = f"max({MIN_FONT_PX}px, var(--jp-widgets-font-size, {MIN_FONT_PX}px))"
WIDGET_CSS = (
    f".{WIDGET_CLASS}{{max-width:100%;font-size:{_SIZE}}}"
    f".{WIDGET_CLASS} :is(.widget-label,.jupyter-widget-label,.widget-readout,.jupyter-widget-readout,"
    f".widget-html,.jupyter-widget-html,.widget-html-content,.jupyter-widget-html-content,.jupyter-button,"
    f".widget-toggle-button,input,select,option,textarea){{font-size:{_SIZE}}}"
    f".{WIDGET_CLASS} :is(.widget-readout,.jupyter-widget-readout){{min-width:3.5em;overflow:visible}}"
    f".{WIDGET_CLASS} :is(.widget-html-content,.jupyter-widget-html-content){{line-height:1.5}}"
    # a part as wide as its column must not add ipywidgets' side margins on top of that width
    f'.{WIDGET_CLASS} [style*="width: 100%"]{{margin-left:0;margin-right:0}}'
)
LABEL_WIDTH = "7.5em"     # a control's description: "temperature", "top-k (0 off)" at 16 px


def unknown_message(err: UnknownCharacterError) -> str:
    """A friendly sentence naming the characters the model has no id for."""
    shown = "、".join(invisible_name(ch) or f"「{ch}」" for ch in err.chars[:12])
    more = f" and {len(err.chars) - 12} more" if len(err.chars) > 12 else ""
    return (f"The model does not know {shown}{more}. Its vocabulary holds only the characters that "
            "occur at least twice in the Tang poems; try other characters.")


def too_long_message(block: int, most: int, room_for: str = "") -> str:
    """What a widget says when its prompt leaves no room: ``most`` prompt characters fit the ``block``."""
    return (f"The prompt is too long: the model reads {block} tokens, so at most {most} characters fit"
            f"{' ' + room_for if room_for else ''}. Use a shorter prompt.")


def error_message(err: BaseException) -> str:
    """What a widget says in place of its picture when an update fails."""
    if isinstance(err, UnknownCharacterError):
        return unknown_message(err)
    return (f"This change could not be shown ({type(err).__name__}: {err}). Nothing from before it is "
            "left on show; change a setting, or press Reset where there is one, to try again.")


def format_top(text: str, pairs, decimals: int = 1) -> str:
    """One line: 「text」→ each candidate with its probability in %, most likely first."""
    cands = "  ".join(f"{char_label(ch)} {100 * p:.{decimals}f}%" for ch, p in pairs)
    return f"「{text}」→ {cands}"


def message_html(text: str) -> str:
    """A message in place of a result (a typing mistake, something that does not fit)."""
    return f'<p style="{FONT};color:{MESSAGE_COLOR};margin:4px 0">{html.escape(text)}</p>'


REFUSAL_CLASS = "kv-refusal"
_EARLIER_REFUSAL = re.compile(rf'^<p class="{REFUSAL_CLASS}"[^>]*>[^<]*</p>')


def show_refusals(area, *controls) -> None:
    """Where a value off a control's range goes: its message above what ``area`` (an HTML widget) shows.

    The control refuses the value and keeps its own, so the picture still matches every control and
    stays; the message replaces an earlier refusal's and goes at the next redraw.
    """
    def refused(message: str) -> None:
        kept = _EARLIER_REFUSAL.sub("", area.value, count=1)
        area.value = f'<p class="{REFUSAL_CLASS}"{message_html(message)[2:]}{kept}'

    for control in controls:
        control.refused = refused


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
    """Horizontal bars in %, largest first, as HTML at most ``width`` pixels wide (narrower when the room is).

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
            f'<div style="display:flex;flex-wrap:wrap;align-items:center;min-height:30px">'
            f'<span style="flex:0 0 auto;min-width:2.2em;font-size:20px;text-align:center">{html_label(labels[i])}</span>'
            f'<span style="flex:1 1 80px;min-width:60px"><span style="display:inline-block;height:22px;'
            f'vertical-align:middle;width:{max(1.0, 100 * p / top):.1f}%;background:{color}"></span></span>'
            f'<span style="flex:0 0 auto;min-width:4.5em;{FONT};padding-left:6px">{p:.1f} %</span></div>')
    head = (f'<div style="font-size:17px;font-weight:600;margin-bottom:4px">{html.escape(title)}</div>'
            if title else "")
    return (f'<div style="width:100%;max-width:{width}px;box-sizing:border-box;{FONT};font-family:sans-serif">'
            f'{head}{"".join(body)}</div>')


# ---- widget frames: the style, rows that wrap, controls that shrink -------------------------------

def frame(*children):
    """The outermost box of a widget: ``children`` in a column, under the scoped :data:`WIDGET_CSS`.

    The ``<style>`` sits in a hidden HTML widget beside the column, so the column holds only what the
    widget shows.
    """
    import ipywidgets as w

    style = w.HTML(f"<style>{WIDGET_CSS}</style>", layout=w.Layout(display="none"))
    column = w.VBox(list(children), layout=w.Layout(width="100%", max_width="100%"))
    box = w.Box([style, column], layout=w.Layout(display="flex", flex_flow="column", width="100%",
                                                 max_width="100%"))
    box.add_class(WIDGET_CLASS)
    return box


def row(*children, align: str = "center", width: str = "100%"):
    """Controls side by side while they fit, on more lines when they do not."""
    import ipywidgets as w

    return w.HBox(list(children), layout=w.Layout(flex_flow="row wrap", align_items=align, width=width,
                                                  max_width="100%"))


def in_row(basis: int = 320, smallest: int = 240, largest: int = 480):
    """The layout of a control in a :func:`row`: ``basis`` px wide when there is room, never clipped."""
    import ipywidgets as w

    return w.Layout(flex=f"1 1 {basis}px", min_width=f"{smallest}px", max_width=f"min(100%, {largest}px)",
                    width="auto")


def in_column(largest: int = 480):
    """The layout of a control stacked in a column: the column's width, up to ``largest`` px."""
    import ipywidgets as w

    return w.Layout(width="100%", max_width=f"{largest}px")


def control_style(**more) -> dict:
    """The style of a control with a description: one width for every description of a widget."""
    return {"description_width": LABEL_WIDTH, **more}


def _strict(base):
    """``base`` (IntSlider, FloatSlider) refusing a value off its range instead of clamping it."""
    from traitlets import TraitError, validate

    def refuse_off_range(self, proposal):
        value = proposal["value"]
        if not self.min <= value <= self.max:
            message = (f"{self.description or 'the value'} {value} is off the slider's range "
                       f"[{self.min}, {self.max}]: refused, the slider stays at {self.value}")
            if self.refused is not None:
                self.refused(message)
            raise TraitError(message)
        return value

    class Strict(base):
        refused = None  # set by the widget: called with a message when a value is refused
        # under the name of ipywidgets' own validator, which clamps: so this one replaces it
        _validate_value = validate("value")(refuse_off_range)

    Strict.__name__ = Strict.__qualname__ = f"Strict{base.__name__}"
    return Strict


def slider(kind: str = "float", **kwargs):
    """A slider (``kind`` "int" or "float") that refuses a value off its range with a message.

    ipywidgets' own sliders clamp such a value to the range without a word; this one raises a
    ``TraitError`` and first calls its ``refused(message)``, which :func:`show_refusals` points at the widget's picture.
    """
    import ipywidgets as w

    global _SLIDERS
    if _SLIDERS is None:
        _SLIDERS = {"int": _strict(w.IntSlider), "float": _strict(w.FloatSlider)}
    kwargs.setdefault("style", control_style())
    return _SLIDERS[kind](**kwargs)


_SLIDERS = None


def step_buttons(label: str = "Step"):
    """(step, reset): the primary button that moves a widget on by one step, and the one that starts it over."""
    import ipywidgets as w

    sized = dict(style={"font_size": "16px"}, layout=w.Layout(width="auto", min_width="6.5em"))
    return (w.Button(description=label, button_style="primary", icon="forward", **sized),
            w.Button(description="Reset", icon="refresh", **sized))


STATIC_NOTE = "A static copy of the widget in its default state: run the notebook to use it live."
LIVE_NOTE = "A live widget: run the notebook to use it."
STATIC_CLASS = "kvlib-static-copy"  # the classroom CSS hides this output under a drawn widget


class LiveWidget:
    """Displays ``widget`` live and, as a separate output right under it, ``static_html`` as its static copy.

    Its own representation (``_repr_mimebundle_``) is the static copy alone: what any renderer can show.
    """

    def __init__(self, widget, static_html: str):
        self.widget, self.static_html = widget, static_html

    def _repr_mimebundle_(self, include=None, exclude=None):
        """The static copy: HTML under :data:`STATIC_NOTE`, and that note as plain text."""
        return {"text/html": f'<div class="{STATIC_CLASS}" style="{FONT};max-width:100%;overflow-wrap:anywhere">'
                             f'<p style="{FONT};color:#666;margin:0 0 6px 0">{html.escape(STATIC_NOTE)}</p>'
                             f"{self.static_html}</div>",
                "text/plain": STATIC_NOTE}

    def _ipython_display_(self):
        """Two outputs: the widget view (with :data:`LIVE_NOTE` as its text), then the static copy."""
        from IPython.display import display as ipython_display

        live = {**self.widget._repr_mimebundle_(), "text/plain": LIVE_NOTE}
        ipython_display(live, self._repr_mimebundle_(), raw=True)
