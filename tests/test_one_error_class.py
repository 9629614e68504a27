"""One exception class per kind of mistake: the same wrong value of the same parameter gets the same class
from every public function that takes it (TypeError for a wrong type, ValueError for a value out of range)."""
from __future__ import annotations

import pytest
import torch

from kvlib import generate, generate_uncached, probabilities, sample_next
from kvlib.serving import Request
from kvlib.paged import parallel_sample
from kvlib.tools.traces import make_trace
from kvlib.speculative import NgramDraft, SpeculativeDecoder, speculative_generate
from kvlib.stepper import CacheStepper

POEMS = ["床前明月光，疑是地上霜。举头望明月，低头思故乡。", "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"]


@pytest.fixture(scope="module")
def w(shipped_char):
    model, tok = shipped_char
    draft = NgramDraft.from_ids(torch.tensor(tok.encode_corpus(POEMS)), tok.vocab_size)
    return model, tok, draft


def takers(w, name):
    """Every public function taking ``name``, as ``value -> call``."""
    model, tok, draft = w
    idx = torch.tensor([[0, 5, 6]])
    logits = torch.randn(1, model.config.vocab_size, generator=torch.Generator().manual_seed(0))
    f = {
        "max_new_tokens": {
            "generate": lambda v: generate(model, idx, v),
            "generate_uncached": lambda v: generate_uncached(model, idx, v, block_size=128),
            "speculative_generate": lambda v: speculative_generate(model, draft, idx, v),
            "SpeculativeDecoder": lambda v: SpeculativeDecoder(model, draft, idx, v),
            "Request": lambda v: Request(0, [0, 5], v),
            "make_trace": lambda v: make_trace(tok, POEMS, 2, max_new_tokens=v),
            "parallel_sample": lambda v: parallel_sample(model, [0, 5], 2, v),
        },
        "temperature": {
            "generate": lambda v: generate(model, idx, 2, temperature=v),
            "sample_next": lambda v: sample_next(logits, temperature=v),
            "probabilities": lambda v: probabilities(logits, temperature=v),
            "speculative_generate": lambda v: speculative_generate(model, draft, idx, 2, temperature=v),
            "parallel_sample": lambda v: parallel_sample(model, [0, 5], 2, 2, temperature=v),
            "CacheStepper": lambda v: CacheStepper(model, tok, "春", temperature=v),
        },
        "top_k": {
            "generate": lambda v: generate(model, idx, 2, top_k=v),
            "sample_next": lambda v: sample_next(logits, top_k=v),
            "probabilities": lambda v: probabilities(logits, top_k=v),
            "speculative_generate": lambda v: speculative_generate(model, draft, idx, 2, temperature=1.0, top_k=v),
            "parallel_sample": lambda v: parallel_sample(model, [0, 5], 2, 2, top_k=v),
            "CacheStepper": lambda v: CacheStepper(model, tok, "春", top_k=v),
        },
    }
    return f[name]


CASES = [("max_new_tokens", 2.5, TypeError), ("max_new_tokens", "3", TypeError), ("max_new_tokens", True, TypeError),
         ("max_new_tokens", -1, ValueError),
         ("temperature", "hot", TypeError), ("temperature", -0.5, ValueError), ("temperature", float("nan"), ValueError),
         ("top_k", 1.5, TypeError), ("top_k", True, TypeError), ("top_k", 0, ValueError), ("top_k", -2, ValueError)]


@pytest.mark.parametrize("name,value,error", CASES, ids=lambda x: repr(x))
def test_the_same_mistake_gets_the_same_class_everywhere(w, name, value, error):
    got = {}
    for fn_name, call in takers(w, name).items():
        with pytest.raises(Exception) as info:
            call(value)
        got[fn_name] = type(info.value)
        assert name in str(info.value), f"{fn_name}: the message does not name {name}: {info.value}"
    wrong = {k: v.__name__ for k, v in got.items() if not issubclass(v, error)}
    assert not wrong, f"{name}={value!r} should be a {error.__name__} everywhere, got {wrong}"
