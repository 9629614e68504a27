"""Text written for people never holds ``<unk>``: the corpus's placeholder for its rarest characters.

The model below scores ``<unk>`` above everything else at every position, so any helper that forgot
the ban would write nothing but ``<unk>``; ``generate`` itself stays general and does write it.
"""
from __future__ import annotations

import copy
import json

import pytest
import torch

from kvlib import constraints, poems
from kvlib.decoding import generate, generate_uncached
from kvlib.speculative import NgramDraft, SpeculativeDecoder
from kvlib.stepper import CacheStepper


@pytest.fixture(scope="module")
def tok(tiny_char_tokenizer):
    return tiny_char_tokenizer


@pytest.fixture(scope="module")
def unk_lover(tiny_gpt, tok):
    """``tiny_gpt`` changed so that ``<unk>`` has by far the largest score after every token."""
    model = copy.deepcopy(tiny_gpt)
    with torch.no_grad():
        ln_f = model.transformer.ln_f
        ln_f.weight.zero_()                         # the final hidden state is ln_f.bias, whatever came before
        ln_f.bias.copy_(torch.linspace(0.5, 1.5, ln_f.bias.numel()))
        model.lm_head.weight[tok.unk_id] = 10 * ln_f.bias  # the tied head: <unk>'s score is about 10 |bias|^2
    return model.eval()


def _no_unk(tok, s: str) -> bool:
    return tok.UNK not in s


def test_the_model_really_prefers_unk_and_generate_stays_general(unk_lover, tok):
    idx = torch.tensor([poems.encode_prompt(tok, "春风")])
    out = generate(unk_lover, idx, 6, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert out.new_tokens[0].tolist() == [tok.unk_id] * 6  # nothing bans it here: generate is general
    banned = generate(unk_lover, idx, 6, temperature=1.0, generator=torch.Generator().manual_seed(0),
                      logits_hook=poems.no_unk(tok))
    assert tok.unk_id not in banned.new_tokens[0].tolist()


def test_unk_ids_and_the_hook(tok, bpe_tokenizer):
    assert poems.unk_ids(tok) == [tok.unk_id] and poems.unk_ids(bpe_tokenizer) == []
    logits = torch.zeros(2, tok.vocab_size)
    banned = poems.without_unk(tok, logits)
    assert torch.isinf(banned[:, tok.unk_id]).all() and torch.isfinite(banned[:, :tok.unk_id]).all()
    assert torch.equal(logits, torch.zeros(2, tok.vocab_size))  # the caller's logits are left alone
    seen = []
    hook = poems.no_unk(tok, lambda step, tokens, lg: seen.append(lg) or lg)
    hook(0, None, logits)
    assert torch.isinf(seen[0][:, tok.unk_id]).all()  # the chained hook sees the ban already applied


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.0, None, None), (1.0, None, None), (1.5, 3, None),
                                                       (1.0, None, 0.5)])
def test_write_never_writes_unk(unk_lover, tok, temperature, top_k, top_p):
    written = poems.write(unk_lover, tok, ["春风", "白日"], 8, temperature=temperature, top_k=top_k, top_p=top_p,
                          seed=3)
    assert all(_no_unk(tok, p) for p in written)
    result = poems.write_ids(unk_lover, tok, ["春风"], 8, temperature=temperature, seed=3)
    assert tok.unk_id not in result.new_tokens[0].tolist()


def test_acrostic_and_quatrain_never_write_unk(unk_lover, tok):
    poem = constraints.acrostic(unk_lover, tok, "春月", 5, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert _no_unk(tok, poem) and constraints.is_acrostic(poem, "春月", 5)
    schedule = constraints.quatrain_schedule(tok, 5, lines=2)  # what fits the tiny model's block of 16
    lines = constraints._write_to_schedule(unk_lover, tok, schedule, 5, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert _no_unk(tok, lines) and len(lines) == 12


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_stepper_never_draws_unk(unk_lover, tok, temperature):
    s = CacheStepper(unk_lover, tok, "春风", temperature=temperature, seed=1)
    chosen = s.run(8)
    assert tok.unk_id not in chosen and _no_unk(tok, s.text())
    assert tok.UNK not in s.view().top_labels  # nor is it among the bars: it has probability 0
    ref = generate(unk_lover, torch.tensor([s.prompt_ids]), 8, temperature=temperature,
                   generator=torch.Generator().manual_seed(1), decoder="model", logits_hook=poems.no_unk(tok))
    assert chosen == ref.new_tokens[0].tolist()  # the same tokens as generate with the ban


def test_the_explorer_never_writes_unk(unk_lover, tok):
    from kvlib.notebook import sampling_explorer

    for t in (0.0, 1.0):
        view = sampling_explorer.explore(unk_lover, tok, "春风", temperature=t, n_chars=8, n_bars=5)
        assert view.ok and _no_unk(tok, view.poem) and tok.UNK not in [c for c, p in zip(view.chars, view.probs) if p > 0]
        assert view.n_kept <= tok.vocab_size - 1 and view.unk_banned


def test_speculative_decoding_with_a_ban(unk_lover, tok):
    always_unk = NgramDraft({}, {}, tok.unk_id, tok.vocab_size)  # every guess is <unk>
    idx = torch.tensor([poems.encode_prompt(tok, "春风")])
    dec = SpeculativeDecoder(unk_lover, always_unk, idx, 8, gamma=3, banned=poems.unk_ids(tok))
    while not dec.done:
        dec.round()
    assert tok.unk_id not in dec.tokens and all(r.drafted == [] for r in dec.rounds)  # the guesses were cut
    want = generate(unk_lover, idx, 8, temperature=0.0, logits_hook=poems.no_unk(tok))
    assert dec.tokens == want.tokens[0].tolist()  # greedy with the ban: generate's tokens with the ban
    sampled = SpeculativeDecoder(unk_lover, always_unk, idx, 8, gamma=3, temperature=1.0,
                                 generator=torch.Generator().manual_seed(0), banned=poems.unk_ids(tok))
    while not sampled.done:
        sampled.round()
    assert tok.unk_id not in sampled.tokens[idx.shape[1]:]  # sampled: every <unk> guess is rejected


def test_the_speculative_view_shows_no_unk(unk_lover, tok):
    from kvlib.notebook.speculative_view import SpeculativeView

    view = SpeculativeView(unk_lover, tok, {"unk": NgramDraft({}, {}, tok.unk_id, tok.vocab_size)}, "春风",
                           gamma=3, max_new_tokens=8, start_rounds=3)
    assert view.decoder is not None and "&lt;unk&gt;" not in view.output.value and "<unk>" not in view.output.value


@pytest.mark.parametrize("extra", [[], ["--no-cache"], ["--temperature", "0"]])
def test_the_cli_never_prints_unk(unk_lover, tok, monkeypatch, capsys, extra):
    from kvlib.tools import cli

    monkeypatch.setattr(cli, "_load", lambda name: (unk_lover, tok))
    assert cli.main(["generate", "--prompt", "春风", "--max-new-tokens", "8", "--json", *extra]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completion"] and _no_unk(tok, report["completion"])


def test_the_cli_batch_never_prints_unk(unk_lover, tok, monkeypatch, capsys):
    from kvlib.tools import cli

    monkeypatch.setattr(cli, "_load", lambda name: (unk_lover, tok))
    assert cli.main(["generate", "--batch-prompts", "春风|白日", "--max-new-tokens", "6", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(_no_unk(tok, c) for c in report["completions"])


def test_generate_uncached_takes_the_same_hook(unk_lover, tok):
    idx = torch.tensor([poems.encode_prompt(tok, "春")])
    out = generate_uncached(unk_lover, idx, 5, block_size=unk_lover.config.block_size, temperature=1.0,
                            generator=torch.Generator().manual_seed(0), logits_hook=poems.no_unk(tok))
    assert tok.unk_id not in out.new_tokens[0].tolist()
