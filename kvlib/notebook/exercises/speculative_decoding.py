"""Notebook 8's checks: the best γ, the share of kept guesses, the blocks a roll-back frees."""
from __future__ import annotations

import math

import torch

from ...paged import ceil_div
from ...tokenizer import token_label
from .harness import as_int, as_number, brief, exact_case, sentences, sorted_ints, stops_at_placeholder


def _gain(alpha, gamma, guess_cost, verify_cost):
    from ...speculative import expected_tokens_per_round

    return expected_tokens_per_round(alpha, gamma) / (gamma * guess_cost + verify_cost)


@stops_at_placeholder
def check_best_gamma(fn, cases=((0.6, 0.05, 1.2), (0.9, 0.05, 1.2), (0.3, 0.05, 1.2), (0.6, 0.3, 1.2),
                                (0.8, 0.0, 1.0), (0.8, 0.5, 1.2)), gammas=range(1, 9)) -> bool:
    """``fn(alpha, guess_cost, verify_cost) -> gamma``: the γ in 1 … 8 that writes the most tokens per unit of cost,
    expected_tokens_per_round(α, γ) / (γ × guess_cost + verify_cost), costs in decode steps."""
    from ...speculative import expected_tokens_per_round

    passed = True
    for alpha, guess, verify in cases:
        want = max(gammas, key=lambda g: _gain(alpha, g, guess, verify))

        def slip(g, got):
            if g is None or g not in gammas:
                return f"expected γ = {want}, got {brief(got)} (a whole number from {gammas[0]} to {gammas[-1]})"
            most = max(gammas, key=lambda k: expected_tokens_per_round(alpha, k))
            return (f"expected γ = {want} ({_gain(alpha, want, guess, verify):.3f} tokens per step of cost), got "
                    f"γ = {g} ({_gain(alpha, g, guess, verify):.3f})" + sentences([
                        "that γ writes the most tokens per call, but each guess costs too: divide by what the round costs"
                        if g == most and guess > 0 else ""]))
        passed &= exact_case(fn, (alpha, guess, verify),
                              f"α = {alpha}, a guess {guess} and a verify pass {verify} decode steps", want, as_int,
                              lambda g: f"γ = {g} ({_gain(alpha, g, guess, verify):.3f} tokens per step of cost)", slip)
    return passed


def check_kept_share(share, model, tokenizer, draft, prompt: str = "举头望明", draws: int = 2000) -> bool:
    """``share``: the share of ``draws`` guesses of ``draft`` after ``prompt`` that the rejection rule kept, at
    temperature 1 with no q (the guess is certain). It must be p(x), the target's probability of the guess x,
    within four standard errors of a share from ``draws`` draws."""
    from ...sampling import probabilities
    from ...poems import encode_prompt

    got = as_number(share, "the share of kept guesses")
    if got is None:
        return False
    ids = encode_prompt(tokenizer, prompt)
    x = draft.propose(ids, 1)[0][0]
    with torch.inference_mode():
        p, bare = (float(probabilities(model(torch.tensor([t]))[0][:, -1], 1.0)[0, x])
                   for t in (ids, tokenizer.encode(prompt)))  # read as a poem's opening, and without the separator
    tol = 4 * math.sqrt(p * (1 - p) / draws) + 1e-9
    guess = token_label(tokenizer, x)
    if abs(got - p) <= tol:
        print(f"✓ kept {got:.3f} of the guesses {guess!r}; p({guess}) = {p:.3f}, within {tol:.3f} (four standard "
              f"errors of a share of {draws:,} draws)")
        return True
    hints = [(abs(got - 100 * p) <= 100 * tol, "give a fraction, not a percentage"),
             (got > 1 and abs(got / draws - p) <= tol, f"that is a count: divide it by the {draws:,} draws"),
             (abs(got - (1 + p)) <= tol, "that counts the tokens a round writes (the kept guess and the one after "
                                         "it): count only whether x was kept, accept_sampled's first value, 0 or 1"),
             (abs(got - 1) <= tol, "every guess was kept: without q the guess is kept with probability p(x) / 1 = p(x)"),
             (got > 1, "a share of the guesses cannot be more than 1"),
             (abs(got - (1 - p)) <= tol, "that is the share of rejected guesses"),
             (abs(got - bare) <= tol < abs(bare - p), f"that is p({guess}) after {prompt} without the separator in front: "
                                                      f"read it as a poem's opening, encode_prompt(tok, {prompt!r})")]
    hint = next((h for hit, h in hints if hit), "")
    print(f"✗ the share of kept guesses: expected p({guess}) = {p:.3f} ± {tol:.3f}, got {got:.3f}"
          + (f". {hint[0].upper()}{hint[1:]}" if hint else ""))
    return False


BLOCK_CASES = ((40, 35, 16), (49, 31, 16), (33, 32, 16), (32, 16, 16), (16, 0, 16), (17, 16, 16), (48, 48, 16),
               (20, 5, 8))


@stops_at_placeholder
def check_blocks_to_free(fn, cases=BLOCK_CASES) -> bool:
    """``fn(length_before, length_after, kv_block_size) -> list of block indices``: the blocks (0, 1, 2, … in the
    sequence's block table) that held at least one slot before the roll-back and hold none after it."""
    passed = True
    for before, after, size in cases:
        want = list(range(ceil_div(after, size), ceil_div(before, size)))

        def slip(blocks, got):
            if blocks is None:
                return f"expected a list of block indices {want}, got {brief(got)}"
            return f"expected {want}, got {blocks}" + sentences([
                "a block holding even one slot stays in use: count the blocks in use as ceil(length / kv_block_size), "
                "not length // kv_block_size" if blocks == list(range(after // size, before // size)) else ""])
        passed &= exact_case(fn, (before, after, size), f"{before} → {after} slots, blocks of {size}", want,
                              sorted_ints, str, slip)
    return passed
