"""The engine: a request's tokens do not depend on its neighbours, preemption and prefix hits change nothing."""
from dataclasses import replace

import pytest
import torch

from kvlib.decoding import generate
from kvlib.serving import Engine, Request
from kvlib.tools.serving_runs import run_continuous, run_one_at_a_time, run_static_batching
from kvlib.paged import parallel_sample
from kvlib.poems import encode_prompt
from kvlib.tools.traces import make_trace

from .tools.test_traces import POEMS, trace  # noqa: F401 (trace is a fixture)

def alone(model, request):
    out = generate(model, torch.tensor([request.prompt]), request.max_new_tokens, temperature=0.0, decoder="model")
    return out.new_tokens[0].tolist()


def test_tokens_do_not_depend_on_the_batch_even_with_preemption(shipped_char, trace):
    model, _ = shipped_char
    # All waiting from the start, so that the squeeze does not depend on how fast this machine serves.
    at_once = [replace(r, arrival=0.0) for r in trace]
    run = run_continuous(model, at_once, num_blocks=8, max_num_seqs=8)  # one sequence's worth: preemption
    assert run.preemptions > 0
    for r in at_once:
        assert run.tokens[r.id] == alone(model, r), f"request {r.id}"


def test_the_three_ways_write_the_same_tokens(shipped_char, trace):
    model, _ = shipped_char
    one, static = run_one_at_a_time(model, trace), run_static_batching(model, trace, 4)
    cont = run_continuous(model, trace, num_blocks=32)
    assert one.tokens == static.tokens == cont.tokens
    for run in (one, static, cont):
        assert set(run.finish) == {r.id for r in trace}
        assert all(run.first_token[i] <= run.finish[i] and run.arrival[i] <= run.first_token[i] for i in run.finish)
        assert 0 < run.memory_share <= 1
    assert static.memory_share < cont.memory_share


def test_the_teaching_decoder_runs_every_pass_through_the_model(shipped_char, trace, monkeypatch):
    """decoder="model": prefills and decodes alike go through GPT.forward, never the lean step; same tokens."""
    model, _ = shipped_char
    fast = run_continuous(model, trace, num_blocks=32)

    def refuse(*args, **kwargs):
        raise AssertionError("the lean step ran in an engine made with decoder='model'")
    monkeypatch.setattr("kvlib.fast.PagedStep.__call__", refuse)
    taught = run_continuous(model, trace, num_blocks=32, decoder="model")
    assert taught.tokens == fast.tokens
    assert taught.prefill_tokens > 0


def test_each_way_counts_its_prefills_and_decode_tokens(shipped_char, trace):
    """Every kept token comes out of a prefill pass or a decode pass, and the two passes' times fit in the run."""
    model, _ = shipped_char
    at_once = [replace(r, arrival=0.0) for r in trace]
    runs = {"one": run_one_at_a_time(model, at_once), "static": run_static_batching(model, at_once, 4),
            "continuous": run_continuous(model, at_once, num_blocks=8, max_num_seqs=8)}
    assert runs["continuous"].preemptions > 0
    for name, run in runs.items():
        # a prefill chooses one token for each sequence it (re)starts: each request once, once more per preemption
        assert run.decode_tokens == run.generated - len(at_once) - run.preemptions, name
        assert 0 < run.prefill_seconds and 0 < run.decode_seconds
        assert run.prefill_seconds + run.decode_seconds <= run.makespan + 1e-9
    assert runs["one"].prefill_passes == len(at_once) and runs["static"].prefill_passes == -(-len(at_once) // 4)


def test_finished_sequences_leave_at_once_and_free_their_blocks(shipped_char, trace):
    model, _ = shipped_char
    engine = Engine(model, 32)
    for r in trace:
        engine.add(r)
    while engine.has_work:
        held = {i: len(t.token_ids) for i, t in engine.cache.block_manager.tables.items()}
        rec = engine.step()
        assert not set(rec.retired) & set(rec.running) and not set(rec.retired) & set(engine.cache.block_manager.tables)
        assert len(rec.running) <= engine.max_num_seqs
        if rec.kind == "decode":  # the pass's memory, read before the finished gave theirs back
            assert rec.real_tokens == sum(held[i] + 1 for i in rec.running + rec.retired) <= rec.used_positions
    assert engine.cache.num_free_blocks == 32 and not engine.cache.block_manager.tables
    assert {s.id for s in engine.finished} == {r.id for r in trace}


def test_prefix_caching_saves_prefill_and_changes_no_token(shipped_char):
    model, tok = shipped_char
    prefix = "床前明月光，疑是地上霜。"
    # Arrivals far apart (waits are skipped, not slept): each one finds the blocks of those before it.
    reqs = [Request(i, encode_prompt(tok, prefix + c), 6, arrival=10.0 * i) for i, c in enumerate("举低望思")]
    off = run_continuous(model, reqs, 32, kv_block_size=4)
    on = run_continuous(model, reqs, 32, kv_block_size=4, enable_prefix_caching=True)
    assert on.tokens == off.tokens
    assert on.computed_tokens < off.computed_tokens


def test_parallel_samples_share_the_prompt_blocks(shipped_char):
    model, tok = shipped_char
    prompt = encode_prompt(tok, "床前明月光，疑是地上霜。")  # 13 tokens: 3 full blocks of 4, one partly filled
    r = parallel_sample(model, prompt, 4, 8, kv_block_size=4, seed=1)
    assert r["prompt_blocks"] == r["blocks_after_fork"] == 4
    assert r["copies_on_write"] == 3 and r["full_prompt_blocks_still_shared"] == 3
    assert r["blocks_at_end"] < r["blocks_without_sharing"]
    assert len({tuple(o) for o in r["outputs"]}) > 1
    assert parallel_sample(model, prompt, 4, 8, kv_block_size=4, seed=1)["outputs"] == r["outputs"]
    kept = parallel_sample(model, prompt, 4, 8, kv_block_size=4, seed=1, banned=(tok.eos_id,))
    assert all(tok.eos_id not in o for o in kept["outputs"])


def test_percentile_interpolates_like_numpy():
    from kvlib.tools.timing import percentile

    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 95) == 5.0
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)


def test_engine_settings_are_checked(shipped_char):
    model, _ = shipped_char
    with pytest.raises(ValueError, match="num_blocks"):
        Engine(model, 7)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Engine(model, 8, max_num_batched_tokens=64)
    for bad, error in ((-0.1, ValueError), (1.0, ValueError), (float("nan"), ValueError), ("0.1", TypeError),
                       (True, TypeError)):
        with pytest.raises(error, match=r"watermark must be .* in \[0, 1\), got"):
            Engine(model, 8, watermark=bad)


def test_the_watermark_keeps_room_to_grow(shipped_char):
    """Admission leaves watermark x the pool free while others run: fewer preemptions, the same tokens."""
    model, tok = shipped_char
    reqs = make_trace(tok, POEMS, 10, rate=1000.0, seed=5, max_new_tokens=24)
    runs = {w: run_continuous(model, reqs, 40, kv_block_size=4, watermark=w) for w in (0.0, 0.25)}
    assert runs[0.25].preemptions < runs[0.0].preemptions
    assert runs[0.25].tokens == runs[0.0].tokens
    assert Engine(model, 40, kv_block_size=4, watermark=0.25).watermark_blocks == 10


def test_a_static_batch_holds_only_requests_that_fit_together(tiny_gpt):
    """Padded to its longest prompt and run until its longest answer, a batch must fit the block as a whole: a
    request that would not fit with the others waits for the next batch, and every answer is written in full."""
    block = tiny_gpt.config.block_size                            # 16
    reqs = [Request(0, [1] * 10, 3), Request(1, [2, 3], 12), Request(2, [4] * 4, 5)]  # 10 + 12 - 1 > 16
    static, one = run_static_batching(tiny_gpt, reqs, batch_size=3), run_one_at_a_time(tiny_gpt, reqs)
    assert static.tokens == one.tokens
    assert all(len(static.tokens[r.id]) == r.max_new_tokens for r in reqs)
    assert static.prefill_passes == 2                             # [0], then [1, 2]: 4 + 12 - 1 fits
    assert max(len(r.prompt) for r in reqs[1:]) + max(r.max_new_tokens for r in reqs[1:]) - 1 <= block


def test_parallel_sampling_keeps_its_cache_in_the_models_dtype(tiny_gpt):
    """A float64 model gets a float64 pool (as the engine does), and samples like its float32 original."""
    import copy

    double = copy.deepcopy(tiny_gpt).double()
    got = parallel_sample(double, [1, 2, 3], 3, 5, seed=4, kv_block_size=4)
    assert [len(o) for o in got["outputs"]] == [5, 5, 5]
    assert got["outputs"] == parallel_sample(tiny_gpt, [1, 2, 3], 3, 5, seed=4, kv_block_size=4)["outputs"]
