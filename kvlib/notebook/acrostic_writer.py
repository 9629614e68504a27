"""Notebook 3's acrostic writer: type the heads, pick the line length, temperature and seed; read the poem."""
from __future__ import annotations

import html
from dataclasses import dataclass

import torch

from ..checks import check_choice
from ..tokenizer import UnknownCharacterError, check_pair
from ..constraints import acrostic, poem_lines
from . import plots
from .english import english_html
from .show import (FONT, LiveWidget, check_setting, control_style, display, error_message, frame, in_column,
                   message_html, require_str, show_refusals, slider, unknown_message)


@dataclass
class AcrosticView:
    heads: str
    chars_per_line: int
    poem: str = ""
    message: str = ""

    @property
    def ok(self) -> bool:
        return not self.message

    def summary(self) -> str:
        if not self.ok:
            return self.message
        return "\n".join(line + mark for line, mark in poem_lines(self.poem))

    def html(self) -> str:
        if not self.ok:
            return message_html(self.message)
        rows = [f'<span style="color:{plots.HIGHLIGHT_COLOR};font-weight:bold">{html.escape(line[:1])}</span>'
                f"{html.escape(line[1:] + mark)}" for line, mark in poem_lines(self.poem)]
        return ('<div style="font-size:22px;line-height:1.6;overflow-wrap:anywhere">' + "<br>".join(rows) + "</div>"
                + english_html(self.poem))


def acrostic_view(model, tokenizer, heads: str, chars_per_line: int = 7, temperature: float = 0.8,
                  seed: int = 1337) -> AcrosticView:
    """An acrostic on ``heads`` (spaces ignored), or a message saying why none can be written."""
    check_pair(model, tokenizer)
    heads = "".join(require_str("heads", heads).split())
    check_choice("chars_per_line", chars_per_line, (5, 7))
    check_setting("temperature", temperature, 0.0, 100.0)
    check_setting("seed", seed, 0, 2**63 - 1, integer=True)
    view = AcrosticView(heads, int(chars_per_line))
    if not heads:
        view.message = "Type one Chinese character for the start of each line, e.g. 春眠不觉."
        return view
    try:
        view.poem = acrostic(model, tokenizer, heads, chars_per_line, temperature=temperature,
                             generator=torch.Generator().manual_seed(int(seed)))
    except UnknownCharacterError as err:
        view.message = unknown_message(err)
    except ValueError as err:  # e.g. a punctuation mark typed as a head
        view.message = str(err)
    return view


class AcrosticWriter:
    """Type the heads, choose 5 or 7 characters a line, a temperature and a seed; read the poem.

    A failed update or a value off a slider's range leaves a message where the poem was.
    """

    def __init__(self, model, tokenizer, heads: str = "春眠不觉", chars_per_line: int = 7,
                 temperature: float = 0.8, seed: int = 1337):
        import ipywidgets as w

        check_pair(model, tokenizer)
        if tokenizer.kind != "char":
            raise ValueError(f"tokenizer must be the character model's (tang-char): an acrostic places one token per "
                             f"character, got a {tokenizer.kind!r} tokenizer")
        require_str("heads", heads)
        check_choice("chars_per_line", chars_per_line, (5, 7))
        check_setting("temperature", temperature, 0.05, 1.5)
        check_setting("seed", seed, 0, 2000, integer=True)
        self.model, self.tokenizer = model, tokenizer
        self.heads = w.Text(value=heads, description="heads", continuous_update=False,
                            placeholder="one character per line", style=control_style(font_size="16px"),
                            layout=in_column(460))
        self.chars_per_line = w.ToggleButtons(options=[5, 7], value=chars_per_line, description="per line",
                                              style=control_style(button_width="4em"),
                                              layout=w.Layout(width="auto", max_width="100%"))
        self.temperature = slider("float", value=temperature, min=0.05, max=1.5, step=0.05,
                                  description="temperature", continuous_update=False, layout=in_column(460))
        self.seed = slider("int", value=seed, min=0, max=2000, description="seed", continuous_update=False,
                           layout=in_column(460))
        self.info = w.HTML(layout=w.Layout(width="100%"))
        self.poem = w.HTML(layout=w.Layout(width="100%"))
        self.widget = frame(self.heads, self.chars_per_line, self.temperature, self.seed, self.info, self.poem)
        self.view: AcrosticView | None = None
        show_refusals(self.poem, self.temperature, self.seed)
        for control in (self.heads, self.chars_per_line, self.temperature, self.seed):
            control.observe(self.update, "value")
        self.update()

    def update(self, change=None) -> AcrosticView | None:
        before = self.view
        try:
            self.view = acrostic_view(self.model, self.tokenizer, self.heads.value, self.chars_per_line.value,
                                      self.temperature.value, self.seed.value)
            self.poem.value = self.view.html()
            self.info.value = self._info(before)
        except Exception as err:  # shown in the widget, where the poem was
            self.fail(error_message(err))
        return self.view

    def fail(self, message: str) -> None:
        """A message where the poem was; the poem and its settings line, which no longer match, go."""
        self.view = None
        self.info.value, self.poem.value = "", message_html(message)

    def _info(self, before: AcrosticView | None) -> str:
        """The settings the poem was written with, and whether the last change changed the poem."""
        line = (f"{self.chars_per_line.value} characters a line, temperature {self.temperature.value:.2f}, "
                f"seed {self.seed.value}")
        if before is not None and self.view.ok and before.ok and before.poem == self.view.poem:
            line += " — the same poem as before: with this seed the draws still pick the same characters"
        return f'<p style="{FONT};color:#555;margin:4px 0">{html.escape(line)}</p>'

    def show(self) -> None:
        """The live widget (with a static copy of its poem for readers without a kernel)."""
        static = self.poem.value if self.view is None else self._info(None) + self.view.html()
        display(LiveWidget(self.widget, static))
