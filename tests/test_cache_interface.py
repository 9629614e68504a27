"""One written-down cache interface: every cache implements ``Cache`` and runs the model to the same logits."""
from __future__ import annotations

import pytest
import torch

from kvlib import FastDecoder, GrowingKVCache, KVCache
from kvlib import Cache
from kvlib.paged import PagedKVCache


def caches(model):
    cfg = model.config
    fast = FastDecoder(model, 1)
    return {"KVCache": KVCache(cfg, 1), "GrowingKVCache": GrowingKVCache(cfg, 1), "FastDecoder.cache": fast.cache}


def test_every_cache_implements_the_protocol(random_gpt):
    for name, cache in caches(random_gpt).items():
        assert isinstance(cache, Cache), name
    paged = PagedKVCache(random_gpt.config, num_blocks=8, kv_block_size=4)
    paged.add_sequence("a", [1, 2, 3])
    assert isinstance(paged.batch(["a"], [[4]]), Cache)


def test_the_model_gives_the_same_logits_through_every_cache_and_after_a_roll_back(random_gpt):
    idx = torch.randint(random_gpt.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full, _ = random_gpt(idx)  # (1, 12, V), no cache
        for name, cache in caches(random_gpt).items():
            a, _ = random_gpt(idx[:, :8], cache=cache)
            b, _ = random_gpt(idx[:, 8:], cache=cache)
            assert torch.allclose(torch.cat([a, b], 1), full, atol=1e-4), name
            assert cache.length == 12
            cache.truncate(9)  # keep 9, feed the last three again
            c, _ = random_gpt(idx[:, 9:], cache=cache)
            assert torch.allclose(c, full[:, 9:], atol=1e-4), name
            assert cache.length == 12


@pytest.mark.parametrize("bad", [-1, 13, 2.0, True, "3"])
def test_truncate_refuses_what_is_not_a_kept_length(random_gpt, bad):
    for name, cache in caches(random_gpt).items():
        cache.advance(12) if name != "GrowingKVCache" else None
        if name == "GrowingKVCache":
            with torch.inference_mode():
                random_gpt(torch.zeros(1, 12, dtype=torch.long), cache=cache)
        with pytest.raises((TypeError, ValueError), match=r"\bn\b"):
            cache.truncate(bad)
        assert cache.length == 12, name  # unchanged by the refused call


def test_a_paged_roll_back_releases_blocks_and_copies_a_block_a_prefix_may_find(random_gpt):
    cfg = random_gpt.config
    paged = PagedKVCache(cfg, num_blocks=8, kv_block_size=4, enable_prefix_caching=True)
    paged.add_sequence("a", list(range(1, 11)))          # 10 tokens: blocks of 4, 4, 2
    paged.forward(random_gpt, ["a"], [list(range(1, 11))])
    free = paged.num_free_blocks
    paged.truncate("a", 6)                                # keeps 2 blocks, the second half full
    assert paged.table("a").length == 6 and len(paged.table("a").blocks) == 2
    assert paged.num_free_blocks == free + 1
    kept = paged.table("a").blocks[1]
    assert paged.slots_needed("a", 1) == 1                # the registered block is copied before a write
    with pytest.raises(KeyError, match="no sequence 'b'"):
        paged.truncate("b", 0)
    with pytest.raises(ValueError, match=r"\bn\b"):
        paged.truncate("a", 7)
    assert paged.table("a").blocks[1] == kept


def test_a_cache_made_for_another_configuration_is_refused_before_anything_is_written(tiny_gpt):
    """Fewer layers, another block size: GPT.forward and the paged cache say so up front, and the cache stays empty."""
    from dataclasses import replace

    from kvlib import GPT, QuantizedKVCache, SlidingWindowCache

    cfg = tiny_gpt.config
    idx = torch.ones(1, 3, dtype=torch.long)
    shallow = replace(cfg, n_layer=cfg.n_layer - 1) if cfg.n_layer > 1 else replace(cfg, n_layer=2)
    for cache in (GPT(shallow).new_cache(1), QuantizedKVCache(shallow, 1), SlidingWindowCache(shallow, 1, window=4)):
        with pytest.raises(ValueError, match="made for another configuration"):
            tiny_gpt(idx, cache=cache)
        assert cache.length == 0
    paged = PagedKVCache(replace(cfg, block_size=2 * cfg.block_size), 8, 4)
    paged.add_sequence(0, [1] * 3)
    with pytest.raises(ValueError, match="made for another configuration"):
        paged.forward(tiny_gpt, [0], [[1] * 3])
    assert paged.table(0).length == 0 and paged.used_blocks() == 0


def every_cache(model) -> dict:
    """One of each cache kind, as a model would be run over it (name -> (cache, exact))."""
    from kvlib import HeavyHitterCache, QuantizedKVCache, SinkCache, SlidingWindowCache

    cfg = model.config
    return {"KVCache": (KVCache(cfg, 1), True), "GrowingKVCache": (GrowingKVCache(cfg, 1), True),
            "FastDecoder.cache": (FastDecoder(model, 1).cache, True),
            "QuantizedKVCache, full window": (QuantizedKVCache(cfg, 1, window=cfg.block_size), True),
            "QuantizedKVCache, 4 bits": (QuantizedKVCache(cfg, 1, bits=4), False),
            "SlidingWindowCache": (SlidingWindowCache(cfg, 1, window=6), False),
            "SinkCache": (SinkCache(cfg, 1, sinks=2, window=4), False),
            "HeavyHitterCache": (HeavyHitterCache(cfg, 1, budget=6, recent=2), False)}


@pytest.mark.parametrize("name", ["KVCache", "GrowingKVCache", "FastDecoder.cache", "QuantizedKVCache, full window",
                                  "QuantizedKVCache, 4 bits", "SlidingWindowCache", "SinkCache", "HeavyHitterCache"])
def test_every_cache_keeps_the_same_contract(random_gpt, name):
    """Through the protocol alone: exact caches give the model's own logits; lossy ones run, roll back and
    report their size; every one resets to empty."""
    cache, exact = every_cache(random_gpt)[name]
    cfg = random_gpt.config
    assert isinstance(cache, Cache) and cache.config == cfg and cache.length == 0 and cache.nbytes >= 0
    assert cache.next_positions(3).tolist() == [[0, 1, 2]] and isinstance(cache.takes_padding, bool)
    idx = torch.randint(cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full, _ = random_gpt(idx)
        a, _ = random_gpt(idx[:, :8], cache=cache)
        b, _ = random_gpt(idx[:, 8:], cache=cache)
        assert torch.isfinite(b).all() and cache.nbytes > 0, name
        if exact:
            assert torch.allclose(torch.cat([a, b], 1), full, atol=1e-4), name
            assert cache.length == 12 and cache.next_positions(1).tolist() == [[12]]
        kept = cache.length
        cache.truncate(kept - 1)  # a roll-back of one position, then the last token again
        assert cache.length == kept - 1
        c, _ = random_gpt(idx[:, -1:], cache=cache)
        assert torch.isfinite(c).all() and cache.length <= kept, name
        if exact:
            assert torch.allclose(c, full[:, -1:], atol=1e-4), name
    cache.reset()
    assert cache.length == 0 and cache.next_positions(1).tolist() == [[0]], name
