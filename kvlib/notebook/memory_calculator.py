"""Notebook 5's memory views: a picture of cache against weights, and a calculator widget.

The numbers come from :mod:`kvlib.memory`; this module only shows them.
"""
from __future__ import annotations

from ..memory import DTYPE_BYTES, MB, SHAPES, ModelShape, describe
from . import plots
from .show import LiveWidget, check_setting, display


def memory_figure(shapes=None, dtype: str = "bfloat16", max_batch: int = 32, highlight: str = "GPT-2 small"):
    """Left: cache against batch for one model at its context, with its weights as a line.
    Right: KV-cache bytes per token for every model (MHA against GQA)."""
    import numpy as np
    from matplotlib.figure import Figure

    shapes = list(shapes or SHAPES.values())
    names = [s.name for s in shapes]
    if highlight not in names:
        raise ValueError(f"highlight must be one of the models shown ({', '.join(names)}), got {highlight!r}")
    check_setting("max_batch", max_batch, 1, 100_000, integer=True)
    main = shapes[names.index(highlight)]
    fig = Figure(figsize=(plots.MAX_WIDTH, 5.2), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.15])
    batches = np.arange(1, max_batch + 1)
    cache_mb = [main.kv_cache_bytes(None, int(b), dtype) / MB for b in batches]
    cross = main.crossover_batch(None, dtype)
    ax.plot(batches, cache_mb, "-", color=plots.HIGHLIGHT_COLOR, lw=2.5, label="KV cache")
    ax.axhline(main.weight_bytes(dtype) / MB, color="tab:blue", lw=2, ls="--",
               label=f"weights ({main.weight_bytes(dtype) / MB:.0f} MB)")
    ax.plot([cross], [main.kv_cache_bytes(None, cross, dtype) / MB], "o", color="black", ms=8)
    ax.annotate(f"batch {cross}: the cache passes the weights", (cross, main.kv_cache_bytes(None, cross, dtype) / MB),
                xytext=(12, -24), textcoords="offset points", fontsize=plots.FONT_SIZE - 2)
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("MB")
    ax.set_title(f"{main.name}, {dtype}, {main.context:,} tokens each")
    ax.set_xlim(0, max_batch)
    ax.set_ylim(0, max(cache_mb) * 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")

    per_token = [s.kv_bytes_per_token(dtype) / 1024 for s in shapes]
    colors = ["#8fb3d9" if s.n_kv_head == s.n_head else plots.HIGHLIGHT_COLOR for s in shapes]
    y = np.arange(len(shapes))
    bars = ax2.barh(y, per_token, color=colors)
    ax2.bar_label(bars, labels=[f"{v:,.0f} KiB  ({s.attention})" for v, s in zip(per_token, shapes)],
                  padding=3, fontsize=plots.FONT_SIZE - 2)
    ax2.set_yticks(y, [s.name for s in shapes])
    ax2.invert_yaxis()
    ax2.set_xlim(0, max(per_token) * 1.45)
    ax2.set_xlabel(f"KV cache per token, {dtype} (KiB)")
    ax2.set_title("blue: every head has its own k, v; orange: grouped-query")
    ax2.spines[["top", "right"]].set_visible(False)
    return fig


class MemoryCalculator:
    """Model, batch, context and dtype in; cache and weight sizes out (``widget`` to display).

    ``text()`` gives the current answer as plain text, so the calculator works without a browser.
    """

    CONTEXTS = [2**i for i in range(7, 18)]  # 128 ... 131,072

    def __init__(self, model: str = "GPT-2 small", batch: int = 7, tokens: int = 1024, dtype: str = "bfloat16",
                 extra: dict[str, ModelShape] | None = None):
        import ipywidgets as w

        self.shapes = {**(extra or {}), **SHAPES}
        if model not in self.shapes:
            raise ValueError(f"model must be one of {', '.join(self.shapes)}, got {model!r}")
        check_setting("batch", batch, 1, 256, integer=True)
        if tokens not in self.CONTEXTS:
            raise ValueError(f"tokens must be one of the context lengths {', '.join(f'{c:,}' for c in self.CONTEXTS)}, "
                             f"got {tokens!r}")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
        self.model = w.Dropdown(options=list(self.shapes), value=model, description="model")
        self.batch = w.IntSlider(value=batch, min=1, max=256, description="batch", continuous_update=True)
        self.tokens = w.SelectionSlider(options=self.CONTEXTS, value=tokens, description="context")
        self.dtype = w.Dropdown(options=list(DTYPE_BYTES), value=dtype, description="dtype")
        self.output = w.HTML()
        for control in (self.model, self.batch, self.tokens, self.dtype):
            control.observe(lambda _: self._refresh(), names="value")
        self.widget = w.VBox([w.HBox([self.model, self.dtype]), w.HBox([self.batch, self.tokens]), self.output])
        self._refresh()

    def show(self) -> None:
        """The live widget (with its current answer as a static copy, for readers without a kernel)."""
        display(LiveWidget(self.widget, self.output.value))

    def text(self) -> str:
        shape = self.shapes[self.model.value]
        return describe(shape, self.batch.value, self.tokens.value, self.dtype.value)

    def _refresh(self) -> None:
        shape = self.shapes[self.model.value]
        note = ""
        if self.tokens.value > shape.context:
            note = f" (longer than the {shape.context:,} tokens {shape.name} was trained for)"
        self.output.value = f"<p style='font-size:16px'>{self.text()}{note}</p>"

