"""Teacher-forced decoding through a cache, and the three numbers that say what a smaller cache costs."""
from __future__ import annotations

import math

import pytest
import torch

from kvlib import ContextLimitError, KVCache, QuantizedKVCache, SlidingWindowCache
from kvlib.quality import cache_cost, stepwise_logits


def ids(model, B=3, T=12, seed=0):
    return torch.randint(model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def test_token_by_token_through_the_full_cache_equals_one_pass(tiny_gpt):
    x = ids(tiny_gpt)
    with torch.no_grad():
        whole = tiny_gpt(x)[0]
    assert torch.allclose(stepwise_logits(tiny_gpt, x, KVCache(tiny_gpt.config, 3)), whole, atol=1e-5)


def test_the_full_cache_against_itself_costs_nothing_and_a_cut_costs_something(shipped_char):
    model, tok = shipped_char
    x = torch.tensor([tok.encode("床前明月光，疑是地上霜。举头望明月，低头思故乡。")])
    x, y = x[:, :-1], x[:, 1:]
    ref = stepwise_logits(model, x, KVCache(model.config, 1))
    same = cache_cost(ref, ref, y)
    assert same["kl"] == pytest.approx(0, abs=1e-12) and same["top1_agreement"] == 1.0
    expected = torch.nn.functional.cross_entropy(ref.flatten(0, 1), y.flatten()).item()
    assert same["nats_per_token"] == pytest.approx(expected, rel=1e-5)
    cut = cache_cost(ref, stepwise_logits(model, x, SlidingWindowCache(model.config, 1, window=4)), y)
    two_bit = cache_cost(ref, stepwise_logits(model, x, QuantizedKVCache(model.config, 1, bits=2)), y)
    for c in (cut, two_bit):
        assert c["kl"] > 1e-3 and c["top1_agreement"] < 1.0 and math.isfinite(c["nats_per_token"])


def test_kl_is_the_textbook_sum():
    p = torch.tensor([[[0.0, math.log(3.0)]]])   # probabilities 1/4, 3/4
    q = torch.tensor([[[0.0, 0.0]]])             # 1/2, 1/2
    kl = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert cache_cost(p, q, torch.tensor([[1]]))["kl"] == pytest.approx(kl)


def test_shapes_are_checked(tiny_gpt):
    x = ids(tiny_gpt)
    with pytest.raises(ValueError, match=r"logits must have the shape of reference \(1, 2, 3\)"):
        cache_cost(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ContextLimitError, match="room is left for 4"):
        stepwise_logits(tiny_gpt, x, KVCache(tiny_gpt.config, 3, max_len=4))
