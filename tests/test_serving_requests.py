"""What a server needs from the engine: per-request sampling with its own seed, stop tokens, banned tokens,
logprobs and abort, each checked against ``generate`` or against the pool's free blocks."""
from __future__ import annotations

import pytest
import torch

from kvlib.decoding import generate
from kvlib.sampling import Sampling, ban, token_mask
from kvlib.serving import Engine, Request
from kvlib.verify import greedy_agreement

PROMPTS = [[0, 5, 9, 14], [0, 7], [0, 21, 4, 8, 30, 2], [0, 11, 12]]


def serve(model, requests, num_blocks=64, **options):
    engine = Engine(model, num_blocks, kv_block_size=4, **options)
    for r in requests:
        engine.add(r)
    while engine.has_work:
        engine.step()
    return engine, {s.id: s for s in engine.finished}


def test_a_sampled_request_writes_what_generate_writes_with_its_seed_whoever_runs_beside_it(shipped_char):
    model, _ = shipped_char
    settings = Sampling(0.9, 40, None)
    mine = Request(7, PROMPTS[0], 24, sampling=settings, seed=123)
    neighbours = [Request(i, p, 20, sampling=Sampling(1.0), seed=i) for i, p in enumerate(PROMPTS[1:])]
    _, alone = serve(model, [mine])
    _, crowded = serve(model, [*neighbours, mine])
    want = generate(model, torch.tensor([mine.prompt]), 24, temperature=0.9, top_k=40,
                    generator=torch.Generator().manual_seed(123)).new_tokens[0].tolist()
    assert alone[7].output == crowded[7].output == want
    _, other_seed = serve(model, [Request(7, PROMPTS[0], 24, sampling=settings, seed=124)])
    assert other_seed[7].output != want


def test_greedy_requests_write_generates_greedy_tokens(shipped_char):
    model, _ = shipped_char
    _, done = serve(model, [Request(i, p, 16) for i, p in enumerate(PROMPTS)])
    for i, p in enumerate(PROMPTS):
        want = generate(model, torch.tensor([p]), 16, temperature=0.0).new_tokens[0]
        assert greedy_agreement(model, torch.tensor(p), torch.tensor(done[i].output), want) != "differ"


def test_a_stop_token_ends_the_request_and_frees_its_blocks(shipped_char):
    model, _ = shipped_char
    free = Engine(model, 64, kv_block_size=4).cache.num_free_blocks
    greedy = generate(model, torch.tensor([PROMPTS[2]]), 20, temperature=0.0).new_tokens[0].tolist()
    stop = greedy[5]
    engine, done = serve(model, [Request(0, PROMPTS[2], 20, stop_token_ids=(stop,))])
    cut = greedy.index(stop) + 1
    assert done[0].output == greedy[:cut] and done[0].finish_reason == "stop"
    assert engine.cache.num_free_blocks == free
    _, full = serve(model, [Request(0, PROMPTS[2], 20)])
    assert full[0].finish_reason == "length" and len(full[0].output) == 20


def test_banned_tokens_are_never_written_and_the_rest_follows_generate(shipped_char):
    model, _ = shipped_char
    V = model.config.vocab_size
    greedy = generate(model, torch.tensor([PROMPTS[0]]), 12, temperature=0.0).new_tokens[0].tolist()
    banned = tuple(sorted(set(greedy[:4])))
    _, done = serve(model, [Request(0, PROMPTS[0], 12, banned=banned)])
    assert not set(done[0].output) & set(banned)
    mask = token_mask(banned, V)
    want = generate(model, torch.tensor([PROMPTS[0]]), 12, temperature=0.0,
                    logits_hook=lambda step, tokens, logits: ban(logits, mask)).new_tokens[0].tolist()
    assert done[0].output == want


def test_logprobs_are_the_models_top_tokens_at_each_step(shipped_char):
    model, _ = shipped_char
    _, done = serve(model, [Request(0, PROMPTS[1], 8, logprobs=5)])
    seq = done[0]
    assert len(seq.logprobs) == 8 and all(len(step) == 5 for step in seq.logprobs)  # greedy: the chosen is the top
    for token, top in zip(seq.output, seq.logprobs):
        assert max(top, key=top.get) == token                      # greedy writes the most likely token
        assert all(v <= 0 for v in top.values())
    with torch.inference_mode():
        first = model(torch.tensor([PROMPTS[1]]))[0][0, -1].log_softmax(-1)
    for t, v in seq.logprobs[0].items():
        assert v == pytest.approx(float(first[t]), abs=1e-4)


def test_abort_frees_a_running_requests_blocks_at_once(shipped_char):
    model, _ = shipped_char
    engine = Engine(model, 64, kv_block_size=4)
    free = engine.cache.num_free_blocks
    engine.add(Request(0, PROMPTS[2], 30))
    engine.add(Request(1, PROMPTS[0], 30, arrival=1e9))             # still waiting
    engine.step()
    engine.step()
    assert engine.cache.num_free_blocks < free
    assert engine.abort(0) and engine.abort(1)
    assert engine.cache.num_free_blocks == free and not engine.has_work
    assert {s.id: s.finish_reason for s in engine.finished} == {0: "abort", 1: "abort"}
    assert not engine.abort(0) and not engine.abort(99)


def test_a_failed_step_puts_back_the_draws_of_sampled_requests(shipped_char, monkeypatch):
    model, _ = shipped_char
    request = Request(0, PROMPTS[0], 10, sampling=Sampling(1.0), seed=5)
    _, clean = serve(model, [request])
    engine = Engine(model, 64, kv_block_size=4)
    engine.add(request)
    engine.step()
    real = engine.record

    def interrupted(*args, **kwargs):  # after the tokens were drawn: the draws must be put back too
        raise KeyboardInterrupt
    monkeypatch.setattr(engine, "record", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    monkeypatch.setattr(engine, "record", real)
    while engine.has_work:
        engine.step()
    assert engine.finished[0].output == clean[0].output


@pytest.mark.parametrize("field, value, error", [
    ("sampling", (0.8, None, None), TypeError), ("seed", -1, ValueError), ("stop_token_ids", ["a"], TypeError),
    ("banned", [-2], ValueError), ("logprobs", 21, ValueError), ("logprobs", True, TypeError)])
def test_a_request_refuses_bad_settings_naming_them(field, value, error):
    with pytest.raises(error, match=field):
        Request(0, [0, 1], 4, **{field: value})
