"""Notebook 2's sampling explorer: explore() and the slider widget."""

import pytest

from kvlib import poems
from kvlib.notebook import sampling_explorer
from kvlib.notebook.sampling_explorer import N_CHARS, SliderExplorer
from kvlib.notebook.show import HIGHLIGHT_COLOR
from kvlib.sampling import probabilities

PNG = b"\x89PNG"



def test_explore_writes_n_chars_characters_reproducibly(char):
    model, tok = char
    a = sampling_explorer.explore(model, tok, "春风", temperature=1.0, top_k=40, seed=3)
    b = sampling_explorer.explore(model, tok, "春风", temperature=1.0, top_k=40, seed=3)
    c = sampling_explorer.explore(model, tok, "春风", temperature=1.0, top_k=40, seed=4)
    assert a.ok and len(a.poem) == N_CHARS
    assert a.poem == b.poem and a.poem != c.poem


def test_explore_first_step_is_the_next_token_distribution(char):
    model, tok = char
    view = sampling_explorer.explore(model, tok, "春风", temperature=1.0, seed=0, n_bars=10)
    probs = poems.next_token_probs(model, tok, "春风").clone()
    probs[poems.unk_ids(tok)] = 0.0  # <unk> is banned before the draw: the rest share its probability
    values, ids = (probs / probs.sum()).topk(10)
    assert view.chars == [tok.decode([i]) for i in ids.tolist()]
    assert view.probs == pytest.approx(values.tolist(), abs=1e-5)
    writable = tok.vocab_size - len(poems.unk_ids(tok))  # <unk> is never written
    assert view.n_kept == writable and all(view.kept) and view.kept_mass == pytest.approx(1.0, abs=1e-4)
    assert f"{writable:,} of {tok.vocab_size:,} tokens kept" in view.kept_line() and "<unk>" in view.kept_line()


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (None, 0.5), (30, 0.9)])
def test_explore_kept_set_matches_the_sampler(char, top_k, top_p):
    model, tok = char
    view = sampling_explorer.explore(model, tok, "春风", temperature=1.2, top_k=top_k, top_p=top_p, seed=0, n_bars=12)
    logits = poems.next_token_probs(model, tok, "春风")[None].log().clone()
    logits[:, poems.unk_ids(tok)] = float("-inf")  # the explorer bans <unk> before the filters
    kept = probabilities(logits, 1.2, top_k, top_p if top_p < 1 else None)[0] > 0
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
    assert ex.view.top_k is None and ex.view.n_kept == tok.vocab_size - 1 and ex.chart.value != chart
    ex.top_p.value = 0.5
    assert ex.view.top_p == 0.5 and 1 <= ex.view.n_kept < tok.vocab_size
    ex.temperature.value = 0.0
    assert ex.view.n_kept == 1 and len(ex.view.poem) == N_CHARS
    assert ex.chart.value.count("%</span>") == 1 and "1 token kept" in ex.chart.value  # only what is kept

    ex.prompt.value = "ab"
    assert not ex.view.ok and "「a」" in ex.poem.value and ex.chart.value == ""  # no stale chart
    ex.prompt.value = ""
    assert ex.view.ok and ex.view.prompt == "" and len(ex.view.poem) == N_CHARS


def test_measure_update_latency_reports_milliseconds(char):
    model, tok = char
    result = sampling_explorer.measure_update_latency(model, tok, repeats=1, prompt="春风", top_k=8)
    assert result["new_tokens"] == N_CHARS
    for key in ("temperature_change_poem_ms", "temperature_change_update_ms", "seed_change_update_ms",
                "temperature_change_poem_cpu_ms", "temperature_change_update_cpu_ms"):
        assert result[key] > 0  # a timing, never compared with a target in a test
    low, high = result["temperature_change_poem_low_ms"], result["temperature_change_poem_high_ms"]
    assert 0 < low <= result["temperature_change_poem_ms"] <= high


# --- notebook 3: acrostics ----------------------------------------------------------------------


def test_the_explorer_carries_its_own_claims(char):
    """What the notebook once printed under the widget ("eight tokens are kept") is the widget's own live line."""
    model, tok = char
    ex = sampling_explorer.SliderExplorer(model, tok, prompt="春风", temperature=1.0, top_k=8, seed=0)
    assert "first step: 8 tokens kept" in ex.chart.value and "first step: 8 of" in ex.info.value
    ex.top_k.value = 1
    assert "first step: 1 token kept" in ex.chart.value and "first step: 1 of" in ex.info.value
    ex.top_k.value = 0
    n = tok.vocab_size - 1
    assert f"first step: {n:,} tokens kept" in ex.chart.value and f"first step: {n:,} of" in ex.info.value


def test_at_temperature_zero_one_bar_at_100_percent(char):
    model, tok = char
    ex = sampling_explorer.SliderExplorer(model, tok, prompt="春风", temperature=0.0, top_k=8, seed=0)
    argmax = tok.decode([int(poems.next_token_probs(model, tok, "春风").argmax())])
    assert ex.chart.value.count("%</span>") == 1 and "100.0 %" in ex.chart.value and argmax in ex.chart.value


def test_a_failed_update_shows_a_message_and_clears_the_rest(char, monkeypatch):
    model, tok = char
    ex = sampling_explorer.SliderExplorer(model, tok, prompt="春风", top_k=8)
    assert ex.chart.value and ex.info.value

    def broken(*args, **kwargs):
        raise RuntimeError("the model is out of order")

    monkeypatch.setattr(sampling_explorer, "explore", broken)
    ex.seed.value = 5
    assert "out of order" in ex.poem.value and ex.chart.value == "" and ex.info.value == "" and ex.view is None
    monkeypatch.undo()
    ex.seed.value = 6
    assert ex.view.ok and ex.chart.value and "seed 6" in ex.info.value


def test_a_value_off_a_slider_is_refused_with_a_message(char):
    from traitlets import TraitError

    model, tok = char
    ex = sampling_explorer.SliderExplorer(model, tok, prompt="春风", temperature=1.0)
    with pytest.raises(TraitError, match=r"temperature 5.0 is off the slider's range \[0.0, 2.0\]"):
        ex.temperature.value = 5.0
    assert ex.temperature.value == 1.0  # not clamped to 2.0
    assert "refused" in ex.poem.value and ex.chart.value  # the bars of temperature 1.0 stay
    with pytest.raises(TraitError):
        ex.top_k.value = -3
    assert ex.top_k.value == 0
    ex.temperature.value = 0.5
    assert ex.view.ok and ex.view.temperature == 0.5 and ex.chart.value


def test_the_explorer_fits_any_width_in_every_state(char):
    from .widget_checks import assert_fits

    model, tok = char
    ex = sampling_explorer.SliderExplorer(model, tok, prompt="春风", top_k=8)
    assert_fits(ex)
    for change in (dict(temperature=0.0), dict(top_k=0), dict(top_p=0.3), dict(prompt="ab"), dict(prompt="")):
        for name, value in change.items():
            getattr(ex, name).value = value
        assert_fits(ex)


def test_byte_level_tokens_get_distinct_labels_and_only_kept_bars_are_orange(shipped_bpe):
    """Decoded alone, a byte of a character is "\ufffd": every such bar looked alike and all were coloured as one."""
    from kvlib.notebook.sampling_explorer import explore

    model, tok = shipped_bpe
    view = explore(model, tok, prompt="春", top_k=3, n_bars=12)
    assert len(set(view.chars)) == len(view.chars) and "\ufffd" not in "".join(view.chars)
    chart = SliderExplorer(model, tok, prompt="春", top_k=3).chart.value
    assert chart.count(HIGHLIGHT_COLOR) == sum(view.kept) == 3
