"""Notebook 1's prompt box: its view function and the widget driven by setting control values."""

import pytest

from kvlib import poems
from kvlib.notebook import next_character, show

PNG = b"\x89PNG"



def test_next_view_matches_top_next(char):
    model, tok = char
    view = next_character.next_view(model, tok, "春风", k=8)
    assert view.ok and len(view.chars) == len(view.probs) == 8
    expected = poems.top_next(model, tok, "春风", 8)
    assert view.chars == [c for c, _ in expected]
    assert view.probs == pytest.approx([p for _, p in expected])
    assert view.probs == sorted(view.probs, reverse=True)
    assert view.summary().startswith("「春风」→ ")


def test_next_view_unknown_characters_give_a_message(char):
    model, tok = char
    view = next_character.next_view(model, tok, "床前 hello")
    assert not view.ok
    for ch in "helo":
        assert f"「{ch}」" in view.message
    assert "a space" in view.message


def test_prompt_box_redraws_on_new_values(char):
    model, tok = char
    box = next_character.PromptBox(model, tok, "春风", k=8)
    assert box.view.ok and len(box.view.chars) == 8
    first = box.chart.value
    assert first.count("%</span>") == 8 and "「春风」" in first
    box.prompt.value = "床前明月光，疑是地上"
    assert box.view.text == "床前明月光，疑是地上" and box.chart.value != first
    box.k.value = 12
    assert len(box.view.chars) == 12 and box.chart.value.count("%</span>") == 12
    box.prompt.value = "hello 春风"
    assert not box.view.ok and "「h」" in box.chart.value and "%</span>" not in box.chart.value  # no stale chart
    box.prompt.value = "春风"
    assert box.view.ok and box.chart.value.count("%</span>") == 12


def test_prompt_box_output_is_followed_by_a_static_copy(char, monkeypatch):
    """Two outputs: the widget view, then the static copy as plain HTML that any renderer shows."""
    model, tok = char
    box = next_character.PromptBox(model, tok, "春风", k=8)
    published = []
    monkeypatch.setattr("IPython.display.display", lambda *bundles, raw: published.extend(bundles))
    show.LiveWidget(box.widget, box.html())._ipython_display_()
    live, static = published
    assert set(live) == {"application/vnd.jupyter.widget-view+json", "text/plain"}
    assert live["text/plain"] == show.LIVE_NOTE
    assert set(static) == {"text/html", "text/plain"} and static["text/plain"] == show.STATIC_NOTE
    assert show.STATIC_CLASS in static["text/html"] and box.html() in static["text/html"]


def test_prompt_box_empty_prompt_is_a_poem_start(char):
    model, tok = char
    view = next_character.next_view(model, tok, "")
    assert view.ok
    assert view.chars[0] == tok.decode([int(poems.next_token_probs(model, tok, "").argmax())])


# --- notebook 2: the slider explorer ---------------------------------------------------------


def test_prompt_box_shows_a_failed_update_in_place_of_the_bars(char, monkeypatch):
    model, tok = char
    box = next_character.PromptBox(model, tok, "春风", k=8)

    def broken(*args, **kwargs):
        raise RuntimeError("no model today")

    monkeypatch.setattr(next_character, "next_view", broken)
    box.k.value = 10
    assert "no model today" in box.chart.value and "%</span>" not in box.chart.value and box.view is None
    assert "no model today" in box.html()  # the static copy says so too
    monkeypatch.undo()
    box.k.value = 9
    assert box.view.ok and box.chart.value.count("%</span>") == 9


def test_prompt_box_refuses_a_k_off_its_slider(char):
    from traitlets import TraitError

    model, tok = char
    box = next_character.PromptBox(model, tok, "春风", k=8)
    with pytest.raises(TraitError, match="top k 50 is off the slider's range"):
        box.k.value = 50
    assert box.k.value == 8 and "refused" in box.chart.value and "%</span>" in box.chart.value  # the bars stay


def test_prompt_box_fits_any_width(char):
    from .widget_checks import assert_fits

    model, tok = char
    box = next_character.PromptBox(model, tok, "春风", k=8)
    assert_fits(box)
    box.k.value = 20
    box.prompt.value = "床前明月光，疑是地上霜。举头望明月，低头思故乡。" * 3
    assert_fits(box)
    box.prompt.value = "hello"
    assert_fits(box)


def test_a_prompt_longer_than_the_model_reads_gets_a_message_not_a_silent_cut(char):
    from kvlib.notebook.next_character import next_view

    model, tok = char
    view = next_view(model, tok, "春" * 300)
    assert not view.ok and "The prompt is too long: the model reads 128 tokens, so at most 127 characters" in view.message
    assert next_view(model, tok, "春" * 127).ok


def test_invisible_characters_are_named_in_the_message(char):
    from kvlib.notebook.next_character import next_view

    model, tok = char
    message = next_view(model, tok, "春\xa0风\u200b").message
    assert "a non-breaking space" in message and "U+200B (zero width space)" in message
