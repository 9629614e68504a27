"""Notebook 4's stepper on screen: the picture of a step and the widget around the stepper."""
from __future__ import annotations

import html
import io
import re
import warnings

import pytest
import torch

from kvlib.notebook.cache_stepper import StepperWidget, view_html
from kvlib.stepper import CacheStepper

@pytest.fixture(scope="module")
def tok(tiny_char_tokenizer):
    return tiny_char_tokenizer


def test_picture_shows_the_view(tiny_gpt, tok):
    s = CacheStepper(tiny_gpt, tok, "床前明月光", temperature=0.8)
    s.run(3)
    view = s.view()
    picture = view_html(view)
    assert picture.count("<svg") == 2 and f"step 3: drew 「{view.chosen_label}」" in picture
    assert f"{view.cache_length} of {view.max_len} slots" in picture
    L, H, S = view.attention.shape
    assert picture.count("<text") >= L * H + S  # a label per head row and per position (S is small)
    assert "⏎" in picture and "\n" not in picture.split("<svg", 1)[1]  # the separator drawn as ⏎
    longer = CacheStepper(tiny_gpt, tok, "床前明月光", temperature=0.8)
    longer.run(10)
    assert "position" in view_html(longer.view())


def test_widget_steps_resets_and_reports_bad_prompts(tiny_gpt, tok):
    ui = StepperWidget(tiny_gpt, tok, "春风", temperature=0.0)
    first = ui.picture.value
    assert first.startswith("<div") and ui.stepper.steps == 0
    ui.step_button.click()
    ui.step_button.click()
    assert ui.stepper.steps == 2 and ui.picture.value != first
    assert "step 2" in ui.status.value and "temperature 0.00" in ui.status.value
    ui.reset_button.click()
    assert ui.stepper.steps == 0 and ui.picture.value == first
    ui.temperature.value = 1.0
    assert ui.stepper.temperature == 1.0
    ui.prompt_box.value = "猫"
    assert ui.stepper is None and ui.step_button.disabled and "「猫」" in ui.status.value
    assert ui.picture.value == ""  # no stale picture under the message
    ui.prompt_box.value = "白日"
    assert ui.stepper.prompt == "白日" and not ui.step_button.disabled
    for _ in range(20):
        ui.step_button.click()
    assert not ui.stepper.can_step and ui.step_button.disabled and "full" in ui.status.value
    ui.prompt_box.value = "春" * 20
    assert ui.stepper is None and "shorter prompt" in ui.status.value and "Reset" not in ui.status.value


@pytest.mark.slow
def test_notebook_plots_draw_without_missing_glyphs(tiny_gpt, tok):
    from kvlib.notebook import plots
    from kvlib.model import causal_mask
    from kvlib.verify import verify_cache

    report = verify_cache(tiny_gpt, torch.tensor([[0, 5, 9]]), 8, decoder="model")
    ns = [4, 8, 16]
    mask = torch.tensor([[0, 0, 1], [1, 1, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figs = [
            plots.plot_token_forwards(ns, [30, 70, 170], [6, 10, 18], 3, {8: (70, 10)}),
            plots.plot_masks({"decode": causal_mask(1, 4), "prefill": causal_mask(3, 3)},
                             row_labels={"decode": ["3"]}, xlabel="key column"),
            plots.plot_cache_check(report),
            plots.plot_timing(ns, {"recompute": [3.0, 9.0, 30.0], "cached": [1.0, 2.0, 4.1]}),
            plots.plot_token_grid([list("xx春"), list("白日尽")], mask, title="春风 ⏎"),
        ]
        for fig in figs:
            fig.savefig(io.BytesIO(), format="png")
    masks_fig = figs[1]
    assert [ax.get_title() for ax in masks_fig.axes] == ["decode", "prefill"]
    assert masks_fig.axes[0].get_xlabel() == "key column"
    speedup = figs[3].axes[1].lines[0].get_ydata()
    assert list(speedup) == pytest.approx([3.0, 4.5, 30 / 4.1])
    grid_text = [t.get_text() for t in figs[4].axes[0].texts]
    assert grid_text == ["pad", "pad", "春", "白", "日", "尽"]


def test_widget_ignores_step_while_the_prompt_is_bad(tiny_gpt, tok):
    ui = StepperWidget(tiny_gpt, tok, "春")
    ui.prompt_box.value = "猫"
    ui._step()  # a click that reaches Python although the button is disabled
    assert ui.stepper is None and "does not know 「猫」" in ui.status.value


def test_a_new_temperature_keeps_the_steps(tiny_gpt, tok):
    ui = StepperWidget(tiny_gpt, tok, "春风", temperature=0.8, seed=3)
    for _ in range(8):
        ui.step_button.click()
    stepper, tokens, picture = ui.stepper, list(ui.stepper.tokens), ui.picture.value
    ui.temperature.value = 1.2
    assert ui.stepper is stepper and ui.stepper.tokens == tokens and ui.stepper.steps == 8  # nothing wiped
    assert "next step at temperature 1.20" in ui.status.value and "step 8" in ui.status.value
    assert "at temperature 0.80" in ui.picture.value and ui.picture.value == picture  # the last draw, as it was
    ui.step_button.click()
    assert ui.stepper.steps == 9 and ui.stepper.tokens[:-1] == tokens
    assert "step 9: drew" in ui.picture.value and "at temperature 1.20" in ui.picture.value
    ui.reset_button.click()
    assert ui.stepper.steps == 0 and ui.stepper.temperature == 1.2  # Reset starts again with the new setting


def test_temperature_zero_shows_what_the_explorer_shows(char):
    """Both widgets draw the distribution with the core's ``probabilities``: one bar, 100 %, the argmax."""
    from kvlib.notebook.sampling_explorer import SliderExplorer
    from kvlib.poems import next_token_probs

    model, tok = char
    ui = StepperWidget(model, tok, "春风", temperature=0.0)
    ex = SliderExplorer(model, tok, prompt="春风", temperature=0.0)
    argmax = tok.decode([int(next_token_probs(model, tok, "春风").argmax())])
    for chart in (ui.picture.value, ex.chart.value):
        assert chart.count("%</span>") == 1 and "100.0 %" in chart and f">{argmax}</span>" in chart
    assert ui.stepper.view().top_probs == [1.0] and ex.view.probs[0] == 1.0
    ui.step_button.click()
    assert ui.stepper.tokens[-1] == tok.encode(argmax)[0] and ex.view.poem.startswith(argmax)
    assert ui.picture.value.count("%</span>") == 1 and "100.0 %" in ui.picture.value


def test_a_failed_step_shows_a_message_and_clears_the_picture(tiny_gpt, tok, monkeypatch):
    ui = StepperWidget(tiny_gpt, tok, "春风")

    def broken(self):
        raise RuntimeError("the cache caught fire")

    monkeypatch.setattr(CacheStepper, "step", broken)
    ui.step_button.click()
    assert "the cache caught fire" in ui.status.value and ui.picture.value == "" and ui.step_button.disabled
    assert ui.stepper is None
    monkeypatch.undo()
    ui.reset_button.click()
    assert ui.stepper is not None and ui.picture.value and not ui.step_button.disabled


def test_a_temperature_off_the_slider_is_refused_and_the_steps_stay(tiny_gpt, tok):
    from traitlets import TraitError

    ui = StepperWidget(tiny_gpt, tok, "春风", temperature=0.8)
    ui.step_button.click()
    with pytest.raises(TraitError, match=r"temperature 2.0 is off the slider's range \[0.0, 1.5\]"):
        ui.temperature.value = 2.0
    assert ui.temperature.value == 0.8 and ui.stepper.temperature == 0.8 and ui.stepper.steps == 1
    assert "refused" in ui.status.value and ui.picture.value
    with pytest.raises(ValueError, match="temperature"):
        StepperWidget(tiny_gpt, tok, "春风", temperature=2.0)  # never clamped to 1.5


def test_the_stepper_fits_any_width_up_to_a_full_cache(char):
    from .widget_checks import assert_fits

    model, tok = char
    ui = StepperWidget(model, tok, "床前看月光，", temperature=0.8)
    assert_fits(ui)
    while ui.stepper.can_step:  # to a full cache: 128 slots, attention over 128 positions
        ui.stepper.step()
    ui._refresh()
    assert "full" in ui.status.value
    assert_fits(ui)
    assert ui.picture.value.count("viewBox") == 2


def test_the_status_line_decodes_byte_level_tokens_together(shipped_bpe):
    """Each byte decoded alone would be "\ufffd"; decoded together they are the text the stepper wrote."""
    model, tok = shipped_bpe
    ui = StepperWidget(model, tok, "床前明月光，", seed=3)
    for _ in range(12):
        ui.step_button.click()
    text = ui.stepper.text().split("\n")[-1]
    shown = html.unescape(re.sub(r"<[^>]+>", "", ui.status.value.split("<br>")[0]))
    assert shown.replace("⏎", "\n").endswith(text[len("床前明月光，"):]) and shown.count("\ufffd") <= text.count("\ufffd")


def test_a_prompt_longer_than_the_cache_says_how_many_characters_fit(char):
    model, tok = char
    ui = StepperWidget(model, tok)
    ui.prompt_box.value = "春" * 128
    assert "The prompt is too long: the model reads 128 tokens, so at most 127 characters fit" in ui.status.value
