"""Checks that answer back: run a learner's solution on cases with known answers and say what is wrong.

Each ``check_*`` function calls the learner's function on a few inputs (or takes the learner's number), compares
with the library's own result, and prints one line per case: ✓, or the input, what was expected and what came
back, with a hint where the answer matches a known mistake (a percentage for a fraction, GiB for GB, an
off-by-one). A function that is still the placeholder (it raises NotImplementedError, or returns None) is
reported, not raised; most checks then stop after that one line.
It never raises for a wrong answer (the learner reads the message and tries again); it returns
whether every case passed, so a notebook can show the worked solution's result too.
"""
from __future__ import annotations

import functools
import math
import numbers
import types

import torch

from ..decoding import generate
from ..paged import ceil_div
from ..poems import encode_prompt
from ..tokenizer import decode_complete, token_label
from ..verify import greedy_agreement


# ---- calling the learner's code, and reading what it gave back ------------------------------------------

def _show(ids, tokenizer) -> str:
    return "「" + decode_complete(tokenizer, ids).replace("\n", "⏎") + "」"


def _brief(value) -> str:
    """A short description of whatever the learner's code gave back."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '…' if len(text) > 60 else text}"


class _NotWritten(Exception):
    """The learner's function is still the placeholder: one line says so, and the check stops."""


def _stops_at_placeholder(check):
    """A check that returns False, after one line, when the learner's function raises NotImplementedError."""
    @functools.wraps(check)
    def run(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except _NotWritten:
            return False
    return run


def _call(fn, *args, label: str):
    """(True, what ``fn`` returned), or (False, None) after saying what it raised."""
    try:
        result = fn(*args)
        if isinstance(result, types.GeneratorType):  # a generator runs the learner's code only when read
            result = list(result)
    except NotImplementedError as e:
        print(f"✗ {label}: your function raised NotImplementedError ({e}): write it, then run this cell again")
        raise _NotWritten from None
    except Exception as e:  # the learner's code: say what it raised, and go on
        print(f"✗ {label}: your function raised {type(e).__name__}: {e}")
        return False, None
    if result is None:
        print(f"✗ {label}: your function returned None: does it end with a return statement?")
        raise _NotWritten
    return True, result


def _as_number(value, name: str) -> float | None:
    """``value`` as a float, or None after saying why it is not a number (yet)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if value is None:
        print(f"✗ {name} is still None: put your answer there and run the cell again")
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        print(f"✗ {name} must be a finite number, got {_brief(value)}")
        return None
    return float(value)


def _as_int(value) -> int | None:
    """``value`` as an int if it is a whole number (an int, a whole float, a one-element integer tensor)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    return int(value) if float(value) == int(value) else None


def _as_bool(value) -> bool | None:
    """``value`` as a bool (True/False, a numpy bool, a one-element boolean tensor), or None."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype == torch.bool:
        return bool(value.item())
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")):
        return bool(value)
    return None


def _as_list(value) -> list | None:
    """A list, tuple, one-dimensional tensor or numpy array as a list; None for anything else."""
    if isinstance(value, torch.Tensor):
        return value.tolist() if value.dim() == 1 else None
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 1:
        return value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else None


def _as_ints(value) -> list[int | None] | None:
    """A list, tuple, tensor or array as a list of whole numbers (None for an item that is not one), or None."""
    items = value.flatten().tolist() if isinstance(value, torch.Tensor) else _as_list(value)
    return None if items is None else [_as_int(x) for x in items]


def _sorted_ints(value) -> list[int] | None:
    """Any collection of whole numbers (a list, set, range, tensor, ...), sorted; None if it is not one."""
    try:
        items = value.flatten().tolist() if isinstance(value, torch.Tensor) else list(value)
    except TypeError:
        return None
    ints = [_as_int(x) for x in items]
    return None if None in ints else sorted(ints)


def _pair_of_ints(value) -> tuple | None:
    """Two whole numbers as a tuple (None for an item that is not one), or None if ``value`` is not a pair."""
    ints = _as_ints(value)
    return tuple(ints) if ints is not None and len(ints) == 2 else None


def _hints(got: float, candidates, close) -> str:
    """Every hint whose mistaken value ``got`` matches, as sentences ("" if none does)."""
    return _sentences(dict.fromkeys(h for value, h in candidates if close(got, value)))


def _close(got: float, want: float, rel: float = 1e-4, abs_: float = 1e-6) -> bool:
    return abs(got - want) <= abs_ + rel * abs(want)



def _number_case(fn, args: tuple, label: str, name: str, close, said: str, expected: str, hint) -> bool:
    """One case whose answer is a number: ✓ with ``said``, or ✗ with the expected, the actual and ``hint(got)``."""
    ok, got = _call(fn, *args, label=label)
    if not ok:
        return False
    got = _as_number(got, f"{label}: {name}")
    if got is None:
        return False
    if close(got):
        print(f"✓ {label}: {said}")
        return True
    print(f"✗ {label}: expected {expected}, got {got:,.6g}" + hint(got))
    return False


def _exact_case(fn, args: tuple, label: str, want, convert, said, slip) -> bool:
    """One case with one right answer: ✓ with ``said(answer)``, or ✗ with ``slip(answer, got)``, where ``got`` is what
    ``fn`` returned and ``answer`` is ``convert(got)`` (None, or holding None, where ``got`` has the wrong form)."""
    ok, got = _call(fn, *args, label=label)
    if not ok:
        return False
    answer = convert(got)
    if answer == want:
        print(f"✓ {label}: {said(answer)}")
        return True
    print(f"✗ {label}: {slip(answer, got)}")
    return False


def _sentences(hints) -> str:
    """Hints as sentences after a message: ". Hint one. Hint two" ("" for none)."""
    return "".join(f". {h[0].upper()}{h[1:]}" for h in hints if h)


# notebook 1 ------------------------------------------------------------------------------------------------

RANK_CASES = (("举头望", "明", True), ("举头望", "山", True), ("举头望", "山", False),
              ("床前看月光，疑是地上霜。举头望", "明", True), ("春风", "。", True), ("春风", "。", False))


def _reading(opening: bool) -> str:
    return "read as a poem's opening" if opening else "read as a piece from anywhere"


@_stops_at_placeholder
def check_rank(fn, model, tokenizer, cases=RANK_CASES) -> bool:
    """``fn(text, char, opening) -> (rank, probability)`` of ``char`` as the next character after ``text``: rank 1
    for the most likely token, the probability a fraction in [0, 1]. ``opening=True`` puts the poem separator in
    front of ``text``, ``False`` does not. Compared with :func:`kvlib.poems.rank_of` on each case."""
    from ..poems import rank_of

    passed = True
    for text, char, opening in cases:
        label = f"「{text}」→ {char}, {_reading(opening)}"
        want_rank, want_p = rank_of(model, tokenizer, text, char, opening=opening)
        ok, got = _call(fn, text, char, opening, label=label)
        if not ok:
            passed = False
            continue
        pair = list(got) if isinstance(got, (tuple, list)) and len(got) == 2 else None
        rank = _as_int(pair[0]) if pair else None
        p = pair[1].item() if pair and isinstance(pair[1], torch.Tensor) and pair[1].numel() == 1 else (
            pair[1] if pair else None)
        if rank is None or isinstance(p, bool) or not isinstance(p, numbers.Real):
            print(f"✗ {label}: expected a pair (rank, probability), a whole number and a number, got {_brief(got)}")
            passed = False
            continue
        p = float(p)
        if rank == want_rank and _close(p, want_p):
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
        if want_p > 0 and _close(p, math.log(want_p)):
            hints.append("that is a log-probability: give the probability itself (its exp)")
        if _close(p, 100 * want_p):
            hints.append("give the probability as a fraction between 0 and 1, not as a percentage")
        other_rank, other_p = rank_of(model, tokenizer, text, char, opening=not opening)
        if rank in (other_rank, other_rank - 1) and (_close(p, other_p) or _close(p, 100 * other_p)):
            hints.append(f"these are the numbers of the text {_reading(not opening)}: with opening=True the "
                         "separator goes in front (encode_prompt), with opening=False it does not (tokenizer.encode)")
        print(f"✗ {label}: expected rank {want_rank:,} and probability {want_p:.5f}, got rank {rank:,} and "
              f"probability {p:.5f}" + "".join(f". {h[0].upper()}{h[1:]}" for h in hints))
    return passed


@_stops_at_placeholder
def check_followers(fn, model, tokenizer, poems, texts=("明月", "春风", "白云"), n: int = 5) -> bool:
    """``fn(text) -> [(char, corpus share, model probability), ...]``: the ``n`` characters that most often follow
    ``text`` in ``poems``, most frequent first; each with its share of all the occurrences of ``text`` (a fraction)
    and the probability the model gives it after reading ``text`` with nothing in front (no separator)."""
    from ..poems import count_followers, next_token_probs

    passed = True
    for text in texts:
        counts = count_followers(poems, text)
        total = sum(counts.values())
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
        anywhere = next_token_probs(model, tokenizer, text, opening=False)
        opening = next_token_probs(model, tokenizer, text, opening=True)
        want = [(ch, c / total, float(anywhere[tokenizer.encode(ch)[0]])) for ch, c in top]
        ok, got = _call(fn, text, label=f"「{text}」")
        if not ok:
            passed = False
            continue
        rows = list(got) if isinstance(got, (list, tuple)) else None
        if rows is None or len(rows) != n or not all(isinstance(r, (list, tuple)) and len(r) == 3 for r in rows):
            print(f"✗ 「{text}」: expected a list of {n} triples (character, corpus share, model probability), "
                  f"got {_brief(got)}")
            passed = False
            continue
        problems = []
        for i, ((ch, share, p), (want_ch, want_share, want_p)) in enumerate(zip(rows, want)):
            if not isinstance(ch, str):
                problems.append(f"place {i + 1}: the character must be a str such as {want_ch!r}, got {_brief(ch)}")
                continue
            if ch != want_ch and counts.get(ch) != counts[want_ch]:  # a tie may come in either order
                problems.append(f"place {i + 1} should be {want_ch!r} (follows {text} {counts[want_ch]:,} times), "
                                f"got {ch!r} ({counts.get(ch, 0):,} times)")
                continue
            share, p = _as_number(share, f"the corpus share of {ch!r}"), _as_number(p, f"the probability of {ch!r}")
            if share is None or p is None:
                problems.append(f"the numbers for {ch!r} are not numbers")
                continue
            want_share, want_p = counts[ch] / total, float(anywhere[tokenizer.encode(ch)[0]])
            if not _close(share, want_share, 1e-3):
                hint = (" (a percentage: give a fraction)" if _close(share, 100 * want_share, 1e-3) else
                        f" (divide by all {total:,} occurrences of {text}, not only the top {n})"
                        if _close(share, counts[ch] / sum(c for _, c in top), 1e-3) else "")
                problems.append(f"the corpus share of {ch!r} should be {want_share:.4f} = {counts[ch]:,} / {total:,}, "
                                f"got {share:.4f}{hint}")
            if not _close(p, want_p, 1e-3, 1e-5):
                o = float(opening[tokenizer.encode(ch)[0]])
                hint = (" (a percentage: give a fraction)" if _close(p, 100 * want_p, 1e-3, 1e-3) else
                        " (that is the probability with the separator in front: read the text with opening=False, "
                        "as the corpus counts do)" if _close(p, o, 1e-3, 1e-5) else "")
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


@_stops_at_placeholder
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
        from ..poems import next_token_probs

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
            return f"expected {want:,}, got {_brief(got) if n is None else f'{n:,}'}" + _sentences([hint])
        passed &= _exact_case(fn, (probs.clone(),), name, want, _as_int, lambda n: f"{n:,}", slip)
    return passed


# notebook 2 ------------------------------------------------------------------------------------------------

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
            ok, got = _call(fn, scores.clone(), s, label=label)
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


@_stops_at_placeholder
def check_top_k(fn) -> bool:
    """``fn(scores (B, V), k) -> scores`` with all but the k largest set to -inf (ties with the k-th kept)."""
    from ..sampling import top_k_filter

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


@_stops_at_placeholder
def check_top_p(fn) -> bool:
    """``fn(scores (B, V), p) -> scores``: the smallest set of favourites holding at least ``p`` (the token
    that crosses ``p`` is kept; ``p`` = 1 keeps every token), the rest set to -inf.

    Every ``p`` below 1 is at least 0.002 away from each case's prefix masses, so float32 or float64, either
    order of summing, gives the same count; among tied scores any tokens may be kept. At ``p`` = 1 dropping
    tokens that float32 rounds away (less than a millionth in all) is accepted."""
    from ..sampling import top_p_filter

    return _check_filter(fn, top_p_filter, TOP_P_SETTINGS, "p", hint=_top_p_slip, tolerated=_rounded_away)


# notebook 3 ------------------------------------------------------------------------------------------------

def _write_with(hook, model, tokenizer, n_new: int, seed: int) -> list[int] | None:
    """The token ids of a new poem written with the learner's hook at temperature 1, or None (said why)."""
    try:
        out = generate(model, torch.tensor([[tokenizer.eos_id]]), n_new, temperature=1.0, logits_hook=hook,
                       generator=torch.Generator().manual_seed(seed))
    except Exception as e:  # the learner's code: say what it raised
        print(f"✗ seed {seed}: generate with your hook raised {type(e).__name__}: {e}")
        return None
    return out.new_tokens[0].tolist()


def _judge_writing(hook, model, tokenizer, n_new: int, seeds, judge) -> bool:
    """A text written with the hook for each seed, one line each: ``judge(new_ids) -> (right, what to say)``."""
    passed = True
    for seed in seeds:
        new = _write_with(hook, model, tokenizer, n_new, seed)
        if new is None:
            return False
        right, said = judge(new)
        print(f"{'✓' if right else '✗'} seed {seed}: {said}")
        passed &= right
    return passed


def _probe(hook, step: int, tokens: list[int], vocab_size: int, label: str) -> torch.Tensor | None:
    """(V,) bool: the tokens ``hook`` leaves allowed after ``tokens`` at ``step``, given flat logits; None (said
    why) if it raised or did not return logits. A score of -1e4 or below counts as banned."""
    if not callable(hook):
        print(f"✗ {label}: expected your hook, a function (step, tokens, logits) -> logits, got {_brief(hook)}")
        raise _NotWritten
    ok, out = _call(hook, step, torch.tensor([tokens]), torch.zeros(1, vocab_size), label=label)
    if not ok:
        return None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, vocab_size):
        print(f"✗ {label}: your hook must return logits of shape (1, {vocab_size}), got {_brief(out)}")
        return None
    return out[0] > -1e4


def _names(ids, tokenizer, most: int = 6) -> str:
    shown = "".join(token_label(tokenizer, i).replace("\n", "⏎") for i in ids[:most])
    return f"{shown}{'…' if len(ids) > most else ''} ({len(ids)} token{'s' * (len(ids) != 1)})"


# A seven-character quatrain the checks feed to a hook as the text so far (李白 Li Bai, 早发白帝城)
QUATRAIN = "朝辞白帝彩云间，千里江陵一日还。两岸猿声啼不住，轻舟已过万重山。"


@_stops_at_placeholder
def check_quatrain_hook(hook, model, tokenizer, chars_per_line: int = 7, seeds=(0, 1, 2)) -> bool:
    """A logits hook for a fixed-format quatrain: ，or 。 exactly after every ``chars_per_line`` characters
    (the last one 。), no punctuation anywhere else.

    First the hook itself, at every step after the opening of a real quatrain, given flat logits: inside a
    line it must leave exactly the characters (no punctuation, no separator); at a line end some of ，。 and
    nothing else; at the last, only 。. Then three poems written with it by ``generate`` from the separator."""
    from ..constraints import punctuation_mask

    n, line = 4 * (chars_per_line + 1), chars_per_line + 1
    text = QUATRAIN if chars_per_line == 7 else "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"
    prefix = [tokenizer.eos_id] + tokenizer.encode(text)
    chars = ~punctuation_mask(tokenizer)
    char_ids = set(chars.nonzero().flatten().tolist())
    marks = {tokenizer.encode(m)[0] for m in "，。"}
    full_stop = tokenizer.encode("。")[0]
    for step in range(n):
        label = f"step {step} (new token {step + 1})"
        allowed = _probe(hook, step, prefix[:1 + step], tokenizer.vocab_size, label)
        if allowed is None:
            return False
        ids = set(allowed.nonzero().flatten().tolist())
        if (step + 1) % line:
            may, must, what = char_ids, char_ids, "exactly the Chinese characters, no punctuation or separator"
        elif step + 1 < n:
            may, must, what = marks, set(), "only ，or 。 (at least one of them)"
        else:
            may, must, what = {full_stop}, {full_stop}, "only 。"
        extra, missing = sorted(ids - may), sorted(must - ids)
        if extra or missing or not ids:
            print(f"✗ {label}, after 「{tokenizer.decode(prefix[1:1 + step])}」: must allow {what}; your hook "
                  + "; ".join(x for x in (f"allows {_names(extra, tokenizer)} it should ban" if extra else "",
                                          f"bans {_names(missing, tokenizer)} it should allow" if missing else "",
                                          "bans every token" if not ids else "") if x)
                  + (f". Steps count from 0: step s chooses new token s + 1, so the line ends are steps "
                     f"{', '.join(str(line * i - 1) for i in range(1, 5))}" if ids and ids <= marks and may is char_ids
                     else ""))
            return False
    print(f"✓ your hook allows the right tokens at each of the {n} steps (probed after the opening of 「{text}」)")

    def form(new):
        punct = [i + 1 for i, t in enumerate(new) if bool(~chars[t]) == bool((i + 1) % line)]
        kept = not punct and new[-1] == full_stop
        return kept, _show(new, tokenizer) + ("" if kept else f": new tokens {punct[:8] or [n]} break the form")
    return _judge_writing(hook, model, tokenizer, n, seeds, form)


@_stops_at_placeholder
def check_no_repeat_hook(hook, model, tokenizer, seeds=(0, 1, 2), n_new: int = 40) -> bool:
    """A logits hook that forbids any Chinese character already in the text (punctuation may repeat).

    First the hook itself after a couplet and a half, given flat logits: exactly the characters in the text
    must be banned, every other score left as it was (punctuation and the separator too). Then three texts
    written with it by ``generate``."""
    from ..tokenizer import is_ideograph

    text = "床前明月光，疑是地上霜。举头望明月，"
    tokens = encode_prompt(tokenizer, text)
    allowed = _probe(hook, 0, tokens, tokenizer.vocab_size, f"after 「{text}」")
    if allowed is None:
        return False
    used = {t for t in tokens if is_ideograph(tokenizer.decode([t]))}
    want = torch.ones(tokenizer.vocab_size, dtype=torch.bool)
    want[sorted(used)] = False
    if not torch.equal(allowed, want):
        kept = sorted(used & set(allowed.nonzero().flatten().tolist()))
        banned = sorted(set((~allowed).nonzero().flatten().tolist()) - used)
        print(f"✗ after 「{text}」: your hook "
              + "; ".join(x for x in (f"still allows {_names(kept, tokenizer)} already in the text" if kept else "",
                                      f"bans {_names(banned, tokenizer)} not among its characters" if banned else "") if x)
              + " (only the Chinese characters already written are forbidden; punctuation may repeat)")
        return False
    print(f"✓ after 「{text}」 your hook bans exactly its {len(used)} different characters")

    def unrepeated(new):
        chars = [ch for ch in tokenizer.decode(new) if is_ideograph(ch)]
        repeats = sorted({ch for ch in chars if chars.count(ch) > 1})
        return (False, f"{_show(new, tokenizer)} repeats {'、'.join(repeats[:8])}") if repeats else (
            True, f"{len(chars)} characters, none repeated")
    return _judge_writing(hook, model, tokenizer, n_new, seeds, unrepeated)


# notebook 4 ------------------------------------------------------------------------------------------------

DECODE_PROMPTS = ("床前看月光，", "白日依山尽，黄河入海", "春")


@_stops_at_placeholder
def check_cached_greedy(fn, model, tokenizer, n_new: int = 12, prompts=DECODE_PROMPTS) -> bool:
    """``fn(model, idx, n_new) -> list[int]``: greedy decoding written by hand over a ``KVCache``.

    Compared with ``generate(model, idx, n_new, temperature=0.0, decoder="model")`` (the same arithmetic) on each
    prompt: the new token ids must be equal, or part only at a near-tie that rounding may flip
    (:func:`kvlib.verify.greedy_agreement`), and the loop may run at most P + n_new tokens through the model for a prompt of P (the
    prompt once, then one token a step; a loop without the cache runs P + i tokens at step i). A mismatch is
    reported with the prompt, the step where the two first differ, and both texts.
    """
    passed, V = True, tokenizer.vocab_size
    fed = [0]  # tokens the embedding table looked up: every token the model ran, on GPT.forward's path
    handle = model.transformer.wte.register_forward_hook(lambda m, args, out: fed.__setitem__(0, fed[0] + args[0].numel()))
    try:
        for text in prompts:
            idx = torch.tensor([encode_prompt(tokenizer, text)])
            expected = generate(model, idx, n_new, temperature=0.0, decoder="model").new_tokens[0].tolist()
            label, fed[0] = f"prompt 「{text}」", 0  # counted from here: the learner's loop only
            ok, got = _call(fn, model, idx.clone(), n_new, label=label)
            if not ok:
                passed = False
                continue
            ids = _as_ints(got)
            if ids is None or None in ids or not all(0 <= i < V for i in ids):
                print(f"✗ {label}: expected a list of {n_new} token ids (ints in [0, {V})), got {_brief(got)}")
                passed = False
                continue
            ran = fed[0]
            agree = "same" if ids == expected else "differ" if len(ids) != len(expected) else \
                greedy_agreement(model, idx[0], ids, expected)
            if agree != "differ" and ran <= idx.shape[1] + n_new:
                print(f"✓ {label}: the same {n_new} tokens as generate: {_show(ids, tokenizer)}" if agree == "same" else
                      f"✓ {label}: the tokens part from generate's only where the model's two best scores are within "
                      f"1e-4, so rounding may pick either (a near-tie, notebook 4's section 7): {_show(ids, tokenizer)}")
                continue
            passed = False
            if agree != "differ":
                print(f"✗ {label}: the right tokens, but your loop ran {ran:,} tokens through the model for "
                      f"{n_new} new ones after a prompt of {idx.shape[1]}; with the cache it takes "
                      f"{idx.shape[1] + n_new - 1}: the prompt once, then only each new token (the cache holds the rest)")
            elif len(ids) != len(expected):
                print(f"✗ {label}: expected {len(expected)} new token ids, got {len(ids)}"
                      + (": that is the prompt and the new tokens; return only the new ones"
                         if len(ids) == idx.shape[1] + n_new and ids[idx.shape[1]:] == expected else ""))
            else:
                step = next(i for i, (a, b) in enumerate(zip(ids, expected)) if a != b)
                print(f"✗ {label}: the tokens differ from step {step} on: expected {_show(expected, tokenizer)}, got "
                      f"{_show(ids, tokenizer)}. "
                      + ("Step 0 comes from the prefill: the argmax of the last row of its logits (greedy)."
                         if step == 0 else "At each decode step feed only the new token to model(…, cache=cache), "
                         "which advances the cache itself (no cache.advance of your own), with one fresh cache per call."))
    finally:
        handle.remove()
    return passed


# notebook 5 ------------------------------------------------------------------------------------------------

def check_tokens_to_match_weights(tokens, inside_context, model_name: str = "Llama 3 8B") -> bool:
    """``tokens``: how long one sequence must be for its bf16 cache to take as many bytes as the bf16 weights
    (within 1 %); ``inside_context``: whether that length is within the model's trained context (True/False)."""
    from ..memory import SHAPES

    shape = SHAPES[model_name]
    want = shape.weight_bytes() / shape.kv_bytes_per_token()
    passed = True
    got = _as_number(tokens, "the number of tokens")
    if got is None:
        passed = False
    elif abs(got - want) <= 0.01 * want:
        print(f"✓ {got:,.0f} tokens: the cache of one sequence that long takes as many bytes as the weights "
              f"({shape.weight_bytes():,} bytes)")
    elif got <= 0:
        passed = False
        print(f"✗ the number of tokens: expected about {want:,.0f} (weights {shape.weight_bytes():,} bytes / cache "
              f"per token), got {got:,.0f}: a length is a positive number of tokens")
    else:
        passed = False
        # got = want / ratio: what the usual slips do to the quotient weights / (cache per token)
        hints = [(2.0, "the weights take 2 bytes a parameter in bf16 (count bytes, not parameters), and the cache "
                       "is bf16 too: 2 bytes a number, not 4"),
                 (0.5, "a token's cache holds a key and a value (the factor 2) for every layer and key/value head, "
                       "and the weights are bf16: 2 bytes a parameter, not 4"),
                 (4.0, f"{model_name} caches {shape.n_kv_head} key/value heads per layer, not its {shape.n_head} "
                       "query heads (grouped-query attention)")]
        hint = _hints(want / got, hints, lambda r, ratio: abs(r - ratio) <= 0.02 * ratio)
        print(f"✗ the number of tokens: expected about {want:,.0f} (weights {shape.weight_bytes():,} bytes / "
              f"cache per token), got {got:,.0f}" + (f". Off by a factor {want / got:g}{hint}" if hint else ""))
    inside = _as_bool(inside_context)
    if inside is None:
        print(f"✗ whether it is inside the trained context must be True or False, got {_brief(inside_context)}")
        return False
    inside_context = inside
    if inside_context != (want <= shape.context):
        print(f"✗ inside the trained context: expected {want <= shape.context}, got {inside_context}: "
              f"{want:,.0f} tokens against a trained context of {shape.context:,}")
        return False
    print(f"✓ {'inside' if inside_context else 'outside'} the trained context of {shape.context:,} tokens")
    return passed


def check_sequences_that_fit(answers, gpu_bytes: int = 80 * 10**9, tokens: int = 4096,
                             models=("Llama 2 7B", "Llama 3 8B")) -> bool:
    """``answers``: {model name: how many whole sequences of ``tokens`` tokens fit, with their bf16 cache, in a GPU of
    ``gpu_bytes`` bytes (80 GB = 80 × 10⁹ bytes) once the bf16 weights are loaded}."""
    from ..memory import SHAPES

    if not isinstance(answers, dict):
        print(f"✗ expected a dict {{model name: number of sequences}} for {', '.join(models)}, got {_brief(answers)}")
        return False
    passed = True
    for name in models:
        shape = SHAPES[name]
        weights, per_sequence = shape.weight_bytes(), shape.kv_cache_bytes(tokens)
        want = (gpu_bytes - weights) // per_sequence
        if name not in answers:
            print(f"✗ {name}: no answer (the dict has {sorted(answers)})")
            passed = False
            continue
        got = _as_number(answers[name], f"the answer for {name}")
        if got is None:
            passed = False
            continue
        if got == want:
            print(f"✓ {name}: {want} sequences of {tokens:,} tokens ({per_sequence:,} bytes each) in the "
                  f"{gpu_bytes - weights:,} bytes left after the weights")
            continue
        passed = False
        kib_per_token = shape.kv_bytes_per_token() // 1024
        hints = [((80 * 2**30 - weights) // per_sequence,
                  f"that is 80 GiB (80 × 2³⁰ = {80 * 2**30:,} bytes); here 80 GB means 80 × 10⁹ bytes, "
                  "as in the table's GB"),
                 ((gpu_bytes - weights) / per_sequence, "a sequence fits only whole: round down"),
                 ((gpu_bytes - weights) // per_sequence + 1, "a sequence fits only whole: round down"),
                 (gpu_bytes // per_sequence, "the weights take their share of the memory first: subtract them"),
                 ((gpu_bytes - weights) // (kib_per_token * 1000 * tokens),
                  f"a KiB is 1,024 bytes: {kib_per_token} KiB per token is {shape.kv_bytes_per_token():,} bytes")]
        hint = _hints(got, hints, lambda g, value: abs(g - value) < 1e-6)  # every slip that gives this number
        print(f"✗ {name}: expected {want} sequences, got {got:g}" + (hint or
              f" ({gpu_bytes:,} bytes, minus {weights:,} of weights, over {per_sequence:,} bytes per sequence)"))
    return passed


@_stops_at_placeholder
def check_token_forwards(fn, cases=((1, 1), (1, 120), (1, 300), (16, 10), (4, 125), (13, 24))) -> bool:
    """``fn(prompt_len, n_new) -> (recompute, cached)``: the token-forwards each loop makes to write ``n_new``
    tokens after a prompt of ``prompt_len`` (a block long enough that nothing slides). Recompute runs
    ``prompt_len + i`` tokens at step i; the cached loop runs the prompt once, then each new token but the last."""
    passed = True
    for P, N in cases:
        want = (N * P + N * (N - 1) // 2, P + N - 1)

        def slip(pair, got):
            if pair is None or None in pair:
                return f"expected a pair of whole numbers (recompute, cached), got {_brief(got)}"
            hints = ["the last new token is never fed back: no step comes after it" if pair[1] == P + N else "",
                     "step i (from 0) runs the prompt and the i tokens written so far: the last step runs P + N − 1 "
                     "tokens, not P + N" if pair[0] == N * P + N * (N + 1) // 2 else "",
                     "every recompute step runs the whole prompt again" if P > 1 and pair[0] == N * (N + 1) // 2 else ""]
            return f"expected ({want[0]:,}, {want[1]:,}), got ({pair[0]:,}, {pair[1]:,})" + _sentences(hints)
        passed &= _exact_case(fn, (P, N), f"prompt of {P}, {N} new token{'s' * (N > 1)}", want, _pair_of_ints,
                              lambda pair: f"{pair[0]:,} without the cache, {pair[1]:,} with it", slip)
    return passed


# notebook 6 ------------------------------------------------------------------------------------------------

RIGHT_PAD_CASES = (([[0, 5, 6], [0, 7], [0]], 9), ([[3, 4], [5, 6]], 0))
RIGHT_PAD_TEXTS = (("春风", "白日依山尽，", "床前看月光，疑是地上霜。"), ("春", "白日依山尽，黄河入海流。"))


def _pad_right(prompts, pad_id):
    T = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.bool)
    for b, p in enumerate(prompts):
        idx[b, :len(p)] = torch.tensor(p)
        mask[b, :len(p)] = True
    return idx, mask


@_stops_at_placeholder
def check_right_padding(pad_right, next_logits, model, tokenizer, texts=RIGHT_PAD_TEXTS) -> bool:
    """Right padding, in two functions. ``pad_right(prompts, pad_id) -> (idx, key_mask)``: the real tokens of each
    row first, pads after them, ``key_mask`` True on real tokens. ``next_logits(model, idx, key_mask) -> (B, V)``:
    each row's next-token logits from one forward pass over the right-padded batch. Each row must give what its
    prompt gives alone (log-probabilities within 1e-4)."""
    from ..decoding import pad_prompts, position_ids_from_mask

    passed = True
    for prompts, pad_id in RIGHT_PAD_CASES:
        want_idx, want_mask = _pad_right(prompts, pad_id)
        label = f"pad_right({prompts}, pad_id={pad_id})"
        ok, got = _call(pad_right, [list(p) for p in prompts], pad_id, label=label)
        if not ok:
            passed = False
            continue
        try:
            if not (isinstance(got, (tuple, list)) and len(got) == 2):  # a lone tensor of two rows is not a pair
                raise TypeError
            got_idx, got_mask = (torch.as_tensor(x) for x in got)
            same = torch.equal(got_idx.long(), want_idx) and torch.equal(got_mask.bool(), want_mask)
        except Exception:
            print(f"✗ {label}: expected a pair of tensors (idx, key_mask), got {_brief(got)}")
            passed = False
            continue
        if same:
            print(f"✓ {label}: idx {want_idx.tolist()}")
            continue
        passed = False
        left_idx, _ = pad_prompts(prompts, pad_id)
        hint = (". That is left padding: here the real tokens come first and the pads after them"
                if got_idx.shape == left_idx.shape and torch.equal(got_idx.long(), left_idx) else "")
        print(f"✗ {label}: expected idx {want_idx.tolist()} and key_mask {want_mask.int().tolist()}, got idx "
              f"{got_idx.tolist()} and key_mask {got_mask.int().tolist()}{hint}")
    for group in texts:
        prompts = [[tokenizer.eos_id, *tokenizer.encode(t)] for t in group]
        idx, mask = _pad_right(prompts, tokenizer.eos_id)
        with torch.inference_mode():  # what reading the last column gives, with or without the mask and positions
            last_column = [model(idx, key_mask=mask, position_ids=position_ids_from_mask(mask))[0][:, -1],
                           model(idx, key_mask=mask)[0][:, -1], model(idx)[0][:, -1]]
        ok, got = _call(next_logits, model, idx.clone(), mask.clone(), label=f"next_logits for {list(group)}")
        if not ok:
            passed = False
            continue
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (len(prompts), tokenizer.vocab_size):
            print(f"✗ next_logits for {list(group)}: expected a tensor of shape {(len(prompts), tokenizer.vocab_size)}, "
                  f"got {_brief(got) if not isinstance(got, torch.Tensor) else tuple(got.shape)}")
            passed = False
            continue
        got = got.detach().float().log_softmax(-1)
        for b, (text, p) in enumerate(zip(group, prompts)):
            with torch.inference_mode():
                alone = model(torch.tensor([p]))[0][0, -1].log_softmax(-1)
            diff = float((got[b] - alone).abs().max())
            if diff < 1e-4:
                print(f"✓ row {b} 「{text}」: the same next-token distribution as the prompt alone")
                continue
            passed = False
            kl = max(0.0, float((alone.exp() * (alone - got[b])).sum()))
            hint = (f". You read the last column, which in this row is a pad: the row has {len(p)} real tokens of "
                    f"{idx.shape[1]}, so its last real token is in column {len(p) - 1}"
                    if any(float((got[b] - c[b].log_softmax(-1)).abs().max()) < 1e-4 for c in last_column) else "")
            want_top, got_top = token_label(tokenizer, alone.argmax()), token_label(tokenizer, got[b].argmax())
            print(f"✗ row {b} 「{text}」: {kl:.3f} nats (KL) from the prompt alone; "
                  + (f"the favourite is the same, {want_top!r}, but the probabilities are not" if want_top == got_top
                     else f"its favourite next token should be {want_top!r}, yours is {got_top!r}") + hint)
    return passed


@_stops_at_placeholder
def check_one_token_characters(fn, tokenizer, poems, ns=(20, 150)) -> bool:
    """``fn(poems, tokenizer, n) -> (single, split)``: the ``n`` most frequent characters of ``poems`` (punctuation
    counts; a tie at the n-th place may be broken either way), in two lists: those ``tokenizer`` encodes as one
    token, and those it splits into several."""
    from collections import Counter

    counts = Counter("".join(poems))
    ranked = counts.most_common()
    passed = True
    for n in ns:
        label = f"n = {n}"
        ok, got = _call(fn, poems, tokenizer, n, label=label)
        if not ok:
            passed = False
            continue
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(
                isinstance(part, (list, tuple, str, set, frozenset)) and all(isinstance(c, str) for c in part)
                for part in got)):
            print(f"✗ {label}: expected a pair of lists of characters (single, split), got {_brief(got)}")
            passed = False
            continue
        single, split = list(got[0]), list(got[1])
        nth = ranked[n - 1][1]                                     # how often the n-th most frequent occurs
        must = {c for c, k in ranked if k > nth}
        problems = []
        if len(single) + len(split) != n:
            problems.append(f"the two lists hold {len(single) + len(split)} characters, expected {n}")
        if len(set(single + split)) != len(single + split):
            problems.append("a character appears twice")
        missing = sorted(must - set(single + split), key=lambda c: (-counts[c], c))
        if missing:
            problems.append(f"leaves out {''.join(missing[:8])} (e.g. {missing[0]!r} occurs {counts[missing[0]]:,} "
                            f"times; the character at place {n} of the ranking occurs {nth:,} times)")
        if any(c in ("\n", "⏎") for c in single + split):
            problems.append("includes the end of a poem, which is not one of the characters here: count the "
                            "characters inside the poems, ''.join(poems)")
        rare = [c for c in single + split if counts.get(c, 0) < nth and c not in ("\n", "⏎")]
        if rare:
            problems.append(f"includes {''.join(rare[:8])!r}, which occur{'s' * (len(rare) == 1)} fewer than {nth:,} "
                            f"times (e.g. {rare[0]!r}: {counts.get(rare[0], 0):,})")
        for c in single:
            if len(tokenizer.encode(c)) != 1:
                problems.append(f"puts {c!r} among the single tokens, but it is encoded as "
                                f"{len(tokenizer.encode(c))} tokens ({' | '.join(tokenizer.token_bytes(i).hex(' ') for i in tokenizer.encode(c))})")
                break
        for c in split:
            if len(tokenizer.encode(c)) == 1:
                problems.append(f"puts {c!r} among the split characters, but it is one token "
                                f"({tokenizer.token_bytes(tokenizer.encode(c)[0]).hex(' ')})")
                break
        if problems:
            print(f"✗ {label}: " + "; ".join(problems))
            passed = False
        else:
            print(f"✓ {label}: {len(single)} are one token, {len(split)} are split"
                  + (f" (e.g. {''.join(split[:5])})" if split else ""))
    return passed


FILLER_CASES = (("two rows, one ends early", [[5, 6, 0, 0], [5, 6, 7, 8]], 0),
                ("no row ends", [[1, 2, 3], [4, 5, 6]], 0),
                ("a row ends at its first step", [[0, 0, 0, 0], [1, 2, 3, 0]], 0),
                ("three rows", [[1, 2, 0], [0, 0, 0], [1, 0, 0]], 0),
                ("the separator is id 3", [[7, 3, 3], [1, 2, 3]], 3),
                ("other tokens after the separator", [[5, 0, 6, 7], [1, 2, 3, 4]], 0))


def _filler(rows, eos_id, eos_is_filler=False, unfinished_useful=True):
    steps = len(rows[0])
    useful = [(r.index(eos_id) + (0 if eos_is_filler else 1)) if eos_id in r else (steps if unfinished_useful else 0)
              for r in rows]
    return 1 - sum(useful) / (len(rows) * steps)


@_stops_at_placeholder
def check_filler_share(fn, cases=FILLER_CASES) -> bool:
    """``fn(new_tokens, eos_id) -> float``: the share of row-steps that were filler, as a fraction. ``new_tokens`` is
    (B, N); a row's steps up to and including its first ``eos_id`` wrote its poem, every step after it is filler, and
    a row that never writes ``eos_id`` has no filler."""
    passed = True
    for name, rows, eos in cases:
        want = _filler(rows, eos)
        label = f"{name}: {rows}, eos_id {eos}"
        ok, got = _call(fn, torch.tensor(rows), eos, label=label)
        if not ok:
            passed = False
            continue
        share = _as_number(got, f"the answer for {name}")
        if share is None:
            passed = False
            continue
        if _close(share, want):
            print(f"✓ {label}: {share:.3f}")
            continue
        passed = False
        hints = [(100 * want, "give a fraction, not a percentage"),
                 (_filler(rows, eos, eos_is_filler=True), "the step that writes the separator is not filler: it ends "
                                                          "the poem; only the steps after it are"),
                 (_filler(rows, eos, unfinished_useful=False), "a row that never writes the separator works at "
                                                               "every step: none of its steps is filler"),
                 (1 - want, "that is the useful share: the filler is the rest")]
        hint = next((h for value, h in hints if _close(share, value) and not _close(value, want)), "")
        print(f"✗ {label}: expected {want:.4f}, got {share:.4f}" + (f". {hint[0].upper()}{hint[1:]}" if hint else ""))
    return passed


# notebook 7 ------------------------------------------------------------------------------------------------

@_stops_at_placeholder
def check_memory_shares(fn, model, requests, sizes=(4, 8, 16, 32), kv_positions: int = 1024) -> bool:
    """``fn(kv_block_size) -> memory share``: ``requests`` served continuously in ``kv_positions`` positions
    cut into blocks of that size; compared with the engine's own count for each size."""
    from ..serving import run_continuous

    passed = True
    for size in sizes:
        want = run_continuous(model, requests, num_blocks=kv_positions // size, kv_block_size=size).memory_share
        hint = lambda got, want=want: (  # noqa: E731
            ". A share is a fraction of 1, not a percentage" if math.isclose(got, 100 * want, rel_tol=1e-6) else "")
        passed &= _number_case(fn, (size,), f"blocks of {size}", "share",
                               lambda got, want=want: math.isclose(got, want, rel_tol=1e-6),
                               f"memory share {100 * want:.1f} %", f"a memory share of {want:.4f}", hint)
    return passed


@_stops_at_placeholder
def check_prefix_hits(fn, model, prompts, sizes=(4, 8)) -> bool:
    """``fn(prompts, kv_block_size) -> list``: the prompt tokens each prompt finds in one pool with prefix
    caching, the prompts arriving one after another (each prefilled before the next arrives); for each of ``sizes``."""
    from ..paged import PagedKVCache

    passed = True
    for kv_block_size in sizes:
        pool, want = PagedKVCache(model.config, 256, kv_block_size=kv_block_size), []
        for i, p in enumerate(prompts):
            want.append(pool.add_sequence(i, p))
            pool.forward(model, [i], [p[want[-1]:]])

        def slip(found, got):
            if found is None or None in found:
                return f"expected {want}, got {_brief(got)}"
            return f"expected {want}, got {found}" + _sentences([
                "a prompt finds only what earlier prompts left in the pool: prefill each before adding the next"
                if found[:1] == want[:1] and all(g == 0 for g in found) else ""])
        passed &= _exact_case(fn, (prompts, kv_block_size), f"{len(prompts)} prompts, blocks of {kv_block_size}", want,
                              _as_ints, str, slip)
    return passed


# notebook 8 ------------------------------------------------------------------------------------------------

def _gain(alpha, gamma, guess_cost, verify_cost):
    from ..speculative import expected_tokens_per_round

    return expected_tokens_per_round(alpha, gamma) / (gamma * guess_cost + verify_cost)


@_stops_at_placeholder
def check_best_gamma(fn, cases=((0.6, 0.05, 1.2), (0.9, 0.05, 1.2), (0.3, 0.05, 1.2), (0.6, 0.3, 1.2),
                                (0.8, 0.0, 1.0), (0.8, 0.5, 1.2)), gammas=range(1, 9)) -> bool:
    """``fn(alpha, guess_cost, verify_cost) -> gamma``: the γ in 1 … 8 that writes the most tokens per unit of cost,
    expected_tokens_per_round(α, γ) / (γ × guess_cost + verify_cost), costs in decode steps."""
    from ..speculative import expected_tokens_per_round

    passed = True
    for alpha, guess, verify in cases:
        want = max(gammas, key=lambda g: _gain(alpha, g, guess, verify))

        def slip(g, got):
            if g is None or g not in gammas:
                return f"expected γ = {want}, got {_brief(got)} (a whole number from {gammas[0]} to {gammas[-1]})"
            most = max(gammas, key=lambda k: expected_tokens_per_round(alpha, k))
            return (f"expected γ = {want} ({_gain(alpha, want, guess, verify):.3f} tokens per step of cost), got "
                    f"γ = {g} ({_gain(alpha, g, guess, verify):.3f})" + _sentences([
                        "that γ writes the most tokens per call, but each guess costs too: divide by what the round costs"
                        if g == most and guess > 0 else ""]))
        passed &= _exact_case(fn, (alpha, guess, verify),
                              f"α = {alpha}, a guess {guess} and a verify pass {verify} decode steps", want, _as_int,
                              lambda g: f"γ = {g} ({_gain(alpha, g, guess, verify):.3f} tokens per step of cost)", slip)
    return passed


def check_kept_share(share, model, tokenizer, draft, prompt: str = "举头望明", draws: int = 2000) -> bool:
    """``share``: the share of ``draws`` guesses of ``draft`` after ``prompt`` that the rejection rule kept, at
    temperature 1 with no q (the guess is certain). It must be p(x), the target's probability of the guess x,
    within four standard errors of a share from ``draws`` draws."""
    from ..sampling import probabilities
    from ..poems import encode_prompt

    got = _as_number(share, "the share of kept guesses")
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


@_stops_at_placeholder
def check_blocks_to_free(fn, cases=BLOCK_CASES) -> bool:
    """``fn(length_before, length_after, kv_block_size) -> list of block indices``: the blocks (0, 1, 2, … in the
    sequence's block table) that held at least one slot before the roll-back and hold none after it."""
    passed = True
    for before, after, size in cases:
        want = list(range(ceil_div(after, size), ceil_div(before, size)))

        def slip(blocks, got):
            if blocks is None:
                return f"expected a list of block indices {want}, got {_brief(got)}"
            return f"expected {want}, got {blocks}" + _sentences([
                "a block holding even one slot stays in use: count the blocks in use as ceil(length / kv_block_size), "
                "not length // kv_block_size" if blocks == list(range(after // size, before // size)) else ""])
        passed &= _exact_case(fn, (before, after, size), f"{before} → {after} slots, blocks of {size}", want,
                              _sorted_ints, str, slip)
    return passed


# notebook 9 ------------------------------------------------------------------------------------------------

@_stops_at_placeholder
def check_bytes_per_token(fn, config, cases=((8, 16), (4, 16), (2, 16), (2, 32), (4, 8))) -> bool:
    """``fn(bits, group_size) -> bytes``: one position of a ``QuantizedKVCache`` without a full-precision
    window, every layer, keys and values, codes, scales and zero points; compared with the size the cache
    measures after two full key groups of positions."""
    from ..quantized import QuantizedKVCache

    config = getattr(config, "config", config)  # the model itself will do
    passed = True
    for bits, group in cases:
        cache = QuantizedKVCache(config, 1, 2 * group, bits=bits, group_size=group)
        H, D, gen = config.n_head, config.head_size, torch.Generator().manual_seed(bits)
        with torch.inference_mode():
            for layer in range(config.n_layer):
                k, v = torch.randn(2, 1, H, 2 * group, D, generator=gen)
                cache.write(layer, k, v)
            cache.advance(2 * group)
        want = cache.nbytes / (2 * group)
        numbers = config.n_layer * 2 * config.n_embd  # keys and values, every layer
        slips = [(numbers * bits / 8, f"the codes alone take {numbers * bits / 8:,.0f} bytes: add 4 bytes (a float16 "
                                      f"scale and a float16 zero point) for every {group} numbers"),
                 (numbers * (bits / 8 + 2 / group), f"the zero point is a float16 too: 4 bytes of scale and zero point "
                                                    f"for every {group} numbers, not 2"),
                 (want / 2, "count the values as well as the keys, in every layer"),
                 (want * 8, "that is in bits: divide by 8"),
                 (numbers * (bits / 8 + 8 / group), f"the count of numbers already holds the keys and the values: 4 bytes "
                                                    f"of scale and zero point for every {group} of them, not 8")]
        hint = lambda got, slips=slips: _hints(got, slips, math.isclose)  # noqa: E731
        passed &= _number_case(fn, (bits, group), f"{bits} bits, groups of {group}", "bytes",
                               lambda got, want=want: math.isclose(got, want, rel_tol=1e-9),
                               f"{want:,.0f} bytes a token, as the cache measures", f"{want:,.0f} bytes a token", hint)
    return passed
