"""The notebooks, in one list: adding a notebook is adding one entry here.

The tests read it (which notebooks exist, what each must print after Run All, which widget the
browser test uses, which numbers in its prose are quoted rather than measured), and so does the
check that the README and the teacher's guide name every notebook.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[2] / "notebooks"


@dataclass(frozen=True)
class Notebook:
    number: int
    file: str
    title: str                      # its first heading, after the number
    known_output: str               # a line its outputs must show after Run All
    interaction: str | None = None  # what the browser test does with its widget (see tests/test_browser.py)
    # Numbers with a unit that no run of it produces: figures quoted from the lessons or papers, said to
    # be theirs where the prose uses them (tests/test_notebook_numbers.py).
    declared: frozenset[str] = field(default_factory=frozenset)

    @property
    def path(self) -> Path:
        return FOLDER / self.file


RNG_LINE = "global RNG untouched: True"  # every notebook's last line

NOTEBOOKS = (
    # Tang-poem lesson: after 春风 its model gave 。 14.2 %, its count 13.9 % (111 of 797)
    Notebook(1, "01_next_character.ipynb", "All the model gives is probabilities", "56,799 poems in the corpus",
             "prompt box", frozenset({"14.2", "13.9"})),
    Notebook(2, "02_sampling.ipynb", "Choosing the next character: temperature, top-k, top-p",
             "p = 0.45: keeps [0]", "temperature slider"),
    Notebook(3, "03_constrained_decoding.ipynb", "Steering the model: constrained decoding",
             "punctuation at positions: [8, 16, 24, 32]"),
    # PyTorch lesson: its cache is 15 % of its 3.5 MB of float32 weights; smallest margin 0.019, ~1,300x the rounding
    Notebook(4, "04_kv_cache.ipynb", "The KV cache: stop recomputing the past", "equals 524,288: True",
             "cache step", frozenset({"15", "3.5", "0.019", "1,300"})),
    # Tang-poem lesson: 1.8 / 2.0 / 2.6x at 32 / 64 / 120 characters; "several hundred KB to over 1 MB per
    # token"; PyTorch lesson: 172 ATen calls per step, its 57x cut in token-forwards became about 4x in time.
    # 98,304: the arithmetic of self-check answer 5 (2 x 24 x 8 x 128 x 2 bytes).
    Notebook(5, "05_timing_and_memory.ipynb", "Timing and memory: what the cache buys, and what it costs", "524,288",
             declared=frozenset({"1.8", "2.0", "2.6", "1", "172", "57", "4", "98,304"})),
    # PyTorch lesson: a 1.38-nat error from arange positions in its padded row
    Notebook(6, "06_batching_and_streaming.ipynb", "Batches and streaming", "stream equals decode: True",
             declared=frozenset({"1.38"})),
    # vLLM paper (Kwon et al. 2023): 20-38 % of reserved KV memory used, vLLM 96 %
    Notebook(7, "07_serving.ipynb", "From one cache to many users", RNG_LINE, "engine step",
             frozenset({"20", "38", "96"})),
    # papers (Leviathan et al. 2023, Chen et al. 2023): 2-3x on large models; the 1.3x goal
    Notebook(8, "08_speculative_decoding.ipynb", "Speculative decoding: guess cheaply, verify in one pass", RNG_LINE,
             "speculative round", frozenset({"3", "1.3"})),
    # papers: KIVI 2.6x less peak memory; GQA about 5 % uptraining; DeepSeek-V2 93.3 % smaller cache
    Notebook(9, "09_shrinking_the_cache.ipynb", "Shrinking the cache: fewer bytes per token, and what they cost",
             RNG_LINE, declared=frozenset({"2.6", "5", "93.3"})),
)
DECLARED_EVERYWHERE = frozenset({"100", "50"})  # "100 %", "50 %": whole and half, as words


def by_file(name: str) -> Notebook:
    """The catalog entry of a notebook file name."""
    for nb in NOTEBOOKS:
        if nb.file == name:
            return nb
    raise KeyError(f"{name} is not in kvlib/notebook/catalog.py; add an entry for it")
