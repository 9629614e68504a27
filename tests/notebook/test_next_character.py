"""Notebook 1's prompt box: its view function and the widget driven by setting control values."""
import warnings

import pytest
import torch

from kvlib import constraints, text
from kvlib.notebook import acrostic_writer, next_character, plots, sampling_explorer, show
from kvlib.sampling import probabilities
from kvlib.tokenizer import UnknownCharacterError

PNG = b"\x89PNG"



def test_next_view_matches_top_next(char):
    model, tok = char
    view = next_character.next_view(model, tok, "春风", k=8)
    assert view.ok and len(view.chars) == len(view.probs) == 8
    expected = text.top_next(model, tok, "春风", 8)
    assert view.chars == [c for c, _ in expected]
    assert view.probs == pytest.approx([p for _, p in expected])
    assert view.probs == sorted(view.probs, reverse=True)
    assert view.summary().startswith("「春风」→ ")


def test_next_view_unknown_characters_give_a_message(char):
    model, tok = char
    view = next_character.next_view(model, tok, "床前 hello")
    assert not view.ok and view.figure() is None
    for ch in "helo":
        assert f"「{ch}」" in view.message
    assert "a space" in view.message


def test_prompt_box_redraws_on_new_values(char):
    model, tok = char
    box = next_character.PromptBox(model, tok, "春风", k=8)
    assert box.view.ok and box.png.startswith(PNG) and bytes(box.image.value) == box.png
    assert len(box.view.chars) == 8
    first_png = box.png
    box.prompt.value = "床前明月光，疑是地上"
    assert box.view.text == "床前明月光，疑是地上" and box.png != first_png
    box.k.value = 12
    assert len(box.view.chars) == 12
    box.prompt.value = "hello 春风"
    assert not box.view.ok and "「h」" in box.message.value and box.image.layout.display == "none"
    box.prompt.value = "春风"
    assert box.view.ok and box.message.value == "" and box.image.layout.display is None


def test_prompt_box_empty_prompt_is_a_poem_start(char):
    model, tok = char
    view = next_character.next_view(model, tok, "")
    assert view.ok
    assert view.chars[0] == tok.decode([int(text.next_token_probs(model, tok, "").argmax())])


# --- notebook 2: the slider explorer ---------------------------------------------------------
