"""Notebook 1's prompt box: type a text, see the most likely next characters as bars."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..checks import check_int
from ..tokenizer import UnknownCharacterError, check_pair
from ..poems import encode_prompt, top_next
from .show import (LiveWidget, bars_html, check_setting, control_style, display, error_message, format_top, frame,
                   in_row, message_html, require_str, row, show_refusals, slider, too_long_message, unknown_message)


@dataclass
class NextView:
    """What the prompt box shows: the top-k next characters, or a message saying why not."""
    text: str
    chars: list[str] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    message: str = ""

    @property
    def ok(self) -> bool:
        return not self.message

    def summary(self) -> str:
        return format_top(self.text, zip(self.chars, self.probs)) if self.ok else self.message



def next_view(model, tokenizer, text: str, k: int = 8) -> NextView:
    """The ``k`` most likely next characters after ``text`` (a poem's opening); unknown characters give a message."""
    check_pair(model, tokenizer)
    text = require_str("text", text).strip()
    k = check_int("k", k, 1, tokenizer.vocab_size, f"an int in [1, {tokenizer.vocab_size}] (the vocabulary size)")
    try:
        if len(encode_prompt(tokenizer, text)) > (block := model.config.block_size):  # the model reads no more
            return NextView(text, message=too_long_message(block, block - 1))
        pairs = top_next(model, tokenizer, text, k)
    except UnknownCharacterError as err:
        return NextView(text, message=unknown_message(err))
    return NextView(text, [c for c, _ in pairs], [p for _, p in pairs])


class PromptBox:
    """A text box and a k slider above the top-k bars of the next character (HTML, as wide as there is room)."""

    def __init__(self, model, tokenizer, text: str = "春风", k: int = 8):
        import ipywidgets as w

        check_pair(model, tokenizer)
        require_str("text", text)
        check_setting("k", k, 3, 20, integer=True)
        self.model, self.tokenizer = model, tokenizer
        self.prompt = w.Text(value=text, description="prompt", continuous_update=False,
                             placeholder="type Chinese characters, then press Enter",
                             style=control_style(font_size="16px"), layout=in_row(360, 260, 520))
        self.k = slider("int", value=k, min=3, max=20, description="top k", continuous_update=False,
                        layout=in_row(300, 240, 420))
        self.chart = w.HTML()
        show_refusals(self.chart, self.k)
        self.widget = frame(row(self.prompt, self.k), self.chart)
        self.view: NextView | None = None
        self.prompt.observe(self.update, "value")
        self.k.observe(self.update, "value")
        self.update()

    def html(self) -> str:
        """What the chart area shows now: the bars, or the message in their place."""
        v = self.view
        if v is None:
            return self.chart.value
        if not v.ok:
            return message_html(v.message)
        shown = v.text if v.text else "(a poem's start)"
        return bars_html(v.chars, v.probs, title=f"「{shown}」→ ?  the {len(v.chars)} most likely next tokens")

    def update(self, change=None) -> NextView | None:
        try:
            self.view = next_view(self.model, self.tokenizer, self.prompt.value, self.k.value)
            self.chart.value = self.html()
        except Exception as err:  # shown in the widget, where the bars were
            self.fail(error_message(err))
        return self.view

    def fail(self, message: str) -> None:
        """A message in place of the bars, which no longer match the controls."""
        self.view = None
        self.chart.value = message_html(message)

    def show(self) -> None:
        """The live widget (with a static copy for readers without a kernel)."""
        display(LiveWidget(self.widget, self.html()))
