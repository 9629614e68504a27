"""The paged cache: block bookkeeping, copy-on-write, prefix hits, and equality with the static cache."""
import pytest
import torch

from kvlib.blocks import BlockManager, block_hash
from kvlib.paged import PagedKVCache
from kvlib.verify import verify_paged
from kvlib.poems import encode_prompt


def test_every_request_matches_the_static_cache(shipped_char):
    model, tok = shipped_char
    prompts = [encode_prompt(tok, s) for s in ["床前明月光", "春", "大漠孤烟直，长河落日圆。", "白日依山尽，黄河入海流。欲穷千里"]]
    reports = verify_paged(model, prompts, 24)
    for r in reports:
        assert r.passed, r
        assert r.max_abs_logit_diff <= 1e-4 and r.tokens_equal


def test_a_report_passes_tokens_that_part_only_at_near_ties():
    from kvlib.verify import PagedReport

    assert PagedReport(3, 8, 2e-5, True).passed
    assert PagedReport(3, 8, 2e-5, False, parted=1, near_ties=1).passed       # rounding may pick either token
    assert not PagedReport(3, 8, 2e-5, False, parted=2, near_ties=1).passed   # one parting was no near-tie
    assert not PagedReport(3, 8, 2e-4, True).passed                           # logits beyond atol


def test_blocks_smaller_than_a_prompt_still_match(shipped_char):
    model, tok = shipped_char
    prompts = [encode_prompt(tok, "白日依山尽，黄河入海流。"), encode_prompt(tok, "春眠")]
    assert all(r.passed for r in verify_paged(model, prompts, 12, kv_block_size=4))


def test_the_pool_hands_out_fresh_blocks_first_and_evicts_the_least_recently_freed(tiny_gpt):
    pool = BlockManager(num_blocks=3, kv_block_size=4)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    assert pool.num_free == 0
    with pytest.raises(RuntimeError, match="full"):
        pool.allocate()
    pool.register(a, block_hash(None, [1, 2, 3, 4]), [1, 2, 3, 4])
    pool.register(b, block_hash(None, [5, 6, 7, 8]), [5, 6, 7, 8])
    pool.release(a)
    pool.release(b)
    pool.release(c)   # never full: fresh again
    assert pool.allocate() == c                              # fresh before cached
    assert pool.lookup(block_hash(None, [1, 2, 3, 4]), [1, 2, 3, 4]) == a
    assert pool.lookup(block_hash(None, [1, 2, 3, 4]), [1, 2, 3, 5]) is None
    assert pool.allocate() == a and pool.evictions == 1      # a was freed first: least recently used
    assert pool.lookup(block_hash(None, [1, 2, 3, 4]), [1, 2, 3, 4]) is None
    pool.share(b)                                            # a hit takes b back out of the free list
    assert pool.blocks[b].ref_count == 1 and pool.num_free == 0


def test_a_hash_depends_on_the_block_before():
    assert block_hash(None, [1, 2]) != block_hash(block_hash(None, [3, 4]), [1, 2])


@torch.inference_mode()
def test_prefix_hits_reuse_full_blocks_and_change_no_logits(shipped_char):
    model, tok = shipped_char
    prompt = encode_prompt(tok, "床前明月光，疑是地上霜。举头望明月，")
    cache = PagedKVCache(model.config, 16, kv_block_size=4)
    assert cache.add_sequence("a", prompt) == 0
    first = cache.forward(model, ["a"], [prompt])
    cached = cache.add_sequence("b", prompt)
    assert cached == 4 * ((len(prompt) - 1) // 4) and cache.prefix_hit_tokens == cached
    assert cache.block_manager.tables["b"].blocks[: cached // 4] == cache.block_manager.tables["a"].blocks[: cached // 4]
    second = cache.forward(model, ["b"], [prompt[cached:]])
    assert (first - second).abs().max() <= 1e-4
    cache.free("a")
    cache.free("b")
    assert cache.num_free_blocks == 16 and cache.block_manager.free_cached  # full blocks stay findable


@torch.inference_mode()
def test_a_fork_shares_blocks_and_copies_the_last_one_on_write(shipped_char):
    model, tok = shipped_char
    prompt = encode_prompt(tok, "春眠不觉晓，处处")  # 9 tokens: two full blocks of 4, one partly filled
    cache = PagedKVCache(model.config, 12, kv_block_size=4, enable_prefix_caching=False)
    cache.add_sequence(0, prompt)
    cache.forward(model, [0], [prompt])
    cache.fork(0, 1)
    assert cache.used_blocks() == 3 and all(cache.block_manager.blocks[b].ref_count == 2 for b in cache.block_manager.tables[0].blocks)
    parent_last = cache.block_manager.tables[0].blocks[-1]
    before = cache.pool.k[:, parent_last * 4:(parent_last + 1) * 4].clone()
    assert cache.slots_needed(1, 1) == 1
    out = cache.forward(model, [0, 1], [[5], [6]])
    assert cache.copies_on_write == 1 and cache.block_manager.tables[0].blocks[:2] == cache.block_manager.tables[1].blocks[:2]
    assert cache.block_manager.tables[0].blocks[-1] != cache.block_manager.tables[1].blocks[-1]
    assert torch.equal(cache.pool.k[:, parent_last * 4:parent_last * 4 + 1], before[:, :1])
    alone = PagedKVCache(model.config, 4, kv_block_size=4)
    alone.add_sequence(0, prompt + [6])
    assert (alone.forward(model, [0], [prompt + [6]])[0] - out[1]).abs().max() <= 1e-4


def test_stored_tokens_count_a_shared_block_once(tiny_gpt):
    cache = PagedKVCache(tiny_gpt.config, 8, kv_block_size=4)
    cache.add_sequence(0, [1, 2, 3, 4, 5])
    cache.forward(tiny_gpt, [0], [[1, 2, 3, 4, 5]])
    cache.fork(0, 1)
    assert cache.used_blocks() == 2 and cache.stored_tokens() == 5


def test_bad_input_names_the_parameter(tiny_gpt):
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache(tiny_gpt.config, 0)
    cache = PagedKVCache(tiny_gpt.config, 8, kv_block_size=4)
    cache.add_sequence(0, [1, 2])
    with pytest.raises(ValueError, match="already"):
        cache.add_sequence(0, [1, 2])
    with pytest.raises(ValueError, match="block holds 16"):
        cache.forward(tiny_gpt, [0], [list(range(17))])
    with pytest.raises(ValueError, match="no new tokens"):
        cache.forward(tiny_gpt, [0], [[]])


@torch.inference_mode()
def test_a_block_computed_twice_at_once_is_kept_once(shipped_char):
    model, tok = shipped_char
    prompt = encode_prompt(tok, "白日依山尽，黄河入海流。")  # 13 tokens: three full blocks of 4
    cache = PagedKVCache(model.config, 8, kv_block_size=4)
    for sid in (0, 1):
        assert cache.add_sequence(sid, prompt) == 0      # neither is stored yet: both compute
    cache.forward(model, [0, 1], [prompt, prompt])
    cache.free(0)
    cache.free(1)
    assert len(cache.block_manager.free_cached) == 3 and len(cache.block_manager.by_hash) == 3
    taken = [cache.block_manager.allocate() for _ in range(8)]   # every block, evicting the cached ones
    assert sorted(taken) == list(range(8)) and not cache.block_manager.by_hash and cache.block_manager.evictions == 3
