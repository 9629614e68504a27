"""The cache interface: what every KV cache in kvlib offers, and the checks that every cache shares.

``Cache`` is the protocol that ``GPT.forward`` and every caller talk to (the static ``KVCache`` and
``GrowingKVCache`` of :mod:`kvlib.model`, the quantised and evicting caches, a paged batch), so that
nothing outside a cache reads its private state or asks which class it is.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from .checks import check_int, describe

if TYPE_CHECKING:
    from .model import GPTConfig


class ContextLimitError(ValueError):
    """More positions than the model's block (or a cache) holds: crop the input or ask for fewer tokens.

    Its two messages are written once, here: :meth:`cache_full` before a forward pass that would not
    fit, :meth:`block_full` when generation stops at the block's end.
    """

    @classmethod
    def cache_full(cls, new: int, cached: int, room: int, name: str = "") -> "ContextLimitError":
        return cls(f"{name + ': ' if name else ''}{new} new token(s) after {cached} cached ones need {cached + new} "
                   f"positions; the cache holds {room}")

    @classmethod
    def block_full(cls, prompt: int, new: int, block: int) -> "ContextLimitError":
        budget = block - prompt + 1  # the last new token is never fed back
        return cls(f"{prompt} prompt tokens + {new} new ones need {prompt + new} tokens; the block holds {block} "
                   f"positions, so at most {budget} new tokens fit")


@runtime_checkable
class Cache(Protocol):
    """What ``GPT.forward`` and every caller need from a cache: every cache in kvlib implements it.

    ``length`` positions are stored for each of ``batch_size`` sequences, room for ``max_len``, for a
    model of ``config``; ``nbytes`` is what it holds now. In a forward pass the model takes the new
    tokens' positions from ``next_positions(T)`` (transformers calls them the cache positions: a cache
    that evicts numbers them past what it keeps), runs inside ``attending(model)`` (where a cache that
    needs to see attention, as H2O's does, hooks in), and each layer calls ``write(layer, k, v)`` with
    the new chunk (B, H, T, D), getting back the keys and values of all ``length + T`` positions; after
    the last layer the model calls ``advance(T)`` once. ``truncate(n)`` keeps the first ``n``
    positions (a roll-back: speculative decoding drops rejected guesses this way), ``reset()`` all
    of them; nothing outside a cache assigns its ``length``. ``takes_padding``: whether left-padded
    rows (a ``key_mask`` over ``length + T`` positions) make sense for it.
    """

    config: "GPTConfig"
    takes_padding: bool

    @property
    def length(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def max_len(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def next_positions(self, T: int, device=None) -> torch.Tensor: ...

    def attending(self, model) -> AbstractContextManager: ...

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def advance(self, n: int) -> None: ...

    def truncate(self, n: int) -> None: ...

    def reset(self) -> None: ...


class PositionsFromLength:
    """What most caches share: the next tokens' positions continue from ``length``, nothing to observe in
    attention, and left-padded rows allowed (an evicting cache overrides all three)."""

    takes_padding = True

    def next_positions(self, T: int, device=None) -> torch.Tensor:
        """(1, T): the positions of the next ``T`` tokens."""
        return torch.arange(self.length, self.length + T, device=device)[None]

    def attending(self, model) -> AbstractContextManager:
        """A context for one forward pass of ``model`` over this cache (nothing to do here)."""
        return nullcontext()


CACHE_ELEMENTS_MAX = 2**31  # keys and values of one cache, at most (as FastDecoder's)


def check_cache_shape(config, batch_size, max_len) -> tuple[int, int]:
    """``batch_size`` and ``max_len`` (None: the block) of a cache of at most 2**31 numbers for ``config``."""
    max_len = check_int("max_len", config.block_size if max_len is None else max_len, 1, config.block_size,
                        f"an int in [1, block_size={config.block_size}]")
    top = max(1, CACHE_ELEMENTS_MAX // (2 * config.n_layer * config.n_embd * max_len))
    batch_size = check_int("batch_size", batch_size, 1, top, f"an int in [1, {top}] (a cache of at most 2**31 numbers)")
    return batch_size, max_len


def check_multi_head(config, what: str, instead: str = "", grouped_ok: bool = False) -> None:
    """``what`` keeps one key/value head per query head (or, with ``grouped_ok``, any number of key/value heads):
    other models are refused, latent ones always, with what to use ``instead`` if there is something."""
    if config.kv_latent or not (config.multi_head or grouped_ok):
        kind = f"a latent of {config.kv_latent}" if config.kv_latent else f"{config.kv_heads} key/value head(s)"
        raise ValueError(f"{what} needs a multi-head attention model's config (one key/value head per query head: "
                         f"n_kv_head=0, kv_latent=0); this config has {config.n_head} query heads and {kind}"
                         + (f": {instead}" if instead else ""))


def check_chunk(name: str, t, shape: tuple, like: torch.Tensor | None = None) -> torch.Tensor:
    """A floating tensor of ``shape`` (None: any size) with finite values; ``like``: its dtype and device."""
    want = "(" + ", ".join("T" if s is None else str(s) for s in shape) + ")"
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor of shape {want}, got {describe(t)}")
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if like is not None and t.dtype != like.dtype:
        raise TypeError(f"{name} must be {like.dtype} like the values stored before it, got {t.dtype}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{name} must be on {like.device} like the values stored before it, got {t.device}")
    if t.device.type != "meta" and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} holds NaN or inf; allowed are finite values")
    return t


def check_cache_made_for(config, cache) -> None:
    """A cache made for a model of ``config`` (every cache keeps the config it was made for)."""
    if cache.config != config:
        raise ValueError(f"the cache was made for another configuration than the model's {config}: build it from "
                         f"model.config (or with model.new_cache)")


def check_truncate(cache, n) -> int:
    """``n`` for ``cache.truncate(n)``: an int in [0, cache.length]."""
    return check_int("n", n, 0, cache.length, f"an int in [0, length={cache.length}] (positions to keep)")


def check_id_tensor(idx, vocab_size: int, *, batch: int | None = None, room: int | None = None,
                    name: str = "idx") -> torch.Tensor:
    """Token ids: an int64 tensor (B, T), B and T >= 1, ids in [0, vocab_size); ``batch`` rows, ``room`` tokens at most."""
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long or idx.dim() != 2:
        raise TypeError(f"{name} must be an int64 tensor of token ids with shape (B, T), got {describe(idx)}")
    if 0 in idx.shape:
        raise ValueError(f"{name} must hold at least one token in at least one row, got shape {tuple(idx.shape)}")
    if batch is not None and idx.shape[0] != batch:
        raise ValueError(f"{name} must have {batch} row(s), one per sequence of the cache, got {idx.shape[0]}")
    lo, hi = (int(v) for v in idx.aminmax())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} holds token ids {lo}..{hi}; allowed are ids in [0, {vocab_size})")
    if room is not None and idx.shape[1] > room:
        raise ContextLimitError(f"{name} has {idx.shape[1]} tokens; room is left for {room}")
    return idx
