"""Speculative decoding changes nothing but the speed: greedy tokens equal ``generate``'s, sampled
tokens follow the target's distribution. (The verify pass, ``FastDecoder.extend``, is tested in test_fast.py.)"""
from __future__ import annotations

import pytest
import torch

from kvlib.cache import ContextLimitError
from kvlib.decoding import generate
from kvlib.model import GPT, GPTConfig
from kvlib.speculative import (Draft, NeuralDraft, NgramDraft, Round, SpeculativeDecoder, accept_greedy,
                               accept_sampled, expected_tokens_per_round, speculative_generate)
from kvlib.tools.spec_costs import alpha_needed, perfect_draft_speedup, round_us
from kvlib.verify import chi_square_homogeneity, total_variation

TINY_SHAPE = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)  # as conftest's tiny_gpt
V = TINY_SHAPE.vocab_size


def seeded_gpt(config: GPTConfig, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(config).eval()


@pytest.fixture(scope="module")
def target():
    return seeded_gpt(TINY_SHAPE, seed=0)


@pytest.fixture(scope="module")
def drafts(target):
    """A one-layer network, the target itself (every guess right), and corpus counts of its own text."""
    small = seeded_gpt(GPTConfig(vocab_size=V, block_size=16, n_layer=1, n_head=2, n_embd=16), seed=1)
    text = generate(target, torch.arange(V)[:, None] % V, 15, temperature=1.0,
                    generator=torch.Generator().manual_seed(0)).tokens.flatten()
    return {"neural": NeuralDraft(small), "self": NeuralDraft(target, name="self"),
            "n-gram": NgramDraft.from_ids(text, V), "lookup": NgramDraft.from_ids(text, V).with_lookup()}


def prompts(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 16, (n,), generator=g).tolist()  # up to the block (16): context limits too
    return [torch.randint(V, (1, L), generator=g) for L in lengths]


@pytest.mark.parametrize("name", ["neural", "self", "n-gram", "lookup"])
def test_greedy_tokens_equal_generate_on_50_prompts(target, drafts, name):
    draft, mismatches, reasons = drafts[name], [], set()
    for i, idx in enumerate(prompts(50)):
        gamma, eos = 1 + i % 6, (i % 7 if i % 3 == 0 else None)   # every γ, with and without a stop token
        n = 3 + i % 17                                            # some runs reach the block, some stop before
        want = generate(target, idx, n, temperature=0.0, eos_id=eos)
        got = speculative_generate(target, draft, idx, n, gamma=gamma, eos_id=eos)
        reasons.add(got.stop_reason)
        if not (torch.equal(got.tokens, want.tokens) and got.stop_reason == want.stop_reason
                and torch.equal(got.finished, want.finished)):
            mismatches.append((i, got.tokens.tolist(), want.tokens.tolist()))
    assert not mismatches, mismatches[:3]
    assert reasons == {"max_new_tokens", "eos", "context_limit"}


def test_greedy_on_the_shipped_model_with_corpus_counts(shipped_char):
    from kvlib.poems import encode_prompt
    from kvlib.tools.corpus import load_poems, split

    model, tok = shipped_char
    train, val = split(load_poems())
    ngram = NgramDraft.from_ids(tok.encode_corpus(train[:3000]), tok.vocab_size).with_lookup()
    for text in [p[:n] for p, n in zip(val[:6], (1, 2, 5, 6, 10, 12))]:
        idx = torch.tensor([encode_prompt(tok, text)])
        want = generate(model, idx, 40, temperature=0.0, eos_id=tok.eos_id)
        got = speculative_generate(model, ngram, idx, 40, gamma=4, eos_id=tok.eos_id)
        assert torch.equal(got.tokens, want.tokens), text


def test_every_guess_right_gives_gamma_plus_one_tokens_a_round(target, drafts):
    got = speculative_generate(target, drafts["self"], torch.tensor([[1, 2]]), 14, gamma=3)
    assert got.alpha == 1.0 and all(r.bonus for r in got.rounds)
    assert [len(r.drafted) for r in got.rounds] == [3, 3, 3, 1] and got.tokens_per_call == 14 / 4


def test_rounds_add_up_and_the_cache_rolls_back(target, drafts):
    dec = SpeculativeDecoder(target, drafts["neural"], torch.tensor([[5, 6, 7]]), 12, gamma=4)
    while not dec.done:
        before = len(dec.tokens)
        r = dec.round()
        assert isinstance(r, Round) and 0 <= r.accepted <= len(r.drafted) <= 4
        assert len(dec.tokens) - before == min(r.accepted + 1, 12 - (before - 3))
        assert dec.target.cache.length == len(dec.tokens) - 1  # every token but the last
    res = dec.result()
    assert res.drafted == sum(len(r.drafted) for r in res.rounds) and 0 <= res.alpha <= 1
    with pytest.raises(RuntimeError, match="stopped"):
        dec.round()


def test_context_limit_raises_like_generate(target, drafts):
    idx = torch.zeros(1, 10, dtype=torch.long)
    res = speculative_generate(target, drafts["n-gram"], idx, 50, gamma=4)
    assert res.stop_reason == "context_limit" and res.new_tokens.shape[1] == 7
    with pytest.raises(ContextLimitError, match="at most 7 new tokens fit"):
        speculative_generate(target, drafts["n-gram"], idx, 50, on_context_limit="raise")
    assert speculative_generate(target, drafts["n-gram"], idx, 0).new_tokens.shape == (1, 0)


def test_bad_input_names_the_parameter(target, drafts):
    idx = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match=r"gamma must be an int in \[1, 16\].*, got 0"):
        speculative_generate(target, drafts["n-gram"], idx, 4, gamma=0)
    with pytest.raises(ValueError, match="batch size 1"):
        speculative_generate(target, drafts["n-gram"], torch.zeros(2, 3, dtype=torch.long), 4)
    with pytest.raises(TypeError, match="draft must be"):
        speculative_generate(target, "bigram", idx, 4)
    with pytest.raises(ValueError, match="temperature"):
        speculative_generate(target, drafts["n-gram"], idx, 4, temperature=-1.0)
    with pytest.raises(ValueError, match="on_context_limit"):
        speculative_generate(target, drafts["n-gram"], idx, 4, on_context_limit="crop")
    with pytest.raises(ValueError, match="ids must be token ids"):
        NgramDraft.from_ids([1, 2, 99], 10)
    with pytest.raises(NotImplementedError, match="Draft must define propose"):
        Draft().propose([1], 2)


@pytest.mark.parametrize("answer", [None, [1, 2], ([1], [0.5]), ("12", None, None)])
def test_a_draft_that_breaks_the_contract_is_named(target, answer):
    class Broken(Draft):
        def propose(self, tokens, gamma, settings=(0.0, None, None), generator=None):
            return answer

    with pytest.raises(TypeError, match=r"Broken.propose must return a pair \(guesses, q\)"):
        speculative_generate(target, Broken(), torch.tensor([[1, 2]]), 4)


@pytest.mark.parametrize("row", [[float("inf"), 0.0, 0.0], [float("-inf")] * 3, [float("nan"), 0.0, 0.0]])
def test_greedy_acceptance_refuses_logits_it_cannot_rank(row):
    logits = torch.tensor([[0.0, 3, 1], row])
    with pytest.raises(ValueError, match="target_logits row 1 cannot be sampled"):
        accept_greedy([1], logits)


def test_ngram_tables_keep_the_most_frequent_follower():
    ids = [0, 1, 2, 0, 1, 2, 0, 1, 3, 4, 1, 3, 4, 1, 3]
    d = NgramDraft.from_ids(ids, 5)
    assert d.next_token(0, 1) == 2      # after 0, 1: 2 twice, 3 once
    assert d.next_token(4, 1) == 3
    assert d.next_token(None, 1) == 3   # after 1: 3 three times, 2 twice
    assert d.next_token(3, 3) == d.bigram[3] == 4  # an unseen pair falls back to the last token
    assert d.propose([0, 1], 3)[0] == [2, 0, 1]
    assert NgramDraft.copied([5, 6, 7, 8, 5, 6]) == 7 and NgramDraft.copied([5, 6]) is None
    assert d.with_lookup().propose([4, 4, 0, 4, 4], 2)[0] == [0, 4]  # copied from the text, not the corpus


def test_greedy_rule_and_the_formula():
    logits = torch.tensor([[0.0, 3, 1], [2, 0, 1], [0, 0, 5]])  # argmax after each prefix: 1, 0, 2
    assert accept_greedy([1, 0], logits) == (2, 2)   # both kept, then the bonus
    assert accept_greedy([1, 2], logits) == (1, 0)   # the second replaced by the target's 0
    assert accept_greedy([], logits[:1]) == (0, 1)
    assert expected_tokens_per_round(0.0, 4) == 1.0 and expected_tokens_per_round(1.0, 4) == 5.0
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75)


@pytest.mark.slow
def test_the_rejection_rule_gives_exactly_p():
    """One drafted token d ~ q, kept with probability min(1, p/q), else a draw from (p − q)+."""
    p = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.0, 0.2])
    q = torch.tensor([0.3, 0.1, 0.1, 0.1, 0.3, 0.1])
    g = torch.Generator().manual_seed(0)
    n = 8000
    out = torch.zeros(len(p))
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=g))
        kept, t = accept_sampled([d], q[None], torch.stack([p, p]), g)
        out[d if kept else t] += 1                           # when d is kept, t is the bonus after it
    direct = torch.bincount(torch.multinomial(p, n, replacement=True, generator=g), minlength=len(p)).float()
    assert out[4] == 0                                       # a token the target never writes
    assert chi_square_homogeneity(out, direct) > 1e-3
    assert total_variation(out, direct) < 0.02


@pytest.mark.slow
def test_sampled_first_tokens_follow_the_target(target, drafts):
    """Many seeded runs: the first three tokens are as close to plain sampling as plain sampling to itself."""
    idx, runs = torch.tensor([[3, 9]]), 800
    spec = torch.zeros(3, V)
    for s in range(runs):
        new = speculative_generate(target, drafts["neural"], idx, 3, gamma=2, temperature=1.0,
                                   generator=torch.Generator().manual_seed(s)).new_tokens[0]
        spec[torch.arange(3), new] += 1
    plain, plain2 = (torch.zeros(3, V) for _ in range(2))
    for counts, seed in ((plain, 0), (plain2, 1)):  # plain sampling: the runs as the rows of one batch
        new = generate(target, idx.expand(runs, -1), 3, temperature=1.0,
                       generator=torch.Generator().manual_seed(seed)).new_tokens  # (runs, 3)
        for pos in range(3):
            counts[pos] += torch.bincount(new[:, pos], minlength=V)
    for pos in range(3):
        tv_spec, tv_plain = total_variation(spec[pos], plain[pos]), total_variation(plain2[pos], plain[pos])
        assert chi_square_homogeneity(spec[pos], plain[pos]) > 1e-3, pos
        assert tv_spec < 1.5 * tv_plain + 0.02, (pos, tv_spec, tv_plain)


def test_sampled_drafts_come_with_their_distributions(target, drafts):
    g = torch.Generator().manual_seed(0)
    tokens, q = drafts["neural"].propose([1, 2, 3], 3, (0.8, 10, None), g)
    assert len(tokens) == 3 and q.shape == (3, V)
    assert torch.allclose(q.sum(-1), torch.ones(3)) and all(q[i, t] > 0 for i, t in enumerate(tokens))
    assert (q > 0).sum(-1).max() <= 10  # top-k applied to the draft as to the target
    assert drafts["n-gram"].propose([1, 2, 3], 3, (0.8, None, None), g)[1] is None


def test_the_cost_model_prices_a_round_and_finds_the_alpha_a_speed_up_needs():
    from kvlib.speculative import expected_tokens_per_round
    from kvlib.tools.spec_bench import alpha_needed, perfect_draft_speedup, round_us

    costs = {"step_us": 100.0, "verify_us": {1: 100.0, 2: 110.0, 3: 120.0, 4: 130.0}}
    assert round_us(costs, guess_us=5.0, gamma=2) == 2 * 5.0 + 120.0
    with pytest.raises(ValueError, match="not the 9 that γ = 8 needs"):  # never priced as a shorter pass
        round_us(costs, guess_us=0.0, gamma=8)
    # a free, always-right draft at γ = 3: 4 tokens for 130 µs against 4 steps of 100 µs
    assert perfect_draft_speedup(costs, 0.0, gammas=(1, 2, 3)) == pytest.approx(400 / 130)
    alpha = alpha_needed(costs, 0.0, 2, speedup=1.3)
    assert 0 < alpha < 1
    assert expected_tokens_per_round(alpha, 2) == pytest.approx(1.3 * 120 / 100, abs=1e-6)
    assert alpha_needed(costs, 50.0, 1, speedup=3.0) is None  # more than γ + 1 tokens a round: out of reach


@pytest.mark.parametrize("call, error, words", [
    (lambda c: alpha_needed({}, 10, 2), TypeError, "costs must be a dict with 'step_us' and 'verify_us'"),
    (lambda c: alpha_needed({**c, "step_us": 0}, 10, 2), ValueError, r"costs\['step_us'\] must be a finite time"),
    (lambda c: round_us(c, 10, -5), ValueError, "gamma must be"),
    (lambda c: round_us(c, 10, 0), ValueError, "gamma must be"),
    (lambda c: perfect_draft_speedup(c, guess_us=-1000), ValueError, "guess_us must be a finite time"),
    (lambda c: round_us({**c, "verify_us": {2: float("nan")}}, 10, 1), ValueError, r"verify_us'\]\[2\]"),
    (lambda c: alpha_needed(c, 10, 2, speedup=0), ValueError, "speedup must be"),
])
def test_the_cost_model_refuses_costs_it_cannot_price(call, error, words):
    costs = {"step_us": 500.0, "verify_us": {1: 500.0, 2: 600.0, 3: 700.0}}
    with pytest.raises(error, match=words):
        call(costs)


def test_a_neural_draft_follows_its_model_when_the_weights_change():
    """Trained on, reloaded or edited: the next proposal comes from the weights as they are, as a new draft's does."""
    model = seeded_gpt(GPTConfig(vocab_size=V, block_size=16, n_layer=1, n_head=2, n_embd=16), seed=1)
    other = seeded_gpt(GPTConfig(vocab_size=V, block_size=16, n_layer=1, n_head=2, n_embd=16), seed=2)
    kept, tokens = NeuralDraft(model), [1, 2, 3]
    before = kept.propose(tokens, 4)[0]
    model.load_state_dict(other.state_dict())
    assert kept.propose(tokens, 4)[0] == NeuralDraft(other).propose(tokens, 4)[0] != before


def test_speculation_on_a_grouped_model_is_refused_with_what_to_do_instead(target):
    from kvlib.compress import grouped

    gqa = grouped(target, 1)
    prompt = torch.ones(1, 2, dtype=torch.long)
    for build in (lambda: NeuralDraft(gqa), lambda: speculative_generate(gqa, NeuralDraft(target), prompt, 3)):
        with pytest.raises(ValueError, match="needs a multi-head attention model.*without speculation.*decoder='model'"):
            build()
