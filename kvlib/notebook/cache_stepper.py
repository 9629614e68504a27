"""Notebook 4's stepper on screen: :func:`view_html` pictures a :class:`~kvlib.stepper.StepView` as
HTML and SVG (drawn by the browser: crisp, a fixed size, fast enough for every Step), and
:class:`StepperWidget` puts Step / Reset buttons, a prompt and a temperature around a stepper."""
from __future__ import annotations

import html

from ..model import GPT
from ..stepper import CacheStepper, StepView, token_label
from ..tokenizer import UnknownCharacterError
from .show import HIGHLIGHT_COLOR, LiveWidget, bars_html, display, html_label, message_html, unknown_message

CELL = 5          # px per cache slot in the cache picture
ROW = 18          # px per layer (cache) and per head (attention)
LABEL_W = 70      # px for the row labels
MIN_W = 760       # px: room for the titles
FONT = 16         # px: legible on a projector (12 pt)
MAX_LABELS = 40   # above this many positions the attention columns are numbered, not labelled


def _shade(value: float, dark: tuple[int, int, int]) -> str:
    """White at 0, ``dark`` at 1."""
    v = min(max(value, 0.0), 1.0)
    r, g, b = (round(255 + (c - 255) * v) for c in dark)
    return f"#{r:02x}{g:02x}{b:02x}"


def _text(x, y, s, size=FONT, anchor="start", color="#222", weight="normal") -> str:
    return (f'<text x="{x}" y="{y}" font-size="{size}" text-anchor="{anchor}" fill="{color}" '
            f'font-weight="{weight}">{html.escape(s)}</text>')


def cache_svg(view: StepView) -> str:
    """The cache: one row per layer, one column per slot, blue where a key is stored (darker = larger)."""
    norms = view.key_norms
    L, M = norms.shape
    top = float(norms.max()) or 1.0
    w, h = max(MIN_W, LABEL_W + M * CELL + 10), 30 + L * ROW + 24
    parts = [_text(0, 17, f"keys in the cache: {view.cache_length} of {view.max_len} slots written in every "
                          f"layer (orange: newest)", weight="600")]
    for layer in range(L):
        y = 26 + layer * ROW
        parts.append(_text(0, y + ROW - 4, f"layer {layer}", 14))
        for slot in range(M):
            value = float(norms[layer, slot])
            fill = _shade(0.25 + 0.75 * value / top, (8, 48, 107)) if value > 0 else "#f4f4f4"
            parts.append(f'<rect x="{LABEL_W + slot * CELL}" y="{y}" width="{CELL - 1}" height="{ROW - 2}" fill="{fill}"/>')
    x_new = LABEL_W + view.query_position * CELL
    parts.append(f'<rect x="{x_new - 1}" y="25" width="{CELL + 1}" height="{L * ROW}" fill="none" '
                 f'stroke="{HIGHLIGHT_COLOR}" stroke-width="2"/>')
    x_prompt = LABEL_W + view.prompt_length * CELL - 1
    parts.append(f'<line x1="{x_prompt}" y1="22" x2="{x_prompt}" y2="{28 + L * ROW}" stroke="#777" '
                 f'stroke-dasharray="3,2"/>')
    parts.append(_text(LABEL_W, 26 + L * ROW + 18, "slot 0"))
    parts.append(_text(LABEL_W + M * CELL, 26 + L * ROW + 18, f"slot {M - 1}", anchor="end"))
    return f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'


def attention_svg(view: StepView) -> str:
    """The newest token's attention over the cached positions, one row per (layer, head); darker = more."""
    L, H, S = view.attention.shape
    cell = max(CELL, min(24, 660 // max(S, 1)))
    labelled = S <= MAX_LABELS and cell >= 16
    w, h = max(MIN_W, LABEL_W + S * cell + 10), 30 + L * H * ROW + 26
    query = html_label(view.labels[view.query_position])
    parts = [_text(0, 17, f"attention of 「{html.unescape(query)}」 (position {view.query_position}) over the "
                          f"{S} cached positions, one row per head", weight="600")]
    weights = view.attention.reshape(L * H, S)
    for row in range(L * H):
        y = 24 + row * ROW
        parts.append(_text(0, y + ROW - 4, f"L{row // H} h{row % H}", 14))
        for j in range(S):
            fill = _shade(float(weights[row, j]), (60, 15, 90))
            parts.append(f'<rect x="{LABEL_W + j * cell}" y="{y}" width="{cell - 1}" height="{ROW - 1}" fill="{fill}"/>')
        if row % H == H - 1 and row < L * H - 1:
            parts.append(f'<line x1="{LABEL_W}" y1="{y + ROW}" x2="{LABEL_W + S * cell}" y2="{y + ROW}" '
                         f'stroke="#fff" stroke-width="2"/>')
    base = 24 + L * H * ROW + 19
    if labelled:
        for j in range(S):
            parts.append(_text(LABEL_W + j * cell + cell / 2, base, html.unescape(html_label(view.labels[j])),
                               anchor="middle"))
    else:
        for j in range(0, S, 16):
            parts.append(_text(LABEL_W + j * cell, base, str(j), 14))
    return f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'


def view_html(view: StepView) -> str:
    """The three panels: the distribution the token came from, the cache's slots, the attention per head."""
    highlight = [] if view.chosen_label is None else [view.chosen_label]
    title = ("next-token distribution (press Step to draw)" if view.chosen is None
             else f"step {view.step}: drew 「{html_label(view.chosen_label)}」")
    bars = bars_html(view.top_labels, view.top_probs, highlight=highlight, title=title, width=300)
    return (f'<div style="display:flex;gap:24px;align-items:flex-start">{bars}'
            f'<div>{cache_svg(view)}<br>{attention_svg(view)}</div></div>')


# ---- the widget -------------------------------------------------------------------------------

class StepperWidget:
    """Step / Reset buttons, a prompt box and a temperature slider around a :class:`CacheStepper`.

    ``widget`` is the ipywidgets box to display; ``stepper`` is the current stepper (replaced when
    the prompt or the temperature changes). Calling ``step_button.click()`` works without a browser.
    """

    def __init__(self, model: GPT, tokenizer, prompt: str = "床前看月光，", *, temperature: float = 0.8,
                 seed: int = 1337):
        import ipywidgets as w

        self.model, self.tokenizer, self.seed = model, tokenizer, seed
        self.prompt_box = w.Text(value=prompt, description="prompt", continuous_update=False)
        self.temperature = w.FloatSlider(value=temperature, min=0.0, max=1.5, step=0.05, description="temperature",
                                         continuous_update=False, style={"description_width": "90px"},
                                         layout=w.Layout(width="380px"))
        self.step_button = w.Button(description="Step", button_style="primary", icon="forward")
        self.reset_button = w.Button(description="Reset", icon="refresh")
        self.status = w.HTML()
        self.picture = w.HTML()
        self.step_button.on_click(lambda _: self._step())
        self.reset_button.on_click(lambda _: self._restart())
        self.prompt_box.observe(lambda _: self._restart(), names="value")
        self.temperature.observe(lambda _: self._restart(), names="value")
        self.widget = w.VBox([w.HBox([self.prompt_box, self.temperature, self.step_button, self.reset_button]),
                              self.status, self.picture])
        self.stepper: CacheStepper | None = None
        self._restart()

    def show(self) -> None:
        """The live widget (with a static copy of what it shows now, for readers without a kernel)."""
        display(LiveWidget(self.widget, self.status.value + self.picture.value))

    def summary(self) -> str:
        """The current state in one line of text."""
        s = self.stepper
        if s is None:
            return "no stepper: fix the prompt"
        last = "" if s.chosen is None else f", last drew 「{token_label(self.tokenizer, s.chosen)}」"
        return (f"step {s.steps}{last}; cache length {s.cache.length} of {s.cache.max_len}; "
                f"text so far: {s.text()!r}")

    def _restart(self) -> None:
        try:
            stepper = CacheStepper(self.model, self.tokenizer, self.prompt_box.value,
                                   temperature=self.temperature.value, seed=self.seed)
        except UnknownCharacterError as e:
            self._refuse(unknown_message(e))
            return
        except ValueError as e:  # a prompt longer than the cache
            self._refuse(f"{e}. Use a shorter prompt.")
            return
        self.stepper = stepper
        self._refresh()

    def _refuse(self, message: str) -> None:
        """An invalid prompt: no stepper, no stale picture, one message."""
        self.stepper = None
        self.step_button.disabled = True
        self.status.value = message_html(message)
        self.picture.value = ""

    def _step(self) -> None:
        if self.stepper is None:  # the prompt is invalid: its message stays on show
            return
        if self.stepper.can_step:
            self.stepper.step()
        self._refresh()

    def _refresh(self) -> None:
        s = self.stepper
        self.step_button.disabled = not s.can_step
        prompt = html.escape(self.tokenizer.decode(s.prompt_ids[1:]))
        new = [html.escape(self.tokenizer.decode([t])) for t in s.tokens[len(s.prompt_ids):]]
        if new:
            new[-1] = f"<b style='color:{HIGHLIGHT_COLOR}'>{new[-1]}</b>"
        full = "" if s.can_step else " — the cache is full: change the prompt or press Reset to start again"
        self.status.value = (f"<span style='font-size:20px'><span style='color:#777'>{prompt}</span>"
                             f"{''.join(new)}</span><br>step {s.steps}, cache length {s.cache.length} "
                             f"of {s.cache.max_len}, temperature {s.temperature:.2f}, seed {s.seed}{full}"
                             ).replace("\n", "⏎")
        self.picture.value = view_html(s.view())
