"""Input checks at the public edges, kept apart so that the functions learners read hold only the idea.

Every check is named ``check_<what>``, raises one exception whose message names the parameter, the
value received and what is allowed, and returns the value in the form the caller goes on with.
Deeper code trusts what passed here.
"""
from __future__ import annotations

import math
import numbers

import torch


class ContextLimitError(ValueError):
    """More positions than the model's block (or a cache) holds: crop the input or ask for fewer tokens."""


# ---- numbers -----------------------------------------------------------------------------------

def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None,
              allowed: str | None = None) -> int:
    """An int (not a bool) in ``[minimum, maximum]``; ``allowed`` words the rule for the message."""
    if allowed is None:
        if minimum is not None and maximum is not None:
            allowed = f"an int in [{minimum}, {maximum}]"
        elif minimum == 1:
            allowed = "a positive int"
        elif minimum is not None:
            allowed = f"an int >= {minimum}"
        else:
            allowed = "an int" if maximum is None else f"an int <= {maximum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number >= 0, got {temperature!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 means argmax), got {temperature!r}")
    return float(temperature)


def check_top_k(k) -> int | None:
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"top_k must be an int >= 1 (or None for no top-k), got {k!r}")
    if k < 1:
        raise ValueError(f"top_k must be an int >= 1 (or None for no top-k), got {k!r}")
    return int(k)


def check_top_p(p) -> float | None:
    if p is None:
        return None
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"top_p must be a number in (0, 1] (or None for no top-p), got {p!r}")
    if not 0 < p <= 1:                                                     # also rejects NaN
        raise ValueError(f"top_p must be in (0, 1] (or None for no top-p), got {p!r}")
    return float(p)


def check_sampling(temperature=1.0, top_k=None, top_p=None) -> tuple[float, int | None, float | None]:
    """Sampling settings as plain Python numbers, checked once before a decoding loop starts."""
    return check_temperature(temperature), check_top_k(top_k), check_top_p(top_p)


def check_generator(generator) -> torch.Generator | None:
    """A sampling loop draws from ``generator`` (a ``torch.Generator``), or from the global RNG if None."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return generator


# ---- tensors -----------------------------------------------------------------------------------

def check_logits(logits, name: str = "logits") -> torch.Tensor:
    """A floating (B, V) tensor with no NaN, no +inf, and at least one finite entry per row."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, V), got {type(logits).__name__}")
    if logits.dim() != 2:
        hint = " (for a single row use logits[None, :])" if logits.dim() == 1 else ""
        raise ValueError(f"{name} must have shape (B, V), got shape {tuple(logits.shape)}{hint}")
    if logits.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one vocabulary entry, got V = 0")
    if not logits.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {logits.dtype}")
    # One boolean per row, then a single check: a -inf entry (a banned token) is fine,
    # but NaN, +inf, or a row with nothing left to sample cannot be turned into probabilities.
    bad_rows = logits.isnan().any(-1) | logits.isposinf().any(-1) | logits.isneginf().all(-1)  # (B,)
    if bad_rows.any():
        row = int(bad_rows.nonzero()[0, 0])
        raise ValueError(f"{name} row {row} cannot be sampled: it contains NaN or +inf, or every "
                         f"entry is -inf; allowed are finite values and -inf for banned tokens")
    return logits


def _describe(x) -> str:
    return f"a {x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def check_forward_inputs(config, idx, cache, key_mask, position_ids, targets, last_only) -> None:
    """What ``GPT.forward`` needs: token ids (B, T), room in the cache and the block, matching masks."""
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.long, torch.int):
        raise TypeError(f"idx must be an integer tensor of token ids with shape (B, T), got {_describe(idx)}")
    B, T = idx.shape
    start = cache.length if cache is not None else 0
    S = start + T
    if cache is not None and S > cache.max_len:
        raise ContextLimitError(
            f"{T} new token(s) after {start} cached ones need {S} positions; the cache holds {cache.max_len}")
    if position_ids is None and S > config.block_size:
        raise ContextLimitError(
            f"position {S - 1} is past the block size {config.block_size}: crop the input "
            f"to the last {config.block_size} tokens")
    if position_ids is not None and position_ids.numel() and int(position_ids.max()) >= config.block_size:
        raise ContextLimitError(
            f"position id {int(position_ids.max())} is past the block size {config.block_size}")
    if key_mask is not None and key_mask.shape != (B, S):
        raise ValueError(f"key_mask must have shape (B, cached + new) = {(B, S)}, got {tuple(key_mask.shape)}")
    if targets is not None and last_only:
        raise ValueError("targets need the logits of every position: pass last_only=False to compute a loss")


def check_eos(eos_id, vocab_size: int | None) -> int | None:
    if eos_id is None:
        return None
    top = "" if vocab_size is None else f", below the vocabulary size {vocab_size}"
    if isinstance(eos_id, bool) or not isinstance(eos_id, int) or eos_id < 0 or (
            vocab_size is not None and eos_id >= vocab_size):
        raise ValueError(f"eos_id must be None or a token id (an int >= 0{top}), got {eos_id!r}")
    return eos_id


def check_prompt(idx, key_mask, max_new_tokens, vocab_size: int | None) -> torch.Tensor | None:
    """Token ids (B, T) int64 in the vocabulary, and an optional key mask of the same shape; returns the mask as bool."""
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
        raise TypeError(f"idx must be an int64 tensor of shape (B, T); use pad_prompts for a list of prompts; "
                        f"got {_describe(idx)}")
    if idx.shape[0] == 0 or idx.shape[1] == 0:
        raise ValueError(f"idx must hold at least one token in at least one row, got shape {tuple(idx.shape)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if int(idx.min()) < 0 or (vocab_size is not None and int(idx.max()) >= vocab_size):
        top = "" if vocab_size is None else f", {vocab_size}"
        raise ValueError(f"token ids must lie in [0{top}), got {int(idx.min())}..{int(idx.max())}")
    if key_mask is None:
        return None
    if not isinstance(key_mask, torch.Tensor) or key_mask.shape != idx.shape:
        got = tuple(key_mask.shape) if isinstance(key_mask, torch.Tensor) else type(key_mask).__name__
        raise ValueError(f"key_mask must have the shape of idx {tuple(idx.shape)}, got {got}")
    key_mask = key_mask.bool()
    if int(key_mask.sum(-1).min()) == 0:
        raise ValueError("every row of key_mask needs at least one real token")
    return key_mask


def check_generate_inputs(model, idx, max_new_tokens, key_mask, eos_id, on_context_limit, generator,
                          temperature, top_k, top_p) -> tuple[torch.Tensor | None, tuple]:
    """Everything ``generate`` is given, checked once; returns (key_mask as bool, sampling settings)."""
    sampling = check_sampling(temperature, top_k, top_p)
    check_generator(generator)
    if on_context_limit not in ("stop", "raise"):
        raise ValueError(f"on_context_limit must be 'stop' or 'raise', got {on_context_limit!r}")
    cfg = model.config
    key_mask = check_prompt(idx, key_mask, max_new_tokens, cfg.vocab_size)
    check_eos(eos_id, cfg.vocab_size)
    if idx.shape[1] > cfg.block_size:
        raise ContextLimitError(f"the prompt has {idx.shape[1]} tokens but the model's block holds "
                                f"{cfg.block_size}; keep the last {cfg.block_size} tokens")
    return key_mask, sampling


def check_hook_output(logits, shape) -> torch.Tensor:
    """A logits hook must return finite-or--inf (B, V) logits, like the ones it was given."""
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != tuple(shape):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits_hook must return a tensor of shape (B, V) = {tuple(shape)}, got {got}")
    return check_logits(logits)
