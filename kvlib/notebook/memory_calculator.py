"""Notebook 5's memory views: a calculator widget, and (from :mod:`.plots`) the picture of cache against weights.

The numbers come from :mod:`kvlib.memory`; this module only shows them.
"""
from __future__ import annotations

import html

from ..memory import DTYPE_BYTES, SHAPES, ModelShape, describe
from .plots import plot_cache_memory as memory_figure  # noqa: F401  the name notebook 5 imports
from .show import (FONT, LiveWidget, check_setting, control_style, display, error_message, frame, in_row,
                   message_html, row, show_refusals, slider)


class MemoryCalculator:
    """Model, batch, context and dtype in; cache and weight sizes out (``widget`` to display).

    ``text()`` gives the current answer as plain text, so the calculator works without a browser.
    """

    CONTEXTS = [2**i for i in range(7, 18)]  # 128 ... 131,072

    def __init__(self, model: str = "GPT-2 small", batch: int = 7, tokens: int = 1024, dtype: str = "bfloat16",
                 extra: dict[str, ModelShape] | None = None):
        import ipywidgets as w

        if extra is not None and (not isinstance(extra, dict) or not all(
                isinstance(k, str) and isinstance(v, ModelShape) for k, v in extra.items())):
            raise TypeError(f"extra must be None or a dict of name -> ModelShape, got {extra!r:.60}")
        for name in extra or {}:
            if not name.strip() or name in SHAPES:
                raise ValueError(f"extra's names must be new and not blank (the built-in ones are {list(SHAPES)}), "
                                 f"got {name!r}")
        self.shapes = {**(extra or {}), **SHAPES}
        for name, value in (("model", model), ("dtype", dtype)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {value!r:.60}")
        if model not in self.shapes:
            raise ValueError(f"model must be one of {', '.join(self.shapes)}, got {model!r}")
        check_setting("batch", batch, 1, 256, integer=True)
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise TypeError(f"tokens must be an int, one of the context lengths "
                            f"{', '.join(f'{c:,}' for c in self.CONTEXTS)}, got {tokens!r:.60}")
        if tokens not in self.CONTEXTS:
            raise ValueError(f"tokens must be one of the context lengths {', '.join(f'{c:,}' for c in self.CONTEXTS)}, "
                             f"got {tokens!r}")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
        controls = dict(style=control_style(), layout=in_row(320, 260, 440))
        self.model = w.Dropdown(options=list(self.shapes), value=model, description="model", **controls)
        self.batch = slider("int", value=batch, min=1, max=256, description="batch", continuous_update=True,
                            **controls)
        self.tokens = w.SelectionSlider(options=self.CONTEXTS, value=tokens, description="context", **controls)
        self.dtype = w.Dropdown(options=list(DTYPE_BYTES), value=dtype, description="dtype", **controls)
        self.output = w.HTML(layout=w.Layout(width="100%"))
        show_refusals(self.output, self.batch)
        for control in (self.model, self.batch, self.tokens, self.dtype):
            control.observe(lambda _: self._refresh(), names="value")
        self.widget = frame(row(self.model, self.dtype), row(self.batch, self.tokens), self.output)
        self._refresh()

    def show(self) -> None:
        """The live widget (with its current answer as a static copy, for readers without a kernel)."""
        display(LiveWidget(self.widget, self.output.value))

    def text(self) -> str:
        shape = self.shapes[self.model.value]
        return describe(shape, self.batch.value, self.tokens.value, self.dtype.value)

    def fail(self, message: str) -> None:
        """A message in place of the answer, which no longer matches the controls."""
        self.output.value = message_html(message)

    def _refresh(self) -> None:
        try:
            shape = self.shapes[self.model.value]
            note = ""
            if self.tokens.value > shape.context:
                note = f" (longer than the {shape.context:,} tokens {shape.name} was trained for)"
            self.output.value = (f"<p style='{FONT};margin:4px 0;overflow-wrap:anywhere'>"
                                 f"{html.escape(self.text() + note)}</p>")
        except Exception as err:  # shown in the widget, where the answer was
            self.fail(error_message(err))
