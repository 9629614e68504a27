"""Notebook 4's stepper on screen: :func:`draw` pictures a :class:`~kvlib.stepper.StepView`, and
:class:`StepperWidget` puts Step / Reset buttons, a prompt and a temperature around a stepper."""
from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from ..model import GPT
from ..stepper import CacheStepper, StepView, token_label
from . import plots
from .fonts import char_label


# ---- the picture --------------------------------------------------------------------------------

def draw(view: StepView, max_labels: int = 40) -> Figure:
    """Three panels: the top-10 distribution, the cache's filled slots, and the attention per head."""
    fig = Figure(figsize=(14, 7.6))  # fixed axes: much faster to draw than a layout engine
    ax_bars = fig.add_axes((0.045, 0.08, 0.2, 0.83))
    ax_cache = fig.add_axes((0.34, 0.75, 0.58, 0.17))
    ax_attn = fig.add_axes((0.34, 0.1, 0.58, 0.5))
    ax_color = fig.add_axes((0.94, 0.1, 0.012, 0.5))

    # 1. The distribution the chosen token came from (or, before any step, the next one).
    highlight = [] if view.chosen_label is None else [view.chosen_label]
    plots.bar_top_k([char_label(c) for c in view.top_labels], view.top_probs, ax=ax_bars,
                    highlight=[char_label(c) for c in highlight])
    if view.chosen is None:
        ax_bars.set_title("next-token distribution\n(press Step to draw)")
    else:
        ax_bars.set_title(f"step {view.step}: drew 「{char_label(view.chosen_label)}」")

    # 2. The cache: one row per layer, one column per slot, coloured where a key is stored.
    norms = np.ma.masked_equal(view.key_norms.float().numpy(), 0.0)
    cmap = _cmap("Blues")
    L = norms.shape[0]
    ax_cache.imshow(norms, aspect="auto", cmap=cmap, interpolation="nearest",
                    extent=(-0.5, view.max_len - 0.5, L - 0.5, -0.5))
    ax_cache.axvline(view.prompt_length - 0.5, color="grey", lw=1, ls="--")  # prompt | generated
    ax_cache.add_patch(_outline(view.query_position, L))
    ax_cache.set_yticks(range(L), [f"layer {i}" for i in range(L)])
    ax_cache.set_xlabel("cache slot (position)")
    ax_cache.set_title(f"keys in the cache: {view.cache_length} of {view.max_len} slots written in every "
                       f"layer (orange: newest)")

    # 3. The newest token's attention over the cached positions, one row per (layer, head).
    L, H, S = view.attention.shape
    weights = view.attention.reshape(L * H, S).float().numpy()
    im = ax_attn.imshow(weights, aspect="auto", cmap="magma_r", vmin=0, vmax=1, interpolation="nearest")
    for layer in range(1, L):
        ax_attn.axhline(layer * H - 0.5, color="white", lw=2)
    ax_attn.set_yticks(range(L * H), [f"L{layer} h{head}" for layer in range(L) for head in range(H)],
                       fontsize=plots.FONT_SIZE - 3)
    if S <= max_labels:
        ax_attn.set_xticks(range(S), [char_label(c) for c in view.labels[:S]])
        ax_attn.set_xlabel("cached position (its token)")
    else:
        ticks = list(range(0, S, max(1, math.ceil(S / 16))))
        ax_attn.set_xticks(ticks, [str(t) for t in ticks])
        ax_attn.set_xlabel("cached position")
    query = char_label(view.labels[view.query_position])
    ax_attn.set_title(f"attention of 「{query}」 (position {view.query_position}) over the {S} cached "
                      f"positions, one row per head")
    fig.colorbar(im, cax=ax_color, label="weight")
    return fig


def _cmap(name: str):
    from matplotlib import colormaps

    return colormaps[name].with_extremes(bad="white")  # empty slots are white


def _outline(position: int, n_layers: int):
    from matplotlib.patches import Rectangle

    return Rectangle((position - 0.5, -0.5), 1, n_layers, fill=False, ec=plots.HIGHLIGHT_COLOR, lw=2.5)


# ---- the widget -------------------------------------------------------------------------------

class StepperWidget:
    """Step / Reset buttons, a prompt box and a temperature slider around a :class:`CacheStepper`.

    ``widget`` is the ipywidgets box to display; ``stepper`` is the current stepper (replaced when
    the prompt or the temperature changes). Calling ``step_button.click()`` works without a browser.
    """

    def __init__(self, model: GPT, tokenizer, prompt: str = "床前看月光，", *, temperature: float = 0.8,
                 seed: int = 1337, dpi: int = 80):
        import ipywidgets as w

        self.model, self.tokenizer, self.seed, self.dpi = model, tokenizer, seed, dpi
        self.prompt_box = w.Text(value=prompt, description="prompt")
        self.temperature = w.FloatSlider(value=temperature, min=0.0, max=1.5, step=0.05,
                                         description="temperature", continuous_update=False)
        self.step_button = w.Button(description="Step", button_style="primary", icon="forward")
        self.reset_button = w.Button(description="Reset", icon="refresh")
        self.status = w.HTML()
        self.image = w.Image(format="png")
        self.step_button.on_click(lambda _: self._step())
        self.reset_button.on_click(lambda _: self._restart())
        self.prompt_box.observe(lambda _: self._restart(), names="value")
        self.temperature.observe(lambda _: self._restart(), names="value")
        self.widget = w.VBox([w.HBox([self.prompt_box, self.temperature, self.step_button, self.reset_button]),
                              self.status, self.image])
        self.stepper: CacheStepper | None = None
        self._restart()

    def show(self) -> None:
        """The live widget, then a static copy of what it shows now (for readers without a kernel)."""
        from IPython.display import Image, display

        display(self.widget)
        if self.stepper is not None:
            display(Image(data=bytes(self.image.value), format="png"))
            print(self.summary())

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
            self.stepper = CacheStepper(self.model, self.tokenizer, self.prompt_box.value,
                                        temperature=self.temperature.value, seed=self.seed)
        except ValueError as e:  # e.g. a character the model has no id for
            self.stepper = None
            self.step_button.disabled = True
            self.status.value = f"<span style='color:#b00'>{_escape(str(e))}</span>"
            return
        self._refresh()

    def _step(self) -> None:
        if self.stepper is None:  # the prompt is invalid: its error message stays on show
            return
        if self.stepper.can_step:
            self.stepper.step()
        self._refresh()

    def _refresh(self) -> None:
        s = self.stepper
        self.step_button.disabled = not s.can_step
        prompt = _escape(self.tokenizer.decode(s.prompt_ids[1:]))
        new = [_escape(self.tokenizer.decode([t])) for t in s.tokens[len(s.prompt_ids):]]
        if new:
            new[-1] = f"<b style='color:{plots.HIGHLIGHT_COLOR}'>{new[-1]}</b>"
        full = "" if s.can_step else " — the cache is full: press Reset"
        self.status.value = (f"<span style='font-size:20px'><span style='color:#777'>{prompt}</span>"
                             f"{''.join(new)}</span><br>step {s.steps}, cache length {s.cache.length} "
                             f"of {s.cache.max_len}{full}").replace("\n", "⏎")
        self.image.value = plots.figure_png(draw(s.view()), self.dpi)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
