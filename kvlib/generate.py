"""Decoding loops: cached (prefill once, then one token a step) and uncached (recompute every step).

Both return a :class:`GenerationResult`. Batches are left-padded: real tokens sit at the right, a
key mask hides the padding, and positions count real tokens only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .fast import FastDecoder
from .model import GPT
from .sampling import _check_logits, _draw, check_generator, validate_sampling

STOP_REASONS = ("max_new_tokens", "eos", "context_limit")


class ContextLimitError(RuntimeError):
    """Generation needed a position past the model's block size."""


@dataclass
class GenerationResult:
    tokens: torch.Tensor          # (B, T_prompt + n_new), the (left-padded) prompt included
    prompt_lengths: torch.Tensor  # (B,) real prompt tokens per row
    new_tokens: torch.Tensor      # (B, n_new)
    stop_reason: str              # one of STOP_REASONS
    finished: torch.Tensor        # (B,) bool: the row produced eos_id

    def row(self, b: int) -> list[int]:
        """Row ``b`` without its padding: prompt then new tokens."""
        pad = self.tokens.shape[1] - self.new_tokens.shape[1] - int(self.prompt_lengths[b])
        return self.tokens[b, pad:].tolist()


def pad_prompts(prompts: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into idx (B, T) int64 and key_mask (B, T) bool (True = real token)."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: every row needs at least one token")
    T = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.bool)
    for i, p in enumerate(prompts):
        idx[i, T - len(p):] = torch.as_tensor(p, dtype=torch.long)
        mask[i, T - len(p):] = True
    return idx, mask


def position_ids_from_mask(key_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) positions that count real tokens only: padding sits at 0 and is never attended."""
    return (key_mask.long().cumsum(-1) - 1).clamp(min=0)


class CachedDecoder:
    """Runs the teaching model over a :class:`KVCache`; returns the last position's logits (B, V)."""

    def __init__(self, model: GPT, batch_size: int, max_len: int | None = None):
        self.model = model
        self.cache = model.new_cache(batch_size, max_len)

    def __call__(self, idx, key_mask=None, position_ids=None):
        logits, _ = self.model(idx, cache=self.cache, key_mask=key_mask, position_ids=position_ids)
        return logits[:, -1]


# What ``generate(..., decoder=...)`` accepts by name. Both build ``decoder(model, batch_size, max_len)``
# and are then called as ``dec(idx, key_mask=None, position_ids=None) -> (B, V)`` logits of the last
# position, keeping their own cache. "fast" (the default) is the lean path of ``fast.py``; "model" runs
# the teaching model of ``model.py`` with its KVCache, step by step as the notebooks explain it.
DECODERS = {"fast": FastDecoder, "model": CachedDecoder}


def make_decoder(decoder, model: GPT, batch_size: int, max_len: int):
    """Build a decoder from a name in ``DECODERS``, a factory ``(model, batch_size, max_len)``, or None (fast)."""
    if decoder is None:
        decoder = "fast"
    if isinstance(decoder, str):
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {sorted(DECODERS)} or a factory "
                             f"(model, batch_size, max_len) -> decoder, got {decoder!r}")
        decoder = DECODERS[decoder]
    elif not callable(decoder):
        raise TypeError(f"decoder must be a name, a factory or None, got {type(decoder).__name__}")
    return decoder(model, batch_size, max_len)


def _check_prompt(idx, key_mask, max_new_tokens, vocab_size) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
        got = (f"a {idx.dtype} tensor of shape {tuple(idx.shape)}" if isinstance(idx, torch.Tensor)
               else type(idx).__name__)
        raise TypeError(f"idx must be an int64 tensor of shape (B, T); use pad_prompts for a list of prompts; got {got}")
    if idx.shape[0] == 0 or idx.shape[1] == 0:
        raise ValueError(f"idx must hold at least one token in at least one row, got shape {tuple(idx.shape)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if int(idx.min()) < 0 or int(idx.max()) >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got {int(idx.min())}..{int(idx.max())}")
    if key_mask is None:
        return torch.full((idx.shape[0],), idx.shape[1], dtype=torch.long), None
    if key_mask.shape != idx.shape:
        raise ValueError(f"key_mask must have the shape of idx {tuple(idx.shape)}, got {tuple(key_mask.shape)}")
    key_mask = key_mask.bool()
    lengths = key_mask.sum(-1)
    if int(lengths.min()) == 0:
        raise ValueError("every row of key_mask needs at least one real token")
    return lengths, key_mask


def _check_eos(eos_id, vocab_size: int | None) -> None:
    if eos_id is None:
        return
    top = "" if vocab_size is None else f", below the vocabulary size {vocab_size}"
    if isinstance(eos_id, bool) or not isinstance(eos_id, int) or eos_id < 0 or (
            vocab_size is not None and eos_id >= vocab_size):
        raise ValueError(f"eos_id must be None or a token id (an int >= 0{top}), got {eos_id!r}")


def _checked_hook_output(logits, shape) -> torch.Tensor:
    """A logits hook must return finite-or--inf (B, V) logits, like the ones it was given."""
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != tuple(shape):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits_hook must return a tensor of shape (B, V) = {tuple(shape)}, got {got}")
    _check_logits(logits)
    return logits


def _finish(out, T, n, lengths, reason, finished) -> GenerationResult:
    tokens = out[:, : T + n].clone()
    return GenerationResult(tokens, lengths, tokens[:, T:], reason, finished)


@torch.inference_mode()
def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             eos_id: int | None = None, key_mask: torch.Tensor | None = None,
             on_context_limit: str = "stop", logits_hook: Callable | None = None,
             decoder: str | Callable | None = None) -> GenerationResult:
    """Sample up to ``max_new_tokens`` after ``idx`` (B, T), prefilling the cache once.

    The cache holds ``block_size`` positions, so at most ``block_size - T + 1`` new tokens fit (the
    last one is never fed back). Past that: ``stop_reason="context_limit"``, or ContextLimitError
    with ``on_context_limit="raise"``. A row that samples ``eos_id`` is finished and repeats it;
    ``logits_hook(step, tokens, logits) -> logits`` may edit the (B, V) logits before sampling.
    ``decoder`` picks the forward pass: None or "fast" (``fast.FastDecoder``), "model" (the teaching
    model with its KVCache), or a factory ``(model, batch_size, max_len) -> decoder``; a new one is
    built on every call, from the model's weights as they are then.
    """
    temperature, top_k, top_p = validate_sampling(temperature, top_k, top_p)  # once, not per step
    check_generator(generator)
    if on_context_limit not in ("stop", "raise"):
        raise ValueError(f"on_context_limit must be 'stop' or 'raise', got {on_context_limit!r}")
    cfg = model.config
    lengths, key_mask = _check_prompt(idx, key_mask, max_new_tokens, cfg.vocab_size)
    _check_eos(eos_id, cfg.vocab_size)
    B, T = idx.shape
    if T > cfg.block_size:
        raise ContextLimitError(f"the prompt has {T} tokens but the model's block holds {cfg.block_size}; "
                                f"keep the last {cfg.block_size} tokens")
    budget = cfg.block_size - T + 1  # new tokens that fit
    n_max = min(max_new_tokens, budget)
    out = torch.empty(B, T + n_max, dtype=torch.long)
    out[:, :T] = idx
    finished = torch.zeros(B, dtype=torch.bool)
    if n_max == 0:
        return _finish(out, T, 0, lengths, "max_new_tokens", finished)

    dec = make_decoder(decoder, model, B, cfg.block_size)
    if key_mask is None:
        logits = dec(idx)  # (B, V)
        masks = positions = None
    else:
        masks = torch.ones(B, cfg.block_size, dtype=torch.bool)  # preallocated key mask
        masks[:, :T] = key_mask
        logits = dec(idx, masks[:, :T], position_ids_from_mask(key_mask))
        positions = lengths.clone()[:, None]  # (B, 1): the next real position of each row

    n = 0
    while True:
        if logits_hook is not None:
            logits = _checked_hook_output(logits_hook(n, out[:, : T + n], logits), (B, cfg.vocab_size))
        nxt = out[:, T + n: T + n + 1]  # (B, 1): the new token is written straight into the output
        if temperature == 0:
            torch.argmax(logits, dim=-1, keepdim=True, out=nxt)
        else:
            nxt.copy_(_draw(logits, temperature, top_k, top_p, generator))
        if eos_id is not None:
            nxt.masked_fill_(finished[:, None], eos_id)  # finished rows repeat eos_id
            finished |= nxt[:, 0] == eos_id
        n += 1
        if eos_id is not None and bool(finished.all()):
            return _finish(out, T, n, lengths, "eos", finished)
        if n == max_new_tokens:
            return _finish(out, T, n, lengths, "max_new_tokens", finished)
        if n == budget:
            if on_context_limit == "raise":
                raise ContextLimitError(
                    f"{T} prompt tokens + {max_new_tokens} new ones need {T + max_new_tokens} tokens; the "
                    f"block holds {cfg.block_size} positions, so at most {budget} new tokens fit")
            return _finish(out, T, n, lengths, "context_limit", finished)
        if masks is None:
            logits = dec(nxt)
        else:
            logits = dec(nxt, masks[:, : T + n], positions)
            positions += 1


@torch.inference_mode()
def generate_uncached(f: Callable, idx: torch.Tensor, max_new_tokens: int, *, block_size: int,
                      temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                      generator: torch.Generator | None = None, eos_id: int | None = None,
                      logits_hook: Callable | None = None) -> GenerationResult:
    """The recompute loop: every step runs ``f`` on the last ``block_size`` tokens (sliding past it).

    ``f(idx) -> (logits, _)`` may return logits for every position or for the last one only.
    """
    temperature, top_k, top_p = validate_sampling(temperature, top_k, top_p)
    check_generator(generator)
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    lengths, _ = _check_prompt(idx, None, max_new_tokens, 1 << 62)
    _check_eos(eos_id, None)
    B, T = idx.shape
    out = torch.empty(B, T + max_new_tokens, dtype=torch.long)
    out[:, :T] = idx
    finished = torch.zeros(B, dtype=torch.bool)
    for n in range(max_new_tokens):
        logits = f(out[:, max(0, T + n - block_size): T + n])[0][:, -1]  # (B, V)
        if logits_hook is not None:
            logits = logits_hook(n, out[:, : T + n], logits)
        _check_logits(logits)  # f is any callable: its logits are checked every step
        nxt = out[:, T + n: T + n + 1]
        nxt.copy_(_draw(logits, temperature, top_k, top_p, generator))
        if eos_id is not None:
            nxt.masked_fill_(finished[:, None], eos_id)
            finished |= nxt[:, 0] == eos_id
        if eos_id is not None and bool(finished.all()):
            return _finish(out, T, n + 1, lengths, "eos", finished)
    return _finish(out, T, max_new_tokens, lengths, "max_new_tokens", finished)
