"""The interactive pieces of notebooks 1-3: a prompt box, the sampling explorer, an acrostic writer.

Each one comes in two layers. A plain function turns settings into a small result object
(``next_view``, ``explore``, ``acrostic_view``): no widgets, no browser, easy to test. A class
(``PromptBox``, ``SliderExplorer``, ``AcrosticWriter``) wires ipywidgets controls to that
function and redraws whenever a control changes. ``show()`` displays the live widget and then a
static copy of its current state, for readers who see the notebook without a running kernel.
"""
from __future__ import annotations

import html
import io
import statistics
import time
from dataclasses import dataclass, field

import torch

from . import plots
from .constrain import LINE_ENDS, acrostic
from .generate import generate
from .poems import encode_prompt, next_token_probs
from .sampling import probabilities
from .tokenizer import UnknownCharacterError

SEPARATOR_LABEL = "⏎"


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------

def unknown_message(err: UnknownCharacterError) -> str:
    """A friendly sentence naming the characters the model has no id for."""
    names = {" ": "a space", "\t": "a tab", "\u3000": "a wide space"}
    shown = "、".join(names.get(ch, f"「{ch}」") for ch in err.chars[:12])
    more = f" and {len(err.chars) - 12} more" if len(err.chars) > 12 else ""
    return (f"The model does not know {shown}{more}. Its vocabulary holds only the characters that "
            "occur at least twice in the Tang poems; try other characters.")


def format_top(text: str, pairs, decimals: int = 1) -> str:
    """One line: 「text」→ each candidate with its probability in %, most likely first."""
    cands = "  ".join(f"{plots.char_label(ch)} {100 * p:.{decimals}f}%" for ch, p in pairs)
    return f"「{text}」→ {cands}"


def _token_labels(tokenizer, ids) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def _display(*objs) -> None:
    from IPython.display import display

    display(*objs)


def _png_image(png: bytes):
    from IPython.display import Image

    return Image(data=png, format="png")


def _figure_png(fig, dpi: int = 90) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Notebook 1: the prompt box (type a text, see the top-k next characters)
# ---------------------------------------------------------------------------------------------

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

    def figure(self):
        """The bars as a matplotlib Figure (None when there is only a message)."""
        if not self.ok:
            return None
        shown = self.text if self.text else "(a poem's start)"
        return plots.bar_top_k(self.chars, self.probs, title=f"「{shown}」→ ?")


def _require_str(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str of Chinese characters, got {value!r}")
    return value


def next_view(model, tokenizer, text: str, k: int = 8) -> NextView:
    """The ``k`` most likely next characters after ``text``; unknown characters give a message."""
    text = _require_str("text", text).strip()
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= tokenizer.vocab_size:
        raise ValueError(f"k must be an int in [1, {tokenizer.vocab_size}] (the vocabulary size), got {k!r}")
    try:
        probs = next_token_probs(model, tokenizer, text)
    except UnknownCharacterError as err:
        return NextView(text, message=unknown_message(err))
    values, ids = probs.topk(k)
    return NextView(text, _token_labels(tokenizer, ids.tolist()), [float(v) for v in values])


class PromptBox:
    """A text box and a k slider above the top-k bar chart of the next character."""

    def __init__(self, model, tokenizer, text: str = "春风", k: int = 8):
        import ipywidgets as w

        self.model, self.tokenizer = model, tokenizer
        self.prompt = w.Text(value=text, description="prompt", continuous_update=False,
                             placeholder="type Chinese characters, then press Enter",
                             layout=w.Layout(width="420px"))
        self.k = w.IntSlider(value=k, min=3, max=20, description="top k", continuous_update=False)
        self.message = w.HTML()
        self.image = w.Image(format="png")
        self.widget = w.VBox([w.HBox([self.prompt, self.k]), self.message, self.image])
        self.view: NextView | None = None
        self.png = b""  # the chart as PNG bytes, as last drawn
        self.prompt.observe(self.update, "value")
        self.k.observe(self.update, "value")
        self.update()

    def update(self, change=None) -> NextView:
        self.view = next_view(self.model, self.tokenizer, self.prompt.value, self.k.value)
        if self.view.ok:
            self.message.value = ""
            self.png = _figure_png(self.view.figure())
            self.image.value = self.png
            self.image.layout.display = None
        else:
            self.message.value = f'<p style="font-size:15px;color:#a34000">{html.escape(self.view.message)}</p>'
            self.image.layout.display = "none"
        return self.view

    def show(self) -> None:
        """The live widget, then a static copy of what it shows now."""
        _display(self.widget)
        if self.view.ok:
            _display(_png_image(self.png))
        print(self.view.summary())


# ---------------------------------------------------------------------------------------------
# Notebook 2: the sampling explorer (temperature, top-k, top-p, seed)
# ---------------------------------------------------------------------------------------------

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
        return f"「{shown}」→ ?   kept: {self.n_kept:,} tokens"


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
    prompt = _require_str("prompt", prompt).strip()
    top_k, top_p = _filters(top_k, top_p)
    view = ExplorerView(prompt, float(temperature), top_k, top_p, int(seed), vocab_size=tokenizer.vocab_size)
    try:
        ids = encode_prompt(tokenizer, prompt)
    except UnknownCharacterError as err:
        view.message = unknown_message(err)
        return view
    room = model.config.block_size + 1 - n_chars  # prompt tokens that leave room for n_chars
    if len(ids) > room:
        view.message = f"The prompt is too long: at most {room - 1} characters leave room for {n_chars} new ones."
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
    view.chars = _token_labels(tokenizer, top_ids.tolist())
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
    the tokens the filters keep, blue ones are dropped. ``timing`` holds the last update's
    milliseconds until the poem was shown (``poem_ms``) and until the bars were redrawn (``update_ms``),
    as wall-clock time and as this process's CPU time (``*_cpu_ms``: what the update costs when
    the machine is busy with other work).
    """

    def __init__(self, model, tokenizer, prompt: str = "", temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, n_chars: int = 48, n_bars: int = 12):
        import ipywidgets as w

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
        self.poem = w.HTML()
        self.info = w.HTML()
        self.image = w.Image(format="png")
        controls = w.VBox([self.prompt, self.temperature, self.top_k, self.top_p, self.seed])
        self.widget = w.VBox([controls, self.poem, self.info, self.image])
        self.bars = plots.LiveBars(n_bars)
        self._drawn = None  # the settings the bars were last drawn for
        self.png = b""      # the chart as PNG bytes, as last drawn
        self.view: ExplorerView | None = None
        self.timing: dict[str, float] = {}
        for control in (self.prompt, self.temperature, self.top_k, self.top_p, self.seed):
            control.observe(self.update, "value")
        self.update()

    def update(self, change=None) -> ExplorerView:
        start, cpu_start = time.perf_counter(), time.process_time()
        view = explore(self.model, self.tokenizer, self.prompt.value, self.temperature.value,
                       self.top_k.value, self.top_p.value, self.seed.value, self.n_chars, self.bars.n_bars)
        self.view = view
        if not view.ok:
            self.poem.value = f'<p style="font-size:15px;color:#a34000">{html.escape(view.message)}</p>'
            self.info.value = ""
            self.timing = {"poem_ms": 1e3 * (time.perf_counter() - start),
                           "poem_cpu_ms": 1e3 * (time.process_time() - cpu_start)}
            return view
        self.poem.value = poem_html(view.prompt, view.poem)
        poem_done, poem_cpu = time.perf_counter(), time.process_time()
        self.info.value = f'<p style="font-size:14px">{html.escape(view.settings())}<br>{html.escape(view.kept_line())}</p>'
        key = (view.prompt, view.temperature, view.top_k, view.top_p)
        if key != self._drawn:  # a new seed alone leaves the first step's distribution as it was
            kept = [c for c, k in zip(view.chars, view.kept) if k]
            self.bars.update(view.chars, view.probs, highlight=kept, title=view.title())
            self.png = self.bars.png()
            self.image.value = self.png
            self._drawn = key
        end, cpu_end = time.perf_counter(), time.process_time()
        self.timing = {"poem_ms": 1e3 * (poem_done - start), "update_ms": 1e3 * (end - start),
                       "poem_cpu_ms": 1e3 * (poem_cpu - cpu_start), "update_cpu_ms": 1e3 * (cpu_end - cpu_start)}
        return view

    def show(self) -> None:
        """The live widget, then a static copy of what it shows now."""
        _display(self.widget)
        if self.view.ok:
            _display(_png_image(self.png))
        print(self.view.summary())


def measure_update_latency(model=None, tokenizer=None, repeats: int = 7, **settings) -> dict[str, float]:
    """Median milliseconds of one slider change in a ``SliderExplorer``, measured in this process.

    Two kinds of change: a new temperature (a new poem and redrawn bars) and a new seed (a new
    poem; the bars stay). ``poem_ms`` is the time until the new poem is on screen; ``cpu_ms`` figures
    count only this process's CPU time, which other busy programs do not inflate. Without a
    model, the shipped ``tang-char`` is loaded. ``settings`` are the explorer's starting values.
    """
    if model is None:
        from .pretrained import load_pretrained

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


# ---------------------------------------------------------------------------------------------
# Notebook 3: the acrostic writer
# ---------------------------------------------------------------------------------------------

def max_heads(model, chars_per_line: int) -> int:
    """How many lines fit in the model's block (each line is its characters plus one mark)."""
    return model.config.block_size // (chars_per_line + 1)


def acrostic_lines(poem: str) -> list[tuple[str, str]]:
    """Split a poem into (line, closing mark) pairs at ， and 。."""
    lines, current = [], ""
    for ch in poem:
        if ch in LINE_ENDS:
            lines.append((current, ch))
            current = ""
        else:
            current += ch
    if current:
        lines.append((current, ""))
    return lines


def acrostic_structure(poem: str, heads: str, chars_per_line: int) -> list[str]:
    """One line of text per poem line: its head, its length and its mark, each checked."""
    out = []
    lines = acrostic_lines(poem)
    for i, (line, mark) in enumerate(lines):
        head = heads[i] if i < len(heads) else "?"
        expected = LINE_ENDS[i % 2]
        good = line[:1] == head and len(line) == chars_per_line and mark == expected
        out.append(f"line {i + 1}: starts with {line[:1]} (asked {head}), {len(line)} characters, "
                   f"ends with {mark or 'nothing'} {'✓' if good else '✗'}")
    if len(lines) != len(heads):
        out.append(f"{len(lines)} lines for {len(heads)} heads ✗")
    return out


def is_acrostic(poem: str, heads: str, chars_per_line: int) -> bool:
    lines = acrostic_lines(poem)
    return len(lines) == len(heads) and all(
        line[:1] == head and len(line) == chars_per_line and mark == LINE_ENDS[i % 2]
        for i, ((line, mark), head) in enumerate(zip(lines, heads)))


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
        return "\n".join(line + mark for line, mark in acrostic_lines(self.poem))

    def html(self) -> str:
        if not self.ok:
            return f'<p style="font-size:15px;color:#a34000">{html.escape(self.message)}</p>'
        rows = [f'<span style="color:{plots.HIGHLIGHT_COLOR};font-weight:bold">{html.escape(line[:1])}</span>'
                f"{html.escape(line[1:] + mark)}" for line, mark in acrostic_lines(self.poem)]
        return '<div style="font-size:22px;line-height:1.6">' + "<br>".join(rows) + "</div>"


def acrostic_view(model, tokenizer, heads: str, chars_per_line: int = 7, temperature: float = 0.8,
                  seed: int = 1337) -> AcrosticView:
    """An acrostic on ``heads`` (spaces ignored), or a message saying why none can be written."""
    heads = "".join(_require_str("heads", heads).split())
    view = AcrosticView(heads, int(chars_per_line))
    if not heads:
        view.message = "Type one Chinese character for the start of each line, e.g. 春眠不觉."
        return view
    if len(heads) > max_heads(model, chars_per_line):
        view.message = (f"{len(heads)} lines do not fit: the model reads at most {model.config.block_size} "
                        f"tokens, room for {max_heads(model, chars_per_line)} lines of {chars_per_line} characters.")
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
    """Type the heads, choose 5 or 7 characters a line, a temperature and a seed; read the poem."""

    def __init__(self, model, tokenizer, heads: str = "春眠不觉", chars_per_line: int = 7,
                 temperature: float = 0.8, seed: int = 1337):
        import ipywidgets as w

        self.model, self.tokenizer = model, tokenizer
        self.heads = w.Text(value=heads, description="heads", continuous_update=False,
                            placeholder="one character per line")
        self.chars_per_line = w.ToggleButtons(options=[5, 7], value=chars_per_line,
                                              description="per line")
        self.temperature = w.FloatSlider(value=temperature, min=0.05, max=1.5, step=0.05,
                                         description="temperature", continuous_update=False)
        self.seed = w.IntSlider(value=seed, min=0, max=2000, description="seed", continuous_update=False)
        self.poem = w.HTML()
        self.widget = w.VBox([self.heads, self.chars_per_line, self.temperature, self.seed, self.poem])
        self.view: AcrosticView | None = None
        for control in (self.heads, self.chars_per_line, self.temperature, self.seed):
            control.observe(self.update, "value")
        self.update()

    def update(self, change=None) -> AcrosticView:
        self.view = acrostic_view(self.model, self.tokenizer, self.heads.value, self.chars_per_line.value,
                                  self.temperature.value, self.seed.value)
        self.poem.value = self.view.html()
        return self.view

    def show(self) -> None:
        """The live widget, then a static copy of the poem it shows now."""
        _display(self.widget)
        print(self.view.summary())
