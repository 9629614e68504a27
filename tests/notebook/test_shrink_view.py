"""Notebook 9's view: a row of the table and a poem written through the chosen cache."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from kvlib.notebook.shrink_view import ShrinkView
from kvlib.model import GPTConfig
from kvlib.tools.shrink_bench import PAPERS, settings

SHIPPED_SHAPE = GPTConfig(vocab_size=7184)  # the char model's config, which the tables here describe


def table(length=48, config=SHIPPED_SHAPE):
    rows = [{"family": s.family, "setting": s.name, "label": s.label, "bytes_per_token": 4096.0 / (i + 1),
             "memory_cut": 1 - 1 / (i + 1), "nats_per_token": 4.8 + i / 100, "kl": i / 1000, "top1_agreement": 1 - i / 100}
            for i, s in enumerate(settings(length))]
    return {"texts": 50, "length": length, "full_bytes_per_token": 4096, "rows": rows, "papers": PAPERS,
            "config": asdict(config)}


def test_each_choice_shows_its_row_and_a_poem_written_through_it(char):
    model, tok = char
    view = ShrinkView(model, tok, table(), n_chars=12)
    poems = {}
    for label in ("full cache: float32", "quantised: 2-bit", "evicted: window of 24", "latent: r = 16, SVD"):
        view.choice.value = label
        numbers, poem = view.text().split("\n")
        assert numbers.startswith(label) and "bytes a token" in numbers and label in view.output.value
        assert poem.startswith("春风") and len(poem) == 2 + 12
        poems[label] = poem
    assert poems["full cache: float32"] != poems["latent: r = 16, SVD"]  # a converted model writes its own
    view.choice.value = "full cache: float32"
    assert view.text().split("\n")[1] == poems["full cache: float32"]     # the same seed: the same poem


def test_bad_settings_are_refused(char):
    model, tok = char
    with pytest.raises(TypeError, match="table must be"):
        ShrinkView(model, tok, {"rows": []})
    with pytest.raises(ValueError, match="n_chars"):
        ShrinkView(model, tok, table(), n_chars=200)
    with pytest.raises(TypeError, match="prompt must be a str"):
        ShrinkView(model, tok, table(), prompt=5)
    with pytest.raises(ValueError, match=r"prompt is too long: the model reads 128 tokens, so at most 126 characters"):
        ShrinkView(model, tok, table(), prompt="春" * 127)
    with pytest.raises(ValueError, match=r"prompt: 4 character\(s\) are not in the vocabulary: helo"):
        ShrinkView(model, tok, table(), prompt="hello")
    with pytest.raises(ValueError, match="model must be the model the table was measured on"):
        ShrinkView(model, tok, table(config=GPTConfig(vocab_size=7184, n_kv_head=2)))


def test_the_poem_has_its_english_only_where_one_is_stored_for_exactly_it(char, monkeypatch):
    from kvlib.notebook.english import NO_ENGLISH, TRANSLATIONS

    model, tok = char
    view = ShrinkView(model, tok, table(), n_chars=12)
    poem = view.text().split("\n")[1]
    assert f"→ {NO_ENGLISH}" in view.output.value                          # nothing stored for this poem: said so
    monkeypatch.setitem(TRANSLATIONS, poem, "Spring wind & <test>")
    view._refresh()
    assert "→ Spring wind &amp; &lt;test&gt;" in view.output.value           # escaped, under the poem
    assert NO_ENGLISH not in view.output.value


def test_the_view_fits_and_no_control_sits_in_a_column_with_a_flex_basis(char):
    """A flex basis is a width in a row but a height in a column: the dropdown's 420 px basis, directly in the frame's
    column, once left a blank gap of about 390 px under it in JupyterLab."""
    import ipywidgets as w

    from .widget_checks import assert_fits

    model, tok = char
    view = ShrinkView(model, tok, table(), n_chars=4)
    assert_fits(view)

    def in_columns(box):
        column = isinstance(box, w.VBox) or "column" in (box.layout.flex_flow or "")
        for child in box.children:
            if column and child.layout.flex:
                yield f"{type(child).__name__} with flex {child.layout.flex!r} in a column"
            if isinstance(child, w.Box):
                yield from in_columns(child)

    assert not list(in_columns(view.widget))
    assert view.choice in view.widget.children[1].children[0].children  # the dropdown's row, under the style
