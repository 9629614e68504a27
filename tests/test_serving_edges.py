"""The serving engine and the paged cache at their edges: refused calls leave everything as it was."""
from __future__ import annotations

import copy
import threading

import pytest
import torch

from kvlib.paged import PagedKVCache
from kvlib.serving import Engine, Request


@pytest.mark.parametrize("args, match", [
    ((-1, [1, 2], 3), "id"),
    ((0, [], 3), "prompt"),
    ((0, "春风", 3), "prompt"),
    ((0, [1, -2], 3), r"prompt\[1\]"),
    ((0, [1, 2], 0), "max_new_tokens"),
    ((0, [1, 2], 3, float("nan")), "arrival"),
    ((0, [1, 2], 3, -1.0), "arrival"),
])
def test_a_request_is_checked_when_made(args, match):
    with pytest.raises((TypeError, ValueError), match=match):
        Request(*args)


def state(engine):
    return (copy.deepcopy([s.request for s in engine.waiting]), len(engine.running),
            engine.cache.num_free_blocks, dict(engine.cache.block_manager.tables))


def test_a_request_that_cannot_fit_is_refused_and_the_engine_stays_as_it_was(tiny_gpt):
    engine = Engine(tiny_gpt, 64, kv_block_size=4)
    engine.add(Request(0, [1, 2, 3], 4))
    before = state(engine)
    block, vocab = tiny_gpt.config.block_size, tiny_gpt.config.vocab_size
    with pytest.raises(ValueError, match=f"block of {block}"):
        engine.add(Request(1, [1] * block, 1))
    with pytest.raises(ValueError, match=r"token id .*allowed are ids in \[0, "):
        engine.add(Request(2, [vocab], 1))
    with pytest.raises(ValueError, match="already in this engine"):
        engine.add(Request(0, [1], 1))
    with pytest.raises(TypeError, match="Request"):
        engine.add((3, [1], 1))
    assert state(engine) == before
    while engine.has_work:
        engine.step()
    assert [len(s.output) for s in engine.finished] == [4]


def test_changing_a_request_after_adding_it_changes_nothing_in_the_engine(tiny_gpt):
    """The engine queues a copy: a request stretched past the block, or its prompt edited, after ``add`` is served as
    it was added (before, the stretched one crashed inside the model at the block's end, and the engine with it)."""
    engine = Engine(tiny_gpt, 64, kv_block_size=4)
    request = Request(0, [1, 2, 3], 4)
    engine.add(request)
    request.max_new_tokens = 10 * tiny_gpt.config.block_size
    request.prompt.append(5)
    while engine.has_work:
        engine.step()
    (served,) = engine.finished
    assert served.request.prompt == [1, 2, 3] and len(served.output) == 4


def test_two_threads_stepping_one_engine_are_refused_clearly(tiny_gpt):
    engine = Engine(tiny_gpt, 64, kv_block_size=4)
    for i in range(4):
        engine.add(Request(i, [1, 2, 3], 8))
    errors, inside = [], threading.Event()
    original = engine.schedule

    def slow_schedule():
        inside.set()
        threading.Event().wait(0.3)
        return original()

    engine.schedule = slow_schedule
    worker = threading.Thread(target=engine.step)
    worker.start()
    inside.wait(5)
    try:
        engine.step()
    except RuntimeError as e:
        errors.append(str(e))
    worker.join()
    assert errors and "Engine.step" in errors[0] and "not thread-safe" in errors[0]


def test_the_paged_cache_names_an_unknown_sequence_and_a_bad_batch(tiny_gpt):
    cache = PagedKVCache(tiny_gpt.config, 8, 4)
    cache.add_sequence("a", [1, 2, 3])
    for call in (lambda: cache.free("x"), lambda: cache.fork("x", "y"), lambda: cache.slots_needed("x", 1),
                 lambda: cache.truncate("x", 0), lambda: cache.batch(["x"], [[1]])):
        with pytest.raises(KeyError, match="no sequence 'x'"):
            call()
    free = cache.num_free_blocks
    with pytest.raises(ValueError, match="same length"):
        cache.batch(["a"], [[1], [2]])
    with pytest.raises(ValueError, match="once in a batch"):
        cache.batch(["a", "a"], [[1], [2]])
    with pytest.raises(ValueError, match="token id"):
        cache.batch(["a"], [[tiny_gpt.config.vocab_size]])
    with pytest.raises(ValueError, match="already in the cache"):
        cache.fork("a", "a")
    assert cache.num_free_blocks == free and list(cache.block_manager.tables) == ["a"]


def full_state(engine):
    """Everything a step may change: queues, each request's progress, tables, pool lists and stored keys."""
    cache, pool, blocks = engine.cache, engine.cache.pool, engine.cache.block_manager
    seqs = [(s.id, s.state, s.preemptions, list(s.output), s.first_token)
            for s in (*engine.waiting, *engine.running, *engine.finished)]
    tables = {sid: (list(t.blocks), list(t.token_ids)) for sid, t in cache.block_manager.tables.items()}
    stored = {sid: [(pool.k[:, b * cache.kv_block_size:(b + 1) * cache.kv_block_size].clone()) for b in t.blocks]
              for sid, t in cache.block_manager.tables.items()}
    return (seqs, [s.id for s in engine.waiting], [s.id for s in engine.running], len(engine.history), tables,
            [(b.ref_count, b.hash) for b in blocks.blocks], list(blocks.free_fresh), list(blocks.free_cached),
            dict(blocks.by_hash), cache.copies_on_write), stored


def assert_same(before, after):
    (meta_a, stored_a), (meta_b, stored_b) = before, after
    assert meta_a == meta_b
    assert stored_a.keys() == stored_b.keys()
    for sid in stored_a:
        assert all(torch.equal(x, y) for x, y in zip(stored_a[sid], stored_b[sid])), sid


class Interrupt(Exception):
    pass


def interrupt_next_forward(model, monkeypatch):
    """The model's next forward pass (either path) raises, as Ctrl-C in a notebook would."""
    import kvlib.fast

    def boom(*args, **kwargs):
        raise Interrupt
    monkeypatch.setattr(type(model), "forward", boom)
    monkeypatch.setattr(kvlib.fast.PagedStep, "__call__", boom)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_an_interrupted_decode_that_preempted_leaves_engine_and_cache_as_before(tiny_gpt, monkeypatch, prefix_caching):
    # A pool so small that the next decode step must preempt the newest sequence and reuse its blocks.
    engine = Engine(tiny_gpt, 4, kv_block_size=4, watermark=0.0, enable_prefix_caching=prefix_caching)
    engine.add(Request(0, [1, 2, 3, 4, 5, 6, 7], 8))
    engine.add(Request(1, [8, 9, 10, 11, 12, 13, 14], 8))
    engine.step()                                      # both prefilled: 2 blocks each, the pool full
    while sum(engine.cache.slots_needed(s.id, 1) for s in engine.running) <= engine.cache.num_free_blocks:
        engine.step()
    before = full_state(engine)
    with monkeypatch.context() as m:
        interrupt_next_forward(tiny_gpt, m)
        with pytest.raises(Interrupt):
            engine.step()
    assert_same(before, full_state(engine))
    record = engine.step()                             # and it goes on as if nothing happened
    assert record.preempted == [1]


def test_an_interrupted_forward_after_copy_on_write_keeps_no_copy(tiny_gpt, monkeypatch):
    cache = PagedKVCache(tiny_gpt.config, 8, 4)
    cache.add_sequence("a", [1, 2, 3, 4, 5, 6])
    cache.forward(tiny_gpt, ["a"], [[1, 2, 3, 4, 5, 6]])
    cache.fork("a", "b")                               # "b" shares a's partly filled last block
    engine_like = type("E", (), {"cache": cache, "waiting": [], "running": [], "finished": [], "history": []})
    before = full_state(engine_like)
    with monkeypatch.context() as m:
        interrupt_next_forward(tiny_gpt, m)
        with pytest.raises(Interrupt):
            cache.forward(tiny_gpt, ["b"], [[7]])       # reserve copies the shared block first
    assert_same(before, full_state(engine_like))
    assert cache.forward(tiny_gpt, ["b"], [[7]]).shape == (1, tiny_gpt.config.vocab_size)
    assert cache.copies_on_write == 1


def test_a_refused_batch_evicts_no_cached_prefix(tiny_gpt):
    cache = PagedKVCache(tiny_gpt.config, 3, 4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    cache.add_sequence("a", prompt)
    cache.forward(tiny_gpt, ["a"], [prompt])
    cache.free("a")                                    # two full blocks stay findable, one fresh
    cached = dict(cache.block_manager.by_hash)
    cache.add_sequence("b", [20, 21])
    with pytest.raises(ValueError, match="token id"):
        cache.forward(tiny_gpt, ["b"], [[20, tiny_gpt.config.vocab_size]])
    assert cache.block_manager.by_hash == cached and cache.add_sequence("c", prompt) == 8


def test_a_bool_or_float_sequence_id_is_refused_not_taken_for_an_int(tiny_gpt):
    """True == 1 and 0.0 == 0 as dict keys: acting on sequence 0 or 1 instead would be silent; they are refused."""
    cache = PagedKVCache(tiny_gpt.config, 8, 4)
    cache.add_sequence(0, [1, 2])
    cache.add_sequence(1, [3])
    before = {sid: list(t.token_ids) for sid, t in cache.block_manager.tables.items()}
    for bad in (True, 0.0, float("nan")):
        with pytest.raises(TypeError, match=f"must be an int or a str.*not a {type(bad).__name__}"):
            cache.forward(tiny_gpt, [bad], [[1]])
        with pytest.raises(TypeError, match="must be an int or a str"):
            cache.add_sequence(bad, [1])
    assert {sid: list(t.token_ids) for sid, t in cache.block_manager.tables.items()} == before


def test_a_device_this_machine_lacks_is_refused_clearly(tiny_gpt):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="device 'cuda:7' is not available here.*'cpu' always is"):
        PagedKVCache(tiny_gpt.config, 4, 4, device="cuda:7")


def test_a_clock_that_stands_still_stops_the_engine_instead_of_idling_forever(tiny_gpt):
    class Frozen:
        def now(self):
            return 0.0

        def wait_until(self, t):
            pass

    engine = Engine(tiny_gpt, 16, kv_block_size=4, clock=Frozen())
    engine.add(Request(0, [1, 2], 2, arrival=1.0))
    with pytest.raises(RuntimeError, match=r"clock stood still: after wait_until\(1\) its now\(\) is 0"):
        engine.step()


def test_logits_that_cannot_be_ranked_stop_a_step_and_leave_the_engine_as_it_was(tiny_gpt):
    """Finite weights whose logits overflow: the step refuses inside its transaction, before any token is kept."""
    hot = copy.deepcopy(tiny_gpt)
    with torch.no_grad():
        hot.transformer.ln_f.weight.fill_(3e38)
    engine = Engine(hot, 16, kv_block_size=4)
    engine.add(Request(0, [1, 2], 3))
    before = state(engine)
    with pytest.raises(ValueError, match="the model's logits row 0 cannot be sampled"):
        engine.step()
    assert state(engine) == before
