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
