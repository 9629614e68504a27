"""Poems in, poems out: prompts, the next character, writing, and counting forms and followers in the corpus.

Every prompt starts with the poem separator, as every poem did in training, so the model knows a
poem begins. Generation stops at the next separator. Text written for people never holds ``<unk>``:
that token stands for the corpus's rarest characters, whichever they were, so it is data, not
writing; :func:`no_unk` bans it, and every helper here that writes text uses it.
"""
from __future__ import annotations

import re

import torch

from .checks import check_int, check_seed, check_text
from .tokenizer import check_pair, check_tokenizer, decode_complete, is_ideograph, token_label
from .cache import ContextLimitError
from .decoding import GenerationResult, generate, pad_prompts
from .sampling import ban, probabilities, token_mask


def unk_ids(tokenizer) -> list[int]:
    """The ids that written text never shows: the character tokenizer's ``<unk>`` (BPE has none)."""
    unk = getattr(tokenizer, "unk_id", None)
    return [] if unk is None else [int(unk)]


def without_unk(tokenizer, logits: torch.Tensor) -> torch.Tensor:
    """(B, V) logits with ``<unk>``'s score set to -inf, so that no sampler can pick it."""
    banned = unk_ids(tokenizer)
    return ban(logits, token_mask(banned, logits.shape[-1])) if banned else logits


def no_unk(tokenizer, then=None):
    """A logits hook for ``generate``: ``<unk>`` banned at every step, then ``then(step, tokens, logits)``.

    ``generate`` itself stays general (it samples whatever the model scores); the helpers that write
    text for people (``write``, ``acrostic``, the widgets, ``python -m kvlib generate``) pass this hook.
    """
    def hook(step, tokens, logits):
        logits = without_unk(tokenizer, logits)
        return logits if then is None else then(step, tokens, logits)
    return hook


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The separator, then ``text`` (an error names any character outside the vocabulary)."""
    check_tokenizer(tokenizer)
    check_text(text)
    return [tokenizer.eos_id, *tokenizer.encode(text)]


@torch.inference_mode()
def next_token_probs(model, tokenizer, text: str, temperature: float = 1.0, opening: bool = True) -> torch.Tensor:
    """(V,) probabilities of the token after ``text``.

    ``opening=True`` reads ``text`` as the start of a poem (after the separator); ``False`` reads
    it as a piece from anywhere in a poem, like the corpus counts of what follows it.
    """
    check_pair(model, tokenizer)
    ids = encode_prompt(tokenizer, text) if opening else tokenizer.encode(text)
    if not ids:
        raise ValueError("text must hold at least one character when opening=False")
    idx = torch.tensor([ids])
    logits, _ = model(idx[:, -model.config.block_size:])
    return probabilities(logits[:, -1], temperature)[0]


def top_next(model, tokenizer, text: str, k: int = 8, opening: bool = True) -> list[tuple[str, float]]:
    """The ``k`` most likely next tokens after ``text`` as (label, probability), most likely first: a token's text,
    or its bytes in hex where they are not whole characters (:func:`kvlib.tokenizer.token_label`)."""
    probs = next_token_probs(model, tokenizer, text, opening=opening)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(probs):
        raise ValueError(f"k must be an int in [1, {len(probs)}] (the vocabulary size), got {k!r}")
    values, ids = probs.topk(k)
    return [(token_label(tokenizer, i), float(p)) for p, i in zip(values, ids.tolist())]


def rank_of(model, tokenizer, text: str, char: str, opening: bool = True) -> tuple[int, float]:
    """(1-based rank, probability) of ``char`` as the next character after ``text``."""
    check_text(char, "char")
    ids = tokenizer.encode(char)
    if len(ids) != 1:
        raise ValueError(f"char must be exactly one token (one character for tang-char), got {char!r} "
                         f"({len(ids)} tokens)")
    probs = next_token_probs(model, tokenizer, text, opening=opening)
    (i,) = ids
    return int((probs > probs[i]).sum()) + 1, float(probs[i])


def write(model, tokenizer, prompts: str | list[str] = "", max_new_tokens: int | None = None, *,
          temperature: float = 0.8, top_k: int | None = None, top_p: float | None = None,
          seed: int | None = 1337, generator: torch.Generator | None = None,
          n: int = 1) -> list[str]:
    """Continue each prompt (``n`` samples of a single prompt) until the separator; prompt included.

    Prompts of a list are padded to the longest: ``max_new_tokens`` must fit the model's block after it
    (ContextLimitError says how many do); None writes as many as fit.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (poems per prompt) must be an int >= 1, got {n!r}")
    if isinstance(prompts, str):
        texts = [prompts] * n
    elif isinstance(prompts, (list, tuple)) and all(isinstance(t, str) for t in prompts):
        texts = list(prompts)
    else:
        raise TypeError(f"prompts must be a str or a list of str, got {prompts!r:.60}")
    result = write_ids(model, tokenizer, texts, max_new_tokens, temperature=temperature, top_k=top_k,
                       top_p=top_p, seed=seed, generator=generator, on_context_limit="raise")
    return [text + completion(tokenizer, result, b) for b, text in enumerate(texts)]


def write_ids(model, tokenizer, texts: list[str], max_new_tokens: int | None = None, *, temperature=0.8,
              top_k=None, top_p=None, seed=1337, generator=None, **kwargs) -> GenerationResult:
    """``generate`` on a left-padded batch of text prompts, stopping at the separator, never writing ``<unk>``.

    A ``logits_hook`` in ``kwargs`` runs after the ban.
    """
    check_pair(model, tokenizer)
    if generator is None and seed is not None:
        generator = torch.Generator().manual_seed(check_seed(seed))
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise TypeError(f"texts must be a list of str, got {texts!r:.60}")
    if not texts:
        raise ValueError("texts must hold at least one prompt, got an empty list")
    for i, t in enumerate(texts):
        check_text(t, f"texts[{i}]")
    idx, mask = pad_prompts([encode_prompt(tokenizer, t) for t in texts], tokenizer.eos_id)
    block = model.config.block_size
    if idx.shape[1] > block:
        longest = max(texts, key=len)
        raise ContextLimitError(
            f"the prompt {longest[:12]!r}... is {idx.shape[1] - 1} tokens long; at most {block - 1} fit "
            f"the model's block of {block} (the poem separator takes one)")
    room = block - idx.shape[1] + 1  # new tokens that fit after the padded prompts
    if max_new_tokens is None:
        max_new_tokens = room
    elif kwargs.get("on_context_limit") == "raise" and type(max_new_tokens) is int and max_new_tokens > room:
        raise ContextLimitError.block_full(idx.shape[1], max_new_tokens, block)  # before writing anything
    kwargs["logits_hook"] = no_unk(tokenizer, kwargs.get("logits_hook"))
    return generate(model, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                    generator=generator, eos_id=tokenizer.eos_id,
                    key_mask=None if bool(mask.all()) else mask, **kwargs)


def completion(tokenizer, result: GenerationResult, b: int = 0) -> str:
    """The new text of row ``b``, without the closing separator (nor a character the token budget cut off)."""
    check_int("b", b, 0, result.new_tokens.shape[0] - 1)
    ids = result.new_tokens[b].tolist()
    if tokenizer.eos_id in ids:
        ids = ids[: ids.index(tokenizer.eos_id)]
    return decode_complete(tokenizer, ids)


def line_lengths(poem: str) -> list[int]:
    """Characters per line, lines being the runs of ideographs between punctuation marks."""
    check_text(poem, "poem")
    return [len(run) for run in re.split(r"[^\w]|[\d_A-Za-z]", poem) if run and all(map(is_ideograph, run))]


def format_score(poems: list[str]) -> float:
    """Share of lines with 5 or 7 characters, over all lines of ``poems``."""
    if isinstance(poems, str) or not isinstance(poems, (list, tuple)) or not all(isinstance(p, str) for p in poems):
        raise TypeError(f"poems must be a list of str, got {poems!r:.60}")
    lengths = [n for p in poems for n in line_lengths(p)]
    return sum(n in (5, 7) for n in lengths) / max(1, len(lengths))


def count_followers(poems: list[str], prefix: str) -> dict[str, int]:
    """How often each character follows ``prefix`` in ``poems`` (a poem's end counts as a newline)."""
    if not check_text(prefix, "prefix"):
        raise ValueError("prefix must hold at least one character, got ''")
    if isinstance(poems, str) or not isinstance(poems, (list, tuple)) or not all(isinstance(p, str) for p in poems):
        raise TypeError(f"poems must be a list of str, got {poems!r:.60}")
    counts: dict[str, int] = {}
    for poem in poems:
        start = poem.find(prefix)
        while start != -1:
            nxt = start + len(prefix)
            ch = poem[nxt] if nxt < len(poem) else "\n"
            counts[ch] = counts.get(ch, 0) + 1
            start = poem.find(prefix, start + 1)
    return counts
