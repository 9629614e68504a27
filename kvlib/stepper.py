"""Step through cached decoding one token at a time and look inside the cache.

:class:`CacheStepper` runs the real model over a real :class:`~kvlib.model.KVCache`: it prefills
the prompt once, then every :meth:`CacheStepper.step` picks one token from the last logits, feeds
that token alone, and records what a learner wants to see:

- the distribution the token was drawn from (its ten most likely entries) and the token chosen;
- which positions of which layer now hold keys, read from the cache tensor itself;
- how the new token's query spread its attention over the cached positions, one row per head.

The attention weights are not a second copy of the model: a forward hook on each layer's
``attn.c_attn`` keeps the new token's query, and the keys are the ones stored in ``cache.k``, so
``softmax(q . k / sqrt(D))`` is exactly what the model's attention computed.

:func:`draw` turns a :class:`StepView` into one matplotlib figure and :class:`StepperWidget` wraps
both in a few ipywidgets controls. Nothing here needs a browser; the widget is built only on request.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure

from . import plots
from .model import GPT, CacheOverflowError
from .poems import encode_prompt
from .sampling import probabilities, sample_next, validate_sampling

TOP = 10  # bars in the distribution panel


@dataclass
class StepView:
    """Everything one picture of the stepper shows (plain tensors and lists, no model)."""

    step: int                # 0 after the prefill, then 1, 2, ... one per Step
    tokens: list[int]        # every token in the cache: the prompt, then the chosen ones
    labels: list[str]        # how each of those tokens is shown
    prompt_length: int
    top_labels: list[str]    # the distribution's most likely tokens (and the chosen one, if not among them)
    top_probs: list[float]
    chosen: int | None       # the token drawn at this step (None before the first Step)
    chosen_label: str | None
    query_position: int      # position of the token whose attention is shown (the last one fed)
    attention: torch.Tensor  # (L, H, S): that token's weights over positions 0..S-1, rows sum to 1
    key_norms: torch.Tensor  # (L, max_len): mean |key| per layer and slot, 0 where nothing is written
    cache_length: int
    max_len: int

    @property
    def filled(self) -> torch.Tensor:
        """(L, max_len) bool: the slots of each layer that hold a key."""
        return self.key_norms > 0


def token_label(tokenizer, token_id: int) -> str:
    """A token as text when its bytes are valid UTF-8, else its bytes in hex (e.g. ``e5 ba``)."""
    raw = tokenizer.token_bytes(int(token_id))
    try:
        return plots.char_label(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return raw.hex(" ")


class CacheStepper:
    """Cached decoding of one prompt, one token per :meth:`step`, with its inside on show.

    ``temperature``, ``top_k`` and ``top_p`` are the sampler's settings; temperature 0 is greedy.
    Draws use a ``torch.Generator`` seeded with ``seed``, so the global RNG is never touched and the
    same settings give the same tokens as ``generate``. At temperature 0 the bars show the plain
    softmax (temperature 1), since the greedy distribution is a single bar; the choice is its top bar.
    """

    def __init__(self, model: GPT, tokenizer, prompt: str = "", *, temperature: float = 0.8,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 1337,
                 top: int = TOP, max_len: int | None = None):
        validate_sampling(temperature, top_k, top_p)
        self.model, self.tokenizer = model, tokenizer
        self.prompt = prompt
        self.prompt_ids = encode_prompt(tokenizer, prompt)  # the poem separator, then the prompt
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed
        self.top = top
        self.max_len = model.config.block_size if max_len is None else max_len
        if len(self.prompt_ids) > self.max_len:
            raise CacheOverflowError(
                f"the prompt takes {len(self.prompt_ids)} tokens but the cache holds {self.max_len}")
        self.reset()

    # ---- decoding ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Empty the cache, reseed the generator and prefill the prompt again."""
        self.generator = torch.Generator().manual_seed(self.seed)
        self.cache = self.model.new_cache(1, self.max_len)
        self.tokens = list(self.prompt_ids)
        self.steps = 0
        self.chosen: int | None = None
        self._feed(self.prompt_ids)
        self._shown = self._display_probs(self.logits)  # the upcoming distribution

    @property
    def can_step(self) -> bool:
        """False once every slot of the cache is written: the next token would have nowhere to go."""
        return self.cache.length < self.cache.max_len

    def step(self) -> int:
        """Draw the next token from the current logits, feed it through the cache; return its id."""
        if not self.can_step:
            raise CacheOverflowError(
                f"the cache is full ({self.cache.max_len} positions): reset to start again")
        self._shown = self._display_probs(self.logits)
        nxt = sample_next(self.logits, self.temperature, self.top_k, self.top_p, self.generator)  # (1, 1)
        self.chosen = int(nxt)
        self.tokens.append(self.chosen)
        self.steps += 1
        self._feed([self.chosen])
        return self.chosen

    def run(self, n: int) -> list[int]:
        """``n`` steps (fewer if the cache fills up); the ids chosen."""
        return [self.step() for _ in range(n) if self.can_step]

    def _display_probs(self, logits: torch.Tensor) -> torch.Tensor:
        if self.temperature == 0:
            return probabilities(logits)[0]
        return probabilities(logits, self.temperature, self.top_k, self.top_p)[0]  # (V,)

    @torch.inference_mode()
    def _feed(self, ids: list[int]) -> None:
        """Run ``ids`` through the model with the cache; keep the last logits and that token's attention."""
        queries: dict[int, torch.Tensor] = {}

        def keep_query(layer):
            def hook(module, inputs, output):  # output (1, T, 3C): q, k, v of the fed tokens
                C = output.shape[-1] // 3
                queries[layer] = output[0, -1, :C].clone()  # the last fed token's query (C,)
            return hook

        blocks = self.model.transformer.h
        handles = [b.attn.c_attn.register_forward_hook(keep_query(i)) for i, b in enumerate(blocks)]
        try:
            logits, _ = self.model(torch.tensor([ids]), cache=self.cache)
        finally:
            for h in handles:
                h.remove()
        self.logits = logits[:, -1]  # (1, V)
        self.attention = self._attention(queries)

    def _attention(self, queries: dict[int, torch.Tensor]) -> torch.Tensor:
        """(L, H, S) softmax(q . k / sqrt(D)) of the last fed token over the S cached keys."""
        S = self.cache.length
        H, D = self.model.config.n_head, self.model.config.head_size
        rows = []
        for layer in range(self.model.config.n_layer):
            q = queries[layer].view(H, D, 1)                   # (H, D, 1)
            keys = self.cache.k[layer, 0, :, :S]               # (H, S, D): what the cache stores
            scores = (keys @ q).squeeze(-1) / math.sqrt(D)     # (H, S); the last token sees all S keys
            rows.append(scores.softmax(-1))
        return torch.stack(rows)

    # ---- what to show -----------------------------------------------------------------------

    def key_norms(self) -> torch.Tensor:
        """(L, max_len) mean absolute key per layer and slot, read from the cache buffer."""
        return self.cache.k[:, 0].abs().mean(dim=(1, 3))  # average over heads and channels

    def view(self) -> StepView:
        probs, ids = self._shown.topk(min(self.top, self._shown.numel()))
        probs, ids = probs.tolist(), ids.tolist()
        if self.chosen is not None and self.chosen not in ids:  # a draw from the tail: show it too
            ids.append(self.chosen)
            probs.append(float(self._shown[self.chosen]))
        label = lambda i: token_label(self.tokenizer, i)  # noqa: E731
        return StepView(
            step=self.steps, tokens=list(self.tokens), labels=[label(i) for i in self.tokens],
            prompt_length=len(self.prompt_ids), top_labels=[label(i) for i in ids], top_probs=probs,
            chosen=self.chosen, chosen_label=None if self.chosen is None else label(self.chosen),
            query_position=self.cache.length - 1, attention=self.attention.clone(),
            key_norms=self.key_norms(), cache_length=self.cache.length, max_len=self.cache.max_len)

    def text(self) -> str:
        """The prompt and everything chosen so far, decoded (poem separators become newlines)."""
        return self.tokenizer.decode(self.tokens[1:])

    def figure(self) -> Figure:
        return draw(self.view())

    def png(self, dpi: int = 80) -> bytes:
        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", dpi=dpi)
        return buf.getvalue()


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
    plots.bar_top_k(view.top_labels, view.top_probs, ax=ax_bars, highlight=highlight)
    if view.chosen is None:
        ax_bars.set_title("next-token distribution\n(press Step to draw)")
    else:
        ax_bars.set_title(f"step {view.step}: drew 「{view.chosen_label}」")

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
        ax_attn.set_xticks(range(S), view.labels[:S])
        ax_attn.set_xlabel("cached position (its token)")
    else:
        ticks = list(range(0, S, max(1, math.ceil(S / 16))))
        ax_attn.set_xticks(ticks, [str(t) for t in ticks])
        ax_attn.set_xlabel("cached position")
    query = view.labels[view.query_position]
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
        self.image.value = s.png(self.dpi)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
