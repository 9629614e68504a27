"""The decoding loops: context limit, EOS per row, left-padded batches, results, seeds, bad input, hooks."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.decoding import (ContextLimitError, GenerationResult, generate, generate_uncached, pad_prompts,
                            position_ids_from_mask)

EOS = 3  # an arbitrary id of the tiny model's 64 used as the stop token


def random_prompt(length: int, vocab_size: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=g)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def cached(model, idx, n, **kw) -> GenerationResult:
    return generate(model, idx, n, **kw)  # the default decoder


def cached_model(model, idx, n, **kw) -> GenerationResult:
    return generate(model, idx, n, decoder="model", **kw)  # the teaching model over its KVCache


def uncached(model, idx, n, **kw) -> GenerationResult:
    return generate_uncached(model, idx, n, block_size=model.config.block_size, **kw)


LOOPS = pytest.mark.parametrize("loop", [cached, cached_model, uncached], ids=["cached", "model", "uncached"])
CACHED = pytest.mark.parametrize("loop", [cached, cached_model], ids=["cached", "model"])


# ---- The context limit --------------------------------------------------------------------------

@CACHED
def test_cached_loop_stops_at_the_context_limit_with_129_tokens(random_gpt, loop):
    idx = random_prompt(120, 7184)
    out = loop(random_gpt, idx, 20, generator=seeded(0))
    assert out.tokens.shape == (1, 129)
    assert out.new_tokens.shape == (1, 9)
    assert out.stop_reason == "context_limit"
    assert torch.equal(out.tokens[:, :120], idx)
    assert out.finished.tolist() == [False]


def test_a_request_that_exactly_fits_is_not_a_context_stop(random_gpt):
    out = generate(random_gpt, random_prompt(120, 7184), 9, generator=seeded(0))
    assert out.tokens.shape == (1, 129)
    assert out.stop_reason == "max_new_tokens"


def test_context_limit_can_raise(random_gpt):
    with pytest.raises(ContextLimitError, match="128"):
        generate(random_gpt, random_prompt(120, 7184), 20, generator=seeded(0), on_context_limit="raise")
    # Within the block nothing is raised.
    out = generate(random_gpt, random_prompt(120, 7184), 9, generator=seeded(0), on_context_limit="raise")
    assert out.tokens.shape == (1, 129)


def test_recompute_loop_slides_to_140_tokens(random_gpt):
    windows = []

    def f(idx):
        windows.append(idx.clone())
        return random_gpt(idx)

    idx = random_prompt(120, 7184)
    out = generate_uncached(f, idx, 20, block_size=128, generator=seeded(0))
    assert out.tokens.shape == (1, 140)
    assert out.new_tokens.shape == (1, 20)
    assert out.stop_reason == "max_new_tokens"
    assert torch.equal(out.tokens[:, :120], idx)
    assert len(windows) == 20
    for n, w in enumerate(windows):  # always the last (at most) 128 tokens produced so far
        end = 120 + n
        assert torch.equal(w, out.tokens[:, max(0, end - 128): end])
    assert max(w.shape[1] for w in windows) == 128


@settings(max_examples=40, deadline=None)
@given(prompt_length=st.integers(1, 16), max_new_tokens=st.integers(0, 24), seed=st.integers(0, 2**16))
def test_generate_never_exceeds_block_size_plus_one(tiny_gpt, prompt_length, max_new_tokens, seed):
    block = tiny_gpt.config.block_size  # 16
    idx = random_prompt(prompt_length, 64, seed)
    out = generate(tiny_gpt, idx, max_new_tokens, generator=seeded(seed))
    fits = block - prompt_length + 1
    assert out.tokens.shape[1] <= block + 1
    assert out.tokens.shape == (1, prompt_length + min(max_new_tokens, fits))
    assert out.new_tokens.shape == (1, min(max_new_tokens, fits))
    assert out.stop_reason == ("context_limit" if max_new_tokens > fits else "max_new_tokens")
    assert torch.equal(out.tokens[:, :prompt_length], idx)


def test_a_prompt_longer_than_the_block_raises(tiny_gpt):
    with pytest.raises(ContextLimitError, match="16"):
        generate(tiny_gpt, random_prompt(17, 64), 1)
    with pytest.raises(ContextLimitError):
        generate(tiny_gpt, random_prompt(17, 64), 1, on_context_limit="stop")


# ---- EOS: per row, eos-only tails, the batch's stop reason --------------------------------------

def eos_at(steps: list[int | None]):
    """A logits hook that makes row b emit EOS at step ``steps[b]`` and never otherwise."""
    def hook(step, tokens, logits):
        logits = logits.clone()
        logits[:, EOS] = float("-inf")  # no row stops by chance
        for b, s in enumerate(steps):
            if s == step:
                logits[b] = float("-inf")
                logits[b, EOS] = 0.0
        return logits
    return hook


def left_padded_batch():
    prompts = [[5, 6, 7, 8], [9], [10, 11]]
    return pad_prompts(prompts, pad_id=0)


@LOOPS
def test_rows_finish_at_different_steps_and_then_emit_only_eos(tiny_gpt, loop):
    idx, mask = left_padded_batch()
    steps = [1, 4, 2]
    out = loop(tiny_gpt, idx, 10, key_mask=mask, eos_id=EOS, logits_hook=eos_at(steps), generator=seeded(0))
    assert out.stop_reason == "eos"
    assert out.new_tokens.shape == (3, 5)  # the last row to finish does so at step 4
    assert out.finished.tolist() == [True, True, True]
    for b, s in enumerate(steps):
        row = out.new_tokens[b].tolist()
        assert EOS not in row[:s], f"row {b} stopped early: {row}"
        assert row[s:] == [EOS] * (5 - s), f"row {b} kept going after EOS: {row}"


@LOOPS
def test_a_row_that_never_samples_eos_runs_to_max_new_tokens(tiny_gpt, loop):
    idx, mask = left_padded_batch()
    out = loop(tiny_gpt, idx, 6, key_mask=mask, eos_id=EOS, logits_hook=eos_at([1, None, 0]),
               generator=seeded(0))
    assert out.stop_reason == "max_new_tokens"
    assert out.new_tokens.shape == (3, 6)
    assert out.finished.tolist() == [True, False, True]
    assert out.new_tokens[0].tolist() == [out.new_tokens[0, 0].item()] + [EOS] * 5
    assert out.new_tokens[2].tolist() == [EOS] * 6
    assert EOS not in out.new_tokens[1].tolist()


@LOOPS
def test_eos_on_the_first_step_of_a_single_row(tiny_gpt, loop):
    out = loop(tiny_gpt, random_prompt(3, 64), 10, eos_id=EOS, logits_hook=eos_at([0]), generator=seeded(0))
    assert out.stop_reason == "eos"
    assert out.new_tokens.tolist() == [[EOS]]
    assert out.tokens.shape == (1, 4)


def test_without_eos_id_nothing_is_finished(tiny_gpt):
    out = generate(tiny_gpt, random_prompt(3, 64), 5, logits_hook=eos_at([0]), generator=seeded(0))
    assert out.stop_reason == "max_new_tokens"
    assert out.new_tokens.shape == (1, 5)
    assert out.finished.tolist() == [False]


# ---- GenerationResult and left-padded batches ---------------------------------------------------

@CACHED
def test_result_holds_the_left_padded_prompt_and_the_new_tokens(tiny_gpt, loop):
    idx, mask = left_padded_batch()
    out = loop(tiny_gpt, idx, 5, key_mask=mask, generator=seeded(0))
    assert out.tokens.shape == (3, 9)
    assert torch.equal(out.tokens[:, :4], idx)
    assert out.new_tokens.shape == (3, 5)
    assert torch.equal(out.new_tokens, out.tokens[:, 4:])
    assert out.new_tokens.dtype == torch.long
    assert out.prompt_lengths.tolist() == [4, 1, 2]
    assert out.finished.tolist() == [False, False, False]
    assert out.row(1) == [9] + out.new_tokens[1].tolist()
    assert out.row(0) == [5, 6, 7, 8] + out.new_tokens[0].tolist()


def test_uncached_result_counts_every_prompt_token(tiny_gpt):
    idx = random_prompt(4, 64, batch=2)
    out = generate_uncached(tiny_gpt, idx, 3, block_size=16, generator=seeded(0))
    assert out.tokens.shape == (2, 7)
    assert torch.equal(out.tokens[:, :4], idx)
    assert torch.equal(out.new_tokens, out.tokens[:, 4:])
    assert out.prompt_lengths.tolist() == [4, 4]
    assert out.stop_reason == "max_new_tokens"
    assert out.finished.tolist() == [False, False]


def test_zero_new_tokens_returns_the_prompt(tiny_gpt):
    idx = random_prompt(4, 64, batch=2)
    out = generate(tiny_gpt, idx, 0)
    assert torch.equal(out.tokens, idx)
    assert out.new_tokens.shape == (2, 0)
    assert out.stop_reason == "max_new_tokens"


def test_pad_prompts_left_pads_and_returns_the_mask():
    idx, mask = pad_prompts([[1, 2, 3], [4], [5, 6]], pad_id=9)
    assert idx.dtype == torch.long
    assert idx.tolist() == [[1, 2, 3], [9, 9, 4], [9, 5, 6]]
    assert mask.tolist() == [[True, True, True], [False, False, True], [False, True, True]]


@pytest.mark.parametrize("prompts", [[], [[1, 2], []]], ids=["no prompts", "an empty prompt"])
def test_pad_prompts_rejects_empty_input(prompts):
    with pytest.raises(ValueError, match="empty"):
        pad_prompts(prompts)


def test_fence4_positions_from_a_left_padded_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]
    assert mask.sum(-1).tolist() == [3, 5, 1]  # the position each row's next token takes
    assert position_ids_from_mask(mask.bool()).tolist() == position_ids_from_mask(mask).tolist()


@CACHED
def test_a_left_padded_row_decodes_like_the_same_prompt_alone(tiny_gpt, loop):
    """Positions advance from mask.sum(-1) for every row, step after step, not from the padded width."""
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    idx, mask = pad_prompts(prompts)
    batch_logits = []

    def record(store):
        def hook(step, tokens, logits):
            store.append(logits.clone())
            return logits
        return hook

    batch = loop(tiny_gpt, idx, 8, temperature=0.0, key_mask=mask, logits_hook=record(batch_logits))
    for b, p in enumerate(prompts):
        alone_logits = []
        alone = loop(tiny_gpt, torch.tensor([p]), 8, temperature=0.0, logits_hook=record(alone_logits))
        assert batch.new_tokens[b].tolist() == alone.new_tokens[0].tolist()
        for step, (x, y) in enumerate(zip(batch_logits, alone_logits)):
            torch.testing.assert_close(x[b], y[0], atol=1e-5, rtol=0, msg=f"row {b}, step {step}")


@CACHED
def test_an_unpadded_batch_decodes_like_each_row_alone(tiny_gpt, loop):
    """Without a mask every row shares one position per step (the one-token fast path, B > 1)."""
    idx = random_prompt(4, 64, seed=7, batch=3)
    batch = loop(tiny_gpt, idx, 10, temperature=0.0)
    for b in range(3):
        alone = loop(tiny_gpt, idx[b:b + 1], 10, temperature=0.0)
        assert batch.tokens[b].tolist() == alone.tokens[0].tolist()


# ---- Seeds and the global RNG -------------------------------------------------------------------

@LOOPS
def test_the_same_seed_repeats_and_different_seeds_differ(tiny_gpt, loop):
    idx = random_prompt(2, 64)
    a = loop(tiny_gpt, idx, 12, generator=seeded(1))
    b = loop(tiny_gpt, idx, 12, generator=seeded(1))
    c = loop(tiny_gpt, idx, 12, generator=seeded(2))
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, c.tokens)


@CACHED
def test_cached_and_uncached_sample_the_same_tokens_from_one_seed(tiny_gpt, loop):
    idx = random_prompt(3, 64)
    a = loop(tiny_gpt, idx, 10, generator=seeded(5), top_k=20, top_p=0.9)
    b = generate_uncached(tiny_gpt, idx, 10, block_size=16, generator=seeded(5), top_k=20, top_p=0.9)
    assert torch.equal(a.tokens, b.tokens)


@LOOPS
def test_generate_with_a_generator_leaves_the_global_rng_alone(tiny_gpt, loop):
    before = torch.get_rng_state()
    loop(tiny_gpt, random_prompt(3, 64), 8, generator=seeded(0), top_k=10, top_p=0.9)
    assert torch.equal(torch.get_rng_state(), before)


# ---- Bad input ---------------------------------------------------------------------------------

GOOD = torch.tensor([[1, 2, 3]])


@pytest.mark.parametrize("args, kwargs, error, match", [
    ((GOOD, -1), {}, ValueError, "max_new_tokens"),
    ((GOOD, 2.5), {}, TypeError, "max_new_tokens"),
    ((GOOD.float(), 2), {}, TypeError, "idx"),
    ((GOOD[0], 2), {}, TypeError, r"\(B, T\)"),
    (([[1, 2, 3]], 2), {}, TypeError, "idx"),
    ((torch.tensor([[1, 64]]), 2), {}, ValueError, r"\[0, 64\)"),
    ((torch.tensor([[-1, 2]]), 2), {}, ValueError, r"\[0, 64\)"),
    ((torch.zeros(1, 0, dtype=torch.long), 2), {}, ValueError, "at least one token"),
    ((GOOD, 2), {"on_context_limit": "truncate"}, ValueError, "on_context_limit"),
    ((GOOD, 2), {"key_mask": torch.ones(1, 4, dtype=torch.bool)}, ValueError, "key_mask"),
    ((GOOD, 2), {"key_mask": torch.ones(2, 3, dtype=torch.bool)}, ValueError, "key_mask"),
    ((GOOD, 2), {"key_mask": torch.zeros(1, 3, dtype=torch.bool)}, ValueError, "real token"),
    ((GOOD, 2), {"temperature": -1.0}, ValueError, "emperature"),
    ((GOOD, 2), {"top_p": 0.0}, ValueError, "top_p"),
    ((GOOD, 2), {"decoder": "slow"}, ValueError, "decoder"),
    ((GOOD, 2), {"decoder": 5}, TypeError, "decoder"),
    ((GOOD, 2), {"generator": 5}, TypeError, "generator"),
], ids=["negative max_new_tokens", "float max_new_tokens", "float idx", "1-D idx", "list idx",
        "id = vocab size", "negative id", "no tokens", "bad on_context_limit", "key_mask too wide",
        "key_mask too tall", "key_mask without real tokens", "negative temperature", "top_p 0",
        "unknown decoder name", "decoder not callable", "generator not a Generator"])
def test_bad_input_gives_a_clear_error(tiny_gpt, args, kwargs, error, match):
    with pytest.raises(error, match=match):
        generate(tiny_gpt, *args, **kwargs)


def test_uncached_loop_checks_its_arguments(tiny_gpt):
    with pytest.raises(ValueError, match="block_size"):
        generate_uncached(tiny_gpt, GOOD, 2, block_size=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_uncached(tiny_gpt, GOOD, -1, block_size=16)
    with pytest.raises(TypeError, match="idx"):
        generate_uncached(tiny_gpt, GOOD.float(), 2, block_size=16)


# ---- The logits hook ---------------------------------------------------------------------------

@LOOPS
def test_logits_hook_sees_step_tokens_so_far_and_the_logits(tiny_gpt, loop):
    idx, mask = left_padded_batch()
    calls = []

    def hook(step, tokens, logits):
        calls.append((step, tokens.clone(), logits.shape))
        return logits

    out = loop(tiny_gpt, idx, 6, key_mask=mask, logits_hook=hook, generator=seeded(0))
    assert [c[0] for c in calls] == list(range(6))
    for step, tokens, shape in calls:
        assert tokens.shape == (3, 4 + step)
        assert torch.equal(tokens, out.tokens[:, :4 + step])
        assert shape == (3, 64)


@LOOPS
def test_the_hooks_logits_are_the_ones_sampled_from(tiny_gpt, loop):
    def force_seven(step, tokens, logits):
        forced = torch.full_like(logits, float("-inf"))
        forced[:, 7] = 0.0
        return forced

    out = loop(tiny_gpt, random_prompt(3, 64, batch=2), 5, logits_hook=force_seven, generator=seeded(0))
    assert out.new_tokens.tolist() == [[7] * 5, [7] * 5]


# ---- The recompute loop on a left-padded batch -------------------------------------------------

PADDED = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]


@pytest.mark.parametrize("decoder", [None, "model"], ids=["default decoder", "model decoder"])
def test_uncached_padded_batch_gives_the_greedy_tokens_of_generate(tiny_gpt, decoder):
    idx, mask = pad_prompts(PADDED)
    plain = generate_uncached(tiny_gpt, idx, 10, block_size=16, temperature=0.0, key_mask=mask)
    fast = generate(tiny_gpt, idx, 10, temperature=0.0, key_mask=mask, decoder=decoder)
    assert torch.equal(plain.tokens, fast.tokens)
    assert plain.prompt_lengths.tolist() == [5, 2, 3]
    assert plain.row(1) == [10, 11] + plain.new_tokens[1].tolist()


def test_uncached_padded_row_decodes_like_the_prompt_alone(tiny_gpt):
    """Positions come from the mask and padding is hidden: each row's logits are those of the row alone."""
    idx, mask = pad_prompts(PADDED)
    batch_logits = []
    batch = generate_uncached(tiny_gpt, idx, 8, block_size=16, temperature=0.0, key_mask=mask,
                              logits_hook=lambda n, t, x: batch_logits.append(x.clone()) or x)
    for b, p in enumerate(PADDED):
        alone_logits = []
        alone = generate_uncached(tiny_gpt, torch.tensor([p]), 8, block_size=16, temperature=0.0,
                                  logits_hook=lambda n, t, x: alone_logits.append(x.clone()) or x)
        assert batch.new_tokens[b].tolist() == alone.new_tokens[0].tolist()
        for step, (x, y) in enumerate(zip(batch_logits, alone_logits)):
            torch.testing.assert_close(x[b], y[0], atol=1e-5, rtol=0, msg=f"row {b}, step {step}")


def test_uncached_padding_ids_do_not_matter(tiny_gpt):
    idx, mask = pad_prompts(PADDED, pad_id=0)
    other, _ = pad_prompts(PADDED, pad_id=63)
    a = generate_uncached(tiny_gpt, idx, 6, block_size=16, temperature=0.0, key_mask=mask)
    b = generate_uncached(tiny_gpt, other, 6, block_size=16, temperature=0.0, key_mask=mask)
    assert torch.equal(a.new_tokens, b.new_tokens)


def test_uncached_padded_batch_passes_mask_and_positions_to_f(tiny_gpt):
    idx, mask = pad_prompts([[5, 6, 7], [8]])
    seen = []

    def f(window, key_mask=None, position_ids=None):
        seen.append((window.shape, key_mask.tolist(), position_ids.tolist()))
        return tiny_gpt(window, key_mask=key_mask, position_ids=position_ids)

    generate_uncached(f, idx, 2, block_size=16, temperature=0.0, key_mask=mask)
    assert seen[0] == ((2, 3), [[True] * 3, [False, False, True]], [[0, 1, 2], [0, 0, 0]])
    assert seen[1][1:] == ([[True] * 4, [False, False, True, True]], [[0, 1, 2, 3], [0, 0, 0, 1]])


def test_uncached_padded_batch_slides_past_the_block(tiny_gpt):
    """Past the block the window is the last 16 columns, renumbered from its real tokens, as unpadded."""
    idx, mask = pad_prompts(PADDED)
    out = generate_uncached(tiny_gpt, idx, 20, block_size=16, temperature=0.0, key_mask=mask)
    assert out.new_tokens.shape == (3, 20) and out.stop_reason == "max_new_tokens"
    alone = generate_uncached(tiny_gpt, torch.tensor([PADDED[0]]), 20, block_size=16, temperature=0.0)
    assert out.new_tokens[0].tolist() == alone.new_tokens[0].tolist()  # the unpadded row


def test_uncached_checks_the_key_mask(tiny_gpt):
    idx, mask = pad_prompts(PADDED)
    with pytest.raises(ValueError, match="key_mask must have the shape of idx"):
        generate_uncached(tiny_gpt, idx, 2, block_size=16, key_mask=mask[:, 1:])
    with pytest.raises(ValueError, match="at least one real token"):
        generate_uncached(tiny_gpt, idx, 2, block_size=16, key_mask=torch.zeros_like(mask))


def _overflowing(model):
    """A copy whose weights are finite but whose logits overflow float32 to ±inf."""
    hot = copy.deepcopy(model)
    with torch.no_grad():
        hot.transformer.ln_f.weight.fill_(3e38)
    return hot


@pytest.mark.parametrize("decoder", ["fast", "model"])
def test_greedy_decoding_refuses_logits_it_cannot_rank(tiny_gpt, decoder):
    """Sampling checks every step's logits; greedy keeps each step's winner and checks them all before returning."""
    with pytest.raises(ValueError, match="logits held NaN or \\+inf.*greedy decoding cannot rank them"):
        generate(_overflowing(tiny_gpt), torch.ones(1, 3, dtype=torch.long), 4, temperature=0.0, decoder=decoder)


def test_a_cache_decoder_needs_an_empty_cache_of_the_models_dtype(tiny_gpt):
    from kvlib.decoding import CacheDecoder

    idx = torch.ones(1, 3, dtype=torch.long)
    cache = tiny_gpt.new_cache(1)
    first = generate(tiny_gpt, idx, 4, temperature=0.0, decoder=lambda m, B, L: CacheDecoder(m, cache))
    assert first.new_tokens.tolist() == generate(tiny_gpt, idx, 4, temperature=0.0).new_tokens.tolist()
    with pytest.raises(ValueError, match="cache must be empty, it holds 6 position"):  # 3 + 4 - 1 fed
        generate(tiny_gpt, idx, 4, temperature=0.0, decoder=lambda m, B, L: CacheDecoder(m, cache))
    with pytest.raises(TypeError, match="the cache holds torch.float32.*model computes in torch.float64"):
        CacheDecoder(copy.deepcopy(tiny_gpt).double(), tiny_gpt.new_cache(1))


def test_weights_converted_in_place_are_seen_by_the_fast_path(tiny_gpt):
    """model.double() keeps each Parameter object and its version but moves its memory: the fast path's copies follow."""
    model, idx = copy.deepcopy(tiny_gpt), torch.ones(1, 3, dtype=torch.long)
    before = generate(model, idx, 4, temperature=0.0).new_tokens
    model.double()
    after = generate(model, idx, 4, temperature=0.0)
    assert torch.equal(after.new_tokens, before)
    assert torch.equal(after.new_tokens, generate(model, idx, 4, temperature=0.0, decoder="model").new_tokens)
