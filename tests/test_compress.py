"""Fewer key/value heads and a latent cache: shapes, exactness where nothing is cut, absorption, refusals."""
from __future__ import annotations

import pytest
import torch

from kvlib import GPTConfig, KVCache, generate
from kvlib.compress import grouped, latent
from kvlib.fast import FastDecoder
from kvlib.paged import PagedKVCache
from kvlib.verify import verify_cache

from .conftest import seeded_gpt

SHAPE = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)


@pytest.fixture(scope="module")
def base():
    return seeded_gpt(SHAPE, seed=3)


def idx(T=9, seed=0):
    return torch.randint(64, (2, T), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(x)[0]


def test_pooling_one_head_per_group_and_the_full_rank_latent_change_nothing(base):
    x = idx()
    want = logits(base, x)
    assert torch.allclose(logits(grouped(base, 4), x), want, atol=1e-5)
    assert torch.allclose(logits(latent(base, 32), x), want, atol=1e-4)  # rank n_embd: the SVD is exact


def test_pooled_heads_are_the_mean_of_their_group(base):
    g = grouped(base, 2)
    D, C = SHAPE.head_size, SHAPE.n_embd
    k_old = base.transformer.h[0].attn.c_attn.weight[C: 2 * C].view(4, D, C)
    k_new = g.transformer.h[0].attn.c_attn.weight[C: C + 2 * D].view(2, D, C)
    assert torch.allclose(k_new[0], k_old[:2].mean(0)) and torch.allclose(k_new[1], k_old[2:].mean(0))
    assert g.config.kv_heads == 2 and g.config.n_kv_head == 2


@pytest.mark.parametrize("make", [lambda m: grouped(m, 2), lambda m: grouped(m, 1), lambda m: latent(m, 8)],
                         ids=["gqa2", "mqa", "latent8"])
def test_the_cache_is_smaller_and_changes_no_output(base, make):
    """verify_cache on the converted model: the cached loop equals the recompute loop; the cache shrinks."""
    model = make(base)
    report = verify_cache(model, idx(4)[:1], 8)
    assert report.passed, report
    full, small = base.new_cache(1), model.new_cache(1)
    assert small.nbytes < full.nbytes
    heads, key, value = model.config.cache_shape
    assert small.bytes_per_token == 4 * SHAPE.n_layer * heads * (key + value)


def test_the_latent_cache_holds_r_numbers_a_position_and_absorbed_decoding_equals_explicit(base):
    model = latent(base, 8)
    cache = model.new_cache(2)
    assert tuple(cache.k.shape) == (2, 2, 1, 16, 8) and cache.v.shape[-1] == 0
    x = idx(10)
    explicit = logits(model, x)
    with torch.no_grad():
        a = model(x[:, :6], cache=cache)[0]
        b = model(x[:, 6:], cache=cache)[0]
    assert torch.allclose(torch.cat([a, b], 1), explicit, atol=1e-5)


def test_a_lower_rank_or_fewer_heads_cost_quality_on_random_weights_but_run(base):
    x = idx()
    want = logits(base, x)
    for model in (grouped(base, 1), latent(base, 2)):
        assert (logits(model, x) - want).abs().max() > 1e-3
        assert generate(model, x, 4, temperature=0.0).new_tokens.shape == (2, 4)  # the teaching decoder


def test_the_original_is_left_as_it_was(base):
    before = {k: v.clone() for k, v in base.state_dict().items()}
    grouped(base, 2), latent(base, 4)
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())


def test_refusals_name_the_parameter(base):
    with pytest.raises(ValueError, match="n_kv_head must divide n_head = 4, got 3"):
        grouped(base, 3)
    with pytest.raises(ValueError, match=r"rank must be an int in \[1, 32\]"):
        latent(base, 33)
    with pytest.raises(ValueError, match="converting a model needs a multi-head attention model.*2 key/value"):
        latent(grouped(base, 2), 4)
    with pytest.raises(ValueError, match=r"n_kv_head \(3\) must divide n_head \(4\)"):
        GPTConfig(vocab_size=8, n_head=4, n_kv_head=3)
    with pytest.raises(ValueError, match="exclude each other"):
        GPTConfig(vocab_size=8, n_kv_head=2, kv_latent=4)
    for what, build in (("FastDecoder", lambda m: FastDecoder(m, 1)),
                        ("the paged cache", lambda m: PagedKVCache(m.config, 4))):
        with pytest.raises(ValueError, match=f"{what} needs a multi-head attention model.*decoder='model'"):
            build(grouped(base, 2))


@pytest.mark.parametrize("shrink", [lambda m: grouped(m, 2), lambda m: grouped(m, 1), lambda m: latent(m, 8)])
def test_the_cache_stepper_and_its_widget_refuse_a_shrunk_model_up_front(base, tiny_char_tokenizer, shrink):
    from kvlib.notebook.cache_stepper import StepperWidget
    from kvlib.stepper import CacheStepper

    model = shrink(base)
    for what, build in (("CacheStepper", CacheStepper), ("StepperWidget", StepperWidget)):
        with pytest.raises(ValueError, match=f"{what} needs a multi-head attention model.*one key per query head"):
            build(model, tiny_char_tokenizer, "床前")


def test_an_old_configuration_loads_as_multi_head():
    cfg = GPTConfig(vocab_size=8)
    assert cfg.multi_head and cfg.kv_heads == cfg.n_head and cfg.cache_shape == (4, 32, 32)
    assert KVCache(cfg, 1).k.shape == KVCache(cfg, 1).v.shape


def test_converting_leaves_the_global_rng_alone(base):
    before = torch.get_rng_state()
    grouped(base, 2), latent(base, 4)
    assert torch.equal(before, torch.get_rng_state())
