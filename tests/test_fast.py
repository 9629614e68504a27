"""The fast decode path computes what the teaching model computes: logits within 1e-4, same tokens.

Checked like ``verify_cache`` does, on the shipped shape with random weights and on a tiny shape,
for one prompt and for a left-padded batch, plus the context limit and the decoder's own contract.
"""
from __future__ import annotations

import copy

import pytest
import torch

from kvlib.fast import FastDecoder
from kvlib.decoding import (DECODERS, CachedDecoder, ContextLimitError, generate, make_decoder, pad_prompts,
                            position_ids_from_mask)
from kvlib.model import GPT, GPTConfig
from kvlib.verify import ATOL, check_batch_consistency, verify_cache

SHAPES = pytest.mark.parametrize("shape", ["shipped", "tiny"])
SHIPPED_VOCAB = 7184


@pytest.fixture(scope="module")
def models(random_gpt, tiny_gpt):
    return {"shipped": random_gpt, "tiny": tiny_gpt}


def prompt(length: int, vocab_size: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.randint(vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def side_by_side(model, batch_size: int, feeds):
    """Feed the same calls to FastDecoder and CachedDecoder; the largest logit difference."""
    fast, plain = FastDecoder(model, batch_size), CachedDecoder(model, batch_size)
    worst = 0.0
    with torch.inference_mode():
        for args in feeds:
            worst = max(worst, max_diff(fast(*args), plain(*args)))
    assert fast.cache.length == plain.cache.length
    return worst


# ---- like verify_cache: one prompt, many steps ------------------------------------------------

@SHAPES
def test_fast_path_matches_the_teaching_forward_for_one_prompt(models, shape):
    model = models[shape]
    block = model.config.block_size
    P = 16 if shape == "shipped" else 4
    report = verify_cache(model, prompt(P, model.config.vocab_size), block - P + 1, decoder="fast")
    assert report.passed, report
    assert report.tokens_equal
    assert report.max_abs_logit_diff <= ATOL


@SHAPES
def test_fast_and_model_decoders_give_the_same_greedy_tokens(models, shape):
    model = models[shape]
    idx = prompt(5, model.config.vocab_size, seed=3)
    n = min(40, model.config.block_size - 5)  # the tiny model runs to its context limit
    fast = generate(model, idx, n, temperature=0.0)  # the default is the fast path
    plain = generate(model, idx, n, temperature=0.0, decoder="model")
    assert torch.equal(fast.tokens, plain.tokens)


def test_seeded_sampling_is_the_same_on_both_decoders(tiny_gpt):
    idx = prompt(3, 64, seed=4)
    kw = dict(temperature=0.9, top_k=20, top_p=0.9)
    a = generate(tiny_gpt, idx, 12, generator=torch.Generator().manual_seed(7), **kw)
    b = generate(tiny_gpt, idx, 12, generator=torch.Generator().manual_seed(7), decoder="model", **kw)
    assert torch.equal(a.tokens, b.tokens)


# ---- left-padded batches ----------------------------------------------------------------------

@SHAPES
def test_left_padded_batch_of_three_matches_each_prompt_alone(models, shape):
    model = models[shape]
    V = model.config.vocab_size
    prompts = [prompt(n, V, seed=n)[0].tolist() for n in (6, 2, 4)]
    report = check_batch_consistency(model, prompts, 8, decoder="fast")
    assert report["consistent"], report
    assert report["max_abs_logit_diff"] <= ATOL


@SHAPES
def test_left_padded_batch_logits_match_the_model_decoder_step_by_step(models, shape):
    model = models[shape]
    idx, mask = pad_prompts([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]])
    B, T = idx.shape
    masks = torch.ones(B, model.config.block_size, dtype=torch.bool)
    masks[:, :T] = mask
    positions = mask.sum(-1, keepdim=True)
    feeds = [(idx, masks[:, :T], position_ids_from_mask(mask))]
    for n in range(6):
        feeds.append((torch.full((B, 1), 11 + n), masks[:, :T + n + 1], positions + n))
    assert side_by_side(model, B, feeds) <= ATOL


@SHAPES
def test_unpadded_batch_takes_the_lean_step_and_matches(models, shape):
    model = models[shape]
    V = model.config.vocab_size
    feeds = [(prompt(4, V, batch=2),)] + [(prompt(1, V, seed=s, batch=2),) for s in range(6)]
    assert side_by_side(model, 2, feeds) <= ATOL


def test_chunks_after_a_prefill_use_the_bottom_right_causal_mask(random_gpt):
    V = SHIPPED_VOCAB
    feeds = [(prompt(5, V),), (prompt(3, V, seed=1),), (prompt(1, V, seed=2),), (prompt(4, V, seed=3),)]
    assert side_by_side(random_gpt, 1, feeds) <= ATOL


def extend_side_by_side(model, batch_size: int, chunks) -> float:
    """Feed chunks to ``FastDecoder.extend`` and to ``GPT.forward`` over a KVCache; the largest difference."""
    dec, cache = FastDecoder(model, batch_size), model.new_cache(batch_size)
    worst = 0.0
    with torch.inference_mode():
        for idx in chunks:
            fast = dec.extend(idx)
            plain, _ = model(idx, cache=cache)
            assert fast.shape == plain.shape == idx.shape + (model.config.vocab_size,)
            assert torch.equal(fast.argmax(-1), plain.argmax(-1))
            worst = max(worst, max_diff(fast, plain))
            assert dec.cache.length == cache.length
    return worst


@SHAPES
@pytest.mark.parametrize("batch_size", [1, 2])
def test_extend_gives_the_logits_after_every_new_token(models, shape, batch_size):
    model = models[shape]
    V = model.config.vocab_size
    lengths = (5, 1, 3, 4, 2) if shape == "tiny" else (5, 1, 3, 6, 9, 16, 2, 30)  # 30: through GPT.forward
    chunks = [prompt(T, V, seed=T, batch=batch_size) for T in lengths]
    assert extend_side_by_side(model, batch_size, chunks) <= ATOL


def test_extend_after_a_roll_back_overwrites_the_rejected_slots(random_gpt):
    V = SHIPPED_VOCAB
    dec = FastDecoder(random_gpt, 1)
    with torch.inference_mode():
        dec.extend(prompt(10, V))
        dec.extend(prompt(4, V, seed=1))
        dec.cache.truncate(11)                                  # keep one of the four
        again = dec.extend(prompt(3, V, seed=2))
        cache = random_gpt.new_cache(1)
        random_gpt(torch.cat([prompt(10, V), prompt(4, V, seed=1)[:, :1]], 1), cache=cache)
        want, _ = random_gpt(prompt(3, V, seed=2), cache=cache)
    assert max_diff(again, want) <= ATOL


def test_extend_checks_like_a_call(tiny_gpt):
    dec = FastDecoder(tiny_gpt, 1)
    with pytest.raises(ContextLimitError, match="cache holds 16"):
        dec.extend(prompt(17, 64))
    with pytest.raises(ValueError, match="batch_size=1"):
        dec.extend(prompt(2, 64, batch=2))
    assert dec.cache.length == 0
    assert dec.extend(prompt(2, 64)).shape == (1, 2, 64)  # outside inference mode too


# ---- the context limit -------------------------------------------------------------------------

def test_context_limit_stops_at_129_tokens_through_the_fast_path(random_gpt):
    idx = prompt(120, SHIPPED_VOCAB)
    out = generate(random_gpt, idx, 20, temperature=0.0, decoder="fast")
    assert out.tokens.shape == (1, 129)
    assert out.stop_reason == "context_limit"
    with pytest.raises(ContextLimitError, match="at most 9 new tokens"):
        generate(random_gpt, idx, 20, temperature=0.0, decoder="fast", on_context_limit="raise")


def test_the_decoder_refuses_more_positions_than_its_cache(tiny_gpt):
    dec = FastDecoder(tiny_gpt, 1, 8)
    dec(prompt(8, 64))
    with pytest.raises(ContextLimitError, match="cache holds 8"):
        dec(prompt(1, 64))
    with pytest.raises(ContextLimitError, match="block size"):
        FastDecoder(tiny_gpt, 1)(prompt(2, 64), position_ids=torch.tensor([[0, 16]]))


# ---- the decoder's contract --------------------------------------------------------------------

def test_decoder_checks_batch_and_mask_shapes(tiny_gpt):
    dec = FastDecoder(tiny_gpt, 2)
    with pytest.raises(ValueError, match="batch_size=2"):
        dec(prompt(3, 64))
    with pytest.raises(ValueError, match="key_mask"):
        dec(prompt(3, 64, batch=2), key_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="batch_size"):
        FastDecoder(tiny_gpt, 0)


def test_each_call_returns_new_logits_and_works_outside_inference_mode(tiny_gpt):
    dec = FastDecoder(tiny_gpt, 1)
    first = dec(prompt(3, 64))  # called without inference_mode: the decoder enters it itself
    kept = first.clone()
    dec(prompt(1, 64, seed=1))
    assert torch.equal(first, kept)
    assert dec.cache.length == 4
    assert first.shape == (1, 64)


def test_the_cache_halves_share_one_buffer(tiny_gpt):
    dec = FastDecoder(tiny_gpt, 1)
    dec(prompt(5, 64))
    plain = CachedDecoder(tiny_gpt, 1)
    with torch.inference_mode():
        plain(prompt(5, 64))
    assert dec.cache.k.shape == plain.cache.k.shape
    assert max_diff(dec.cache.k[:, :, :, :5], plain.cache.k[:, :, :, :5]) <= 1e-6
    assert max_diff(dec.cache.v[:, :, :, :5], plain.cache.v[:, :, :, :5]) <= 1e-6
    assert dec.cache.k.data_ptr() == dec.kv.data_ptr()


def test_a_new_decoder_sees_changed_weights_and_an_old_one_keeps_its_copy():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)).eval()
    idx = prompt(5, 64)
    old = FastDecoder(model, 1)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    expected = model(idx)[0][:, -1]
    new = FastDecoder(model, 1)
    new(idx[:, :4])
    assert max_diff(new(idx[:, 4:]), expected) <= ATOL
    old(idx[:, :4])  # the prefill runs GPT.forward, which sees the new weights
    assert max_diff(old(idx[:, 4:]), expected) > 1e-3  # the step's copies were taken before: rebuild after training


# ---- choosing a decoder ------------------------------------------------------------------------

def test_decoder_names_and_factories(tiny_gpt):
    assert DECODERS == {"fast": FastDecoder, "model": CachedDecoder}
    assert isinstance(make_decoder(None, tiny_gpt, 1, 16), FastDecoder)
    assert isinstance(make_decoder("model", tiny_gpt, 1, 16), CachedDecoder)
    built = []

    def factory(model, batch_size, max_len):
        built.append((batch_size, max_len))
        return CachedDecoder(model, batch_size, max_len)

    out = generate(tiny_gpt, prompt(3, 64, batch=2), 4, temperature=0.0, decoder=factory)
    assert built == [(2, 16)]
    assert torch.equal(out.tokens, generate(tiny_gpt, prompt(3, 64, batch=2), 4, temperature=0.0).tokens)
    with pytest.raises(ValueError, match="'fast', 'model'"):
        generate(tiny_gpt, prompt(3, 64), 2, decoder="compiled")
    with pytest.raises(TypeError, match="factory"):
        generate(tiny_gpt, prompt(3, 64), 2, decoder=3)


def test_step_weights_are_shared_until_a_parameter_changes():
    from kvlib.fast import step_weights

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(6)
        model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)).eval()
        other = GPT(model.config).eval()
    first = step_weights(model)
    assert step_weights(model) is first  # built once, shared by every decoder of this model state
    model.load_state_dict(other.state_dict())  # in-place copies: the version counters move
    second = step_weights(model)
    assert second is not first and torch.equal(second.wpe, other.transformer.wpe.weight)
    model.transformer.wpe.weight = torch.nn.Parameter(torch.zeros_like(model.transformer.wpe.weight))  # replaced
    assert torch.equal(step_weights(model).wpe, torch.zeros_like(second.wpe))
    idx = prompt(5, 64)
    dec = FastDecoder(model, 1)
    dec(idx[:, :4])
    assert max_diff(dec(idx[:, 4:]), model(idx)[0][:, -1]) <= ATOL


def test_a_padded_decode_step_takes_the_lean_step(tiny_gpt, monkeypatch):
    """After the prefill, generate's padded decode steps never call GPT.forward."""
    idx, mask = pad_prompts([[1, 2, 3, 4], [5, 6]])
    expected = generate(tiny_gpt, idx, 6, temperature=0.0, key_mask=mask, decoder="model")
    calls = []
    forward = type(tiny_gpt).forward
    monkeypatch.setattr(type(tiny_gpt), "forward", lambda self, idx, **kw: calls.append(idx.shape) or forward(self, idx, **kw))
    got = generate(tiny_gpt, idx, 6, temperature=0.0, key_mask=mask)
    assert torch.equal(got.tokens, expected.tokens)
    assert calls == [idx.shape]  # the prefill only


def test_head_logits_equal_the_plain_product_for_one_row_and_several(random_gpt):
    """A few rows: the plain product, bit for bit. More: oneDNN's, within float rounding of it. A model
    oneDNN does not take (float64 here) keeps the plain product for every row count."""
    from kvlib.fast import BLOCKED_HEAD_ROWS, head_logits, step_weights
    h = torch.randn(9, random_gpt.config.n_embd, generator=torch.Generator().manual_seed(0))
    w = step_weights(random_gpt)
    assert w.head_blocked is not None
    for rows in range(1, BLOCKED_HEAD_ROWS):
        assert torch.equal(head_logits(h[:rows], w), h[:rows] @ w.head)
    for rows in (BLOCKED_HEAD_ROWS, 9):
        assert max_diff(head_logits(h[:rows], w), h[:rows] @ w.head) <= 1e-4
    wide = step_weights(copy.deepcopy(random_gpt).double())
    assert wide.head_blocked is None and torch.equal(head_logits(h.double(), wide), h.double() @ wide.head)


# ---- the paged lean step -----------------------------------------------------------------------

@SHAPES
def test_the_paged_lean_step_matches_gpt_forward(models, shape):
    """Rows of different lengths, in changing subsets and orders, over blocks of 4: the lean step's
    logits and stored keys equal those of GPT.forward over the same paged cache."""
    from kvlib.paged import PagedKVCache
    model = models[shape]
    V = model.config.vocab_size
    prompts = [prompt(n, V, seed=n)[0].tolist() for n in (7, 2, 5)]
    caches = {d: PagedKVCache(model.config, 64, 4, enable_prefix_caching=False) for d in ("fast", "model")}
    for d, cache in caches.items():
        for s, p in enumerate(prompts):
            cache.add_sequence(s, p)
        cache.forward(model, [0, 1, 2], prompts, decoder=d)
    worst = 0.0
    for step in range(9):
        live = [0, 1, 2] if step % 3 else [2, 0]
        new = [[(7 * step + s) % V] for s in live]
        out = {d: cache.forward(model, live, new, decoder=d) for d, cache in caches.items()}
        worst = max(worst, max_diff(out["fast"], out["model"]))
    assert worst <= ATOL
    for s in range(3):
        assert caches["fast"].table(s).token_ids == caches["model"].table(s).token_ids
    assert max_diff(caches["fast"].pool.k, caches["model"].pool.k) <= ATOL
    assert max_diff(caches["fast"].pool.v, caches["model"].pool.v) <= ATOL


@SHAPES
def test_the_paged_lean_step_takes_chunks_of_new_tokens_like_gpt_forward(models, shape):
    """Prefills and chunks of several new tokens after cached ones, rows of different lengths and chunk
    sizes, some prompt blocks found by prefix caching: logits and stored keys as GPT.forward's."""
    from kvlib.paged import PagedKVCache
    model = models[shape]
    V = model.config.vocab_size
    shared = prompt(8, V, seed=1)[0].tolist()
    prompts = [shared + [3, 4], prompt(3, V, seed=2)[0].tolist(), shared + [5]]
    caches = {d: PagedKVCache(model.config, 64, 4) for d in ("fast", "model")}
    out = {}
    for d, cache in caches.items():
        cache.add_sequence(0, prompts[0])
        cache.forward(model, [0], [prompts[0]], decoder=d)
        hits = [cache.add_sequence(s, prompts[s]) for s in (1, 2)]
        first = cache.forward(model, [1, 2], [prompts[s][h:] for s, h in zip((1, 2), hits)], decoder=d)
        chunks = [[(5 * i + s) % V for i in range(n)] for s, n in ((2, 1), (0, 3), (1, 2))]
        out[d] = (hits, first, cache.forward(model, [2, 0, 1], chunks, decoder=d))
    assert out["fast"][0] == out["model"][0] == [0, 8]  # the shared prompt's two full blocks were found
    assert max_diff(out["fast"][1], out["model"][1]) <= ATOL and max_diff(out["fast"][2], out["model"][2]) <= ATOL
    for s in range(3):
        assert caches["fast"].table(s).token_ids == caches["model"].table(s).token_ids
    assert max_diff(caches["fast"].pool.k, caches["model"].pool.k) <= ATOL
    assert max_diff(caches["fast"].pool.v, caches["model"].pool.v) <= ATOL


def test_the_paged_decoder_name_is_checked(tiny_gpt):
    from kvlib.paged import PagedKVCache
    cache = PagedKVCache(tiny_gpt.config, 8, 4)
    cache.add_sequence(0, [1, 2])
    with pytest.raises(ValueError, match="decoder must be 'fast' or 'model', got 'lean'"):
        cache.forward(tiny_gpt, [0], [[1, 2]], decoder="lean")
    assert cache.table(0).length == 0 and cache.num_free_blocks == 8
