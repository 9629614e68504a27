"""Notebook 4's stepper on screen: :func:`view_html` pictures a :class:`~kvlib.stepper.StepView` as
HTML and SVG (drawn by the browser: crisp, scaled to the room there is, fast enough for every Step),
and :class:`StepperWidget` puts Step / Reset buttons, a prompt and a temperature around a stepper."""
from __future__ import annotations

import html
import os

from ..checks import check_seed
from ..tokenizer import UnknownCharacterError, check_pair, decode_complete
from ..cache import ContextLimitError, check_multi_head
from ..model import GPT
from ..stepper import ONE_KEY_PER_HEAD, CacheStepper, StepView, token_label
from .show import (FONT, HIGHLIGHT_COLOR, LiveWidget, bars_html, check_setting, control_style, display,
                   error_message, frame, html_label, in_row, message_html, row, show_refusals, slider, step_buttons,
                   too_long_message, unknown_message)

ROW = 20          # px per layer (cache) and per head (attention)
LABEL_W = 64      # px for the row labels ("layer 0", "L0 h0")
DRAW_W = 560      # px at most for the cells of a row: with the labels, a picture is at most 632 px wide
PICTURE_W = LABEL_W + DRAW_W + 8   # 632 px: the pictures' natural width, their column's flex basis
FONT_PX = 16      # the pictures' text: legible on a projector (12 pt), never smaller
MAX_LABELS = 40   # above this many positions the attention columns are numbered, not labelled
TEMPERATURE_RANGE = (0.0, 1.5)


def _shade(value: float, dark: tuple[int, int, int]) -> str:
    """White at 0, ``dark`` at 1."""
    v = min(max(value, 0.0), 1.0)
    r, g, b = (round(255 + (c - 255) * v) for c in dark)
    return f"#{r:02x}{g:02x}{b:02x}"


def _text(x, y, s, size=FONT_PX, anchor="start", color="#222", weight="normal") -> str:
    return (f'<text x="{x}" y="{y}" font-size="{size}" text-anchor="{anchor}" fill="{color}" '
            f'font-weight="{weight}">{html.escape(s)}</text>')


def _svg(width: float, height: float, parts: list[str]) -> str:
    """An SVG that is ``width`` px wide where there is room and shrinks with its column where there is not."""
    return (f'<svg viewBox="0 0 {width:g} {height:g}" width="100%" preserveAspectRatio="xMinYMin meet" '
            f'style="display:block;max-width:{width:g}px;height:auto;font-family:sans-serif" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>')


def _caption(text: str) -> str:
    return f'<div style="{FONT};font-weight:600;margin:8px 0 4px 0">{html.escape(text)}</div>'


def cache_svg(view: StepView) -> str:
    """The cache: one row per layer, one column per slot, blue where a key is stored (darker = larger)."""
    norms = view.key_norms
    L, M = norms.shape
    cell = max(2, min(5, DRAW_W // max(M, 1)))
    top = float(norms.max()) or 1.0
    w, h = LABEL_W + M * cell + 8, 6 + L * ROW + 24
    parts = []
    for layer in range(L):
        y = 4 + layer * ROW
        parts.append(_text(0, y + ROW - 5, f"layer {layer}"))
        for slot in range(M):
            value = float(norms[layer, slot])
            fill = _shade(0.25 + 0.75 * value / top, (8, 48, 107)) if value > 0 else "#f4f4f4"
            parts.append(f'<rect x="{LABEL_W + slot * cell}" y="{y}" width="{max(cell - 1, 1)}" height="{ROW - 2}" '
                         f'fill="{fill}"/>')
    x_new = LABEL_W + view.query_position * cell
    parts.append(f'<rect x="{x_new - 1}" y="3" width="{cell + 1}" height="{L * ROW}" fill="none" '
                 f'stroke="{HIGHLIGHT_COLOR}" stroke-width="2"/>')
    x_prompt = LABEL_W + view.prompt_length * cell - 1
    parts.append(f'<line x1="{x_prompt}" y1="0" x2="{x_prompt}" y2="{6 + L * ROW}" stroke="#777" '
                 f'stroke-dasharray="3,2"/>')
    parts.append(_text(LABEL_W, 4 + L * ROW + 19, "slot 0"))
    parts.append(_text(LABEL_W + M * cell, 4 + L * ROW + 19, f"slot {M - 1}", anchor="end"))
    return _svg(w, h, parts)


def attention_svg(view: StepView) -> str:
    """The newest token's attention over the cached positions, one row per (layer, head); darker = more."""
    L, H, S = view.attention.shape
    cell = max(3, min(24, DRAW_W // max(S, 1)))
    labelled = S <= MAX_LABELS and cell >= 16
    w, h = LABEL_W + S * cell + 8, 4 + L * H * ROW + 26
    parts = []
    weights = view.attention.reshape(L * H, S)
    for r in range(L * H):
        y = 2 + r * ROW
        parts.append(_text(0, y + ROW - 5, f"L{r // H} h{r % H}"))
        for j in range(S):
            fill = _shade(float(weights[r, j]), (60, 15, 90))
            parts.append(f'<rect x="{LABEL_W + j * cell}" y="{y}" width="{cell - 1}" height="{ROW - 1}" fill="{fill}"/>')
        if r % H == H - 1 and r < L * H - 1:
            parts.append(f'<line x1="{LABEL_W}" y1="{y + ROW}" x2="{LABEL_W + S * cell}" y2="{y + ROW}" '
                         f'stroke="#fff" stroke-width="2"/>')
    base = 2 + L * H * ROW + 20
    if labelled:
        for j in range(S):
            parts.append(_text(LABEL_W + j * cell + cell / 2, base, html.unescape(html_label(view.labels[j])),
                               anchor="middle"))
    else:
        for j in range(0, S, 16):
            parts.append(_text(LABEL_W + j * cell, base, str(j)))
    return _svg(w, h, parts)


def settings_text(settings) -> str:
    """``(temperature, top_k, top_p)`` in words: "temperature 0.80", then the filters that are on."""
    temperature, top_k, top_p = settings
    words = f"temperature {temperature:.2f}"
    if top_k is not None:
        words += f", top-k {top_k}"
    if top_p is not None:
        words += f", top-p {top_p:.2f}"
    return words


def view_html(view: StepView) -> str:
    """The three panels: the distribution the token came from, the cache's slots, the attention per head.

    Side by side where they fit, the bars above the pictures where they do not. The pictures' column
    asks for their full width (``PICTURE_W``) before it shares a line with the bars, so that their
    16 px text is drawn at 16 px; only a column narrower than that shrinks them.
    """
    highlight = [] if view.chosen_label is None else [view.chosen_label]
    drawn_with = settings_text(view.settings)
    title = (f"next-token distribution at {drawn_with} (press Step to draw)" if view.chosen is None
             else f"step {view.step}: drew 「{html_label(view.chosen_label)}」 at {drawn_with}")
    bars = bars_html(view.top_labels, view.top_probs, highlight=highlight, title=title, width=380)
    query = html.unescape(html_label(view.labels[view.query_position]))
    L, H, S = view.attention.shape
    pictures = (_caption(f"keys in the cache: {view.cache_length} of {view.max_len} slots written in every "
                         f"layer (orange: newest)") + cache_svg(view)
                + _caption(f"attention of 「{query}」 (position {view.query_position}) over the {S} cached "
                           f"positions, one row per head") + attention_svg(view))
    return (f'<div style="display:flex;flex-wrap:wrap;gap:8px 24px;align-items:flex-start;{FONT}">'
            f'<div style="flex:1 1 260px;min-width:0;max-width:380px">{bars}</div>'
            f'<div style="flex:1 1 {PICTURE_W}px;min-width:0;max-width:{PICTURE_W}px">{pictures}</div></div>')


# ---- the widget -------------------------------------------------------------------------------

class StepperWidget:
    """Step / Reset buttons, a prompt box and a temperature slider around a :class:`CacheStepper`.

    ``widget`` is the ipywidgets box to display; ``stepper`` is the current stepper. A new prompt
    starts a new stepper; a new temperature keeps the steps taken and applies from the next step
    (Reset starts again with it). A failed update leaves a message, no picture, and a disabled Step.
    Calling ``step_button.click()`` works without a browser.
    """

    def __init__(self, model: GPT, tokenizer, prompt: str = "床前看月光，", *, temperature: float = 0.8,
                 seed: int = 1337):
        import ipywidgets as w

        check_pair(model, tokenizer)
        check_multi_head(model.config, "StepperWidget", ONE_KEY_PER_HEAD)
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str of Chinese characters, got {prompt!r:.60}")
        check_setting("temperature", temperature, *TEMPERATURE_RANGE)
        self.model, self.tokenizer, self.seed = model, tokenizer, check_seed(seed)
        self.prompt_box = w.Text(value=prompt, description="prompt", continuous_update=False,
                                 style=control_style(font_size="16px"), layout=in_row(300, 240, 420))
        self.temperature = slider("float", value=temperature, min=TEMPERATURE_RANGE[0], max=TEMPERATURE_RANGE[1],
                                  step=0.05, description="temperature", continuous_update=False,
                                  layout=in_row(320, 260, 420))
        self.step_button, self.reset_button = step_buttons()
        self.status = w.HTML(layout=w.Layout(width="100%"))
        self.picture = w.HTML(layout=w.Layout(width="100%"))
        show_refusals(self.status, self.temperature)
        self.step_button.on_click(lambda _: self._step())
        self.reset_button.on_click(lambda _: self._restart())
        self.prompt_box.observe(lambda _: self._restart(), names="value")
        self.temperature.observe(lambda _: self._set_temperature(), names="value")
        buttons = row(self.step_button, self.reset_button, width="auto")  # one unit when the row wraps
        self.widget = frame(row(self.prompt_box, self.temperature, buttons), self.status, self.picture)
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
        except ContextLimitError:  # a prompt longer than the cache
            block = self.model.config.block_size
            self._refuse(too_long_message(block, block - 1))
            return
        except Exception as e:
            self._refuse(error_message(e))
            return
        self.stepper = stepper
        self._refresh()

    def _set_temperature(self) -> None:
        """The new temperature from the next step on; the steps so far stay."""
        if self.stepper is None:  # no stepper yet (a bad prompt): the new setting waits for a good one
            self._restart()
            return
        try:
            self.stepper.set_sampling(temperature=self.temperature.value)
        except Exception as e:
            self._refuse(error_message(e))
            return
        self._refresh()

    def _refuse(self, message: str) -> None:
        """An invalid prompt or a failed update: no stepper, no stale picture, one message."""
        self.stepper = None
        self.step_button.disabled = True
        self.status.value = message_html(message)
        self.picture.value = ""

    def _step(self) -> None:
        if self.stepper is None:  # the prompt is invalid: its message stays on show
            return
        try:
            if self.stepper.can_step:
                self.stepper.step()
        except Exception as e:
            self._refuse(error_message(e))
            return
        self._refresh()

    def _refresh(self) -> None:
        s = self.stepper
        try:
            self.step_button.disabled = not s.can_step
            prompt = html.escape(self.tokenizer.decode(s.prompt_ids[1:]))
            new_ids = s.tokens[len(s.prompt_ids):]
            # Decoded together (a byte-level token alone may be part of a character); the last step's part in bold.
            whole, before = decode_complete(self.tokenizer, new_ids), decode_complete(self.tokenizer, new_ids[:-1])
            same = len(os.path.commonprefix([whole, before]))
            new = [html.escape(whole[:same])] + ([f"<b style='color:{HIGHLIGHT_COLOR}'>{html.escape(whole[same:])}</b>"]
                                                 if new_ids else [])
            full = "" if s.can_step else " — the cache is full: change the prompt or press Reset to start again"
            self.status.value = (f"<div style='{FONT};overflow-wrap:anywhere'><span style='font-size:20px'>"
                                 f"<span style='color:#777'>{prompt}</span>{''.join(new)}</span><br>step {s.steps}, "
                                 f"cache length {s.cache.length} of {s.cache.max_len}, next step at "
                                 f"{settings_text(s.settings)}, seed {s.seed}{full}</div>").replace("\n", "⏎")
            self.picture.value = view_html(s.view())
        except Exception as e:
            self._refuse(error_message(e))
