"""The notebook widgets: their logic functions, and the widgets driven by setting control values."""
import warnings

import pytest
import torch

from kvlib import plots, poems, widgets
from kvlib.sampling import probabilities
from kvlib.tokenizer import UnknownCharacterError

PNG = b"\x89PNG"


@pytest.fixture(scope="module")
def char(shipped_char):
    return shipped_char


@pytest.fixture(autouse=True)
def global_rng_untouched():
    """Every widget draws from its own generator: the global RNG must not move."""
    before = torch.get_rng_state()
    yield
    assert torch.equal(before, torch.get_rng_state())


# --- shared helpers -------------------------------------------------------------------------

def test_unknown_message_names_every_character():
    msg = widgets.unknown_message(UnknownCharacterError(["h", " ", "é"]))
    assert "「h」" in msg and "a space" in msg and "「é」" in msg
    assert "Traceback" not in msg


def test_format_top_rounds_to_one_decimal():
    assert widgets.format_top("春风", [("。", 0.1424), ("\n", 0.05)]) == "「春风」→ 。 14.2%  ⏎ 5.0%"


# --- notebook 1: the prompt box -----------------------------------------------------------------

def test_next_view_matches_top_next(char):
    model, tok = char
    view = widgets.next_view(model, tok, "春风", k=8)
    assert view.ok and len(view.chars) == len(view.probs) == 8
    expected = poems.top_next(model, tok, "春风", 8)
    assert view.chars == [c for c, _ in expected]
    assert view.probs == pytest.approx([p for _, p in expected])
    assert view.probs == sorted(view.probs, reverse=True)
    assert view.summary().startswith("「春风」→ ")


def test_next_view_unknown_characters_give_a_message(char):
    model, tok = char
    view = widgets.next_view(model, tok, "床前 hello")
    assert not view.ok and view.figure() is None
    for ch in "helo":
        assert f"「{ch}」" in view.message
    assert "a space" in view.message


def test_prompt_box_redraws_on_new_values(char):
    model, tok = char
    box = widgets.PromptBox(model, tok, "春风", k=8)
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
    view = widgets.next_view(model, tok, "")
    assert view.ok
    assert view.chars[0] == tok.decode([int(poems.next_token_probs(model, tok, "").argmax())])


# --- notebook 2: the slider explorer ---------------------------------------------------------

def test_explore_writes_48_characters_reproducibly(char):
    model, tok = char
    a = widgets.explore(model, tok, "春风", temperature=1.0, top_k=40, seed=3)
    b = widgets.explore(model, tok, "春风", temperature=1.0, top_k=40, seed=3)
    c = widgets.explore(model, tok, "春风", temperature=1.0, top_k=40, seed=4)
    assert a.ok and len(a.poem) == 48
    assert a.poem == b.poem and a.poem != c.poem


def test_explore_first_step_is_the_next_token_distribution(char):
    model, tok = char
    view = widgets.explore(model, tok, "春风", temperature=1.0, seed=0, n_bars=10)
    probs = poems.next_token_probs(model, tok, "春风")
    values, ids = probs.topk(10)
    assert view.chars == [tok.decode([i]) for i in ids.tolist()]
    assert view.probs == pytest.approx(values.tolist(), abs=1e-5)
    assert view.n_kept == tok.vocab_size and all(view.kept) and view.kept_mass == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.5), (30, 0.9)])
def test_explore_kept_set_matches_the_sampler(char, top_k, top_p):
    model, tok = char
    view = widgets.explore(model, tok, "春风", temperature=1.2, top_k=top_k, top_p=top_p, seed=0, n_bars=12)
    logits = poems.next_token_probs(model, tok, "春风")[None].log()
    kept = probabilities(logits, 1.2, top_k or None, top_p if top_p < 1 else None)[0] > 0
    assert view.n_kept == int(kept.sum())
    assert view.kept == [bool(kept[tok.encode(c)[0]]) for c in view.chars]
    if top_k == 5:
        assert view.kept == [True] * 5 + [False] * 7


def test_explore_temperature_zero_ignores_the_seed(char):
    model, tok = char
    views = [widgets.explore(model, tok, "春风", temperature=0.0, top_k=10, seed=s) for s in range(3)]
    assert len({v.poem for v in views}) == 1
    assert views[0].n_kept == 1 and views[0].kept[0] and views[0].probs[0] == pytest.approx(1.0)


def test_explore_messages_instead_of_errors(char):
    model, tok = char
    assert "「x」" in widgets.explore(model, tok, "春x").message
    too_long = widgets.explore(model, tok, "春" * 100)
    assert not too_long.ok and "too long" in too_long.message


def test_slider_explorer_updates_when_sliders_move(char):
    model, tok = char
    ex = widgets.SliderExplorer(model, tok, prompt="春风", temperature=1.0, top_k=8, top_p=1.0, seed=0)
    assert ex.view.ok and ex.view.top_k == 8 and ex.view.top_p is None
    assert ex.png.startswith(PNG) and bytes(ex.image.value) == ex.png and "春风" in ex.poem.value
    assert set(ex.timing) == {"poem_ms", "update_ms", "poem_cpu_ms", "update_cpu_ms"}

    png, poem = ex.png, ex.view.poem
    ex.seed.value = 1  # a new poem; the first step's distribution is unchanged, so the chart stays
    assert ex.view.seed == 1 and ex.view.poem != poem and ex.png is png

    ex.top_k.value = 0  # off
    assert ex.view.top_k is None and ex.view.n_kept == tok.vocab_size and ex.png != png
    ex.top_p.value = 0.5
    assert ex.view.top_p == 0.5 and 1 <= ex.view.n_kept < tok.vocab_size
    ex.temperature.value = 0.0
    assert ex.view.n_kept == 1 and len(ex.view.poem) == 48

    ex.prompt.value = "ab"
    assert not ex.view.ok and "「a」" in ex.poem.value
    ex.prompt.value = ""
    assert ex.view.ok and ex.view.prompt == "" and len(ex.view.poem) == 48


def test_measure_update_latency_reports_milliseconds(char):
    model, tok = char
    result = widgets.measure_update_latency(model, tok, repeats=1, prompt="春风", top_k=8)
    assert result["new_tokens"] == 48
    for key in ("temperature_change_poem_ms", "temperature_change_update_ms", "seed_change_update_ms",
                "temperature_change_poem_cpu_ms", "temperature_change_update_cpu_ms"):
        assert result[key] > 0  # a timing, never compared with a target in a test


# --- notebook 3: acrostics ----------------------------------------------------------------------

@pytest.mark.parametrize("heads,n", [("春眠不觉", 7), ("学无止境", 5)])
def test_acrostic_view_has_the_form(char, heads, n):
    model, tok = char
    view = widgets.acrostic_view(model, tok, heads, n, temperature=0.8, seed=1337)
    assert view.ok and widgets.is_acrostic(view.poem, heads, n)
    lines = widgets.acrostic_lines(view.poem)
    assert [line[0] for line, _ in lines] == list(heads)
    assert [mark for _, mark in lines] == ["，", "。"] * (len(heads) // 2)
    assert all(s.endswith("✓") for s in widgets.acrostic_structure(view.poem, heads, n))
    assert view.summary().splitlines()[0].startswith(heads[0])


def test_acrostic_structure_flags_a_broken_poem():
    assert not widgets.is_acrostic("春风吹，月明。", "春月", 3)  # the second line is one character short
    report = widgets.acrostic_structure("春风吹，月明。", "春月", 3)
    assert report[0].endswith("✓") and report[1].endswith("✗")
    assert widgets.acrostic_structure("春风吹，", "春月", 3)[-1] == "1 lines for 2 heads ✗"


@pytest.mark.parametrize("heads,needle", [("", "Type one Chinese character"), ("AI好", "「A」"),
                                          ("春，", "Chinese characters"), ("春" * 17, "do not fit")])
def test_acrostic_view_messages(char, heads, needle):
    model, tok = char
    view = widgets.acrostic_view(model, tok, heads, 7)
    assert not view.ok and needle in view.message and "color" in view.html()


def test_acrostic_writer_follows_its_controls(char):
    model, tok = char
    w = widgets.AcrosticWriter(model, tok, "春眠不觉", 7, temperature=0.8, seed=1337)
    assert widgets.is_acrostic(w.view.poem, "春眠不觉", 7) and "春" in w.poem.value
    w.heads.value = "学无 止境"  # spaces are ignored
    w.chars_per_line.value = 5
    assert w.view.heads == "学无止境" and widgets.is_acrostic(w.view.poem, "学无止境", 5)
    poem = w.view.poem
    w.seed.value = 7
    assert widgets.is_acrostic(w.view.poem, "学无止境", 5) and w.view.poem != poem
    w.heads.value = "hi"
    assert not w.view.ok and "「h」" in w.poem.value


# --- plots used by the widgets --------------------------------------------------------------------

def test_live_bars_and_panels_render_chinese_without_warnings():
    chars = list("春风。，⏎") + ["\n"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        live = plots.LiveBars(4)
        live.update(chars, [0.3, 0.25, 0.2, 0.1, 0.1, 0.05], highlight={"春", "。"}, title="「春风」→ ?")
        assert live.png().startswith(PNG)
        labels = [t.get_text() for t in live.ax.get_yticklabels()]
        assert labels == ["春", "风", "。", "，"]  # the four largest, largest on top
        colours = [b.get_facecolor() for b in live.bars]
        assert colours[0] == colours[2] != colours[1]
        live.update(["月"], [1.0])
        assert [t.get_text() for t in live.ax.get_yticklabels()] == ["月", "", "", ""]
        fig = plots.bar_panels([(list("春风"), [0.6, 0.4], "a"), (list("明月"), [0.5, 0.5], "b", "月")])
        assert len(fig.axes) == 2
        fig.savefig(__import__("io").BytesIO(), format="png")
    with pytest.raises(ValueError):
        live.update(list("春风"), [1.0])
