"""Notebook 1's checks: a character's rank and probability, the corpus's followers, the half cover."""
from __future__ import annotations

import math
import numbers

import torch

from .harness import as_int, as_number, brief, call, close, exact_case, sentences, stops_at_placeholder


RANK_CASES = (("举头望", "明", True), ("举头望", "山", True), ("举头望", "山", False),
              ("床前看月光，疑是地上霜。举头望", "明", True), ("春风", "。", True), ("春风", "。", False))


def _reading(opening: bool) -> str:
    return "read as a poem's opening" if opening else "read as a piece from anywhere"


@stops_at_placeholder
def check_rank(fn, model, tokenizer, cases=RANK_CASES) -> bool:
    """``fn(text, char, opening) -> (rank, probability)`` of ``char`` as the next character after ``text``: rank 1
    for the most likely token, the probability a fraction in [0, 1]. ``opening=True`` puts the poem separator in
    front of ``text``, ``False`` does not. Compared with :func:`kvlib.poems.rank_of` on each case."""
    from ...poems import rank_of

    passed = True
    for text, char, opening in cases:
        label = f"「{text}」→ {char}, {_reading(opening)}"
        want_rank, want_p = rank_of(model, tokenizer, text, char, opening=opening)
        ok, got = call(fn, text, char, opening, label=label)
        if not ok:
            passed = False
            continue
        pair = list(got) if isinstance(got, (tuple, list)) and len(got) == 2 else None
        rank = as_int(pair[0]) if pair else None
        p = pair[1].item() if pair and isinstance(pair[1], torch.Tensor) and pair[1].numel() == 1 else (
            pair[1] if pair else None)
        if rank is None or isinstance(p, bool) or not isinstance(p, numbers.Real):
            print(f"✗ {label}: expected a pair (rank, probability), a whole number and a number, got {brief(got)}")
            passed = False
            continue
        p = float(p)
        if rank == want_rank and close(p, want_p):
            print(f"✓ {label}: rank {rank:,}, probability {p:.5f}")
            continue
        passed = False
        hints = []
        if rank == want_rank - 1:
            hints.append("ranks count from 1: the most likely token has rank 1, so add one to the number of "
                         "tokens that are more likely")
        if rank == want_rank + 1:
            hints.append("count only the tokens strictly more likely than it (the character itself is not one of "
                         "them), then add one")
        if want_p > 0 and close(p, math.log(want_p)):
            hints.append("that is a log-probability: give the probability itself (its exp)")
        if close(p, 100 * want_p):
            hints.append("give the probability as a fraction between 0 and 1, not as a percentage")
        other_rank, other_p = rank_of(model, tokenizer, text, char, opening=not opening)
        if rank in (other_rank, other_rank - 1) and (close(p, other_p) or close(p, 100 * other_p)):
            hints.append(f"these are the numbers of the text {_reading(not opening)}: with opening=True the "
                         "separator goes in front (encode_prompt), with opening=False it does not (tokenizer.encode)")
        print(f"✗ {label}: expected rank {want_rank:,} and probability {want_p:.5f}, got rank {rank:,} and "
              f"probability {p:.5f}" + "".join(f". {h[0].upper()}{h[1:]}" for h in hints))
    return passed


@stops_at_placeholder
def check_followers(fn, model, tokenizer, poems, texts=("明月", "春风", "白云"), n: int = 5) -> bool:
    """``fn(text) -> [(char, corpus share, model probability), ...]``: the ``n`` characters that most often follow
    ``text`` in ``poems``, most frequent first; each with its share of all the occurrences of ``text`` (a fraction)
    and the probability the model gives it after reading ``text`` with nothing in front (no separator)."""
    from ...poems import count_followers, next_token_probs

    passed = True
    for text in texts:
        counts = count_followers(poems, text)
        total = sum(counts.values())
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
        anywhere = next_token_probs(model, tokenizer, text, opening=False)
        opening = next_token_probs(model, tokenizer, text, opening=True)
        want = [(ch, c / total, float(anywhere[tokenizer.encode(ch)[0]])) for ch, c in top]
        ok, got = call(fn, text, label=f"「{text}」")
        if not ok:
            passed = False
            continue
        rows = list(got) if isinstance(got, (list, tuple)) else None
        if rows is None or len(rows) != n or not all(isinstance(r, (list, tuple)) and len(r) == 3 for r in rows):
            print(f"✗ 「{text}」: expected a list of {n} triples (character, corpus share, model probability), "
                  f"got {brief(got)}")
            passed = False
            continue
        problems = []
        for i, ((ch, share, p), (want_ch, want_share, want_p)) in enumerate(zip(rows, want)):
            if not isinstance(ch, str):
                problems.append(f"place {i + 1}: the character must be a str such as {want_ch!r}, got {brief(ch)}")
                continue
            if ch != want_ch and counts.get(ch) != counts[want_ch]:  # a tie may come in either order
                problems.append(f"place {i + 1} should be {want_ch!r} (follows {text} {counts[want_ch]:,} times), "
                                f"got {ch!r} ({counts.get(ch, 0):,} times)")
                continue
            share, p = as_number(share, f"the corpus share of {ch!r}"), as_number(p, f"the probability of {ch!r}")
            if share is None or p is None:
                problems.append(f"the numbers for {ch!r} are not numbers")
                continue
            want_share, want_p = counts[ch] / total, float(anywhere[tokenizer.encode(ch)[0]])
            if not close(share, want_share, 1e-3):
                hint = (" (a percentage: give a fraction)" if close(share, 100 * want_share, 1e-3) else
                        f" (divide by all {total:,} occurrences of {text}, not only the top {n})"
                        if close(share, counts[ch] / sum(c for _, c in top), 1e-3) else "")
                problems.append(f"the corpus share of {ch!r} should be {want_share:.4f} = {counts[ch]:,} / {total:,}, "
                                f"got {share:.4f}{hint}")
            if not close(p, want_p, 1e-3, 1e-5):
                o = float(opening[tokenizer.encode(ch)[0]])
                hint = (" (a percentage: give a fraction)" if close(p, 100 * want_p, 1e-3, 1e-3) else
                        " (that is the probability with the separator in front: read the text with opening=False, "
                        "as the corpus counts do)" if close(p, o, 1e-3, 1e-5) else "")
                problems.append(f"the model's probability of {ch!r} should be {want_p:.4f}, got {p:.4f}{hint}")
        if problems:
            more = f"; and {len(problems) - 3} more" if len(problems) > 4 else ""
            print(f"✗ 「{text}」: " + "; ".join(problems[:3] if more else problems) + more)
            passed = False
        else:
            print(f"✓ 「{text}」 ({total:,} times), corpus share / model probability: "
                  + "  ".join(f"{ch} {s:.1%}/{p:.1%}" for ch, s, p in want))
    return passed


def _half_cover(probs: torch.Tensor) -> int:
    return int((probs.sort(descending=True).values.cumsum(0) < 0.5).sum()) + 1


@stops_at_placeholder
def check_half_cover(fn, model=None, tokenizer=None, prompts=("春眠不觉晓，", "大漠孤烟直，", "明月")) -> bool:
    """``fn(probs) -> int``: how many of the most likely tokens it takes for their probabilities to add up to at
    least one half. ``probs`` is a (V,) tensor in vocabulary order (not sorted). Tried on small distributions with
    known answers, then (given a model) on the next-token distributions after ``prompts`` (other than the
    exercise's own, so that a passing check does not print its answers)."""
    cases = {"[0.5, 0.25, 0.25]": torch.tensor([0.5, 0.25, 0.25]),
             "[0.1, 0.2, 0.3, 0.4] (not sorted)": torch.tensor([0.1, 0.2, 0.3, 0.4]),
             "eight tokens of 0.125": torch.full((8,), 0.125),
             "[0.01, 0.97, 0.01, 0.01]": torch.tensor([0.01, 0.97, 0.01, 0.01])}
    if model is not None:
        from ...poems import next_token_probs

        cases |= {f"the model after 「{t}」": next_token_probs(model, tokenizer, t) for t in prompts}
    passed = True
    for name, probs in cases.items():
        want = _half_cover(probs)

        def slip(n, got):
            unsorted = int((probs.cumsum(0) < 0.5).sum()) + 1
            rising = int((probs.sort().values.cumsum(0) < 0.5).sum()) + 1    # sorted from the smallest up
            inclusive = int((probs.sort(descending=True).values.cumsum(0) <= 0.5).sum()) + 1
            hint = ("at least one half: a total of exactly 0.5 is enough, so stop at the token that reaches it"
                    if n == inclusive else "sort the probabilities from the largest down before adding them up"
                    if n in (unsorted, rising) else "count the token that brings the total to one half, and stop there"
                    if n in (want + 1, want - 1) else "")
            return f"expected {want:,}, got {brief(got) if n is None else f'{n:,}'}" + sentences([hint])
        passed &= exact_case(fn, (probs.clone(),), name, want, as_int, lambda n: f"{n:,}", slip)
    return passed
