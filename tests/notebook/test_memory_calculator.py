"""Notebook 5's memory picture and calculator widget."""
import io
import warnings

from kvlib.memory import ModelShape
from kvlib.notebook.memory_calculator import MemoryCalculator, memory_figure


def test_calculator_widget_and_figure():
    calc = MemoryCalculator()
    assert "batch 7 x 1,024 tokens" in calc.text() and "0.264 GB" in calc.text()
    calc.batch.value = 1
    calc.tokens.value = 2048
    assert "batch 1 x 2,048 tokens" in calc.output.value
    calc.model.value = "Llama 3.2 1B"
    calc.dtype.value = "float8"
    assert "16 kv heads" not in calc.text() and "8 kv heads" in calc.text()
    extra = ModelShape("mine", 2, 2, 2, 8, 1000, 64)
    assert "mine" in MemoryCalculator(extra={"mine": extra}).model.options
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory_figure().savefig(io.BytesIO(), format="png")


import pytest  # noqa: E402


@pytest.mark.parametrize("make, fragment", [
    (lambda: MemoryCalculator(batch=1000), r"batch .*\[1, 256\].*1000"),
    (lambda: MemoryCalculator(model="GPT-5"), r"model must be one of .*GPT-2 small.*'GPT-5'"),
    (lambda: MemoryCalculator(tokens=1000), r"tokens must be one of .*1,024.*1000"),
    (lambda: MemoryCalculator(dtype="int4"), r"dtype .*'int4'"),
    (lambda: memory_figure(highlight="GPT-5"), r"highlight must be one of .*'GPT-5'"),
])
def test_calculator_refuses_what_it_cannot_show(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make()


def test_calculator_refuses_a_batch_off_its_slider_and_shows_failures():
    from traitlets import TraitError

    calc = MemoryCalculator()
    with pytest.raises(TraitError, match="batch 1000 is off the slider's range"):
        calc.batch.value = 1000
    assert calc.batch.value == 7 and "refused" in calc.output.value and "GB" in calc.output.value  # batch 7's answer stays
    calc.batch.value = 8
    assert "batch 8 x 1,024 tokens" in calc.output.value
    calc.shapes["GPT-2 small"] = None  # a broken shape: the next update fails
    calc.batch.value = 9
    assert "could not be shown" in calc.output.value and "GB" not in calc.output.value


def test_calculator_fits_any_width():
    from .widget_checks import assert_fits

    calc = MemoryCalculator()
    assert_fits(calc)
    calc.model.value = "Llama 3 8B"
    calc.tokens.value = 131072
    assert_fits(calc)


@pytest.mark.parametrize("name", ["GPT-2 small", "", "  "])
def test_an_extra_shape_may_not_hide_a_built_in_one_or_have_no_name(name):
    from kvlib.memory import SHAPES

    with pytest.raises(ValueError, match="extra's names must be new and not blank"):
        MemoryCalculator(extra={name: SHAPES["Llama 3 70B"]})
