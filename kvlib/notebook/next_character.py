"""Notebook 1's prompt box: type a text, see the most likely next characters as bars."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..text import top_next
from ..tokenizer import UnknownCharacterError
from .show import LiveWidget, bars_html, check_setting, display, format_top, message_html, require_str, unknown_message


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
    text = require_str("text", text).strip()
    try:
        pairs = top_next(model, tokenizer, text, k)
    except UnknownCharacterError as err:
        return NextView(text, message=unknown_message(err))
    return NextView(text, [c for c, _ in pairs], [p for _, p in pairs])


class PromptBox:
    """A text box and a k slider beside the top-k bars of the next character (HTML, a fixed size)."""

    def __init__(self, model, tokenizer, text: str = "春风", k: int = 8):
        import ipywidgets as w

        check_setting("k", k, 3, 20, integer=True)
        self.model, self.tokenizer = model, tokenizer
        self.prompt = w.Text(value=text, description="prompt", continuous_update=False,
                             placeholder="type Chinese characters, then press Enter",
                             layout=w.Layout(width="420px"))
        self.k = w.IntSlider(value=k, min=3, max=20, description="top k", continuous_update=False)
        self.chart = w.HTML()
        self.widget = w.VBox([w.HBox([self.prompt, self.k]), self.chart])
        self.view: NextView | None = None
        self.prompt.observe(self.update, "value")
        self.k.observe(self.update, "value")
        self.update()

    def html(self) -> str:
        """What the chart area shows now: the bars, or the message in their place."""
        v = self.view
        if not v.ok:
            return message_html(v.message)
        shown = v.text if v.text else "(a poem's start)"
        return bars_html(v.chars, v.probs, title=f"「{shown}」→ ?  the {len(v.chars)} most likely next tokens")

    def update(self, change=None) -> NextView:
        self.view = next_view(self.model, self.tokenizer, self.prompt.value, self.k.value)
        self.chart.value = self.html()
        return self.view

    def show(self) -> None:
        """The live widget (with a static copy for readers without a kernel)."""
        display(LiveWidget(self.widget, self.html()))
