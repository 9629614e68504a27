"""Count words in the prose match what they count: "the check tries six settings" must be six.

An exercise's answer cell says what its check tries, in words ("eight roll-backs, one of them with blocks
of 8", "prompts of 1, 4, 13 and 16 tokens"). The check's own ``cases`` are the truth: this test reads the
sentence and the cases and compares them, so a case added to a check without the prose (or the reverse)
fails here, not in front of a class.
"""
from __future__ import annotations

import inspect
import json
import re

import pytest

import kvlib.notebook.exercises as exercises
from kvlib.notebook import catalog

WORDS = {w: n for n, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}
TRIES = re.compile(r"\*\*Your answer to exercise (\d+)\*\*\s*\(the check tries ([^)]*)\)")


def number(word: str) -> int:
    return int(word) if word.isdigit() else WORDS[word.lower()]


def said_counts(nb: dict):
    """(exercise, what the prose says it tries, the check's cases) for every check that has ``cases``."""
    cells = nb["cells"]
    for i, cell in enumerate(cells):
        m = TRIES.search("".join(cell["source"]))
        if not m or cell["cell_type"] != "markdown":
            continue
        answer = "".join(cells[i + 1]["source"])
        check = getattr(exercises, re.search(r"(check_\w+)\(", answer).group(1))
        cases = inspect.signature(check).parameters.get("cases")
        if cases is not None:
            yield m.group(1), " ".join(m.group(2).split()), cases.default


def test_the_sentence_reader_reads_counts_and_lists():
    assert number("eight") == 8 and number("12") == 12
    nb = {"cells": [{"cell_type": "markdown", "source": ["**Your answer to exercise 3** (the check tries eight "
                                                         "roll-backs, one of them with blocks of 8):"]},
                    {"cell_type": "code", "source": ["_ = check_blocks_to_free(your_blocks_to_free)"]}]}
    [(k, said, cases)] = list(said_counts(nb))
    assert k == "3" and said.startswith("eight roll-backs") and len(cases) == 8


@pytest.mark.parametrize("notebook", [nb.path for nb in catalog.NOTEBOOKS], ids=lambda p: p.name)
def test_what_a_check_tries_is_what_the_prose_says(notebook):
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    for k, said, cases in said_counts(nb):
        where = f"{notebook.name}, exercise {k}: the prose says the check tries “{said}”"
        listed = re.match(r"prompts of ([\d, and]+) tokens", said)
        if listed:  # a list of prompt lengths: the cases' first numbers, each named once
            lengths = {int(x) for x in re.findall(r"\d+", listed.group(1))}
            assert lengths == {c[0] for c in cases}, f"{where}; its cases use {sorted({c[0] for c in cases})}"
            continue
        count = re.match(r"(\w+) ", said)
        assert count and count.group(1).lower() in WORDS | {str(n): n for n in range(100)}, where
        assert number(count.group(1)) == len(cases), f"{where}; it has {len(cases)} cases"
        part = re.search(r"(\w+) of them with blocks of (\d+)", said)
        if part:
            with_blocks = sum(c[-1] == int(part.group(2)) for c in cases)
            assert number(part.group(1)) == with_blocks, f"{where}; {with_blocks} of its cases use that block size"
