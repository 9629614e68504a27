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
