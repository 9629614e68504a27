"""The serving engine and the paged cache at their edges: refused calls leave everything as it was."""
from __future__ import annotations

import copy
import threading

import pytest

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
            engine.cache.pool.num_free, dict(engine.cache.tables))


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


def test_two_threads_stepping_one_engine_are_refused_clearly(tiny_gpt):
    engine = Engine(tiny_gpt, 64, kv_block_size=4)
    for i in range(4):
        engine.add(Request(i, [1, 2, 3], 8))
    errors, inside = [], threading.Event()
    original = engine._step

    def slow_step():
        inside.set()
        threading.Event().wait(0.3)
        return original()

    engine._step = slow_step
    worker = threading.Thread(target=engine.step)
    worker.start()
    inside.wait(5)
    try:
        engine.step()
    except RuntimeError as e:
        errors.append(str(e))
    worker.join()
    assert errors and "not thread-safe" in errors[0]


def test_the_paged_cache_names_an_unknown_sequence_and_a_bad_batch(tiny_gpt):
    cache = PagedKVCache(tiny_gpt.config, 8, 4)
    cache.add_sequence("a", [1, 2, 3])
    for call in (lambda: cache.free("x"), lambda: cache.fork("x", "y"), lambda: cache.slots_needed("x", 1),
                 lambda: cache.truncate("x", 0), lambda: cache.batch(["x"], [[1]])):
        with pytest.raises(KeyError, match="no sequence 'x'"):
            call()
    free = cache.pool.num_free
    with pytest.raises(ValueError, match="same length"):
        cache.batch(["a"], [[1], [2]])
    with pytest.raises(ValueError, match="once in a batch"):
        cache.batch(["a", "a"], [[1], [2]])
    with pytest.raises(ValueError, match="token id"):
        cache.batch(["a"], [[tiny_gpt.config.vocab_size]])
    with pytest.raises(ValueError, match="already in the cache"):
        cache.fork("a", "a")
    assert cache.pool.num_free == free and list(cache.tables) == ["a"]
