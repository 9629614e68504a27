"""The GPT and its static KV cache: sizes, cached = uncached, padding, and the errors it raises."""
from __future__ import annotations

import math

import pytest
import torch

from kvlib.model import GPT, GPTConfig, KVCache, causal_mask
from kvlib.cache import ContextLimitError

CHAR_VOCAB, BPE_VOCAB = 7_184, 512


@pytest.fixture(scope="module")
def model() -> GPT:
    """The shipped char-model shape with random weights (the equalities hold for any weights)."""
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=CHAR_VOCAB)).eval()


@pytest.fixture(scope="module")
def small() -> GPT:
    torch.manual_seed(1)
    return GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16)).eval()


# ---- the cache ------------------------------------------------------------------------------

def test_cache_size_of_the_char_model():
    cfg = GPTConfig(vocab_size=CHAR_VOCAB)
    cache = KVCache(cfg, 1, 128)
    assert cache.nbytes == 524_288  # 2 (k, v) x 4 layers x 128 positions x 128 channels x 4 bytes
    assert cache.k.shape == cache.v.shape == (4, 1, 4, 128, 32)  # (L, B, H, max_len, D)
    assert cache.k.dtype == torch.float32
    assert cache.bytes_per_token == 4_096
    assert (cache.batch_size, cache.max_len, cache.length) == (1, 128, 0)
    assert KVCache(cfg, 3, 64).k.shape == (4, 3, 4, 64, 32)
    assert KVCache(cfg, 2).max_len == cfg.block_size


def test_cache_arguments_are_checked():
    cfg = GPTConfig(vocab_size=10, block_size=8)
    with pytest.raises(ValueError, match="batch_size"):
        KVCache(cfg, 0, 8)
    with pytest.raises(ValueError, match="max_len"):
        KVCache(cfg, 1, 9)
    with pytest.raises(ValueError, match="max_len"):
        KVCache(cfg, 1, 0)


@torch.no_grad()
def test_reset_lets_a_cache_be_reused(small):
    idx = torch.randint(50, (1, 6), generator=torch.Generator().manual_seed(2))
    cache = small.new_cache(1)
    first, _ = small(idx, cache=cache)
    assert cache.length == 6
    cache.reset()
    assert cache.length == 0
    again, _ = small(idx, cache=cache)
    assert cache.length == 6
    torch.testing.assert_close(again, first, rtol=0, atol=0)


# ---- parameters -----------------------------------------------------------------------------

def test_parameter_counts():
    char = GPT(GPTConfig(vocab_size=CHAR_VOCAB)).num_params()
    bpe = GPT(GPTConfig(vocab_size=BPE_VOCAB)).num_params()
    assert abs(char - 1.73e6) < 0.01e6
    assert abs(bpe - 0.87e6) < 0.01e6
    # 4 blocks of 198,272 + learned positions 128 x 128 + final LayerNorm, plus V x 128 embeddings.
    assert char == 1_729_280
    assert bpe == 875_264
    assert char - bpe == (CHAR_VOCAB - BPE_VOCAB) * 128  # the head adds nothing: it is tied


def test_embeddings_are_tied(model):
    assert model.lm_head.weight is model.transformer.wte.weight


def test_initial_loss_is_close_to_uniform(model):
    idx = torch.randint(CHAR_VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, loss = model(idx[:, :-1], targets=idx[:, 1:])
    assert logits.shape == (2, 15, CHAR_VOCAB)
    assert abs(loss.item() - math.log(CHAR_VOCAB)) < 0.2
    assert model(idx)[1] is None


# ---- cached equals uncached -----------------------------------------------------------------

def test_causal_mask_is_bottom_right_aligned():
    assert causal_mask(2, 5).tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert torch.equal(causal_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril())


@torch.no_grad()
def test_prefill_then_single_tokens_equals_one_uncached_forward(model):
    idx = torch.randint(CHAR_VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    full, _ = model(idx)
    cache = model.new_cache(batch_size=2, max_len=32)
    logits, _ = model(idx[:, :5], cache=cache)
    assert cache.length == 5  # advanced once per forward, not once per layer
    torch.testing.assert_close(logits, full[:, :5], rtol=0, atol=1e-5)
    for t in range(5, 12):
        step, _ = model(idx[:, t:t + 1], cache=cache)
        assert cache.length == t + 1
        assert step.shape == (2, 1, CHAR_VOCAB)
        torch.testing.assert_close(step[:, 0], full[:, t], rtol=0, atol=1e-5)
    # The cache holds exactly the keys and values of the positions written so far.
    assert cache.k[:, :, :, 12:].abs().sum() == 0
    assert cache.k[:, :, :, :12].abs().sum() > 0


@torch.no_grad()
def test_chunked_prefill_equals_one_uncached_forward(small):
    idx = torch.randint(50, (2, 16), generator=torch.Generator().manual_seed(5))
    full, _ = small(idx)
    cache = small.new_cache(2)
    parts = [small(idx[:, a:b], cache=cache)[0] for a, b in ((0, 3), (3, 10), (10, 16))]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)
    assert cache.length == 16


# ---- errors ---------------------------------------------------------------------------------

def test_overflowing_the_cache_raises(small):
    cache = small.new_cache(1, max_len=8)
    with torch.no_grad():
        small(torch.zeros(1, 6, dtype=torch.long), cache=cache)
        with pytest.raises(ContextLimitError, match="cache holds 8"):
            small(torch.zeros(1, 3, dtype=torch.long), cache=cache)
        assert cache.length == 6  # nothing was written by the refused call
        small(torch.zeros(1, 2, dtype=torch.long), cache=cache)
        assert cache.length == 8
        with pytest.raises(ContextLimitError):
            small(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    assert issubclass(ContextLimitError, ValueError)


def test_positions_past_the_block_size_raise_without_a_cache(small):
    with torch.no_grad():
        small(torch.zeros(1, 16, dtype=torch.long))  # exactly the block fits
        with pytest.raises(ContextLimitError, match="block size 16"):
            small(torch.zeros(1, 17, dtype=torch.long))
        with pytest.raises(ContextLimitError, match="position id 16"):
            small(torch.zeros(1, 2, dtype=torch.long), position_ids=torch.tensor([[15, 16]]))


def test_key_mask_of_the_wrong_shape_raises(small):
    idx = torch.zeros(2, 4, dtype=torch.long)
    with torch.no_grad():
        with pytest.raises(ValueError, match="key_mask"):
            small(idx, key_mask=torch.ones(2, 3, dtype=torch.long))
        with pytest.raises(ValueError, match="key_mask"):
            small(idx, key_mask=torch.ones(1, 4, dtype=torch.long))
        cache = small.new_cache(2)
        small(idx, cache=cache, key_mask=torch.ones(2, 4, dtype=torch.long))
        # With a cache the mask covers the cached keys too: 4 + 1, not 1.
        with pytest.raises(ValueError, match=r"\(2, 5\)"):
            small(idx[:, :1], cache=cache, key_mask=torch.ones(2, 1, dtype=torch.long))


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_size=0), "vocab_size"),
    (dict(vocab_size=10, n_layer=0), "n_layer"),
    (dict(vocab_size=10, block_size=-1), "block_size"),
    (dict(vocab_size=10.0), "vocab_size"),
    (dict(vocab_size=10, n_embd=130, n_head=4), "divisible"),
])
def test_config_validation(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        GPTConfig(**kwargs)


def test_config_head_size():
    assert GPTConfig(vocab_size=10).head_size == 32
    assert GPTConfig(vocab_size=10, n_embd=64, n_head=8).head_size == 8


# ---- left padding ---------------------------------------------------------------------------

def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def test_left_padded_row_matches_the_row_alone(model):
    g = torch.Generator().manual_seed(6)
    long_row = torch.randint(CHAR_VOCAB, (1, 9), generator=g)
    short_row = torch.randint(CHAR_VOCAB, (1, 5), generator=g)
    pad = torch.full((1, 4), 7)  # any id: padded keys are never attended to
    idx = torch.cat([long_row, torch.cat([pad, short_row], dim=1)])
    mask = torch.tensor([[1] * 9, [0] * 4 + [1] * 5])
    assert positions(mask).tolist() == [list(range(9)), [0, 0, 0, 0, 0, 1, 2, 3, 4]]

    logits, _ = model(idx, key_mask=mask, position_ids=positions(mask))
    alone_long, _ = model(long_row)
    alone_short, _ = model(short_row)
    torch.testing.assert_close(logits[0, -1], alone_long[0, -1], rtol=0, atol=1e-5)
    torch.testing.assert_close(logits[1, -1], alone_short[0, -1], rtol=0, atol=1e-5)
    torch.testing.assert_close(logits[1, 4:], alone_short[0], rtol=0, atol=1e-5)

    other_pad, _ = model(torch.cat([long_row, torch.cat([pad + 100, short_row], dim=1)]),
                         key_mask=mask, position_ids=positions(mask))
    torch.testing.assert_close(other_pad[1, 4:], logits[1, 4:], rtol=0, atol=1e-5)


@torch.no_grad()
def test_left_padded_batch_decodes_with_the_cache_like_each_row_alone(model):
    g = torch.Generator().manual_seed(7)
    rows = [torch.randint(CHAR_VOCAB, (6,), generator=g), torch.randint(CHAR_VOCAB, (3,), generator=g)]
    nxt = torch.randint(CHAR_VOCAB, (2, 1), generator=g)
    idx = torch.stack([rows[0], torch.cat([torch.zeros(3, dtype=torch.long), rows[1]])])
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    cache = model.new_cache(2, max_len=16)
    model(idx, cache=cache, key_mask=mask, position_ids=positions(mask))
    mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
    step, _ = model(nxt, cache=cache, key_mask=mask, position_ids=mask[:, :-1].sum(-1, keepdim=True))
    assert cache.length == 7
    for b, row in enumerate(rows):
        alone, _ = model(torch.cat([row, nxt[b]])[None])
        torch.testing.assert_close(step[b, 0], alone[0, -1], rtol=0, atol=1e-5)


def test_the_weights_key_changes_with_every_kind_of_weight_change(tiny_gpt):
    import copy

    from kvlib.weights import weights_key

    model = copy.deepcopy(tiny_gpt)
    key = weights_key(model)
    assert weights_key(model) == key                                # nothing changed, nothing moves
    with torch.no_grad():
        model.transformer.ln_f.bias.add_(0.0)                       # an in-place write bumps a version
    assert weights_key(model) != key
    key = weights_key(model)
    model.load_state_dict(tiny_gpt.state_dict())                    # copies in place
    assert weights_key(model) != key
    key = weights_key(model)
    model.transformer.ln_f.weight = torch.nn.Parameter(model.transformer.ln_f.weight.detach().clone())
    assert weights_key(model) != key                                # a replaced parameter
    key = weights_key(model)
    model.transformer.h[0].mlp = copy.deepcopy(model.transformer.h[0].mlp)
    assert weights_key(model) != key                                # a replaced submodule
    assert len(weights_key(model)) == len(list(model.parameters())) + len(list(model.buffers()))
