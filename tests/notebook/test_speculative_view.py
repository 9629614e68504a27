"""Notebook 8's round-by-round view: rounds, colours, α, reset, bad prompts, the static copy; and the counts its
exercise prose quotes."""
import html

import pytest
import torch

from kvlib.decoding import generate
from kvlib.notebook.show import LiveWidget
from kvlib.notebook.speculative_view import SpeculativeView, round_html
from kvlib.speculative import NeuralDraft, NgramDraft, Round
from kvlib.poems import encode_prompt
from kvlib.tools.spec_bench import corpus_ids


def small_drafts(model, tok):
    from kvlib.tools.corpus import load_poems, split

    ids = corpus_ids(tok, split(load_poems())[0][:2000])
    ngram = NgramDraft.from_ids(ids, tok.vocab_size)
    return {"n-gram + lookup": ngram.with_lookup(), "self": NeuralDraft(model, name="self")}


def test_rounds_step_colour_and_reset(char, monkeypatch):
    model, tok = char
    view = SpeculativeView(model, tok, small_drafts(model, tok), "白日依山尽，", gamma=3, max_new_tokens=24,
                           start_rounds=2)
    d = view.decoder
    assert len(d.rounds) == 2 and "round 2" in view.output.value and "round 3" not in view.output.value
    view.step_button.click()
    assert len(view.decoder.rounds) == 3 and "round 3" in view.output.value
    assert "α = " in view.output.value and 0 <= view.alpha <= 1
    while not view.step_button.disabled:
        view.step_button.click()
    want = generate(model, torch.tensor([encode_prompt(tok, "白日依山尽，")]), 24, temperature=0.0)
    assert view.decoder.tokens == want.tokens[0].tolist()         # greedy: the target's own text
    assert "stopped: max_new_tokens" in view.output.value
    view.draft_menu.value = "self"                                 # the target as its own draft: all kept
    assert len(view.decoder.rounds) == 2 and view.alpha == 1.0 and "spec-bonus" in view.output.value
    view.gamma.value = 5
    assert view.decoder.gamma == 5
    view.reset_button.click()
    assert len(view.decoder.rounds) == 2
    shown = []
    monkeypatch.setattr("kvlib.notebook.speculative_view.display", shown.append)
    assert view.show() is None and isinstance(shown[0], LiveWidget) and "round 1" in shown[0].static_html


def test_bad_prompt_disables_the_button(char):
    model, tok = char
    view = SpeculativeView(model, tok, small_drafts(model, tok), start_rounds=0)
    assert "press Round" in view.output.value
    view.prompt_box.value = "猫a"
    assert view.decoder is None and view.step_button.disabled and "does not know" in view.output.value
    view.step()  # a click that reaches Python although the button is disabled
    assert view.summary() == "no decoder: fix the prompt"


def test_round_colours(char):
    _, tok = char
    ids = tok.encode("春风花")
    line = round_html(tok, Round(ids, 1, ids[0]), 1)
    assert line.count("spec-kept") == 1 and line.count("spec-rejected") == 1 and "spec-correction" in line
    assert line.count("spec-unjudged") == 1  # after the first rejection the round stops: never judged
    assert "spec-unjudged" not in round_html(tok, Round(ids, 2, ids[0]), 1)
    assert "spec-bonus" in round_html(tok, Round(ids[:2], 2, ids[2]), 2)


def test_byte_level_guesses_are_labelled_apart(bpe_tokenizer):
    """Two bytes of 月 guessed alone would each decode to U+FFFD: the line shows their bytes instead."""
    first, second = "月".encode()[:2]  # ids 0-255 are single bytes
    line = round_html(bpe_tokenizer, Round([first, second], 1, second), 1)
    assert "\ufffd" not in line and f"{first:02x}" in line and f"{second:02x}" in line


def test_failures_show_in_place_and_disable_the_round_button(char, monkeypatch):
    from kvlib.speculative import SpeculativeDecoder

    model, tok = char
    drafts = {"self": NeuralDraft(model, name="self")}
    view = SpeculativeView(model, tok, drafts, "白日依山尽，", max_new_tokens=16, start_rounds=1)
    view.prompt_box.value = "春" * 200  # longer than the model's block: a message, not a traceback
    assert view.decoder is None and view.step_button.disabled
    assert "The prompt is too long: the model reads 128 tokens, so at most 127 characters fit" in view.output.value
    view.prompt_box.value = "春风"
    assert view.decoder is not None and "round 1" in view.output.value

    def broken(self):
        raise RuntimeError("the draft fell asleep")

    monkeypatch.setattr(SpeculativeDecoder, "round", broken)
    view.step_button.click()
    assert "the draft fell asleep" in view.output.value and "round 1" not in view.output.value
    assert view.step_button.disabled and view.decoder is None


def test_settings_off_the_controls_are_refused(char):
    import pytest
    from traitlets import TraitError

    model, tok = char
    drafts = {"self": NeuralDraft(model, name="self")}
    with pytest.raises(ValueError, match=r"gamma .*\[1, 8\].*20"):
        SpeculativeView(model, tok, drafts, gamma=20)  # never clamped to 8
    view = SpeculativeView(model, tok, drafts, gamma=4, max_new_tokens=8, start_rounds=0)
    with pytest.raises(TraitError, match="γ 0 is off"):
        view.gamma.value = 0
    assert view.gamma.value == 4 and "refused" in view.output.value and not view.step_button.disabled  # rounds go on


def test_the_view_fits_any_width(char):
    from .widget_checks import assert_fits

    model, tok = char
    view = SpeculativeView(model, tok, small_drafts(model, tok), "白日依山尽，", gamma=8, max_new_tokens=48,
                           start_rounds=0)
    assert_fits(view)
    while not view.step_button.disabled:
        view.step_button.click()
    assert_fits(view)
    view.prompt_box.value = "猫a"
    assert_fits(view)


def test_a_huge_number_of_start_rounds_stops_when_the_text_is_done(char):
    model, tok = char
    view = SpeculativeView(model, tok, small_drafts(model, tok), "白日依山尽，", max_new_tokens=6, start_rounds=10**12)
    assert view.decoder.done and view.decoder.n_new == 6


def test_a_model_or_draft_it_cannot_use_is_refused_when_the_view_is_made(char):
    from kvlib.compress import grouped
    from kvlib.model import GPT, GPTConfig

    model, tok = char
    with pytest.raises(ValueError, match="SpeculativeView needs a multi-head attention model.*without speculation"):
        SpeculativeView(grouped(model, 2), tok, {"self": NeuralDraft(model, name="self")})
    with torch.random.fork_rng(devices=[]):  # a random model, the global generator left alone
        other = NeuralDraft(GPT(GPTConfig(vocab_size=512, n_layer=1, n_head=2, n_embd=16)))
    with pytest.raises(ValueError, match=r"drafts\['small'\] guesses among 512 token ids.*7184"):
        SpeculativeView(model, tok, {"small": other})


def test_the_text_comes_with_its_english():
    from kvlib.notebook.english import TRANSLATIONS
    from kvlib.notebook.speculative_view import english_html

    text = next(iter(TRANSLATIONS))
    assert html.escape(TRANSLATIONS[text]) in english_html(text, text[-3:])  # a translation stored for exactly that text
    glossed = english_html("独在异乡为异客，月明。", "月明。")        # no translation: the new characters' glosses
    assert "月 moon" in glossed and "明 bright" in glossed and "。" not in glossed
    assert english_html("独在异乡为异客，", "，") == ""                # nothing with a gloss: no line at all


def test_notebook_8_counts_its_exercise_checks_cases_in_words():
    """The prose above each exercise cell says how many cases its check tries: it must match the check."""
    import json
    import re

    from kvlib.notebook import catalog
    from kvlib.notebook.exercises import check_best_gamma, check_blocks_to_free
    from kvlib.notebook.exercises.speculative_decoding import BLOCK_CASES

    words = {n: w for n, w in enumerate("zero one two three four five six seven eight nine ten".split())}
    cells = json.loads(catalog.by_file("08_speculative_decoding.ipynb").path.read_text(encoding="utf-8"))["cells"]
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    settings = len(inspect_default(check_best_gamma, "cases"))
    assert f"the check tries {words[settings]} settings of α" in prose
    by_8 = sum(size == 8 for *_, size in BLOCK_CASES)
    assert f"the check tries {words[len(BLOCK_CASES)]} roll-backs, {words[by_8]} of them with blocks of 8" in prose
    assert inspect_default(check_blocks_to_free, "cases") == BLOCK_CASES
    assert not re.search(r"the check tries \w+ (settings|roll-backs)", prose.replace(
        f"the check tries {words[settings]} settings", "").replace(f"the check tries {words[len(BLOCK_CASES)]} roll-backs", ""))


def inspect_default(fn, name):
    """The default of ``fn``'s parameter ``name`` (through the decorator's ``__wrapped__``)."""
    import inspect

    return inspect.signature(inspect.unwrap(fn)).parameters[name].default

