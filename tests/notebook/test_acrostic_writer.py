"""Notebook 3's acrostic writer, and the form checks it reports."""

import pytest

from kvlib import constraints
from kvlib.notebook import acrostic_writer

PNG = b"\x89PNG"



@pytest.mark.parametrize("heads,n", [("春眠不觉", 7), ("学无止境", 5)])
def test_acrostic_view_has_the_form(char, heads, n):
    model, tok = char
    view = acrostic_writer.acrostic_view(model, tok, heads, n, temperature=0.8, seed=1337)
    assert view.ok and constraints.is_acrostic(view.poem, heads, n)
    lines = constraints.poem_lines(view.poem)
    assert [line[0] for line, _ in lines] == list(heads)
    assert [mark for _, mark in lines] == ["，", "。"] * (len(heads) // 2)
    assert all(s.endswith("✓") for s in constraints.acrostic_report(view.poem, heads, n))
    assert view.summary().splitlines()[0].startswith(heads[0])


def test_acrostic_structure_flags_a_broken_poem():
    assert not constraints.is_acrostic("春风吹，月明。", "春月", 3)  # the second line is one character short
    report = constraints.acrostic_report("春风吹，月明。", "春月", 3)
    assert report[0].endswith("✓") and report[1].endswith("✗")
    assert constraints.acrostic_report("春风吹，", "春月", 3)[-1] == "1 lines for 2 heads ✗"


@pytest.mark.parametrize("heads,needle", [("", "Type one Chinese character"), ("AI好", "「A」"),
                                          ("春，", "Chinese characters"), ("春" * 17, "do not fit")])
def test_acrostic_view_messages(char, heads, needle):
    model, tok = char
    view = acrostic_writer.acrostic_view(model, tok, heads, 7)
    assert not view.ok and needle in view.message and "color" in view.html()


def test_acrostic_writer_follows_its_controls(char):
    model, tok = char
    w = acrostic_writer.AcrosticWriter(model, tok, "春眠不觉", 7, temperature=0.8, seed=1337)
    assert constraints.is_acrostic(w.view.poem, "春眠不觉", 7) and "春" in w.poem.value
    w.heads.value = "学无 止境"  # spaces are ignored
    w.chars_per_line.value = 5
    assert w.view.heads == "学无止境" and constraints.is_acrostic(w.view.poem, "学无止境", 5)
    poem = w.view.poem
    w.seed.value = 7
    assert constraints.is_acrostic(w.view.poem, "学无止境", 5) and w.view.poem != poem
    w.heads.value = "hi"
    assert not w.view.ok and "「h」" in w.poem.value


# --- plots used by the widgets --------------------------------------------------------------------


def test_acrostic_writer_shows_a_failed_update_in_place_of_the_poem(char, monkeypatch):
    model, tok = char
    w = acrostic_writer.AcrosticWriter(model, tok, "春眠不觉")

    def broken(*args, **kwargs):
        raise RuntimeError("the ink ran dry")

    monkeypatch.setattr(acrostic_writer, "acrostic_view", broken)
    w.seed.value = 9
    assert "the ink ran dry" in w.poem.value and w.info.value == "" and w.view is None
    monkeypatch.undo()
    w.seed.value = 10
    assert w.view.ok and "seed 10" in w.info.value


def test_acrostic_writer_refuses_values_off_its_controls(char):
    from traitlets import TraitError

    model, tok = char
    w = acrostic_writer.AcrosticWriter(model, tok, "春眠不觉", temperature=0.8)
    with pytest.raises(TraitError, match="temperature 3.0 is off"):
        w.temperature.value = 3.0
    assert w.temperature.value == 0.8 and "refused" in w.poem.value and "0.80" in w.info.value  # the poem stays
    with pytest.raises(TraitError):
        w.chars_per_line.value = 6  # not one of the toggle's options
    assert w.chars_per_line.value == 7


def test_acrostic_writer_fits_any_width(char):
    from .widget_checks import assert_fits

    model, tok = char
    w = acrostic_writer.AcrosticWriter(model, tok, "春眠不觉")
    assert_fits(w)
    w.heads.value = "春眠不觉晓处处闻啼鸟夜来风雨声花落"
    assert_fits(w)
    w.heads.value = "AI"
    assert_fits(w)


def test_a_tokenizer_that_splits_characters_is_refused_up_front(shipped_bpe):
    from kvlib.notebook.acrostic_writer import AcrosticWriter

    with pytest.raises(ValueError, match="tokenizer must be the character model's.*got a 'bpe' tokenizer"):
        AcrosticWriter(*shipped_bpe)
