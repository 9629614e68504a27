"""Constrained decoding: a per-position rule set to -inf every token it forbids.

A *schedule* says, for each new position, which tokens are allowed: one forced token (an acrostic's
head, the punctuation the program adds) or "anything but punctuation". The same ``generate`` loop
runs it through ``logits_hook``; the model only ever chooses among allowed tokens.
"""
from __future__ import annotations

import torch

from .checks import check_choice, check_int, check_text
from .tokenizer import UnknownCharacterError, check_pair, check_tokenizer, is_ideograph
from .decoding import generate
from .poems import no_unk
from .sampling import ban, only  # noqa: F401  (the filters constrained decoding is made of)

# ---- input checks of this module ------------------------------------------------------------

LINE_ENDS = "，。"


def punctuation_mask(tokenizer) -> torch.Tensor:
    """(V,) bool: True for every token that is not an ideograph, the poem separator included."""
    check_tokenizer(tokenizer)
    mask = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    mask[tokenizer.punctuation_ids] = True
    return mask


def schedule_hook(schedule: list[torch.Tensor]):
    """A logits hook allowing only ``schedule[step]`` (a (V,) bool mask) at each step."""
    def hook(step, tokens, logits):
        if step >= len(schedule):
            raise ValueError(f"step {step} is past the schedule's {len(schedule)} positions: ask generate for at "
                             f"most {len(schedule)} new tokens")
        return only(logits, schedule[step])
    return hook


def _one_hot(tokenizer, ch: str) -> torch.Tensor:
    m = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    m[tokenizer.encode(ch)] = True
    return m


def max_lines(block_size: int, chars_per_line: int) -> int:
    """Lines that fit the block after the poem-start token: each is its characters plus one mark."""
    check_int("block_size", block_size, 1)
    check_int("chars_per_line", chars_per_line, 1)
    return block_size // (chars_per_line + 1)


def _write_to_schedule(model, tokenizer, schedule, chars_per_line: int, **sampling) -> str:
    """A poem that follows ``schedule`` (one mask of allowed tokens per position), decoded to text."""
    check_pair(model, tokenizer)
    lines = len(schedule) // (chars_per_line + 1)
    room = max_lines(model.config.block_size, chars_per_line)
    if lines > room:
        raise ValueError(f"{lines} lines do not fit: the poem needs {len(schedule)} tokens but the model reads at "
                         f"most {model.config.block_size}, room for {room} lines of {chars_per_line} characters: "
                         f"use fewer or shorter lines")
    start = torch.tensor([[tokenizer.eos_id]])
    out = generate(model, start, len(schedule), logits_hook=no_unk(tokenizer, schedule_hook(schedule)), **sampling)
    return tokenizer.decode(out.new_tokens[0])


def acrostic_schedule(tokenizer, heads: str, chars_per_line: int = 7) -> list[torch.Tensor]:
    """Head forced, then ``chars_per_line - 1`` non-punctuation tokens, then ， and 。 alternately."""
    if not isinstance(heads, str) or not heads:
        raise ValueError(f"heads must be a non-empty string of Chinese characters, e.g. '春眠不觉', got {heads!r}")
    check_text(heads, "heads")
    check_tokenizer(tokenizer)
    check_choice("chars_per_line", chars_per_line, (5, 7))
    if tokenizer.kind != "char":
        raise ValueError(f"acrostics need the character model (tang-char): one token per character; "
                         f"got a {tokenizer.kind!r} tokenizer")
    missing = tokenizer.unknown(heads)
    if missing:
        raise UnknownCharacterError(missing)
    not_ideographs = [ch for ch in heads if not is_ideograph(ch)]
    if not_ideographs:
        raise ValueError(f"acrostic heads must be Chinese characters; got {''.join(not_ideographs)!r}")
    free = ~punctuation_mask(tokenizer)
    schedule = []
    for i, head in enumerate(heads):
        schedule.append(_one_hot(tokenizer, head))
        schedule += [free] * (chars_per_line - 1)
        schedule.append(_one_hot(tokenizer, LINE_ENDS[i % 2]))
    return schedule


def acrostic(model, tokenizer, heads: str, chars_per_line: int = 7, *, temperature: float = 0.8,
             top_k: int | None = None, top_p: float | None = None, generator=None) -> str:
    """A poem whose lines start with the characters of ``heads``; the program adds ，/。."""
    schedule = acrostic_schedule(tokenizer, heads, chars_per_line)
    return _write_to_schedule(model, tokenizer, schedule, chars_per_line, temperature=temperature, top_k=top_k, top_p=top_p,
                generator=generator)


def quatrain_schedule(tokenizer, chars_per_line: int = 7, lines: int = 4) -> list[torch.Tensor]:
    """Punctuation exactly after every line (the 8th, 16th, 24th, 32nd tokens), nowhere else.

    The model chooses ， or 。 at line ends (the last one must be 。) and any ideograph elsewhere.
    """
    check_choice("chars_per_line", chars_per_line, (5, 7))
    lines = check_int("lines", lines, 1)
    check_tokenizer(tokenizer)
    if tokenizer.kind != "char":
        raise ValueError(f"quatrains need the character model (tang-char): one token per character; "
                         f"got a {tokenizer.kind!r} tokenizer")
    free = ~punctuation_mask(tokenizer)
    ends = _one_hot(tokenizer, "，") | _one_hot(tokenizer, "。")
    schedule = []
    for i in range(lines):
        schedule += [free] * chars_per_line
        schedule.append(ends if i < lines - 1 else _one_hot(tokenizer, "。"))
    return schedule


def quatrain(model, tokenizer, chars_per_line: int = 7, *, temperature: float = 0.8,
             top_k: int | None = None, top_p: float | None = None, generator=None) -> str:
    """A fixed-format quatrain: four lines of ``chars_per_line`` characters, punctuation only at line ends."""
    schedule = quatrain_schedule(tokenizer, chars_per_line)
    return _write_to_schedule(model, tokenizer, schedule, chars_per_line, temperature=temperature, top_k=top_k, top_p=top_p,
                generator=generator)


# ---- checking a poem against the form ---------------------------------------------------------

def poem_lines(poem: str) -> list[tuple[str, str]]:
    """Split a poem into (line, closing mark) pairs at ， and 。."""
    check_text(poem, "poem")
    lines, current = [], ""
    for ch in poem:
        if ch in LINE_ENDS:
            lines.append((current, ch))
            current = ""
        else:
            current += ch
    if current:
        lines.append((current, ""))
    return lines


def acrostic_report(poem: str, heads: str, chars_per_line: int) -> list[str]:
    """One line of text per poem line: its head, its length and its mark, each checked."""
    check_text(heads, "heads")
    check_int("chars_per_line", chars_per_line, 1)
    out = []
    lines = poem_lines(poem)
    for i, (line, mark) in enumerate(lines):
        head = heads[i] if i < len(heads) else "?"
        good = line[:1] == head and len(line) == chars_per_line and mark == LINE_ENDS[i % 2]
        out.append(f"line {i + 1}: starts with {line[:1]} (asked {head}), {len(line)} characters, "
                   f"ends with {mark or 'nothing'} {'✓' if good else '✗'}")
    if len(lines) != len(heads):
        out.append(f"{len(lines)} lines for {len(heads)} heads ✗")
    return out


def is_acrostic(poem: str, heads: str, chars_per_line: int) -> bool:
    """Every line starts with its head, has ``chars_per_line`` characters and ends with ，/。 in turn."""
    check_text(heads, "heads")
    check_int("chars_per_line", chars_per_line, 1)
    lines = poem_lines(poem)
    return len(lines) == len(heads) and all(
        line[:1] == head and len(line) == chars_per_line and mark == LINE_ENDS[i % 2]
        for i, ((line, mark), head) in enumerate(zip(lines, heads)))
