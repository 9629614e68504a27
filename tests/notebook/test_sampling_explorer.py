"""Notebook 2's sampling explorer: explore() and the slider widget."""
import warnings

import pytest
import torch

from kvlib import constraints, text
from kvlib.notebook import acrostic_writer, next_character, plots, sampling_explorer, show
from kvlib.sampling import probabilities
from kvlib.tokenizer import UnknownCharacterError

PNG = b"\x89PNG"



def test_explore_writes_48_characters_reproducibly(char):
    model, tok = char
    a = sampling_explorer.explore(model, tok, "春风", temperature=1.0, top_k=40, seed=3)
    b = sampling_explorer.explore(model, tok, "春风", temperature=1.0, top_k=40, seed=3)
    c = sampling_explorer.explore(model, tok, "春风", temperature=1.0, top_k=40, seed=4)
    assert a.ok and len(a.poem) == 48
    assert a.poem == b.poem and a.poem != c.poem


def test_explore_first_step_is_the_next_token_distribution(char):
    model, tok = char
    view = sampling_explorer.explore(model, tok, "春风", temperature=1.0, seed=0, n_bars=10)
    probs = text.next_token_probs(model, tok, "春风")
    values, ids = probs.topk(10)
    assert view.chars == [tok.decode([i]) for i in ids.tolist()]
    assert view.probs == pytest.approx(values.tolist(), abs=1e-5)
    assert view.n_kept == tok.vocab_size and all(view.kept) and view.kept_mass == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.5), (30, 0.9)])
def test_explore_kept_set_matches_the_sampler(char, top_k, top_p):
    model, tok = char
    view = sampling_explorer.explore(model, tok, "春风", temperature=1.2, top_k=top_k, top_p=top_p, seed=0, n_bars=12)
    logits = text.next_token_probs(model, tok, "春风")[None].log()
    kept = probabilities(logits, 1.2, top_k or None, top_p if top_p < 1 else None)[0] > 0
    assert view.n_kept == int(kept.sum())
    assert view.kept == [bool(kept[tok.encode(c)[0]]) for c in view.chars]
    if top_k == 5:
        assert view.kept == [True] * 5 + [False] * 7


def test_explore_temperature_zero_ignores_the_seed(char):
    model, tok = char
    views = [sampling_explorer.explore(model, tok, "春风", temperature=0.0, top_k=10, seed=s) for s in range(3)]
    assert len({v.poem for v in views}) == 1
    assert views[0].n_kept == 1 and views[0].kept[0] and views[0].probs[0] == pytest.approx(1.0)


def test_explore_messages_instead_of_errors(char):
    model, tok = char
    assert "「x」" in sampling_explorer.explore(model, tok, "春x").message
    too_long = sampling_explorer.explore(model, tok, "春" * 100)
    assert not too_long.ok and "too long" in too_long.message


def test_slider_explorer_updates_when_sliders_move(char):
    model, tok = char
    ex = sampling_explorer.SliderExplorer(model, tok, prompt="春风", temperature=1.0, top_k=8, top_p=1.0, seed=0)
    assert ex.view.ok and ex.view.top_k == 8 and ex.view.top_p is None
    assert ex.chart.value.count("%</span>") == 12 and "春风" in ex.poem.value and "top-k 8" in ex.info.value
    assert set(ex.timing) == {"poem_ms", "update_ms", "poem_cpu_ms", "update_cpu_ms"}

    chart, poem = ex.chart.value, ex.view.poem
    ex.seed.value = 1  # a new poem; the first step's distribution is unchanged, so the chart stays
    assert ex.view.seed == 1 and ex.view.poem != poem and ex.chart.value == chart and "seed 1" in ex.info.value

    ex.top_k.value = 0  # off
    assert ex.view.top_k is None and ex.view.n_kept == tok.vocab_size and ex.chart.value != chart
    ex.top_p.value = 0.5
    assert ex.view.top_p == 0.5 and 1 <= ex.view.n_kept < tok.vocab_size
    ex.temperature.value = 0.0
    assert ex.view.n_kept == 1 and len(ex.view.poem) == 48
    assert ex.chart.value.count("%</span>") == 1 and "1 token kept" in ex.chart.value  # only what is kept

    ex.prompt.value = "ab"
    assert not ex.view.ok and "「a」" in ex.poem.value and ex.chart.value == ""  # no stale chart
    ex.prompt.value = ""
    assert ex.view.ok and ex.view.prompt == "" and len(ex.view.poem) == 48


def test_measure_update_latency_reports_milliseconds(char):
    model, tok = char
    result = sampling_explorer.measure_update_latency(model, tok, repeats=1, prompt="春风", top_k=8)
    assert result["new_tokens"] == 48
    for key in ("temperature_change_poem_ms", "temperature_change_update_ms", "seed_change_update_ms",
                "temperature_change_poem_cpu_ms", "temperature_change_update_cpu_ms"):
        assert result[key] > 0  # a timing, never compared with a target in a test


# --- notebook 3: acrostics ----------------------------------------------------------------------
