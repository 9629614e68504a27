"""The compiled decode step: the eager step's tokens both ways it is built, its greedy loop's too, the eager decoder
where it cannot run, and a fallback where no C++ compiler exists. Its speed is the bench's to report, never a test's."""
from __future__ import annotations

import pytest
import torch

from kvlib.decoding import generate
from kvlib.fast import FastDecoder
from kvlib.model import GPT, GPTConfig
from kvlib.tools import compiled_step
from kvlib.tools.compiled_step import CompiledDecoder, compiled_decoder, format_compiled

needs_compiler = pytest.mark.skipif(not compiled_step.compiler_available(), reason="no C++ compiler on the PATH")


@pytest.mark.slow
@needs_compiler
@pytest.mark.parametrize("way", compiled_step.WAYS)
def test_the_compiled_step_writes_the_eager_steps_tokens_and_logits(shipped_char, way):
    model, tok = shipped_char
    idx = torch.tensor([[tok.eos_id] + tok.encode("白日依山尽，黄河入海流。")])
    eager = generate(model, idx, 40, temperature=0.0).new_tokens
    dec = compiled_decoder(model, 1, way=way)
    assert torch.equal(generate(model, idx, 40, temperature=0.0, decoder=lambda *a: compiled_decoder(
        *a, way=way)).new_tokens, eager)
    assert torch.equal(dec.greedy(idx, 40), eager)          # the loop that keeps the tokens in compiled code
    ref = FastDecoder(model, 1)
    with torch.inference_mode():
        dec.cache.truncate(0)
        dec(idx), ref(idx)
        nxt = torch.tensor([[5]])
        assert dec.takes(nxt, None, None) and not dec.takes(torch.tensor([[5, 6]]), None, None)
        assert (dec(nxt) - ref(nxt)).abs().max() <= 1e-4
        assert (dec.eager.kv[:, :, :, :, :ref.cache.length] - ref.kv[:, :, :, :, :ref.cache.length]).abs().max() <= 1e-5
        assert dec.cache.length == ref.cache.length == idx.shape[1] + 1
    assert dec.compile_seconds > 0
    with pytest.raises(ValueError, match="idx"):
        dec(torch.tensor([[10**6]]))                         # refused by the eager decoder's own check
    with pytest.raises(ValueError, match=r"\bn\b"):
        dec.greedy(idx, model.config.block_size)             # more tokens than the cache holds after this prompt


def test_without_a_compiler_the_eager_decoder_is_used(shipped_char, monkeypatch):
    model, _ = shipped_char
    monkeypatch.setattr(compiled_step, "compiler_available", lambda: False)
    assert type(compiled_decoder(model, 1)) is FastDecoder


def test_a_decoder_is_built_once_per_shape_and_again_when_the_weights_change(monkeypatch):
    tiny_model, built = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)).eval(), []

    class Recorded:
        def __init__(self, model, batch_size, max_len, way):
            built.append((batch_size, way))
            self.cache = FastDecoder(model, batch_size, max_len).cache

    monkeypatch.setattr(compiled_step, "compiler_available", lambda: True)
    monkeypatch.setattr(compiled_step, "CompiledDecoder", Recorded)
    first = compiled_decoder(tiny_model, 1)
    assert compiled_decoder(tiny_model, 1) is first and len(built) == 1
    compiled_decoder(tiny_model, 2), compiled_decoder(tiny_model, 1, way="inductor")
    assert built == [(1, "aoti"), (2, "aoti"), (1, "inductor")]
    with torch.no_grad():
        tiny_model.lm_head.weight.mul_(1.0)                  # a write: the compiled weights are stale
    assert compiled_decoder(tiny_model, 1) is not first and len(built) == 4


def test_the_report_judges_both_goals_and_says_where_the_time_goes():
    ms = {"compiled, greedy loop (AOTInductor)": (40.0, 39.0, 42.0), "compiled, greedy loop (torch.compile)": (70.0, 68.0, 75.0),
          "eager fast path (generate)": (60.0, 58.0, 63.0), "ctranslate2": (38.0, 37.0, 40.0),
          compiled_step.STEP_ALONE: (39.0, 38.0, 40.0), compiled_step.READ_ONCE: (33.0, 32.0, 34.0)}
    main = next(iter(ms))
    d = {"compile_s": {"aoti": 21.0, "inductor": 15.0}, "new_tokens": 100, "weight_bytes": 7_200_000, "main": main,
         "same_tokens": {k: True for k in ms if k not in (compiled_step.STEP_ALONE, compiled_step.READ_ONCE)}, "ms": ms,
         "verdicts": {k: "within noise" for k in ms if k != main}}
    text = format_compiled(d, floor_us=25.0)
    assert "built in 21 s (AOTInductor), 15 s (torch.compile)" in text and "same tokens as the eager fast path: every path" in text
    assert "at least CTranslate2's speed: 0.95x (within noise), NOT met" in text
    assert "within 3x of the FLOP floor (25 µs a token): 16x, NOT met" in text
    assert "reads 7.2 MB of weights" in text and "330 µs a token here, 13x the FLOP floor" in text
    assert "400 µs a token go: 330 reading the weights, 60 more inside the compiled step" in text
    assert "10 in the Python loop around it" in text
    d["same_tokens"]["ctranslate2"] = False
    assert "all but ctranslate2" in format_compiled(d)


def test_a_compiler_inductor_cannot_use_is_reported_and_the_eager_rows_stand(shipped_char, monkeypatch):
    model, tok = shipped_char

    def broken(*args, **kwargs):
        raise RuntimeError("C++ compile error\nfatal error: omp.h: No such file or directory")

    monkeypatch.setattr(compiled_step, "compiled_decoder", broken)
    d = compiled_step.compiled_report(model, torch.tensor([tok.encode("春眠")]), 4, rounds=1)
    assert d == {"failed": "RuntimeError: C++ compile error"}
    assert format_compiled(d, floor_us=25.0) == ("the fast step compiled to C++ by Inductor: it could not be built here "
                                                 "(RuntimeError: C++ compile error); the rows above stand")


@pytest.mark.parametrize("way, rows_in, word", [("jit", 0, "way"), ("aoti", 3, "rows_in"), ("aoti", -1, "rows_in")])
def test_compile_step_refuses_what_it_cannot_build(way, rows_in, word):
    with pytest.raises(ValueError, match=rf"\b{word}\b"):
        compiled_step.compile_step(torch.nn.Identity(), (torch.zeros(1),), way, rows_in)
