"""The quantised cache: its pure pieces (quantise, pack) on their own, then the cache on the real model."""
from __future__ import annotations

import pytest
import torch

from kvlib import Cache, GPTConfig, KVCache, QuantizedKVCache, cache_decoder, generate
from kvlib.quantized import (QuantizedStore, dequantize, pack, quantize, quantized_bytes_per_token,
                             unpack)

PROMPTS = ["床前明月光，", "春风", "白日依山尽，", "山中", "江上秋风起，", "故人"]


def keys_like(seed: int = 0) -> torch.Tensor:
    """(B, H, T, D) = (2, 3, 32, 16) with a few loud channels, as real keys have."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 32, 16, generator=g)
    x[..., 3] *= 20
    x[..., 7] += 5
    return x


# ---- quantise and dequantise -----------------------------------------------------------------------

@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dim", [2, 3])
def test_every_value_comes_back_within_half_a_step_of_its_group(bits, dim):
    x = keys_like()
    codes, scale, zero = quantize(x, bits, dim, 8)
    assert codes.dtype == torch.uint8 and codes.shape == x.shape and int(codes.max()) <= 2**bits - 1
    assert scale.dtype == zero.dtype == torch.float16
    expected = list(x.shape)
    expected[dim] //= 8
    assert list(scale.shape) == expected == list(zero.shape)
    back = dequantize(codes, scale, zero, dim, 8)
    half_step = scale.float().repeat_interleave(8, dim=dim) / 2                 # each element's own group
    assert bool(((back - x).abs() <= half_step + 1e-5 * x.abs().amax()).all())
    assert bool((half_step > 0).all())


def test_the_range_of_each_group_is_covered_and_a_constant_group_is_exact():
    x = torch.tensor([[[[0.1, 0.2, 0.3, 0.4], [2.0, 2.0, 2.0, 2.0]]]])             # (1, 1, 2, 4)
    codes, scale, zero = quantize(x, 2, -1, 4)
    assert codes[0, 0, 0].tolist() == [0, 1, 2, 3]                              # min -> 0, max -> 3
    assert float(zero[0, 0, 0, 0]) <= 0.1 and float(zero[0, 0, 0, 0]) + 3 * float(scale[0, 0, 0, 0]) >= 0.4
    assert torch.equal(dequantize(codes, scale, zero, -1, 4)[0, 0, 1], x[0, 0, 1])  # 2.0 is a float16
    assert float(scale[0, 0, 1, 0]) == 0.0


def test_the_error_shrinks_with_more_bits_and_keys_per_channel_beat_keys_per_token():
    x = keys_like()
    err = {b: (dequantize(*quantize(x, b, 2, 8), 2, 8) - x).abs().mean() for b in (2, 4, 8)}
    assert err[8] < err[4] / 8 < err[2] / 16
    per_token = (dequantize(*quantize(x, 4, 3, 8), 3, 8) - x).abs().mean()    # the loud channels share groups
    assert err[4] < 0.7 * per_token


# ---- pack and unpack --------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [2, 4, 8])
def test_packing_is_exact_and_takes_bits_over_8_bytes_a_code(bits):
    codes = torch.randint(0, 2**bits, (3, 5, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5, 16 * bits // 8)
    assert torch.equal(unpack(packed, bits), codes)


def test_the_first_code_sits_in_the_lowest_bits():
    assert pack(torch.tensor([1, 2, 3, 0], dtype=torch.uint8), 2).tolist() == [1 | 2 << 2 | 3 << 4]
    assert pack(torch.tensor([0xA, 0x5], dtype=torch.uint8), 4).tolist() == [0x5A]
    assert unpack(torch.tensor([0x5A], dtype=torch.uint8), 4).tolist() == [0xA, 0x5]


# ---- one layer's store -----------------------------------------------------------------------------

def test_keys_wait_in_full_precision_until_a_group_is_complete_and_values_go_at_once():
    x = keys_like()
    keys, values = QuantizedStore(4, 8, 2, window=3), QuantizedStore(4, 8, 3, window=3)
    for t in range(13):
        for store in (keys, values):
            store.append(x[:, :, t:t + 1])
            assert store.residual.shape[2] >= min(t + 1, 3)                     # the window stays exact
            store.flush()
    assert (keys.quantized, keys.residual.shape[2]) == (8, 5)                   # 13 - 3 = 10: one group of 8
    assert (values.quantized, values.residual.shape[2]) == (10, 3)
    assert torch.equal(keys.read()[:, :, 8:], x[:, :, 8:13])                    # the rest is exact
    assert torch.equal(values.read()[:, :, 10:], x[:, :, 10:13])


@pytest.mark.parametrize("n", [0, 5, 8, 11, 13])
def test_truncating_a_store_keeps_what_it_read(n):
    x = keys_like()
    for dim in (2, 3):
        store = QuantizedStore(2, 8, dim, window=0)
        store.append(x[:, :, :13])
        store.flush()
        before = store.read()
        store.truncate(n)
        assert store.length == n and torch.equal(store.read(), before[:, :, :n])
        assert store.quantized % store.step == 0


# ---- the cache ---------------------------------------------------------------------------------------

def test_bytes_per_token_on_the_char_models_shape():
    cfg = GPTConfig(vocab_size=7184)                                            # L=4, H=4, D=32
    assert cfg.kv_bytes_per_token() == KVCache(cfg, 1).bytes_per_token == 4096
    # per layer, keys and values: 128 channels x bits/8, plus 4 bytes of float16 scale+zero per 16
    assert [quantized_bytes_per_token(cfg, b, 16) for b in (8, 4, 2)] == [1280, 768, 512]
    assert quantized_bytes_per_token(cfg, 2, 32) == 384


@pytest.mark.parametrize("extra", [{"n_kv_head": 2}, {"n_kv_head": 1}, {"kv_latent": 16}])
def test_a_full_precision_position_of_a_shrunk_model_is_what_its_kvcache_stores(extra):
    cfg = GPTConfig(vocab_size=100, **extra)
    assert cfg.kv_bytes_per_token() == KVCache(cfg, 1).bytes_per_token < 4096
    if cfg.kv_latent:  # a latent has no heads to quantise
        with pytest.raises(ValueError, match="QuantizedKVCache needs a multi-head attention model"):
            quantized_bytes_per_token(cfg, 4, 16)
    else:              # fewer key/value heads: fewer bytes in the same proportion
        assert quantized_bytes_per_token(cfg, 4, 16) * cfg.n_head == 768 * cfg.kv_heads


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_nbytes_is_codes_scales_zero_points_and_the_float_rest(bits, tiny_gpt):
    cfg = tiny_gpt.config                                                       # L=2, H=2, D=16
    cache = QuantizedKVCache(cfg, 2, bits=bits, group_size=4, window=3)
    idx = torch.randint(cfg.vocab_size, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        tiny_gpt(idx[:, :6], cache=cache)
        for t in range(6, 13):
            tiny_gpt(idx[:, t:t + 1], cache=cache)
    # 13 positions, 3 in the window: keys quantise 8 (two groups of 4) and keep 5 exact; values 10 and 3
    B, H, D, L = 2, 2, 16, 2
    keys = B * H * (8 * D * bits // 8 + 2 * 2 * D * 8 // 4 + 5 * D * 4)
    values = B * H * (10 * D * bits // 8 + 2 * 2 * (D // 4) * 10 + 3 * D * 4)
    assert cache.nbytes == L * (keys + values)
    assert cache.bytes_per_token == cache.nbytes / (2 * 13)


def test_nbytes_matches_bytes_per_token_when_every_position_is_quantised(tiny_gpt):
    cfg = tiny_gpt.config
    cache = QuantizedKVCache(cfg, 1, bits=2, group_size=4)
    with torch.inference_mode():
        tiny_gpt(torch.zeros(1, 12, dtype=torch.long), cache=cache)
    assert cache.nbytes == 12 * quantized_bytes_per_token(cfg, 2, 4) < KVCache(cfg, 1, 12).nbytes / 3


def test_a_window_over_every_position_is_the_full_cache_exactly(shipped_char):
    model, tok = shipped_char
    idx = torch.tensor([tok.encode("白日依山尽，")])
    ref = generate(model, idx, 40, temperature=0, decoder="model")
    out = generate(model, idx, 40, temperature=0, decoder=cache_decoder(QuantizedKVCache, bits=2, window=128))
    assert torch.equal(out.tokens, ref.tokens)
    with torch.inference_mode():
        a, b = KVCache(model.config, 1), QuantizedKVCache(model.config, 1, bits=2, window=128)
        for t in range(0, 30, 6):
            assert torch.equal(model(ref.tokens[:, t:t + 6], cache=a)[0], model(ref.tokens[:, t:t + 6], cache=b)[0])


@pytest.mark.slow
def test_greedy_tokens_agree_with_the_full_cache_and_more_bits_stay_closer(shipped_char):
    model, tok = shipped_char
    agree = []
    for p in PROMPTS:
        idx = torch.tensor([tok.encode(p)])
        ref = generate(model, idx, 40, temperature=0, decoder="model").new_tokens
        out = generate(model, idx, 40, temperature=0, decoder=cache_decoder(QuantizedKVCache, bits=8)).new_tokens
        agree.append((out == ref).float().mean())
    assert float(torch.stack(agree).mean()) >= 0.9, agree
    # the same 40 tokens fed one at a time: the logits' distance from the full cache grows as bits fall
    seq = torch.tensor([tok.encode("江上秋风起，")])
    seq = generate(model, seq, 40, temperature=0, decoder="model").tokens
    with torch.inference_mode():
        full = model(seq)[0]
        gap = {}
        for bits in (8, 4, 2):
            cache = QuantizedKVCache(model.config, 1, bits=bits)
            steps = [model(seq[:, t:t + 1], cache=cache)[0] for t in range(seq.shape[1])]
            gap[bits] = float((torch.cat(steps, 1) - full).abs().max())
    assert 0 < gap[8] < 0.1 and gap[8] < gap[4] < gap[2], gap


def test_a_roll_back_returns_the_state_the_cache_had(tiny_gpt):
    cfg = tiny_gpt.config
    idx = torch.randint(cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(3))
    cache = QuantizedKVCache(cfg, 1, bits=4, group_size=4)
    assert isinstance(cache, Cache)
    with torch.inference_mode():
        first = [tiny_gpt(idx[:, t:t + 1], cache=cache)[0] for t in range(12)]
        cache.truncate(8)                                   # a group boundary: the state after 8 positions
        assert cache.length == 8
        again = [tiny_gpt(idx[:, t:t + 1], cache=cache)[0] for t in range(8, 12)]
        for a, b in zip(first[8:], again):
            assert torch.equal(a, b)
        before = [store.read() for store in cache.keys + cache.values]
        cache.truncate(6)                                   # inside a group: positions 4, 5 stay as they were read
        assert all(torch.equal(store.read(), b[:, :, :6]) for store, b in zip(cache.keys + cache.values, before))
        assert cache.keys[0].residual.shape[2] == 2 and cache.values[0].quantized == 6
        cache.reset()
        assert cache.length == 0 and cache.nbytes == 0
        with pytest.raises(ValueError, match=r"\bn\b"):
            cache.truncate(1)


def test_a_forward_pass_that_stopped_half_way_leaves_no_trace(tiny_gpt):
    cfg = tiny_gpt.config
    idx = torch.randint(cfg.vocab_size, (1, 8), generator=torch.Generator().manual_seed(4))
    a, b = QuantizedKVCache(cfg, 1, group_size=4), QuantizedKVCache(cfg, 1, group_size=4)
    with torch.inference_mode():
        tiny_gpt(idx[:, :5], cache=a)
        tiny_gpt(idx[:, :5], cache=b)
        b.write(0, *(torch.randn(1, 2, 3, 16),) * 2)                          # layer 0 only, never advanced
        assert torch.equal(tiny_gpt(idx[:, 5:], cache=a)[0], tiny_gpt(idx[:, 5:], cache=b)[0])


def test_a_chunk_is_read_in_full_precision_in_its_own_pass_and_quantised_after(tiny_gpt):
    idx = torch.randint(tiny_gpt.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        full = tiny_gpt(idx)[0]
        cache = QuantizedKVCache(tiny_gpt.config, 1, bits=2, group_size=4)
        assert torch.equal(tiny_gpt(idx[:, :8], cache=cache)[0], full[:, :8])   # the prompt, as KIVI prefills
        assert cache.keys[0].quantized == cache.values[0].quantized == 8
        gap = (tiny_gpt(idx[:, 8:], cache=cache)[0] - full[:, 8:]).abs().max()
    assert 1e-3 < gap < 1.0


def test_advance_without_writing_is_refused(tiny_gpt):
    cache = QuantizedKVCache(tiny_gpt.config, 1)
    with pytest.raises(ValueError, match="advance"):
        cache.advance(3)
    assert cache.length == 0


def test_past_the_cache_is_a_context_limit(tiny_gpt):
    from kvlib import ContextLimitError

    cache = QuantizedKVCache(tiny_gpt.config, 1, max_len=6, group_size=4)
    with pytest.raises(ContextLimitError, match="holds 6"):
        cache.write(0, torch.zeros(1, 2, 7, 16), torch.zeros(1, 2, 7, 16))


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(bits=3), ValueError, "bits must be 2, 4 or 8, got 3"),
    (dict(bits=8.0), TypeError, "bits must be 2, 4 or 8, got 8.0"),
    (dict(bits=True), TypeError, "bits must be"),
    (dict(group_size=5), ValueError, r"group_size must be a divisor of the head size 16 \(values are grouped along channels\), got 5"),
    (dict(group_size=0), ValueError, "group_size"),
    (dict(group_size=32), ValueError, "group_size"),
    (dict(window=-1), ValueError, r"window must be an int in \[0, max_len=16\]"),
    (dict(window=17), ValueError, r"window must be an int in \[0, max_len=16\]"),
    (dict(window="all"), TypeError, "window"),
    (dict(max_len=17), ValueError, r"max_len must be an int in \[1, block_size=16\], got 17"),
    (dict(batch_size=0), ValueError, r"batch_size must be an int in \[1, \d+\] \(a cache of at most 2\*\*31 numbers\), got 0"),
])
def test_bad_settings_are_refused_by_name(tiny_gpt, kwargs, error, words):
    settings = dict(batch_size=1) | kwargs
    with pytest.raises(error, match=words):
        QuantizedKVCache(tiny_gpt.config, **settings)


def test_a_config_that_is_not_a_gpt_config_is_refused():
    with pytest.raises(TypeError, match="config must be a GPTConfig"):
        QuantizedKVCache({"n_layer": 4}, 1)
    with pytest.raises(ValueError, match="bits must be 2, 4 or 8"):
        quantized_bytes_per_token(GPTConfig(vocab_size=10), 16, 16)


def test_values_beyond_float16_are_refused_instead_of_turning_into_nan():
    """A zero point or scale past 65504 would be infinite in float16, and every dequantised value NaN."""
    edge = torch.tensor([[0.0, 65504.0, -65504.0, 5.0]])
    back = dequantize(*quantize(edge, 8, 1, 4), 1, 4)
    assert torch.isfinite(back).all() and (back - edge).abs().max() <= 514 / 2
    with pytest.raises(ValueError, match=r"x holds a value of size 1e\+06; allowed are values within ±65504"):
        quantize(torch.tensor([[0.0, 1e6, -1e6, 5.0]]), 8, 1, 4)
    cache = QuantizedKVCache(GPTConfig(vocab_size=10), 1)
    big, fine = torch.full((1, 4, 1, 32), 1e5), torch.zeros(1, 4, 1, 32)
    for k, v, name in ((big, fine, "k"), (fine, big, "v")):
        with pytest.raises(ValueError, match=f"{name} holds a value of size 1e\\+05"):
            cache.write(0, k, v)
    assert cache.length == 0 and all(s.length == 0 for s in cache.keys + cache.values)


def test_a_grouped_query_model_takes_a_quantised_cache_of_its_own_heads(tiny_gpt):
    """Fewer key/value heads and fewer bits combine: the cache stores each of the model's key/value heads once."""
    from kvlib.compress import grouped
    from kvlib.quality import stepwise_logits

    gqa = grouped(tiny_gpt, 1)                                # one key/value head for every query head
    cfg = gqa.config
    x = torch.randint(cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    exact = QuantizedKVCache(cfg, 2, 16, bits=4, window=16, group_size=4)   # all in the window: no code at all
    with torch.inference_mode():
        assert (stepwise_logits(gqa, x, exact) - gqa(x)[0]).abs().max() < 1e-4
    coded = QuantizedKVCache(cfg, 2, 16, bits=4, group_size=4)
    stepwise_logits(gqa, x, coded)
    assert coded.nbytes / x.numel() == quantized_bytes_per_token(cfg, 4, 4)    # 16 positions: four whole key groups
    assert quantized_bytes_per_token(cfg, 4, 4) * cfg.n_head == quantized_bytes_per_token(tiny_gpt.config, 4, 4) * cfg.kv_heads
