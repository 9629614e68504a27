"""Properties that must hold for any input, checked with hypothesis on small random cases.

- top-k and top-p keep exactly the sets DESIGN §3 defines, for any logits, whatever the order of
  the vocabulary, and the kept probabilities are renormalised;
- tokenizers round-trip any text they can encode;
- ``stream_decode`` joins to ``decode`` for any id sequence, invalid UTF-8 included;
- ``generate`` never feeds the model a position past its block;
- a left-padded batch of prompts of any lengths decodes (greedily) like each prompt alone.

Example counts are capped (``FAST``, ``SLOW``) so the whole module runs in a few seconds.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvlib.decoding import generate, generate_uncached, pad_prompts
from kvlib.model import GPT, GPTConfig
from kvlib.sampling import probabilities, top_k_filter, top_p_filter
from kvlib.tokenizer import ByteBPETokenizer, CharTokenizer, UnknownCharacterError, stream_decode

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SLOW = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

LINES = ["床前看月光", "疑是地上霜", "举头望山月", "低头思故乡", "白日依山尽", "黄河入海流",
         "欲穷千里目", "更上一层楼", "春眠不觉晓", "处处闻啼鸟", "夜来风雨声", "花落知多少"]
POEMS = ["{}，{}。{}，{}。".format(*(LINES[(i + j) % 12] for j in range(4))) for i in range(24)]
CHAR_TOK = CharTokenizer.train(POEMS)
BPE_TOK = ByteBPETokenizer.train(POEMS + ["hello world 123", "Tang poems, one token at a time."], vocab_size=300)
BLOCK = 16


def tiny(vocab_size: int = 40, seed: int = 0) -> GPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(GPTConfig(vocab_size=vocab_size, block_size=BLOCK, n_layer=2, n_head=2, n_embd=16)).eval()


MODEL = tiny()

# Logits: finite floats on a coarse grid (so ties happen often), one row of 1..40 entries.
logit_values = st.integers(-12, 12).map(lambda i: i / 4)
logit_rows = st.lists(logit_values, min_size=1, max_size=40)


def kept(filtered: torch.Tensor) -> set[int]:
    return set(torch.nonzero(filtered[0] > -math.inf).flatten().tolist())


# ---- top-k ---------------------------------------------------------------------------------------

@FAST
@given(row=logit_rows, k=st.integers(1, 50), data=st.data())
def test_top_k_keeps_everything_at_least_the_kth_value_in_any_order(row, k, data):
    logits = torch.tensor([row])
    kth = sorted(row, reverse=True)[min(k, len(row)) - 1]
    expected = {i for i, x in enumerate(row) if x >= kth}  # ties with the k-th value are kept
    assert kept(top_k_filter(logits, k)) == expected
    assert len(expected) >= min(k, len(row))

    perm = data.draw(st.permutations(range(len(row))))
    shuffled = torch.tensor([[row[j] for j in perm]])
    assert {perm[i] for i in kept(top_k_filter(shuffled, k))} == expected


# ---- top-p ---------------------------------------------------------------------------------------

def nucleus_reference(probs: list[float], p: float) -> set[int]:
    """DESIGN §3 in plain Python: stable descending order, drop a token once the mass strictly
    before it has reached p, always keep the top token."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])  # Python's sort is stable
    out, before = set(), 0.0
    for rank, i in enumerate(order):
        if rank > 0 and before >= p:
            break
        out.add(i)
        before += probs[i]
    return out


@FAST
@given(row=logit_rows, p=st.floats(0.01, 1.0), data=st.data())
def test_top_p_keeps_the_smallest_prefix_with_mass_at_least_p(row, p, data):
    logits = torch.tensor([row], dtype=torch.float64)  # float64: the reference and the filter agree exactly
    probs = logits.softmax(-1)[0].tolist()
    order = sorted(range(len(row)), key=lambda i: -probs[i])
    masses = [sum(probs[i] for i in order[: n + 1]) for n in range(len(row))]
    # Skip the knife-edge where a prefix's mass equals p up to rounding: either answer is right there.
    assume(all(abs(m - p) > 1e-6 for m in masses))

    got = kept(top_p_filter(logits, p))
    assert got == nucleus_reference(probs, p)
    # It is a prefix of the stable descending order ...
    assert got == set(order[: len(got)])
    # ... whose mass reaches p (or is everything), and the prefix one shorter does not.
    assert masses[len(got) - 1] >= p or len(got) == len(row)
    assert len(got) == 1 or masses[len(got) - 2] < p

    # Renormalised: the kept tokens share all the mass, in their original proportions.
    q = probabilities(logits, top_p=p)[0]
    assert float(q.sum()) == pytest.approx(1.0, abs=1e-9)
    mass = sum(probs[i] for i in got)
    for i in range(len(row)):
        assert float(q[i]) == pytest.approx(probs[i] / mass if i in got else 0.0, abs=1e-9)

    # Independent of the vocabulary's order when no two probabilities tie.
    if len(set(row)) == len(row):
        perm = data.draw(st.permutations(range(len(row))))
        shuffled = torch.tensor([[row[j] for j in perm]], dtype=torch.float64)
        assert {perm[i] for i in kept(top_p_filter(shuffled, p))} == got


@FAST
@given(row=logit_rows, p=st.floats(0.01, 1.0))
def test_top_p_ties_go_to_the_lower_token_id(row, p):
    logits = torch.tensor([row], dtype=torch.float64)
    got = kept(top_p_filter(logits, p))
    probs = logits.softmax(-1)[0].tolist()
    for i in got:  # an equal-probability token with a lower id is never dropped in favour of i
        for j in range(i):
            if probs[j] == probs[i]:
                assert j in got


# ---- tokenizers ----------------------------------------------------------------------------------

@FAST
@given(st.text(alphabet=st.sampled_from(CHAR_TOK.itos[2:] + ["\n"]), max_size=80))
def test_char_tokenizer_round_trips_any_text_over_its_vocabulary(s):
    ids = CHAR_TOK.encode(s)
    assert len(ids) == len(s)
    assert CHAR_TOK.decode(ids) == s


@FAST
@given(st.text(max_size=40))
def test_char_tokenizer_names_exactly_the_characters_it_lacks(s):
    missing = [ch for ch in dict.fromkeys(s) if ch not in CHAR_TOK.stoi]
    if not missing:
        assert CHAR_TOK.decode(CHAR_TOK.encode(s)) == s
        return
    with pytest.raises(UnknownCharacterError) as info:
        CHAR_TOK.encode(s)
    assert info.value.chars == missing


@FAST
@given(st.text(max_size=60))
def test_bpe_round_trips_any_text(s):
    ids = BPE_TOK.encode(s)
    assert all(0 <= i < BPE_TOK.eos_id for i in ids)  # text never encodes to the separator id
    assert BPE_TOK.decode(ids) == s


@FAST
@given(st.lists(st.sampled_from(LINES + ["，", "。", "hello", "😀"]), max_size=12))
def test_bpe_round_trips_poem_like_text(parts):
    s = "".join(parts)
    assert BPE_TOK.decode(BPE_TOK.encode(s)) == s


# ---- streaming decode ------------------------------------------------------------------------------

@FAST
@given(st.lists(st.integers(0, BPE_TOK.vocab_size - 1), max_size=40))
def test_stream_decode_joins_to_decode_for_any_ids(ids):
    pieces = list(stream_decode(BPE_TOK, ids))
    assert "".join(pieces) == BPE_TOK.decode(ids)
    assert "".join(stream_decode(BPE_TOK, torch.tensor(ids, dtype=torch.long))) == BPE_TOK.decode(ids)


@FAST
@given(st.lists(st.integers(0, 255), max_size=40))
def test_stream_decode_of_raw_bytes_matches_replace_decoding(byte_ids):
    """Ids 0-255 are single bytes, so this is any byte string, valid UTF-8 or not."""
    text = "".join(stream_decode(BPE_TOK, byte_ids))
    assert text == bytes(byte_ids).decode("utf-8", errors="replace") == BPE_TOK.decode(byte_ids)


@FAST
@given(st.lists(st.integers(0, CHAR_TOK.vocab_size - 1), max_size=40))
def test_stream_decode_of_char_ids_yields_one_token_at_a_time(ids):
    pieces = list(stream_decode(CHAR_TOK, ids))
    assert pieces == [CHAR_TOK.itos[i].encode("utf-8").decode() for i in ids]
    assert "".join(pieces) == CHAR_TOK.decode(ids)


# ---- generate stays inside the block ------------------------------------------------------------------

@SLOW
@given(lengths=st.lists(st.integers(1, BLOCK), min_size=1, max_size=3), max_new=st.integers(0, 3 * BLOCK),
       temperature=st.sampled_from([0.0, 0.8, 1.5]), seed=st.integers(0, 2**16))
def test_generate_never_feeds_a_position_past_the_block(lengths, max_new, temperature, seed):
    """The cached loop stops at the block (the model has no position past it: going further would
    raise); the recompute loop slides, handing the model at most ``block_size`` tokens a call."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 40, (n,), generator=gen).tolist() for n in lengths]
    idx, mask = pad_prompts(prompts)
    T = idx.shape[1]
    out = generate(MODEL, idx, max_new, temperature=temperature, generator=gen,
                   key_mask=None if len(set(lengths)) == 1 else mask)
    assert out.tokens.shape[1] == T + out.new_tokens.shape[1] <= BLOCK + 1
    assert out.new_tokens.shape[1] == min(max_new, BLOCK - T + 1)
    assert out.stop_reason == ("context_limit" if max_new > BLOCK - T + 1 else "max_new_tokens")

    windows = []

    def f(x):
        windows.append(x.shape[1])
        return MODEL(x)

    plain = generate_uncached(f, idx, max_new, block_size=BLOCK, temperature=temperature, generator=gen)
    assert max(windows, default=0) <= BLOCK
    assert plain.tokens.shape[1] == T + max_new  # the recompute loop slides instead of stopping


# ---- batches equal single runs ------------------------------------------------------------------------

def _recording():
    store = []

    def hook(step, tokens, logits):
        store.append(logits.clone())
        return logits
    return store, hook


@SLOW
@given(lengths=st.lists(st.integers(1, 10), min_size=1, max_size=4), steps=st.integers(1, 6),
       seed=st.integers(0, 2**16))
def test_a_padded_batch_decodes_like_each_prompt_alone(lengths, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 40, (n,), generator=gen).tolist() for n in lengths]
    idx, mask = pad_prompts(prompts, pad_id=0)
    batch_logits, hook = _recording()
    batch = generate(MODEL, idx, steps, temperature=0.0, key_mask=mask, logits_hook=hook)
    for b, prompt in enumerate(prompts):
        single_logits, hook = _recording()
        single = generate(MODEL, torch.tensor([prompt]), steps, temperature=0.0, logits_hook=hook)
        n = min(len(single_logits), len(batch_logits))
        for s in range(n):
            here, alone = batch_logits[s][b], single_logits[s][0]
            assert torch.allclose(here, alone, atol=1e-4), (b, s, float((here - alone).abs().max()))
            if int(batch.new_tokens[b, s]) != int(single.new_tokens[0, s]):
                top2 = alone.topk(2).values
                assert float(top2[0] - top2[1]) < 1e-4  # only a near-tie may flip greedy
                break
        else:
            m = single.new_tokens.shape[1]
            assert batch.new_tokens[b, :m].tolist() == single.new_tokens[0].tolist()
