"""Notebook 2's sampling explorer: temperature, top-k, top-p and seed sliders over a poem and its first step.

:func:`explore` turns settings into an :class:`ExplorerView` (no widgets, easy to test);
:class:`SliderExplorer` wires ipywidgets controls to it and redraws on every change.
"""
from __future__ import annotations

import html
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..decoding import generate
from ..sampling import probabilities
from ..text import encode_prompt
from ..tokenizer import UnknownCharacterError
from . import plots
from .show import LiveWidget, bars_html, check_setting, display, message_html, require_str, unknown_message

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
                f"{100 * self.kept_mass:.1f}% of the probability after temperature")

    def summary(self) -> str:
        if not self.ok:
            return self.message
        return f"{self.settings()}\n{self.kept_line()}\n「{self.prompt}」{self.poem}"

    def title(self) -> str:
        shown = self.prompt if self.prompt else "(a poem's start)"
        kept = "1 token kept" if self.n_kept == 1 else f"{self.n_kept:,} tokens kept"
        return f"「{shown}」→ ?   first step: {kept} (orange)"


def _filters(top_k, top_p) -> tuple[int | None, float | None]:
    """Slider values to sampler settings: top-k 0 and top-p 1 both mean "no filter"."""
    top_k = None if not top_k else int(top_k)
    top_p = None if top_p is None or top_p >= 1 else float(top_p)
    return top_k, top_p


def explore(model, tokenizer, prompt: str = "", temperature: float = 1.0, top_k: int | None = 0,
            top_p: float | None = 1.0, seed: int = 0, n_chars: int = 48, n_bars: int = 12) -> ExplorerView:
    """Write ``n_chars`` new characters after ``prompt`` and describe the first step's choice.

    The first step's logits are captured from inside ``generate`` (through its logits hook), so
    the bars show exactly the distribution the first character was drawn from. The poem does
    not stop at the poem separator: when one poem ends, the next begins on a new line.
    """
    prompt = require_str("prompt", prompt).strip()
    block = model.config.block_size
    check_setting("n_chars", n_chars, 1, block, integer=True)
    check_setting("n_bars", n_bars, 1, min(100, tokenizer.vocab_size), integer=True)
    check_setting("seed", seed, 0, 2**63 - 1, integer=True)
    check_setting("temperature", temperature, 0.0, 100.0)
    top_k, top_p = _filters(top_k, top_p)
    view = ExplorerView(prompt, float(temperature), top_k, top_p, int(seed), vocab_size=tokenizer.vocab_size)
    try:
        ids = encode_prompt(tokenizer, prompt)
    except UnknownCharacterError as err:
        view.message = unknown_message(err)
        return view
    room = model.config.block_size + 1 - n_chars  # prompt tokens that leave room for n_chars
    if len(ids) > room:
        view.message = (f"The prompt is too long: the model reads {block} tokens, so at most {room - 1} "
                        f"characters leave room for {n_chars} new ones. Use a shorter prompt.")
        return view
    first = []

    def capture(step, tokens, logits):
        if step == 0:
            first.append(logits[:1].clone())
        return logits

    out = generate(model, torch.tensor([ids]), n_chars, temperature=view.temperature, top_k=top_k,
                   top_p=top_p, generator=torch.Generator().manual_seed(view.seed), logits_hook=capture)
    view.poem = tokenizer.decode(out.new_tokens[0].tolist())
    tempered = probabilities(first[0], view.temperature)[0]                       # (V,)
    kept = probabilities(first[0], view.temperature, top_k, top_p)[0] > 0          # (V,) bool
    values, top_ids = tempered.topk(n_bars)
    view.chars = [tokenizer.decode([i]) for i in top_ids.tolist()]
    view.probs = [float(v) for v in values]
    view.kept = kept[top_ids].tolist()
    view.n_kept = int(kept.sum())
    view.kept_mass = float(tempered[kept].sum())
    return view


def poem_html(prompt: str, poem: str) -> str:
    """The prompt in bold, then the poem, a new line wherever a poem ends."""
    body = html.escape(poem).replace("\n", f'<span style="color:#999"> {SEPARATOR_LABEL}</span><br>')
    return (f'<div style="font-size:20px;line-height:1.6"><b>{html.escape(prompt)}</b>{body}</div>')


class SliderExplorer:
    """Temperature, top-k, top-p and seed sliders plus a prompt, above a poem and the first step's bars.

    Any change writes a new poem of ``n_chars`` characters and redraws the bars: orange bars are
    the tokens the filters keep, blue ones are dropped (at temperature 0 only the winner is drawn).
    ``timing`` holds the last update's
    milliseconds until the poem was shown (``poem_ms``) and until the bars were redrawn (``update_ms``),
    as wall-clock time and as this process's CPU time (``*_cpu_ms``: what the update costs when
    the machine is busy with other work).
    """

    def __init__(self, model, tokenizer, prompt: str = "", temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, n_chars: int = 48, n_bars: int = 12):
        import ipywidgets as w

        for name, value, low, high, integer in (("temperature", temperature, 0.0, 2.0, False),
                                                 ("top_k", top_k, 0, 100, True), ("top_p", top_p, 0.05, 1.0, False),
                                                 ("seed", seed, 0, 99, True)):
            check_setting(name, value, low, high, integer)
        self.model, self.tokenizer, self.n_chars = model, tokenizer, n_chars
        slider = dict(continuous_update=False, style={"description_width": "90px"},
                      layout=w.Layout(width="420px"))
        self.prompt = w.Text(value=prompt, description="prompt", placeholder="empty: start a new poem",
                             **slider)
        self.temperature = w.FloatSlider(value=temperature, min=0.0, max=2.0, step=0.05,
                                         description="temperature", **slider)
        self.top_k = w.IntSlider(value=top_k, min=0, max=100, description="top-k (0 off)", **slider)
        self.top_p = w.FloatSlider(value=top_p, min=0.05, max=1.0, step=0.05,
                                   description="top-p (1 off)", **slider)
        self.seed = w.IntSlider(value=seed, min=0, max=99, description="seed", **slider)
        self.poem = w.HTML(layout=w.Layout(width="440px"))
        self.info = w.HTML()
        self.chart = w.HTML()
        controls = w.VBox([self.prompt, self.temperature, self.top_k, self.top_p, self.seed, self.info, self.poem])
        self.widget = w.HBox([controls, self.chart])  # side by side: sliders and bars on screen together
        self.n_bars = n_bars
        self.view: ExplorerView | None = None
        self.timing: dict[str, float] = {}
        for control in (self.prompt, self.temperature, self.top_k, self.top_p, self.seed):
            control.observe(self.update, "value")
        self.update()

    def update(self, change=None) -> ExplorerView:
        start, cpu_start = time.perf_counter(), time.process_time()
        view = explore(self.model, self.tokenizer, self.prompt.value, self.temperature.value,
                       self.top_k.value, self.top_p.value, self.seed.value, self.n_chars, self.n_bars)
        self.view = view
        self.poem.value, self.info.value, chart = self._html(view)
        poem_done, poem_cpu = time.perf_counter(), time.process_time()
        self.chart.value = chart
        end, cpu_end = time.perf_counter(), time.process_time()
        self.timing = {"poem_ms": 1e3 * (poem_done - start), "update_ms": 1e3 * (end - start),
                       "poem_cpu_ms": 1e3 * (poem_cpu - cpu_start), "update_cpu_ms": 1e3 * (cpu_end - cpu_start)}
        return view

    @staticmethod
    def _html(view: ExplorerView) -> tuple[str, str, str]:
        """(poem, settings line, chart) for a view; a bad input clears the chart and says why."""
        settings = f'<p style="font-size:14px">{html.escape(view.settings())}'
        if not view.ok:
            return message_html(view.message), settings + "</p>", ""
        kept = [c for c, k in zip(view.chars, view.kept) if k]
        probs = view.probs if view.temperature > 0 else [p if k else 0.0 for p, k in zip(view.probs, view.kept)]
        return (poem_html(view.prompt, view.poem), f"{settings}<br>{html.escape(view.kept_line())}</p>",
                bars_html(view.chars, probs, highlight=kept, title=view.title()))

    def show(self) -> None:
        """The live widget (with a static copy for readers without a kernel)."""
        poem, info, chart = self._html(self.view)
        display(LiveWidget(self.widget, f'<div style="display:flex;gap:24px"><div>{info}{poem}</div>{chart}</div>'))


def measure_update_latency(model=None, tokenizer=None, repeats: int = 7, **settings) -> dict[str, float]:
    """Median milliseconds of one slider change in a ``SliderExplorer``, measured in this process.

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
    for i in range(repeats):
        explorer.temperature.value = t0 + (0.05 if i % 2 == 0 else 0.0)
        temps.append(explorer.timing)
        explorer.seed.value = (explorer.seed.value + 1) % (explorer.seed.max + 1)
        seeds.append(explorer.timing)
    return {
        "new_tokens": explorer.n_chars,
        "temperature_change_poem_ms": statistics.median(t["poem_ms"] for t in temps),
        "temperature_change_update_ms": statistics.median(t["update_ms"] for t in temps),
        "seed_change_update_ms": statistics.median(t["update_ms"] for t in seeds),
        "temperature_change_poem_cpu_ms": statistics.median(t["poem_cpu_ms"] for t in temps),
        "temperature_change_update_cpu_ms": statistics.median(t["update_cpu_ms"] for t in temps),
        "threads": torch.get_num_threads(),
    }
