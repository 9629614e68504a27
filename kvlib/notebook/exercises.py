"""Checks that answer back: run a learner's solution on cases with known answers and say what is wrong.

Each ``check_*`` function calls the learner's function on a few inputs, compares with the library's
own result, and prints one line per case: ✓, or the input, what was expected and what came back.
It never raises for a wrong answer (the learner reads the message and tries again); it returns
whether every case passed, so a notebook can show the worked solution's result too.
"""
from __future__ import annotations

import torch

from ..decoding import generate
from ..text import encode_prompt

DECODE_PROMPTS = ("床前看月光，", "白日依山尽，黄河入海", "春")


def _show(ids, tokenizer) -> str:
    return "「" + tokenizer.decode(ids).replace("\n", "⏎") + "」"


def check_cached_greedy(fn, model, tokenizer, n_new: int = 12, prompts=DECODE_PROMPTS) -> bool:
    """``fn(model, idx, n_new) -> list[int]``: greedy decoding written by hand over a ``KVCache``.

    Compared with ``generate(model, idx, n_new, temperature=0.0)`` on each prompt: the new token ids
    must be equal. A mismatch is reported with the prompt, the step where the two first differ, and
    both texts; an exception is reported with its type and message.
    """
    passed = True
    for text in prompts:
        idx = torch.tensor([encode_prompt(tokenizer, text)])
        expected = generate(model, idx, n_new, temperature=0.0).new_tokens[0].tolist()
        try:
            got = fn(model, idx, n_new)
            got = got.flatten().tolist() if isinstance(got, torch.Tensor) else list(got)
        except Exception as e:  # the learner's code: say what it raised, and go on
            print(f"✗ prompt 「{text}」: your function raised {type(e).__name__}: {e}")
            passed = False
            continue
        if got == expected:
            print(f"✓ prompt 「{text}」: the same {n_new} tokens as generate: {_show(got, tokenizer)}")
            continue
        passed = False
        if len(got) != len(expected):
            print(f"✗ prompt 「{text}」: expected {len(expected)} new token ids, got {len(got)}")
            continue
        step = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
        print(f"✗ prompt 「{text}」: the tokens differ from step {step} on: expected "
              f"{_show(expected, tokenizer)}, got {_show(got, tokenizer)}. "
              + ("Step 0 comes from the prefill: take the last row of its logits."
                 if step == 0 else "Feed only the new token at each decode step; the cache holds the rest."))
    return passed


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


def _check_filter(fn, reference, settings, name: str) -> bool:
    passed = True
    for case, scores in _filter_cases().items():
        for s in settings:
            expected = reference(scores, s)
            try:
                got = fn(scores.clone(), s)
            except Exception as e:
                print(f"✗ {case}, {name} = {s}: your function raised {type(e).__name__}: {e}")
                passed = False
                continue
            if not isinstance(got, torch.Tensor) or got.shape != scores.shape:
                print(f"✗ {case}, {name} = {s}: expected a tensor of shape {tuple(scores.shape)}, "
                      f"got {type(got).__name__} {tuple(getattr(got, 'shape', ()))}")
                passed = False
                continue
            for b in range(scores.shape[0]):
                want, have = _kept(expected[b]), _kept(got[b])
                if want != have:
                    extra, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
                    print(f"✗ {case}, row {b}, {name} = {s}: kept {len(have)} tokens, expected {len(want)}"
                          + (f"; kept but should be dropped: {extra[:8]}" if extra else "")
                          + (f"; dropped but should be kept: {missing[:8]}" if missing else ""))
                    passed = False
                    break
                if not torch.equal(got[b][torch.isfinite(got[b])], scores[b][torch.isfinite(expected[b])]):
                    print(f"✗ {case}, row {b}, {name} = {s}: the kept scores changed; a filter only drops tokens")
                    passed = False
                    break
    if passed:
        print(f"✓ the same kept tokens as the library's filter in every case ({', '.join(_filter_cases())})")
    return passed


def check_top_k(fn) -> bool:
    """``fn(scores (B, V), k) -> scores`` with all but the k largest set to -inf (ties with the k-th kept)."""
    from ..sampling import top_k_filter

    return _check_filter(fn, top_k_filter, (1, 2, 5, 50), "k")


def check_top_p(fn) -> bool:
    """``fn(scores (B, V), p) -> scores``: the smallest set of favourites holding at least ``p`` (the token
    that crosses ``p`` is kept; ``p`` = 1 keeps every token), the rest set to -inf."""
    from ..sampling import top_p_filter

    return _check_filter(fn, top_p_filter, (0.2, 0.5, 0.9, 1.0), "p")


def _write_with(hook, model, tokenizer, n_new: int, seed: int) -> str | None:
    """A new poem written with the learner's hook at temperature 1, or None (said why) if the hook failed."""
    try:
        out = generate(model, torch.tensor([[tokenizer.eos_id]]), n_new, temperature=1.0, logits_hook=hook,
                       generator=torch.Generator().manual_seed(seed))
    except Exception as e:  # the learner's code: say what it raised
        print(f"✗ seed {seed}: generate with your hook raised {type(e).__name__}: {e}")
        return None
    return tokenizer.decode(out.new_tokens[0].tolist())


def check_quatrain_hook(hook, model, tokenizer, chars_per_line: int = 7, seeds=(0, 1, 2)) -> bool:
    """A logits hook for a fixed-format quatrain: ，or 。 exactly after every ``chars_per_line`` characters
    (the last one 。), no punctuation anywhere else. Run with ``generate`` from the poem separator."""
    from ..tokenizer import is_ideograph

    n = 4 * (chars_per_line + 1)
    ends = {(chars_per_line + 1) * i for i in range(1, 5)}
    passed = True
    for seed in seeds:
        poem = _write_with(hook, model, tokenizer, n, seed)
        if poem is None:
            return False
        wrong = [i + 1 for i, ch in enumerate(poem) if (i + 1 in ends) == is_ideograph(ch)]
        if wrong or not poem.endswith("。") or any(poem[i - 1] not in "，。" for i in ends):
            print(f"✗ seed {seed}: 「{poem}」: positions {wrong[:8] or [n]} break the form (punctuation must "
                  f"be ，or 。 at {sorted(ends)} and 。 at {n}, characters everywhere else)")
            passed = False
        else:
            print(f"✓ seed {seed}: 「{poem}」")
    return passed


def check_no_repeat_hook(hook, model, tokenizer, seeds=(0, 1, 2), n_new: int = 40) -> bool:
    """A logits hook that forbids any Chinese character already in the text (punctuation may repeat)."""
    from ..tokenizer import is_ideograph

    passed = True
    for seed in seeds:
        text = _write_with(hook, model, tokenizer, n_new, seed)
        if text is None:
            return False
        chars = [ch for ch in text if is_ideograph(ch)]
        repeats = sorted({ch for ch in chars if chars.count(ch) > 1})
        if repeats:
            print(f"✗ seed {seed}: 「{text}」 repeats {'、'.join(repeats[:8])}")
            passed = False
        else:
            print(f"✓ seed {seed}: {len(chars)} characters, none repeated")
    return passed
