"""Shared message helpers of the widgets."""

import pytest

from kvlib import poems
from kvlib.notebook import acrostic_writer, next_character, sampling_explorer, show
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
    (lambda m, t: sampling_explorer.SliderExplorer(m, t, top_k=101), r"top_k .*\[1, 100\].*101"),
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


# --- every widget fits 800 to 1920 px and reads at 16 px --------------------------------------------

import importlib  # noqa: E402
import inspect  # noqa: E402
import pkgutil  # noqa: E402

import kvlib.notebook  # noqa: E402

from .widget_checks import MAX_FIXED_PX, MIN_FONT_PX, fit_problems, font_sizes, html_problems  # noqa: E402


def widget_classes() -> list[type]:
    """Every class of kvlib.notebook that builds ipywidgets: each one is a widget on screen."""
    found = []
    for info in pkgutil.iter_modules(kvlib.notebook.__path__):
        module = importlib.import_module(f"kvlib.notebook.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and "ipywidgets" in inspect.getsource(cls):
                found.append(cls)
    return found


def _prompt_box(model, tok):
    box = next_character.PromptBox(model, tok, "春风", k=8)
    yield box
    box.k.value = 20
    yield box
    box.prompt.value = "hello 春风"
    yield box


def _explorer(model, tok):
    ex = sampling_explorer.SliderExplorer(model, tok, prompt="春风", top_k=8)
    yield ex
    ex.temperature.value = 0.0
    yield ex
    ex.prompt.value = "春" * 100  # too long: a message
    yield ex


def _acrostic(model, tok):
    w = acrostic_writer.AcrosticWriter(model, tok, "春眠不觉")
    yield w
    w.chars_per_line.value = 5
    yield w
    w.heads.value = "AI"
    yield w


def _stepper(model, tok):
    from kvlib.notebook.cache_stepper import StepperWidget

    ui = StepperWidget(model, tok, "床前看月光，")
    yield ui
    for _ in range(8):
        ui.step_button.click()
    yield ui
    ui.prompt_box.value = "猫a"
    yield ui


def _calculator(model, tok):
    from kvlib.notebook.memory_calculator import MemoryCalculator

    calc = MemoryCalculator()
    yield calc
    calc.tokens.value = 131072
    calc.model.value = "Llama 3 8B"
    yield calc


def _serving(model, tok):
    from kvlib.notebook.serving_view import ServingView
    from kvlib.serving import Request

    reqs = [Request(i, poems.encode_prompt(tok, p), 12, arrival=i) for i, p in enumerate(["床前明月光，", "白日依山尽，", "春风"])]
    view = ServingView(model, reqs, num_blocks=16, kv_block_size=8)
    yield view
    for _ in range(6):
        view.step_button.click()
    yield view


def _speculative(model, tok):
    from kvlib.notebook.speculative_view import SpeculativeView
    from kvlib.speculative import NeuralDraft

    view = SpeculativeView(model, tok, {"self": NeuralDraft(model, name="self")}, max_new_tokens=16, start_rounds=2)
    yield view
    view.prompt_box.value = "猫a"
    yield view


def _shrink(model, tok):
    from kvlib.notebook.shrink_view import ShrinkView

    from .test_shrink_view import table

    view = ShrinkView(model, tok, table(), n_chars=8)
    yield view
    view.choice.value = "evicted: window of 24"
    yield view


CASES = {"PromptBox": _prompt_box, "SliderExplorer": _explorer, "AcrosticWriter": _acrostic,
         "StepperWidget": _stepper, "MemoryCalculator": _calculator, "ServingView": _serving,
         "SpeculativeView": _speculative, "ShrinkView": _shrink}


def test_every_widget_class_has_a_fit_case():
    names = {cls.__name__ for cls in widget_classes()}
    assert names, "no widget class found in kvlib.notebook"
    missing = names - set(CASES)
    assert not missing, (f"widget class(es) {sorted(missing)} of kvlib.notebook have no case in CASES: add one that "
                         f"drives the widget through its states, so that its widths and fonts are checked")
    assert not set(CASES) - names, f"CASES names classes that no longer exist: {sorted(set(CASES) - names)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_widget_fits_800_to_1920_px_and_reads_at_16_px(char, name):
    model, tok = char
    sizes = []
    for state, obj in enumerate(CASES[name](model, tok)):
        problems = fit_problems(obj)
        assert not problems, f"{name}, state {state}:\n  " + "\n  ".join(problems)
        sizes += font_sizes(obj)
    assert sizes and min(sizes) >= MIN_FONT_PX


@pytest.mark.parametrize("bad, fragment", [
    ('<div style="width:1086px">', "wider than"),
    ('<div style="min-width: 800px">', "wider than"),
    ('<div style="display:flex;gap:24px">', "does not wrap"),
    ('<span style="font-size:13px">', "below 16"),
    ('<p style="font-size:small">', "not in px"),
    ('<svg width="900" height="10" viewBox="0 0 900 10">', "wider than"),
    ('<svg width="300" height="10">', "no viewBox"),
    ('<svg viewBox="0 0 1 1"><text font-size="14">x</text></svg>', "below 16"),
    ("<style>.x{font-size:12px}</style>", "below 16"),
])
def test_the_fit_checker_catches_what_it_should(bad, fragment):
    assert any(fragment in p for p in html_problems(bad)), html_problems(bad)


def test_the_fit_checker_passes_what_fits():
    fine = ('<div style="display:flex;flex-wrap:wrap;max-width:520px;font-size:16px">'
            '<svg viewBox="0 0 600 20" width="100%" style="max-width:600px"><text font-size="16">x</text></svg></div>'
            f"<style>{show.WIDGET_CSS}</style>")
    assert html_problems(fine) == []
    assert MAX_FIXED_PX <= 760


def test_the_checker_sees_layouts_and_styles(char):
    import ipywidgets as w

    class Wide:
        def __init__(self):
            self.widget = show.frame(w.HBox([w.IntSlider(layout=w.Layout(width="1086px")),
                                             w.Button(style={"font_size": "12px"})]))

        def show(self):
            return show.LiveWidget(self.widget, "")

    problems = "\n".join(fit_problems(Wide()))
    assert "does not wrap" in problems and "1086px" in problems and "12px" in problems


# --- a value off a slider's range: refused, with the picture kept --------------------------------------------

def _sliders(obj):
    """(name, slider) for every range-checking slider the widget holds."""
    return [(name, c) for name, c in vars(obj).items() if type(c).__name__.startswith("Strict")]


def _html_areas(obj) -> dict:
    import ipywidgets as w

    return {name: c.value for name, c in vars(obj).items() if isinstance(c, w.HTML)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_value_off_a_slider_leaves_the_picture_and_says_why(char, name):
    """The slider keeps its value, so what the widget shows still matches it: the message goes above, once."""
    from traitlets import TraitError

    model, tok = char
    obj = next(CASES[name](model, tok))
    for slider_name, control in _sliders(obj):
        before, value = _html_areas(obj), control.value
        for off in (control.max + 1, control.min - 1, control.max + 2):
            with pytest.raises(TraitError, match="off the slider's range"):
                control.value = off
        after = _html_areas(obj)
        changed = [k for k in after if after[k] != before[k]]
        assert len(changed) == 1, f"{name}.{slider_name}: the message should go to one area, went to {changed}"
        shown = after[changed[0]]
        assert control.value == value and shown.count(show.REFUSAL_CLASS) == 1 and str(control.max + 2) in shown
        picture = show._EARLIER_REFUSAL.sub("", before[changed[0]])  # a message from the slider before is replaced
        assert shown.endswith(picture) and picture, f"{name}.{slider_name}: the picture before the refusal is gone"
    if _sliders(obj):
        control.value = control.min if control.value != control.min else control.max  # a good change redraws
        assert not any(show.REFUSAL_CLASS in v for v in _html_areas(obj).values()), f"{name}: the message stayed"


def test_every_widget_with_a_slider_is_in_the_refusal_test(char):
    model, tok = char
    with_sliders = {name for name in CASES if _sliders(next(CASES[name](model, tok)))}
    assert with_sliders >= {"PromptBox", "SliderExplorer", "AcrosticWriter", "StepperWidget", "MemoryCalculator",
                            "SpeculativeView"}
