"""Notebook 2's checks: the top-k and top-p filters against the library's own."""
from __future__ import annotations

import torch

from .harness import call, stops_at_placeholder


def _filter_cases(vocab: int = 50):
    """Scores with known answers: distinct values, ties, one sure favourite, a flat row; (B, V) each."""
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(3, vocab, generator=g) * 2                          # distinct values
    tied = torch.tensor([[3.0, 1.0, 1.0, 1.0, 0.0] + [-5.0] * (vocab - 5)])  # three tokens tie
    sure = torch.full((1, vocab), -10.0).index_fill_(1, torch.tensor([7]), 10.0)
    flat = torch.zeros(1, vocab)
    return {"distinct scores": spread, "a three-way tie": tied, "one sure token": sure, "a flat row": flat}


def _kept(row: torch.Tensor) -> list[int]:
    return torch.isfinite(row).nonzero().flatten().tolist()


def _same_kept(row: torch.Tensor, want: list[int], have: list[int]) -> bool:
    """As many kept tokens as the reference, with the same scores: tied tokens are interchangeable.

    Which of several equal scores a filter keeps is decided by its sort (the library's stable sort keeps
    the lower ids); any choice among ties is accepted, so a flat row asks only for the right count.
    """
    return len(want) == len(have) and torch.equal(row[want].sort().values, row[have].sort().values)


def _check_filter(fn, reference, settings, name: str, hint=None, tolerated=None) -> bool:
    """Every case and setting through ``fn`` against ``reference``; one line per failing case and row.

    ``hint(row, want, have, s)`` may name a known mistake; ``tolerated(row, have, s)`` accepts a kept set that
    differs from the reference's only by float rounding. A result that is not a tensor of the right shape
    stops the check after one line: every case would say the same."""
    passed = True
    for case, scores in _filter_cases().items():
        for s in settings:
            expected = reference(scores, s)
            label = f"{case}, {name} = {s}"
            ok, got = call(fn, scores.clone(), s, label=label)
            if not ok:
                passed = False
                continue
            if not isinstance(got, torch.Tensor) or got.shape != scores.shape:
                print(f"✗ {label}: expected a tensor of shape {tuple(scores.shape)}, "
                      f"got {type(got).__name__} {tuple(getattr(got, 'shape', ()))}")
                return False
            if got.is_floating_point() and bool((got >= 0).all()) and torch.allclose(got.sum(-1), torch.ones(len(got))):
                print(f"✗ {label}: your filter returned probabilities; return the scores, with float('-inf') for "
                      f"every dropped token (sampling applies the softmax after the filter)")
                return False
            for b in range(scores.shape[0]):
                row = got[b].masked_fill(torch.isfinite(got[b]) & (got[b] <= -1e4), float("-inf"))
                if not torch.equal(row, got[b]):  # "dropped" with a large negative number: the same mistake everywhere
                    print(f"✗ {label}, row {b}: set a dropped token's score to float('-inf'); a large negative "
                          f"number still counts as kept")
                    return False
                want, have = _kept(expected[b]), _kept(got[b])
                if not _same_kept(scores[b], want, have) and not (tolerated and tolerated(scores[b], have, s)):
                    extra, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
                    ties_only = bool(extra and missing) and len(set(scores[b][extra + missing].tolist())) == 1
                    # (then which of the equal scores were kept is noise: any will do)
                    print(f"✗ {case}, row {b}, {name} = {s}: kept {len(have)} tokens, expected {len(want)}"
                          + (f"; kept but should be dropped: {extra[:8]}" if extra and not ties_only else "")
                          + (f"; dropped but should be kept: {missing[:8]}" if missing and not ties_only else "")
                          + (hint(scores[b], want, have, s) if hint else ""))
                    passed = False
                    break
                if not torch.equal(got[b][have], scores[b][have]):
                    print(f"✗ {case}, row {b}, {name} = {s}: the kept scores changed; a filter only drops tokens")
                    passed = False
                    break
    if passed:
        print(f"✓ the same kept tokens as the library's filter in every case ({', '.join(_filter_cases())})")
    return passed


def _top_k_slip(row, want, have, k) -> str:
    if len(have) == k < len(want):
        return ". Tokens tied with the k-th largest score are kept too, as top_k_filter keeps them"
    if len(have) == k - 1 and len(want) >= k:
        return ". Keep the k-th largest itself too: drop only the scores below it (<, not <=)"
    return ""


@stops_at_placeholder
def check_top_k(fn) -> bool:
    """``fn(scores (B, V), k) -> scores`` with all but the k largest set to -inf (ties with the k-th kept)."""
    from ...sampling import top_k_filter

    return _check_filter(fn, top_k_filter, (1, 2, 5, 50), "k", hint=_top_k_slip)


# Values of p for check_top_p, each far from every mass a case's favourites add up to (the flat row's
# 50 tokens of 0.02 reach every multiple of 0.02): there the answer would be decided by rounding, and a
# correct filter in float64, or one that sums in another order, could keep one token more or fewer.
# p = 1 is the exception: in float32 a sure favourite's probability rounds to 1.0 (see _rounded_away).
TOP_P_SETTINGS = (0.23, 0.47, 0.87, 1.0)


def _rounded_away(row: torch.Tensor, have: list[int], p: float) -> bool:
    """At p = 1, a filter that keeps the favourites and drops only tokens whose total probability float32
    cannot add to them (their running total already rounds to 1.0) is right in its own arithmetic."""
    if p != 1 or not have:
        return False
    probs = row.double().softmax(-1)
    order = probs.sort(descending=True, stable=True).values
    top = order[:len(have)]
    return bool(torch.equal(probs[have].sort(descending=True).values, top)) and float(order[len(have):].sum()) < 1e-6


def _top_p_slip(row, want, have, p) -> str:
    if len(have) == len(want) - 1:
        return ". The token that brings the total past p is kept too: drop a token only once the tokens before it hold p"
    return ""


@stops_at_placeholder
def check_top_p(fn) -> bool:
    """``fn(scores (B, V), p) -> scores``: the smallest set of favourites holding at least ``p`` (the token
    that crosses ``p`` is kept; ``p`` = 1 keeps every token), the rest set to -inf.

    Every ``p`` below 1 is at least 0.002 away from each case's prefix masses, so float32 or float64, either
    order of summing, gives the same count; among tied scores any tokens may be kept. At ``p`` = 1 dropping
    tokens that float32 rounds away (less than a millionth in all) is accepted."""
    from ...sampling import top_p_filter

    return _check_filter(fn, top_p_filter, TOP_P_SETTINGS, "p", hint=_top_p_slip, tolerated=_rounded_away)
