"""Notebook 2's sampling explorer: temperature, top-k, top-p and seed sliders over a poem and its first step.

:func:`explore` turns settings into an :class:`ExplorerView` (no widgets, easy to test);
:class:`SliderExplorer` wires ipywidgets controls to it and redraws on every change.
"""
from __future__ import annotations

import html
import numbers
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..checks import check_text
from ..tokenizer import UnknownCharacterError, check_pair, decode_complete, token_label
from ..decoding import generate
from ..sampling import probabilities
from ..poems import encode_prompt, no_unk, unk_ids
from . import plots  # noqa: F401  registers the font the bars use
from .english import english_html
from .show import (FONT, LiveWidget, bars_html, check_setting, control_style, display, error_message, frame,
                   in_column, message_html, require_str, row, show_refusals, slider, too_long_message, unknown_message)

SEPARATOR_LABEL = "⏎"


@dataclass
class ExplorerView:
    """One run of the explorer: the poem, and the first step's distribution with its kept set."""
    prompt: str
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    poem: str = ""                 # the new characters only, separators as newlines
    chars: list[str] = field(default_factory=list)   # the most likely first tokens
    probs: list[float] = field(default_factory=list)  # their probabilities after temperature
    kept: list[bool] = field(default_factory=list)    # whether top-k / top-p keep each of them
    n_kept: int = 0                # tokens kept at the first step, out of the vocabulary
    kept_mass: float = 0.0         # their share of the tempered probability mass
    vocab_size: int = 0
    unk_banned: bool = False       # the tokenizer's <unk> had its score set to -inf before every draw
    message: str = ""

    @property
    def ok(self) -> bool:
        return not self.message

    def settings(self) -> str:
        k = "off" if self.top_k is None else self.top_k
        p = "off" if self.top_p is None else f"{self.top_p:.2f}"
        return f"temperature {self.temperature:.2f}, top-k {k}, top-p {p}, seed {self.seed}"

    def kept_line(self) -> str:
        return (f"first step: {self.n_kept:,} of {self.vocab_size:,} tokens kept, "
                f"{100 * self.kept_mass:.1f}% of the probability after temperature"
                + (" (<unk> is never written)" if self.unk_banned else ""))

    def summary(self) -> str:
        if not self.ok:
            return self.message
        return f"{self.settings()}\n{self.kept_line()}\n「{self.prompt}」{self.poem}"

    def title(self) -> str:
        shown = self.prompt if self.prompt else "(a poem's start)"
        kept = "1 token kept" if self.n_kept == 1 else f"{self.n_kept:,} tokens kept"
        return f"「{shown}」→ ?   first step: {kept} (orange)"


N_CHARS = 32  # characters a change writes: a seven-character quatrain's length, quick enough for a slider


def _filters(top_k, top_p) -> tuple[int | None, float | None]:
    """Checked settings to sampler settings: top-p 1 keeps every token, the same as no top-p."""
    top_k = None if top_k is None else int(top_k)
    top_p = None if top_p is None or top_p >= 1 else float(top_p)
    return top_k, top_p


def explore(model, tokenizer, prompt: str = "", temperature: float = 1.0, top_k: int | None = None,
            top_p: float | None = 1.0, seed: int = 0, n_chars: int = N_CHARS, n_bars: int = 12) -> ExplorerView:
    """Write ``n_chars`` new characters after ``prompt`` and describe the first step's choice.

    The first step's logits are captured from inside ``generate`` (through its logits hook), so
    the bars show exactly the distribution the first character was drawn from: ``<unk>``, which
    stands for the corpus's rarest characters, is banned first (``no_unk``), as everywhere text is
    written for people. The poem does not stop at the poem separator: when one poem ends, the next
    begins on a new line.
    """
    check_pair(model, tokenizer)
    prompt = check_text(require_str("prompt", prompt), "prompt").strip()
    block = model.config.block_size
    if top_k is not None:  # None: no top-k, as everywhere in kvlib
        rule = f"top_k must be an int >= 1 and <= the vocabulary size {tokenizer.vocab_size} (None: no top-k)"
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
            raise TypeError(f"{rule}, got {top_k!r:.40}")
        if not 1 <= top_k <= tokenizer.vocab_size:
            raise ValueError(f"{rule}, got {top_k!r}")
    if top_p is not None:
        rule = "top_p must be a number in (0, 1] (1 or None: no top-p)"
        if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
            raise TypeError(f"{rule}, got {top_p!r:.40}")
        if not 0 < top_p <= 1:
            raise ValueError(f"{rule}, got {top_p!r}")
    check_setting("n_chars", n_chars, 1, block, integer=True)
    check_setting("n_bars", n_bars, 1, min(100, tokenizer.vocab_size), integer=True)
    check_setting("seed", seed, 0, 2**63 - 1, integer=True)
    check_setting("temperature", temperature, 0.0, 100.0)
    top_k, top_p = _filters(top_k, top_p)
    view = ExplorerView(prompt, float(temperature), top_k, top_p, int(seed), vocab_size=tokenizer.vocab_size,
                        unk_banned=bool(unk_ids(tokenizer)))
    try:
        ids = encode_prompt(tokenizer, prompt)
    except UnknownCharacterError as err:
        view.message = unknown_message(err)
        return view
    room = model.config.block_size + 1 - n_chars  # prompt tokens that leave room for n_chars
    if len(ids) > room:
        view.message = too_long_message(block, room - 1, f"with room for {n_chars} new ones")
        return view
    first = []

    def capture(step, tokens, logits):
        if step == 0:
            first.append(logits[:1].clone())
        return logits

    out = generate(model, torch.tensor([ids]), n_chars, temperature=view.temperature, top_k=top_k,
                   top_p=top_p, generator=torch.Generator().manual_seed(view.seed),
                   logits_hook=no_unk(tokenizer, capture))
    view.poem = decode_complete(tokenizer, out.new_tokens[0])
    tempered = probabilities(first[0], view.temperature)[0]                       # (V,); one-hot at 0
    kept = probabilities(first[0], view.temperature, top_k, top_p)[0] > 0          # (V,) bool
    values, top_ids = tempered.topk(n_bars)
    view.chars = [token_label(tokenizer, i) for i in top_ids.tolist()]  # distinct labels: the bars are coloured by them
    view.probs = [float(v) for v in values]
    view.kept = kept[top_ids].tolist()
    view.n_kept = int(kept.sum())
    view.kept_mass = float(tempered[kept].sum())
    return view


def poem_html(prompt: str, poem: str) -> str:
    """The prompt in bold, then the poem, a new line wherever a poem ends; its English under it."""
    body = html.escape(poem).replace("\n", f'<span style="color:#999"> {SEPARATOR_LABEL}</span><br>')
    return (f'<div style="font-size:20px;line-height:1.6;overflow-wrap:anywhere"><b>{html.escape(prompt)}</b>'
            f'{body}</div>' + english_html(prompt + poem))


class SliderExplorer:
    """Temperature, top-k, top-p and seed sliders plus a prompt, beside (or, when narrow, above) a poem and the
    first step's bars.

    Any change writes a new poem of ``n_chars`` characters and redraws the bars: orange bars are
    the tokens the filters keep, blue ones are dropped (at temperature 0 only the winner is drawn,
    at 100 %). A failed update or a value off a slider's range leaves a message where the poem was and
    clears the bars, which no longer match the controls. ``timing`` holds the last update's
    milliseconds until the poem was shown (``poem_ms``) and until the bars were redrawn (``update_ms``),
    as wall-clock time and as this process's CPU time (``*_cpu_ms``: what the update costs when
    the machine is busy with other work).
    """

    def __init__(self, model, tokenizer, prompt: str = "", temperature: float = 1.0, top_k: int | None = None,
                 top_p: float = 1.0, seed: int = 0, n_chars: int = N_CHARS, n_bars: int = 12):
        import ipywidgets as w

        for name, value, low, high, integer in (("temperature", temperature, 0.0, 2.0, False),
                                                 ("top_k", top_k, 1, 100, True), ("top_p", top_p, 0.05, 1.0, False),
                                                 ("seed", seed, 0, 99, True)):
            if value is not None or name != "top_k":  # top_k None: no top-k
                check_setting(name, value, low, high, integer)
        check_pair(model, tokenizer)
        require_str("prompt", prompt)
        check_setting("n_chars", n_chars, 1, model.config.block_size, integer=True)
        check_setting("n_bars", n_bars, 1, min(100, tokenizer.vocab_size), integer=True)
        self.model, self.tokenizer, self.n_chars = model, tokenizer, n_chars
        common = dict(continuous_update=False, layout=in_column(460))
        self.prompt = w.Text(value=prompt, description="prompt", placeholder="empty: start a new poem",
                             style=control_style(font_size="16px"), **common)
        self.temperature = slider("float", value=temperature, min=0.0, max=2.0, step=0.05,
                                  description="temperature", **common)
        # The slider's 0 end is "no top-k": it is turned into None here, at the widget's edge.
        self.top_k = slider("int", value=top_k or 0, min=0, max=100, description="top-k (0 off)", **common)
        self.top_p = slider("float", value=top_p, min=0.05, max=1.0, step=0.05, description="top-p (1 off)",
                            **common)
        self.seed = slider("int", value=seed, min=0, max=99, description="seed", **common)
        self.poem = w.HTML(layout=w.Layout(width="100%"))
        self.info = w.HTML(layout=w.Layout(width="100%"))
        self.chart = w.HTML(layout=w.Layout(flex="1 1 340px", min_width="0", max_width="560px"))
        controls = w.VBox([self.prompt, self.temperature, self.top_k, self.top_p, self.seed, self.info, self.poem],
                          layout=w.Layout(flex="1 1 360px", min_width="0", max_width="560px", margin="0 24px 0 0"))
        # side by side where there is room, so that sliders and bars are on screen together; else stacked
        self.widget = frame(row(controls, self.chart, align="flex-start"))
        self.n_bars = n_bars
        self.view: ExplorerView | None = None
        self.timing: dict[str, float] = {}
        show_refusals(self.poem, self.temperature, self.top_k, self.top_p, self.seed)
        for control in (self.prompt, self.temperature, self.top_k, self.top_p, self.seed):
            control.observe(self.update, "value")
        self.update()

    def update(self, change=None) -> ExplorerView | None:
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            view = explore(self.model, self.tokenizer, self.prompt.value, self.temperature.value,
                           self.top_k.value or None, self.top_p.value, self.seed.value, self.n_chars, self.n_bars)
            self.view = view
            self.poem.value, self.info.value, chart = self._html(view)
            poem_done, poem_cpu = time.perf_counter(), time.process_time()
            self.chart.value = chart
        except Exception as err:  # shown in the widget, where the poem was
            self.fail(error_message(err))
            return None
        end, cpu_end = time.perf_counter(), time.process_time()
        self.timing = {"poem_ms": 1e3 * (poem_done - start), "update_ms": 1e3 * (end - start),
                       "poem_cpu_ms": 1e3 * (poem_cpu - cpu_start), "update_cpu_ms": 1e3 * (cpu_end - cpu_start)}
        return view

    def fail(self, message: str) -> None:
        """A message where the poem was; the settings line, poem and bars of the last update go."""
        self.view = None
        self.info.value, self.poem.value, self.chart.value = "", message_html(message), ""

    @staticmethod
    def _html(view: ExplorerView) -> tuple[str, str, str]:
        """(poem, settings line, chart) for a view; a bad input clears the chart and says why."""
        settings = f'<p style="{FONT};margin:4px 0">{html.escape(view.settings())}'
        if not view.ok:
            return message_html(view.message), settings + "</p>", ""
        kept = [c for c, k in zip(view.chars, view.kept) if k]
        return (poem_html(view.prompt, view.poem), f"{settings}<br>{html.escape(view.kept_line())}</p>",
                bars_html(view.chars, view.probs, highlight=kept, title=view.title(), width=520))

    def static_html(self) -> str:
        """The widget's current state as plain HTML: settings, poem and bars, side by side when they fit."""
        if self.view is None:
            return self.poem.value
        poem, info, chart = self._html(self.view)
        return (f'<div style="display:flex;flex-wrap:wrap;gap:8px 24px;align-items:flex-start">'
                f'<div style="flex:1 1 340px;min-width:0;max-width:560px">{info}{poem}</div>'
                f'<div style="flex:1 1 340px;min-width:0;max-width:560px">{chart}</div></div>')

    def show(self) -> None:
        """The live widget (with a static copy for readers without a kernel)."""
        display(LiveWidget(self.widget, self.static_html()))


def measure_update_latency(model=None, tokenizer=None, repeats: int = 7, **settings) -> dict[str, float]:
    """Median milliseconds of one slider change in a ``SliderExplorer``, measured in this process
    (the new poem after a temperature change also with its lowest and highest).

    Two kinds of change: a new temperature (a new poem and redrawn bars) and a new seed (a new
    poem; the bars stay). ``poem_ms`` is the time until the new poem is on screen; ``cpu_ms`` figures
    count only this process's CPU time, which other busy programs do not inflate. Without a
    model, the shipped ``tang-char`` is loaded. ``settings`` are the explorer's starting values.
    """
    if model is None:
        from ..tools.loading import load_pretrained

        model, tokenizer = load_pretrained("tang-char")
    explorer = SliderExplorer(model, tokenizer, **settings)
    explorer.update()  # warm-up
    temps, seeds = [], []
    t0 = explorer.temperature.value
    nudge = 0.05 if t0 + 0.05 <= explorer.temperature.max else -0.05  # a change the slider accepts
    for i in range(repeats):
        explorer.temperature.value = t0 + (nudge if i % 2 == 0 else 0.0)
        temps.append(explorer.timing)
        explorer.seed.value = (explorer.seed.value + 1) % (explorer.seed.max + 1)
        seeds.append(explorer.timing)
    return {
        "new_tokens": explorer.n_chars,
        "temperature_change_poem_ms": statistics.median(t["poem_ms"] for t in temps),
        "temperature_change_poem_low_ms": min(t["poem_ms"] for t in temps),
        "temperature_change_poem_high_ms": max(t["poem_ms"] for t in temps),
        "temperature_change_update_ms": statistics.median(t["update_ms"] for t in temps),
        "seed_change_update_ms": statistics.median(t["update_ms"] for t in seeds),
        "temperature_change_poem_cpu_ms": statistics.median(t["poem_cpu_ms"] for t in temps),
        "temperature_change_update_cpu_ms": statistics.median(t["update_cpu_ms"] for t in temps),
        "threads": torch.get_num_threads(),
    }
