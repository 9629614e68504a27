"""Shared message helpers of the widgets."""
import warnings

import pytest
import torch

from kvlib import constraints, text
from kvlib.notebook import acrostic_writer, next_character, plots, sampling_explorer, show
from kvlib.sampling import probabilities
from kvlib.tokenizer import UnknownCharacterError

PNG = b"\x89PNG"



# --- shared helpers -------------------------------------------------------------------------

def test_unknown_message_names_every_character():
    msg = show.unknown_message(UnknownCharacterError(["h", " ", "é"]))
    assert "「h」" in msg and "a space" in msg and "「é」" in msg
    assert "Traceback" not in msg


def test_format_top_rounds_to_one_decimal():
    assert show.format_top("春风", [("。", 0.1424), ("\n", 0.05)]) == "「春风」→ 。 14.2%  ⏎ 5.0%"


# --- notebook 1: the prompt box -----------------------------------------------------------------


@pytest.mark.parametrize("make, fragment", [
    (lambda m, t: sampling_explorer.SliderExplorer(m, t, temperature=5.0), r"temperature must be a number in \[0.0, 2.0\].*5.0"),
    (lambda m, t: sampling_explorer.SliderExplorer(m, t, top_k=101), r"top_k .*\[0, 100\].*101"),
    (lambda m, t: sampling_explorer.SliderExplorer(m, t, seed=-1), r"seed .*-1"),
    (lambda m, t: sampling_explorer.explore(m, t, "春", n_chars=0), r"n_chars .*got 0"),
    (lambda m, t: sampling_explorer.explore(m, t, "春", n_chars=200), r"n_chars .*\[1, 128\].*200"),
    (lambda m, t: sampling_explorer.explore(m, t, "春", n_chars=-5), r"n_chars .*-5"),
    (lambda m, t: sampling_explorer.explore(m, t, "春", n_bars=10**6), r"n_bars .*1000000"),
    (lambda m, t: sampling_explorer.explore(m, t, "春", temperature="hot"), r"temperature .*'hot'"),
    (lambda m, t: sampling_explorer.explore(m, t, "春", seed="abc"), r"seed .*'abc'"),
    (lambda m, t: acrostic_writer.acrostic_view(m, t, "春眠", chars_per_line=-1), r"chars_per_line must be 5 or 7, got -1"),
    (lambda m, t: acrostic_writer.acrostic_view(m, t, "春眠", 7, seed="abc"), r"seed .*'abc'"),
    (lambda m, t: acrostic_writer.AcrosticWriter(m, t, temperature=3.0), r"temperature .*3.0"),
    (lambda m, t: next_character.PromptBox(m, t, k=50), r"k must be an int in \[3, 20\].*50"),
])
def test_widgets_refuse_settings_their_controls_cannot_show(char, make, fragment):
    model, tok = char
    with pytest.raises((TypeError, ValueError), match=fragment):
        make(model, tok)
