"""The compiled decode step: the eager step's tokens, the eager decoder where it cannot run, and a fallback
where no C++ compiler exists. Its speed is the bench's to report, never a test's."""
from __future__ import annotations

import pytest
import torch

from kvlib.decoding import generate
from kvlib.fast import FastDecoder
from kvlib.tools import compiled_step
from kvlib.tools.compiled_step import CompiledDecoder, compiled_decoder, format_compiled

needs_compiler = pytest.mark.skipif(not compiled_step.compiler_available(), reason="no C++ compiler on the PATH")


@pytest.mark.slow
@needs_compiler
def test_the_compiled_step_writes_the_eager_steps_tokens_and_logits(shipped_char):
    model, tok = shipped_char
    idx = torch.tensor([[tok.eos_id] + tok.encode("白日依山尽，黄河入海流。")])
    assert torch.equal(generate(model, idx, 40, temperature=0.0, decoder=compiled_decoder).tokens,
                       generate(model, idx, 40, temperature=0.0).tokens)
    compiled, eager = CompiledDecoder(model, 1), FastDecoder(model, 1)
    with torch.inference_mode():
        compiled(idx), eager(idx)
        nxt = torch.tensor([[5]])
        assert compiled.takes(nxt, None, None) and not compiled.takes(torch.tensor([[5, 6]]), None, None)
        assert (compiled(nxt) - eager(nxt)).abs().max() <= 1e-4
        assert compiled.cache.length == eager.cache.length == idx.shape[1] + 1
        assert compiled.compile_seconds is not None
    with pytest.raises(ValueError, match="idx"):
        compiled(torch.tensor([[10**6]]))  # refused by the eager decoder's own check


def test_without_a_compiler_the_eager_decoder_is_used(shipped_char, monkeypatch):
    model, _ = shipped_char
    monkeypatch.setattr(compiled_step, "compiler_available", lambda: False)
    assert type(compiled_decoder(model, 1)) is FastDecoder


def test_the_report_judges_both_goals_and_prints_where_the_time_goes():
    d = {"compile_s": 12.0, "new_tokens": 100, "same_tokens": True,
         "ms": {"compiled": (100.0, 95.0, 110.0), "eager": (75.0, 70.0, 80.0), "ctranslate2": (45.0, 44.0, 46.0)},
         "verdicts": {"eager": "slower", "ctranslate2": "slower"},
         "profile": {"compiled": [("Call CompiledFxGraph", 740.0)], "eager": [("aten::mm", 159.0)]},
         "operators": {"head product (1 row)": (180.0, 338.0)}}
    text = format_compiled(d, floor_us=25.0)
    assert "compiled in 12 s" in text and "same tokens as the eager step: True" in text
    assert "at least CTranslate2's speed: 0.45x, NOT met" in text and "FLOP floor (25 µs a token): 40x, NOT met" in text
    assert "Call CompiledFxGraph 740 µs" in text and "aten::mm 159 µs" in text
    assert "head product (1 row)" in text and "180.0" in text and "338.0" in text


@pytest.mark.slow
@needs_compiler
def test_each_main_operator_is_timed_eager_and_compiled(shipped_char):
    model, _ = shipped_char
    ops = compiled_step.operators_compiled_alone(model, calls=20)
    assert len(ops) == 3 and all(e > 0 and c > 0 for e, c in ops.values())
