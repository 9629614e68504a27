"""Request traces drawn from the corpus: who asks the server what, and when (notebook 7, ``serve``).

``make_trace`` takes poem openings of varied length arriving as a Poisson process; ``class_trace``
a classroom continuing one couplet, each student with a line of their own (prefix caching's case).
"""
from __future__ import annotations

import random
from collections import Counter

from ..checks import check_int, check_list, check_real, check_seed, check_text
from ..tokenizer import check_tokenizer, is_ideograph
from ..serving import Request
from ..poems import encode_prompt

MAX_REQUESTS = 100_000  # a trace longer than this is a typo, not a classroom
MIN_RATE, MAX_RATE = 0.01, 100_000.0  # arrivals per second: slower is no trace, faster is all at once


def _check_poems(poems) -> list[str]:
    poems = check_list("poems", poems, str, "poems (str)")
    for i, p in enumerate(poems):
        check_text(p, f"poems[{i}]")
    return poems


def is_plain_verse(poem: str) -> bool:
    """Only characters and the two punctuation marks of a regular poem (no editors' brackets or notes)."""
    return all(is_ideograph(ch) or ch in "，。" for ch in poem)


def make_trace(tokenizer, poems: list[str], n_requests: int = 32, rate: float = 100.0, seed: int = 0, *,
               prompt_chars: tuple[int, int] = (4, 24), max_new_tokens: int = 96,
               block_size: int = 128) -> list[Request]:
    """A seeded trace: ``n_requests`` poem openings of varied length, arriving at ``rate`` per second.

    Each request takes a random poem, the first 4-24 of its characters as the prompt, and the rest of
    that poem's length (at most ``max_new_tokens``) as its answer length; gaps between arrivals are
    exponential with mean ``1 / rate`` (a Poisson process), drawn from ``random.Random(seed)``.
    The longest prompt (separator included) plus ``max_new_tokens`` must fit the model's ``block_size``,
    so that even a left-padded static batch holds every request.
    """
    check_tokenizer(tokenizer)
    poems = _check_poems(poems)
    n_requests = check_int("n_requests", n_requests, 1, MAX_REQUESTS)
    rate = check_real("rate", rate, MIN_RATE, MAX_RATE,
                      allowed=f"a number of requests per second in [{MIN_RATE:g}, {MAX_RATE:g}]")
    seed = check_seed(seed)
    if (not isinstance(prompt_chars, tuple) or len(prompt_chars) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in prompt_chars)):
        raise TypeError(f"prompt_chars must be a pair of ints (shortest, longest), got {prompt_chars!r:.60}")
    if not 1 <= prompt_chars[0] <= prompt_chars[1]:
        raise ValueError(f"prompt_chars must be a pair of ints (shortest, longest) with 1 <= shortest <= longest, "
                         f"got {prompt_chars!r}")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    block_size = check_int("block_size", block_size, 2)
    if prompt_chars[1] + 1 + max_new_tokens > block_size:
        raise ValueError(f"prompt_chars allows prompts of up to {prompt_chars[1]} characters (+ the separator) and max_new_tokens="
                         f"{max_new_tokens} need {prompt_chars[1] + 1 + max_new_tokens} positions; the block holds "
                         f"{block_size}")
    lo, hi = prompt_chars
    if not any(len(p) >= lo + 4 and is_plain_verse(p) and not tokenizer.unknown(p) for p in poems):
        raise ValueError(f"poems must hold at least one poem of {lo + 4} or more characters, only characters "
                         f"and ，。, all in the tokenizer's vocabulary; none of the {len(poems)} given does")
    rng, t, trace = random.Random(seed), 0.0, []
    while len(trace) < n_requests:
        poem = poems[rng.randrange(len(poems))]
        if len(poem) < lo + 4 or not is_plain_verse(poem) or tokenizer.unknown(poem):
            continue
        k = rng.randint(lo, min(hi, len(poem) - 4))
        prompt = encode_prompt(tokenizer, poem[:k])
        trace.append(Request(len(trace), prompt, min(len(poem) - k, max_new_tokens), round(t, 6)))
        t += rng.expovariate(rate)
    return trace


def class_trace(tokenizer, poems: list[str], prefix: str = "床前明月光，疑是地上霜。", n_requests: int = 30,
                answer_tokens: int = 11, gap: float = 0.01) -> list[Request]:
    """A class of ``n_requests`` students continuing one opening couplet, each with a line of their own.

    Student ``i`` arrives ``i * gap`` seconds in and starts the third line with one of the characters
    Tang poets most often put there (the 13th character of the corpus's five-character poems), so the
    prompts share ``prefix`` and differ after it. The class is smaller than ``n_requests`` when the
    poems offer fewer such characters (at least one is needed).
    """
    check_tokenizer(tokenizer)
    poems = _check_poems(poems)
    check_text(prefix, "prefix")
    n_requests = check_int("n_requests", n_requests, 1, MAX_REQUESTS)
    answer_tokens = check_int("answer_tokens", answer_tokens, 1)
    gap = check_real("gap", gap, 0, allowed="a finite number of seconds >= 0")
    counts = Counter(p[12] for p in poems if len(p) >= 24 and p[5] == "，" and p[11] == "。" and is_plain_verse(p[12])
                     and not tokenizer.unknown(p[12]))
    starts = [ch for ch, _ in counts.most_common(n_requests)]
    if not starts:
        raise ValueError(f"poems must hold at least one five-character poem (24 or more characters) whose third "
                         f"line starts with a character of the vocabulary; none of the {len(poems)} given does")
    return [Request(i, encode_prompt(tokenizer, prefix + c), answer_tokens, round(i * gap, 6))
            for i, c in enumerate(starts)]
