"""Evicting caches: they keep what they say, at the original positions, and equal the full cache when nothing goes."""
from __future__ import annotations

import pytest
import torch

from kvlib import (Cache, ContextLimitError, HeavyHitterCache, KVCache, QuantizedKVCache, SinkCache,
                   SlidingWindowCache, cache_decoder, generate, pad_prompts)
from kvlib.evict import forward_with_cache

WIDE = [(SlidingWindowCache, dict(window=16)), (SinkCache, dict(sinks=2, window=14)),
        (HeavyHitterCache, dict(budget=16, recent=4))]  # for the tiny model's 16-token block: nothing goes


def tokens(model, n: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.randint(model.config.vocab_size, (batch, n), generator=torch.Generator().manual_seed(seed))


def decode(model, cache, idx, prefill: int) -> torch.Tensor:
    """Logits (B, T, V) of ``idx``: the first ``prefill`` tokens in one pass, then one at a time."""
    with torch.inference_mode():
        out = [forward_with_cache(model, idx[:, :prefill], cache)[0]]
        out += [forward_with_cache(model, idx[:, t:t + 1], cache)[0] for t in range(prefill, idx.shape[1])]
    return torch.cat(out, 1)


@pytest.mark.parametrize("cls, settings", WIDE, ids=lambda x: getattr(x, "__name__", ""))
def test_a_budget_over_the_whole_sequence_is_the_full_cache_exactly(tiny_gpt, cls, settings):
    idx = tokens(tiny_gpt, 16, batch=2)
    cache = cls(tiny_gpt.config, 2, **settings)
    assert isinstance(cache, Cache)
    with torch.inference_mode():
        full = KVCache(tiny_gpt.config, 2)
        ref = torch.cat([tiny_gpt(idx[:, :5], cache=full)[0]] +
                        [tiny_gpt(idx[:, t:t + 1], cache=full)[0] for t in range(5, 16)], 1)
    assert torch.equal(decode(tiny_gpt, cache, idx, 5), ref)
    assert cache.length == cache.position == 16


@pytest.mark.parametrize("cls, settings", [(SlidingWindowCache, dict(window=128)), (SinkCache, dict(sinks=4, window=124)),
                                           (HeavyHitterCache, dict(budget=128, recent=8))], ids=lambda x: getattr(x, "__name__", ""))
def test_generate_on_the_shipped_model_gives_the_full_caches_tokens_when_nothing_is_evicted(shipped_char, cls, settings):
    model, tok = shipped_char
    idx = torch.tensor([tok.encode("床前明月光，")] * 2)
    ref = generate(model, idx, 40, temperature=0, decoder="model")
    out = generate(model, idx, 40, temperature=0, decoder=cache_decoder(cls, **settings))
    assert torch.equal(out.tokens, ref.tokens)


@pytest.mark.parametrize("cls, settings, kept", [
    (SlidingWindowCache, dict(window=5), lambda P: list(range(P - 5, P))),
    (SinkCache, dict(sinks=2, window=4), lambda P: [0, 1] + list(range(P - 4, P))),
], ids=["window", "sinks"])
def test_the_kept_positions_are_the_sinks_and_the_window_and_evicting_is_masking(tiny_gpt, cls, settings, kept):
    """The model's positions are learned and added to the input, so dropping a position is hiding its key."""
    idx = tokens(tiny_gpt, 14, seed=1)
    cache = cls(tiny_gpt.config, 1, **settings)
    full = KVCache(tiny_gpt.config, 1)
    with torch.inference_mode():
        a = forward_with_cache(tiny_gpt, idx[:, :8], cache)[0]
        assert torch.allclose(a, tiny_gpt(idx[:, :8], cache=full)[0], atol=1e-6)  # the prompt is prefilled in full
        for P in range(8, 14):
            assert cache.position == P and cache.length == len(kept(P))
            assert all(p[0, h].tolist() == kept(P) for p in cache.positions for h in range(2))
            mask = torch.zeros(1, P + 1, dtype=torch.bool)
            mask[0, kept(P) + [P]] = True                  # the same keys, hidden in the full cache instead
            got = forward_with_cache(tiny_gpt, idx[:, P:P + 1], cache)[0]
            want = tiny_gpt(idx[:, P:P + 1], cache=full, key_mask=mask)[0]
            assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("make", [lambda cfg: SlidingWindowCache(cfg, 1, window=4),
                                  lambda cfg: SinkCache(cfg, 1, sinks=1, window=3)])
def test_after_an_eviction_the_model_asks_the_cache_for_the_positions(tiny_gpt, make):
    """Numbered from the kept count (4), the next token would be another token entirely: GPT.forward takes the
    positions from the cache (9, past the four it keeps), as forward_with_cache does."""
    idx = tokens(tiny_gpt, 10, seed=2)
    right, other = make(tiny_gpt.config), make(tiny_gpt.config)
    with torch.inference_mode():
        forward_with_cache(tiny_gpt, idx[:, :9], right)
        tiny_gpt(idx[:, :9], cache=other)
        assert right.next_positions(1).tolist() == [[9]] and right.length == other.length == 4
        a = forward_with_cache(tiny_gpt, idx[:, 9:], right)[0]
        b = tiny_gpt(idx[:, 9:], cache=other)[0]
        assert other.length == 4 and other.position == 10
    assert torch.allclose(a, b)


def test_heavy_hitters_are_the_most_attended_keys_plus_the_recent_ones(tiny_gpt):
    idx = tokens(tiny_gpt, 12, seed=3, batch=2)
    roomy = HeavyHitterCache(tiny_gpt.config, 2, budget=16, recent=3)
    tight = HeavyHitterCache(tiny_gpt.config, 2, budget=7, recent=3)
    with torch.inference_mode():
        forward_with_cache(tiny_gpt, idx, roomy)
        forward_with_cache(tiny_gpt, idx, tight)
    for layer in range(tiny_gpt.config.n_layer):
        scores = roomy.scores[layer]                                        # (B, H, 12): attention received
        assert torch.allclose(scores.sum(-1), torch.full((2, 2), 12.0))     # each query spreads 1
        heavy = scores[..., :9].topk(4, dim=-1).indices.sort(-1).values
        want = torch.cat([heavy, torch.arange(9, 12).expand(2, 2, 3)], -1)
        assert torch.equal(tight.positions[layer], want)
        assert torch.equal(tight.k[layer], roomy.k[layer].gather(2, want[..., None].expand(-1, -1, -1, 16)))
    assert tight.length == 7 and tight.position == 12


def test_heavy_hitter_scores_are_the_attention_weights_of_the_first_layer(tiny_gpt):
    idx = tokens(tiny_gpt, 6, seed=4)
    cache = HeavyHitterCache(tiny_gpt.config, 1, budget=16, recent=0)
    with torch.inference_mode():
        forward_with_cache(tiny_gpt, idx, cache)
        block = tiny_gpt.transformer.h[0]
        x = block.ln_1(tiny_gpt.transformer.wte(idx) + tiny_gpt.transformer.wpe(torch.arange(6)))
        q, k, _ = block.attn.c_attn(x).split(32, dim=2)
        q, k = (t.view(1, 6, 2, 16).transpose(1, 2) for t in (q, k))      # (B, H, T, D)
        att = (q @ k.transpose(-2, -1) / 4).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    assert torch.allclose(cache.scores[0], att.softmax(-1).sum(2), atol=1e-5)


def test_eviction_bounds_the_bytes(tiny_gpt):
    idx = tokens(tiny_gpt, 16, seed=5)
    window, h2o = SlidingWindowCache(tiny_gpt.config, 1, window=4), HeavyHitterCache(tiny_gpt.config, 1, budget=6, recent=2)
    decode(tiny_gpt, window, idx, 8)
    decode(tiny_gpt, h2o, idx, 8)
    L, B, H, D = 2, 1, 2, 16
    assert window.nbytes == L * 2 * B * H * 4 * D * 4                  # keys and values of 4 positions, float32
    assert h2o.nbytes == L * (2 * B * H * 6 * D * 4 + B * H * 6 * 4)    # and one float32 score per kept key
    assert window.nbytes == KVCache(tiny_gpt.config, 1).nbytes * 4 // 16


def test_truncate_keeps_the_oldest_kept_and_goes_on_after_the_newest(tiny_gpt):
    idx = tokens(tiny_gpt, 16, seed=6)
    cache = SinkCache(tiny_gpt.config, 1, sinks=2, window=4)
    decode(tiny_gpt, cache, idx[:, :12], 6)                 # kept: 0, 1, 8, 9, 10, 11
    cache.truncate(4)
    assert (cache.length, cache.position) == (4, 10)
    assert cache.positions[0][0, 0].tolist() == [0, 1, 8, 9]
    with torch.inference_mode():
        forward_with_cache(tiny_gpt, idx[:, 10:11], cache)
    assert cache.positions[1][0, 1].tolist() == [0, 1, 8, 9, 10]
    cache.truncate(1)
    assert (cache.length, cache.position) == (1, 1)
    cache.reset()
    assert (cache.length, cache.position, cache.nbytes) == (0, 0, 0)
    for bad, error in [(2, ValueError), (-1, ValueError), (1.0, TypeError)]:
        with pytest.raises(error, match=r"\bn\b"):
            cache.truncate(bad)


def test_before_any_eviction_a_roll_back_is_exact(tiny_gpt):
    idx = tokens(tiny_gpt, 12, seed=7)
    with torch.inference_mode():
        full = tiny_gpt(idx)[0]
        for cls, settings in WIDE:
            cache = cls(tiny_gpt.config, 1, **settings)
            forward_with_cache(tiny_gpt, idx, cache)
            cache.truncate(9)
            again = forward_with_cache(tiny_gpt, idx[:, 9:], cache)[0]
            assert torch.allclose(again, full[:, 9:], atol=1e-5), cls.__name__


def test_a_forward_pass_that_stopped_half_way_leaves_no_trace(tiny_gpt):
    idx = tokens(tiny_gpt, 10, seed=8)
    a, b = SlidingWindowCache(tiny_gpt.config, 1, window=4), SlidingWindowCache(tiny_gpt.config, 1, window=4)
    with torch.inference_mode():
        forward_with_cache(tiny_gpt, idx[:, :7], a)
        forward_with_cache(tiny_gpt, idx[:, :7], b)
        b.write(0, torch.randn(1, 2, 2, 16), torch.randn(1, 2, 2, 16))  # layer 0 only, never advanced
        assert torch.equal(forward_with_cache(tiny_gpt, idx[:, 7:], a)[0], forward_with_cache(tiny_gpt, idx[:, 7:], b)[0])
    with pytest.raises(ValueError, match="advance"):
        b.advance(1)


def test_positions_past_the_cache_are_a_context_limit(tiny_gpt):
    cache = SlidingWindowCache(tiny_gpt.config, 1, max_len=10, window=4)
    with torch.inference_mode():
        forward_with_cache(tiny_gpt, tokens(tiny_gpt, 9), cache)
        with pytest.raises(ContextLimitError, match="at most 10"):
            forward_with_cache(tiny_gpt, tokens(tiny_gpt, 2), cache)
    assert (cache.length, cache.position) == (4, 9)


def test_h2o_sees_the_queries_through_the_model_and_refuses_a_write_without_them(tiny_gpt):
    cache = HeavyHitterCache(tiny_gpt.config, 1, budget=4, recent=2)
    with torch.inference_mode():
        tiny_gpt(tokens(tiny_gpt, 3), cache=cache)          # GPT.forward runs inside cache.attending(model)
    assert (cache.length, cache.position) == (3, 3)
    k = torch.zeros(1, tiny_gpt.config.n_head, 1, tiny_gpt.config.head_size)
    with pytest.raises(RuntimeError, match="queries"):
        cache.write(0, k, k)                                 # a write outside a forward pass: no queries seen
    assert (cache.length, cache.position) == (3, 3)


def test_padded_prompts_and_other_caches_are_refused(tiny_gpt):
    idx, mask = pad_prompts([[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match="key_mask"):
        generate(tiny_gpt, idx, 3, temperature=0, key_mask=mask, decoder=cache_decoder(SinkCache, sinks=1, window=4))
    with pytest.raises(TypeError, match="cache must be an EvictingCache"):
        forward_with_cache(tiny_gpt, idx, QuantizedKVCache(tiny_gpt.config, 2))
    with pytest.raises(TypeError, match="cache_class"):
        cache_decoder("SinkCache")


@pytest.mark.parametrize("cls, settings, error, words", [
    (SlidingWindowCache, dict(window=0), ValueError, r"window must be an int in \[1, 16\]"),
    (SlidingWindowCache, dict(window=2.5), TypeError, r"window must be an int in \[1, 16\]"),
    (SlidingWindowCache, dict(window=17), ValueError, r"window must be an int in \[1, 16\]"),
    (SinkCache, dict(sinks=-1, window=4), ValueError, r"sinks must be an int in \[0, 15\] \(first positions kept"),
    (SinkCache, dict(sinks=4, window=13), ValueError, r"window must be an int in \[1, 12\]"),
    (SinkCache, dict(sinks=True, window=4), TypeError, "sinks"),
    (HeavyHitterCache, dict(budget=0, recent=0), ValueError, r"budget must be an int in \[1, max_len=16\]"),
    (HeavyHitterCache, dict(budget=17, recent=0), ValueError, r"budget must be an int in \[1, max_len=16\]"),
    (HeavyHitterCache, dict(budget=4, recent=5), ValueError, r"recent must be an int in \[0, budget=4\], got 5"),
    (SlidingWindowCache, dict(window=4, max_len=17), ValueError, r"max_len must be an int in \[1, block_size=16\]"),
    (SlidingWindowCache, dict(window=4, batch_size=0), ValueError, r"batch_size must be an int in \[1, \d+\]"),
])
def test_bad_settings_are_refused_by_name(tiny_gpt, cls, settings, error, words):
    with pytest.raises(error, match=words):
        cls(tiny_gpt.config, **(dict(batch_size=1) | settings))
