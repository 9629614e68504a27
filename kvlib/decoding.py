"""Decoding loops: cached (prefill once, then one token a step) and uncached (recompute every step).

Both return a :class:`GenerationResult`. Batches are left-padded: real tokens sit at the right, a
key mask hides the padding, and positions count real tokens only.
"""
from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass
from typing import Callable

import torch

from .checks import check_int, check_model, describe
from .sampling import Sampling, check_generator, check_logits, sample_next
from .cache import Cache, ContextLimitError, check_cache_made_for
from .fast import FastDecoder
from .model import GPT, check_gpt
from .weights import check_weights

# ---- input checks of this module ------------------------------------------------------------

MAX_NEW_TOKENS = 1_000_000  # a run's length at most: the recompute loop slides past the block, so only this bounds it

def check_generate_inputs(model, idx, max_new_tokens, *, temperature, top_k, top_p, generator, eos_id, key_mask,
                          on_context_limit) -> tuple[torch.Tensor | None, tuple]:
    """Everything ``generate`` is given, checked once; returns (key_mask as bool, sampling settings)."""
    check_model(model)
    sampling = Sampling(temperature, top_k, top_p)
    check_generator(generator)
    if on_context_limit not in ("stop", "raise"):
        raise ValueError(f"on_context_limit must be 'stop' or 'raise', got {on_context_limit!r}")
    cfg = model.config
    key_mask = check_prompt(idx, key_mask, max_new_tokens, cfg.vocab_size)
    check_eos(eos_id, cfg.vocab_size)
    check_weights(model)
    if idx.shape[1] > cfg.block_size:
        raise ContextLimitError(f"idx: the prompt has {idx.shape[1]} tokens but the model's block holds "
                                f"{cfg.block_size}; keep the last {cfg.block_size} tokens")
    return key_mask, sampling


def check_token_lists(prompts, pad_id) -> list[list[int]]:
    """A non-empty list of non-empty token-id lists (ints >= 0), and a pad id (an int >= 0)."""
    check_int("pad_id", pad_id, 0)
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, (list, tuple)) or not prompts:
        got = describe(prompts) if isinstance(prompts, torch.Tensor) else f"{prompts!r:.60}"
        raise (ValueError if isinstance(prompts, (list, tuple)) else TypeError)(
            f"prompts must be a non-empty list of token-id lists, got {got}")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, torch.Tensor):
            if p.dim() != 1 or p.is_floating_point() or p.dtype == torch.bool:
                raise TypeError(f"prompt {i} must be a list of int token ids (or a 1-D integer tensor), "
                                f"got {describe(p)}")
            p = p.tolist()
        if isinstance(p, (str, bytes)) or not isinstance(p, (list, tuple)):
            raise TypeError(f"prompt {i} must be a list of int token ids, got {p!r:.60}")
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: every row needs at least one token")
        for j, t in enumerate(p):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise TypeError(f"prompt {i}, token {j} must be an int token id, got {t!r}")
            if t < 0 or t >= 2**63:
                raise ValueError(f"prompt {i}, token {j} must be a token id (an int >= 0), got {t!r}")
        out.append([int(t) for t in p])
    return out


def check_prompt(idx, key_mask, max_new_tokens, vocab_size: int | None) -> torch.Tensor | None:
    """Token ids (B, T) int64 in the vocabulary, and an optional key mask of the same shape; returns the mask as bool."""
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
        raise TypeError(f"idx must be an int64 tensor of shape (B, T); use pad_prompts for a list of prompts; "
                        f"got {describe(idx)}")
    if idx.shape[0] == 0 or idx.shape[1] == 0:
        raise ValueError(f"idx must hold at least one token in at least one row, got shape {tuple(idx.shape)}")
    check_int("max_new_tokens", max_new_tokens, 0, MAX_NEW_TOKENS,
              f"an int in [0, {MAX_NEW_TOKENS:,}] (each new token takes room in the output)")
    if int(idx.min()) < 0 or (vocab_size is not None and int(idx.max()) >= vocab_size):
        top = "" if vocab_size is None else f", {vocab_size}"
        hint = "" if vocab_size is None else " (the model's vocabulary: were the ids made by another model's tokenizer?)"
        allowed = f"ids in [0{top})" if top else "ids >= 0"
        raise ValueError(f"idx holds token ids {int(idx.min())}..{int(idx.max())}; allowed are {allowed}{hint}")
    if key_mask is None:
        return None
    if isinstance(key_mask, torch.Tensor) and key_mask.shape != idx.shape:
        raise ValueError(f"key_mask must have the shape of idx {tuple(idx.shape)}, got {tuple(key_mask.shape)}")
    key_mask = check_key_mask(key_mask).bool()
    if int(key_mask.sum(-1).min()) == 0:
        raise ValueError("every row of key_mask needs at least one real token")
    # Left padding: in each row the padding (False) comes first, then only real tokens (True).
    bad = (key_mask[:, :-1] & ~key_mask[:, 1:]).any(-1)                  # a real token followed by padding
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"key_mask row {row} is {key_mask[row].int().tolist()!r:.80}: padding after a real "
                         f"token (right padding); the decoding loop reads each row's last column, so pad on "
                         f"the left (pad_prompts does)")
    return key_mask


def check_eos(eos_id, vocab_size: int | None) -> int | None:
    if eos_id is None:
        return None
    top = "" if vocab_size is None else f", below the vocabulary size {vocab_size}"
    if isinstance(eos_id, bool) or not isinstance(eos_id, int) or eos_id < 0 or (
            vocab_size is not None and eos_id >= vocab_size):
        raise ValueError(f"eos_id must be None or a token id (an int >= 0{top}), got {eos_id!r}")
    return eos_id


def check_step_logits(logits, batch: int) -> torch.Tensor:
    """The recompute loop's logits for one step: (B, V) with one row per prompt, as ``check_logits``."""
    if isinstance(logits, torch.Tensor) and logits.dim() == 2 and logits.shape[0] != batch:
        raise ValueError(f"f (or logits_hook) must give (B, V) logits with B = {batch} rows, one per prompt, "
                         f"got shape {tuple(logits.shape)}")
    return check_logits(logits)


def check_hook_output(logits, shape) -> torch.Tensor:
    """A logits hook must return finite-or--inf (B, V) logits, like the ones it was given."""
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != tuple(shape):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits_hook must return a tensor of shape (B, V) = {tuple(shape)}, got {got}")
    return check_logits(logits)


STOP_REASONS = ("max_new_tokens", "eos", "context_limit")


@dataclass
class GenerationResult:
    tokens: torch.Tensor          # (B, T_prompt + n_new), the (left-padded) prompt included
    prompt_lengths: torch.Tensor  # (B,) real prompt tokens per row
    new_tokens: torch.Tensor      # (B, n_new)
    stop_reason: str              # one of STOP_REASONS
    finished: torch.Tensor        # (B,) bool: the row produced eos_id

    def row(self, b: int) -> list[int]:
        """Row ``b`` without its padding: prompt then new tokens."""
        b = check_int("b", b, 0, self.tokens.shape[0] - 1)
        pad = self.tokens.shape[1] - self.new_tokens.shape[1] - int(self.prompt_lengths[b])
        return self.tokens[b, pad:].tolist()


def pad_prompts(prompts: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into idx (B, T) int64 and key_mask (B, T) bool (True = real token)."""
    prompts = check_token_lists(prompts, pad_id)
    T = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.bool)
    for i, p in enumerate(prompts):
        idx[i, T - len(p):] = torch.as_tensor(p, dtype=torch.long)
        mask[i, T - len(p):] = True
    return idx, mask


def position_ids_from_mask(key_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) positions that count real tokens only: padding sits at 0 and is never attended."""
    check_key_mask(key_mask)
    return (key_mask.long().cumsum(-1) - 1).clamp(min=0)


def check_key_mask(key_mask) -> torch.Tensor:
    """A key mask: a 2-D tensor (B, T) of True/False (or 1/0), no other value."""
    if not isinstance(key_mask, torch.Tensor):
        raise TypeError(f"key_mask must be a (B, T) tensor of True/False, got {type(key_mask).__name__}")
    if key_mask.dim() != 2:
        raise ValueError(f"key_mask must be a (B, T) tensor of True/False, got shape {tuple(key_mask.shape)}")
    if key_mask.dtype != torch.bool and (key_mask.is_complex() or not bool(((key_mask == 0) | (key_mask == 1)).all())):
        raise ValueError(f"key_mask must hold only True/False (or 1/0), got {describe(key_mask)} with other values")
    return key_mask


class CachedDecoder:
    """Runs the teaching model over a :class:`KVCache`; returns the last position's logits (B, V)."""

    def __init__(self, model: GPT, batch_size: int, max_len: int | None = None):
        self.model = model
        self.cache = model.new_cache(batch_size, max_len)

    def __call__(self, idx, key_mask=None, position_ids=None):
        logits, _ = self.model(idx, cache=self.cache, key_mask=key_mask, position_ids=position_ids, last_only=True)
        return logits[:, -1]  # (B, V)


class CacheDecoder:
    """Runs the teaching model over a given ``cache`` (any :class:`kvlib.Cache`); the last logits (B, V).

    The model asks the cache for the new tokens' positions (an evicting cache numbers them past what it
    keeps) and whether padded rows suit it. The cache must be empty: a decoder starts a new text (a
    full one would continue the last text, silently).
    """

    def __init__(self, model: GPT, cache):
        check_cache(model, cache)
        if cache.length:
            raise ValueError(f"cache must be empty, it holds {cache.length} position(s) of an earlier text: a decoder "
                             f"starts a new one; call cache.truncate(0) or make a new cache")
        self.model, self.cache = model, cache

    def __call__(self, idx, key_mask=None, position_ids=None):
        logits, _ = self.model(idx, cache=self.cache, key_mask=key_mask, position_ids=position_ids, last_only=True)
        return logits[:, -1]  # (B, V)


def check_cache(model, cache) -> None:
    """A kvlib GPT and a cache (see :class:`kvlib.Cache`) made for its configuration."""
    check_gpt(model)
    if isinstance(cache, type) or not isinstance(cache, Cache):
        raise TypeError(f"cache must be a kvlib cache (KVCache, QuantizedKVCache, SlidingWindowCache, ...), "
                        f"got {cache!r:.60}")
    check_cache_made_for(model.config, cache)
    k, weight = getattr(cache, "k", None), model.lm_head.weight
    if isinstance(k, torch.Tensor) and (k.dtype, k.device) != (weight.dtype, weight.device):
        raise TypeError(f"the cache holds {k.dtype} on {k.device} but the model computes in {weight.dtype} on "
                        f"{weight.device}: build the cache with model.new_cache (or pass its dtype and device)")


def check_cache_class(cache_class, settings: dict) -> None:
    """A cache class whose constructor takes ``(config, batch_size, max_len, **settings)``."""
    if not isinstance(cache_class, type) or not all(callable(getattr(cache_class, a, None))
                                                    for a in ("write", "advance", "truncate")):
        raise TypeError(f"cache_class must be a cache class (e.g. QuantizedKVCache), got {cache_class!r:.60}")
    try:
        inspect.signature(cache_class).bind(None, 1, None, **settings)
    except TypeError as e:
        raise TypeError(f"settings {sorted(settings)} do not fit {cache_class.__name__}(config, batch_size, "
                        f"max_len, ...): {e}") from None


def cache_decoder(cache_class: type, **settings):
    """A factory for ``generate(..., decoder=...)``: a :class:`CacheDecoder` over
    ``cache_class(config, batch_size, max_len, **settings)``, e.g. ``cache_decoder(QuantizedKVCache, bits=4)``."""
    check_cache_class(cache_class, settings)

    def make(model: GPT, batch_size: int, max_len: int) -> CacheDecoder:
        check_gpt(model)
        return CacheDecoder(model, cache_class(model.config, batch_size, max_len, **settings))

    return make


# What ``generate(..., decoder=...)`` accepts by name. Both build ``decoder(model, batch_size, max_len)``
# and are then called as ``dec(idx, key_mask=None, position_ids=None) -> (B, V)`` logits of the last
# position, keeping their own cache. "fast" (the default) is the lean path of ``fast.py``; "model" runs
# the teaching model of ``model.py`` with its KVCache, step by step as the notebooks explain it.
DECODERS = {"fast": FastDecoder, "model": CachedDecoder}


def make_decoder(decoder, model: GPT, batch_size: int, max_len: int):
    """Build a decoder from a name in ``DECODERS``, a factory ``(model, batch_size, max_len)``, or None (fast)."""
    if decoder is None:  # the lean path where it applies, else the teaching model
        decoder = "fast" if model.config.multi_head else "model"
    if isinstance(decoder, str):
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {sorted(DECODERS)} or a factory "
                             f"(model, batch_size, max_len) -> decoder, got {decoder!r}")
        decoder = DECODERS[decoder]
    elif not callable(decoder):
        raise TypeError(f"decoder must be a name, a factory or None, got {type(decoder).__name__}")
    made = decoder(model, batch_size, max_len)
    if not callable(made):
        raise TypeError(f"decoder: the factory returned {type(made).__name__}, not a decoder; a factory "
                        f"(model, batch_size, max_len) must return a callable (idx, key_mask, position_ids) -> logits")
    return made


def _finish(out, T, n, lengths, reason, finished) -> GenerationResult:
    tokens = out[:, : T + n].clone()
    return GenerationResult(tokens, lengths, tokens[:, T:], reason, finished)


def stop_reason(n: int, max_new_tokens: int, budget: int | None, finished: torch.Tensor | None) -> str | None:
    """Why to stop after ``n`` new tokens, or None to go on: every row finished (``eos``), the tokens asked
    for (``max_new_tokens``), or the block's room (``context_limit``; ``budget`` None: no limit). The one
    rule of every decoding loop: ``generate``, ``generate_uncached`` and speculative decoding."""
    if finished is not None and bool(finished.all()):
        return "eos"
    if n == max_new_tokens:
        return "max_new_tokens"
    if budget is not None and n == budget:
        return "context_limit"
    return None


def emit(step: int, nxt: torch.Tensor, finished: torch.Tensor, eos_id: int | None, on_token: Callable | None) -> None:
    """The chosen tokens ``nxt`` (B, 1), in place: a finished row repeats ``eos_id``, a row that chose it is
    finished from now on, and ``on_token(step, tokens (B,))`` streams them before the next forward pass."""
    if eos_id is not None:
        nxt.masked_fill_(finished[:, None], eos_id)      # finished rows repeat eos_id
        finished |= nxt[:, 0] == eos_id
    if on_token is not None:
        on_token(step, nxt[:, 0].clone())


@torch.inference_mode()
def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             eos_id: int | None = None, key_mask: torch.Tensor | None = None,
             on_context_limit: str = "stop", logits_hook: Callable | None = None,
             on_token: Callable | None = None, decoder: str | Callable | None = None) -> GenerationResult:
    """Sample up to ``max_new_tokens`` after ``idx`` (B, T), prefilling the cache once.

    The cache holds ``block_size`` positions, so at most ``block_size - T + 1`` new tokens fit (the
    last one is never fed back). Past that: ``stop_reason="context_limit"``, or ContextLimitError
    with ``on_context_limit="raise"``. A row that samples ``eos_id`` is finished and repeats it.

    ``logits_hook(step, tokens, logits) -> logits`` may edit the (B, V) logits before sampling.
    ``on_token(step, new)`` is called with each step's new tokens (B,) as soon as they are chosen,
    before the next forward pass: that is streaming. A callback rather than an iterator keeps one
    loop and one return value (the whole result) for every caller, streaming or not.
    ``decoder`` picks the forward pass: None or "fast" (``fast.FastDecoder``), "model" (the teaching
    model with its KVCache), or a factory ``(model, batch_size, max_len) -> decoder``; a new one is
    built on every call, from the model's weights as they are then.
    """
    key_mask, (temperature, top_k, top_p) = check_generate_inputs(
        model, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
        eos_id=eos_id, key_mask=key_mask, on_context_limit=on_context_limit)
    B, T = idx.shape
    block = model.config.block_size
    budget = block - T + 1                               # new tokens that fit in the block
    out = torch.empty(B, T + min(max_new_tokens, budget), dtype=torch.long)  # prompt, then new tokens
    out[:, :T] = idx
    lengths = torch.full((B,), T) if key_mask is None else key_mask.sum(-1)  # real prompt tokens per row
    finished = torch.zeros(B, dtype=torch.bool)
    if max_new_tokens == 0:
        return _finish(out, T, 0, lengths, "max_new_tokens", finished)

    dec = make_decoder(decoder, model, B, block)
    if key_mask is None:                                 # prefill: the whole prompt in one forward
        logits = dec(idx)                                # (B, V), the last position's
    else:
        masks = torch.ones(B, block, dtype=torch.bool)   # the key mask of every step, preallocated:
        masks[:, :T] = key_mask                          # padding hidden, every new token real
        logits = dec(idx, masks[:, :T], position_ids_from_mask(key_mask))
        positions = lengths[:, None].clone()             # (B, 1): each row's next real position

    best = torch.empty(B, out.shape[1] - T, dtype=logits.dtype)  # greedy: each step's winning logit
    n, reason = 0, None
    while reason is None:
        if logits_hook is not None:
            logits = check_hook_output(logits_hook(n, out[:, : T + n], logits), (B, model.config.vocab_size))
        nxt = out[:, T + n: T + n + 1]                   # (B, 1): written straight into the output
        if temperature == 0:                             # greedy: nothing to draw
            torch.max(logits, dim=-1, keepdim=True, out=(best[:, n: n + 1], nxt))
        else:
            nxt.copy_(sample_next(logits, temperature, top_k, top_p, generator))
        emit(n, nxt, finished, eos_id, on_token)
        n += 1
        reason = stop_reason(n, max_new_tokens, budget, finished if eos_id is not None else None)
        if reason is None:                               # decode: one new token per row
            if key_mask is None:
                logits = dec(nxt)
            else:
                logits = dec(nxt, masks[:, : T + n], positions)
                positions += 1
    if temperature == 0 and not bool(best[:, :n].isfinite().all()):  # sampling checks each step's logits
        raise ValueError("the model's logits held NaN or +inf (or only -inf): greedy decoding cannot rank them, so its "
                         "tokens mean nothing; check the model's weights and dtype (float16 can overflow)")
    if reason == "context_limit" and on_context_limit == "raise":
        raise ContextLimitError.block_full(T, max_new_tokens, block)
    return _finish(out, T, n, lengths, reason, finished)


@torch.inference_mode()
def generate_uncached(f: Callable, idx: torch.Tensor, max_new_tokens: int, *, block_size: int,
                      temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                      generator: torch.Generator | None = None, eos_id: int | None = None,
                      key_mask: torch.Tensor | None = None, logits_hook: Callable | None = None,
                      on_token: Callable | None = None) -> GenerationResult:
    """The recompute loop: every step runs ``f`` on the last ``block_size`` tokens (sliding past it).

    ``f(idx) -> (logits, _)`` may return logits for every position or for the last one only (the
    model with ``last_only=True``). ``logits_hook`` and ``on_token`` work as in ``generate``.
    With ``key_mask`` (B, T) for a left-padded ``idx``, ``f`` is called as
    ``f(window, key_mask=..., position_ids=...)``: the window's mask hides the padding (every new
    token is real) and positions count the window's real tokens, as for a row alone.
    """
    temperature, top_k, top_p = Sampling(temperature, top_k, top_p)
    check_generator(generator)
    block_size = check_int("block_size", block_size, 1)
    key_mask = check_prompt(idx, key_mask, max_new_tokens, None)
    check_eos(eos_id, None)
    B, T = idx.shape
    out = torch.empty(B, T + max_new_tokens, dtype=torch.long)
    out[:, :T] = idx
    lengths = torch.full((B,), T) if key_mask is None else key_mask.sum(-1)
    if key_mask is not None:
        masks = torch.ones(B, T + max_new_tokens, dtype=torch.bool)  # padding hidden, new tokens real
        masks[:, :T] = key_mask
    finished = torch.zeros(B, dtype=torch.bool)
    for n in range(max_new_tokens):
        first = max(0, T + n - block_size)                               # the window: the last block_size
        if key_mask is None:
            logits = f(out[:, first: T + n])[0][:, -1]                   # (B, V): the whole window again
        else:
            window = masks[:, first: T + n]
            logits = f(out[:, first: T + n], key_mask=window,
                       position_ids=position_ids_from_mask(window))[0][:, -1]
        if logits_hook is not None:
            logits = check_hook_output(logits_hook(n, out[:, : T + n], logits), tuple(logits.shape))
        check_step_logits(logits, B)  # f is any callable: its logits are checked every step
        nxt = out[:, T + n: T + n + 1]
        nxt.copy_(sample_next(logits, temperature, top_k, top_p, generator))
        emit(n, nxt, finished, eos_id, on_token)
        reason = stop_reason(n + 1, max_new_tokens, None, finished if eos_id is not None else None)
        if reason is not None:
            return _finish(out, T, n + 1, lengths, reason, finished)
    return _finish(out, T, max_new_tokens, lengths, "max_new_tokens", finished)
