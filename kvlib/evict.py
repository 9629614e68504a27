"""Caches that keep a bounded set of positions: a sliding window, sinks plus a window, heavy hitters (H2O).

The model adds a learned position embedding to each token before the first layer, so every key
already carries its position: dropping a position's keys and values is all that eviction does, and
the positions kept keep their original numbers.

How these caches meet :class:`kvlib.model.Cache` and ``GPT.forward``:

- ``length`` is the number of positions *kept*, as the protocol says ("``length`` positions are
  stored"). ``GPT.forward`` sizes its causal mask from it (S = length + T keys, bottom-right
  aligned), which is exactly right for the kept keys followed by the new chunk, whichever were evicted.
- ``position`` counts the positions written so far: the next token's position. Once something is
  evicted it differs from ``length``, so the cache numbers the new tokens itself:
  ``GPT.forward`` asks every cache for ``next_positions(T)``, and this one answers from ``position``.
- ``write`` appends the chunk and returns every kept key plus the chunk; eviction happens in
  ``advance``, after the last layer. A prompt is therefore prefilled in full (every prompt token sees
  every earlier one) and cut down to the budget afterwards; decoding one token at a time, each new
  token sees the kept positions and itself.
- ``truncate(n)`` keeps the ``n`` oldest kept positions; the next position follows the newest one
  kept. What was evicted stays evicted.

H2O ranks keys by the attention they have received, so the cache needs each layer's queries, which
``write(layer, k, v)`` is not given. Rather than a second copy of the forward pass,
:class:`HeavyHitterCache` watches each layer's fused ``c_attn`` projection while the model runs over it
(``GPT.forward`` enters ``cache.attending(model)`` around its layers; :func:`kvlib.model.watching_attention`
hands over the queries) and keeps them with ``observe(layer, q)``. ``write``
then computes the softmax weights over the kept keys and the new chunk (the causal mask included)
and adds each key's column sum to its score. The model's own forward pass runs unchanged.

Padded batches (a ``key_mask``) are not supported: rows of equal length only.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from .checks import check_bool, check_config, check_device, check_int
from .cache import (ContextLimitError, check_cache_shape, check_chunk, check_id_tensor, check_multi_head,
                    check_truncate)
from .model import GPT, GPTConfig, causal_mask, watching_attention

__all__ = ["EvictingCache", "SlidingWindowCache", "SinkCache", "HeavyHitterCache", "forward_with_cache"]


def _take(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Entries ``index`` along dim 2 of ``t`` (B, H, K, ...): one (K',) index for all, or (B, H, K') each."""
    if index.dim() == 1:
        return t.index_select(2, index)
    return t.gather(2, index.view(*index.shape, *[1] * (t.dim() - 3)).expand(*index.shape, *t.shape[3:]))


class EvictingCache:
    """Keys and values of the kept positions, per layer (B, H, K, D), with their positions (B, H, K).

    Subclasses say what to keep in :meth:`keep`; everything else (writing, advancing, the roll-back)
    is here.
    """

    budget: int  # positions kept between forward passes
    takes_padding = False  # rows are numbered by the cache, all alike

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int | None = None):
        check_config(config, GPTConfig)
        check_multi_head(config, type(self).__name__)
        self.config = config
        self.batch_size, self.max_len = check_cache_shape(config, batch_size, max_len)
        L = config.n_layer
        self.k: list[torch.Tensor | None] = [None] * L
        self.v: list[torch.Tensor | None] = [None] * L
        self.positions: list[torch.Tensor | None] = [None] * L  # (B, H, K) int64, ascending
        self.length = 0    # positions kept
        self.position = 0  # positions written: the next token's position

    def next_positions(self, T: int, device=None) -> torch.Tensor:
        """(1, T): the positions of the next ``T`` tokens, for ``GPT.forward``'s ``position_ids``."""
        self.check_room(check_int("T", T, 0))
        device = check_device(device)
        return torch.arange(self.position, self.position + T, device=device)[None]

    def check_room(self, T: int, name: str = "T") -> None:
        """``T`` more positions (of ``name``) fit: the cache numbers at most ``max_len``."""
        if self.position + T > self.max_len:
            raise ContextLimitError(f"{name}: {T} new position(s) after {self.position} need {self.position + T}; "
                                    f"the cache numbers at most {self.max_len}")

    def check_model(self, model) -> None:
        """A kvlib GPT of the cache's configuration."""
        if not isinstance(model, GPT):
            raise TypeError(f"model must be a kvlib GPT (e.g. from load_pretrained), got {type(model).__name__}")
        if model.config != self.config:
            raise ValueError(f"model's config {model.config} is not the cache's {self.config}: make the cache "
                             f"from model.config")

    def attending(self, model):
        """A context in which ``model``'s forward pass hands the cache what it needs (nothing here)."""
        self.check_model(model)
        return nullcontext()

    def keep(self, layer: int) -> torch.Tensor | None:
        """Indices of the entries of ``layer`` to keep, ascending, or None to keep all."""
        raise NotImplementedError

    # ---- the Cache protocol ------------------------------------------------------------------------

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append a chunk (B, H, T, D) at positions ``position ...``; return the kept keys and it, (B, H, K + T, D)."""
        self.check_write(layer, k, v)
        T = k.shape[2]
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k[:, :, :0], v[:, :, :0]
            self.positions[layer] = torch.empty(*k.shape[:2], 0, dtype=torch.long, device=k.device)
        self._cut(layer, self.length)  # entries past length: a forward pass that stopped half way
        new = self.next_positions(T, k.device).expand(*k.shape[:2], T)  # (B, H, T)
        self.k[layer] = torch.cat([self.k[layer], k], dim=2)
        self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        self.positions[layer] = torch.cat([self.positions[layer], new], dim=2)
        self.written(layer)
        return self.k[layer], self.v[layer]

    def check_write(self, layer, k, v) -> None:
        """``layer`` in [0, L), k and v finite (B, H, T, D) chunks that fit the positions left."""
        check_int("layer", layer, 0, self.config.n_layer - 1)
        shape = (self.batch_size, self.config.n_head, None, self.config.head_size)
        like = next((t for t in self.k if t is not None), None)
        check_chunk("k", k, shape, like)
        check_chunk("v", v, (*shape[:2], k.shape[2], shape[3]), like)
        self.check_room(k.shape[2], "k")

    def written(self, layer: int) -> None:
        """Called after each write (H2O scores the keys here)."""

    def advance(self, n: int) -> None:
        """``n`` positions were written to every layer: count them, then evict down to the budget."""
        n = check_int("n", n, 0)
        held = {0 if t is None else t.shape[2] for t in self.k}
        if held != {self.length + n}:
            raise ValueError(f"advance(n) comes after writing n new positions to every layer; n = {n!r}, "
                             f"but the layers hold {sorted(held)} after {self.length} kept")
        self.position += n
        for layer in range(self.config.n_layer):
            index = self.keep(layer)
            if index is not None:
                self._select(layer, index)
        self.length = self.k[0].shape[2]

    def truncate(self, n: int) -> None:
        """Keep the ``n`` oldest kept positions; the next position follows the newest one kept."""
        n = check_truncate(self, n)
        for layer in range(self.config.n_layer):
            self._cut(layer, n)
        self.length = n
        self.position = int(max(p.max() for p in self.positions)) + 1 if n else 0

    def reset(self) -> None:
        self.truncate(0)

    # ---- sizes and bookkeeping ---------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes of the kept keys and values (positions are bookkeeping, not counted)."""
        return sum(t.nbytes for t in self.k + self.v if t is not None)

    def _cut(self, layer: int, n: int) -> None:
        if self.k[layer] is not None and self.k[layer].shape[2] != n:
            self._select(layer, torch.arange(n, device=self.k[layer].device))

    def _select(self, layer: int, index: torch.Tensor) -> None:
        self.k[layer], self.v[layer] = _take(self.k[layer], index), _take(self.v[layer], index)
        self.positions[layer] = _take(self.positions[layer], index)


class SlidingWindowCache(EvictingCache):
    """Keeps the ``window`` most recent positions."""

    sinks = 0

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int | None = None, *, window: int):
        super().__init__(config, batch_size, max_len)
        self._set_window(window)

    def _set_window(self, window) -> None:
        room = self.max_len - self.sinks
        self.window = check_int("window", window, 1, room, f"an int in [1, {room}] (recent positions kept, "
                                f"{self.sinks} sinks and the window in max_len={self.max_len})")
        self.budget = self.sinks + self.window

    def keep(self, layer: int) -> torch.Tensor | None:
        K = self.k[layer].shape[2]
        if K <= self.budget:
            return None
        device = self.k[layer].device
        return torch.cat([torch.arange(self.sinks, device=device), torch.arange(K - self.window, K, device=device)])


class SinkCache(SlidingWindowCache):
    """StreamingLLM: the first ``sinks`` positions, which draw much attention, plus the ``window`` most recent."""

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int | None = None, *, sinks: int, window: int):
        EvictingCache.__init__(self, config, batch_size, max_len)
        top = self.max_len - 1
        self.sinks = check_int("sinks", sinks, 0, top, f"an int in [0, {top}] (first positions kept, a window "
                               f"of at least 1 after them in max_len={self.max_len})")
        self._set_window(window)


class HeavyHitterCache(EvictingCache):
    """H2O: per layer and head, the ``recent`` most recent positions plus the keys with the most attention.

    ``budget`` positions are kept in all: ``recent`` of them by recency, ``budget - recent`` by the
    attention they have received, summed over every query so far (``scores``, (B, H, K) per layer).
    The model hands the cache each layer's queries through :meth:`attending`.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int | None = None, *, budget: int,
                 recent: int):
        super().__init__(config, batch_size, max_len)
        self.budget = check_int("budget", budget, 1, self.max_len,
                                f"an int in [1, max_len={self.max_len}] (positions kept)")
        self.recent = check_int("recent", recent, 0, budget, f"an int in [0, budget={budget}]")
        self.scores: list[torch.Tensor | None] = [None] * config.n_layer  # (B, H, K)
        self.queries: list[torch.Tensor | None] = [None] * config.n_layer  # (B, H, T), until written

    @contextmanager
    def attending(self, model):
        """While inside, each attention layer hands this cache its queries before it writes."""
        self.check_model(model)
        try:
            with watching_attention(model, lambda layer, q, k, v: self.observe(layer, q)):
                yield
        finally:
            self.queries = [None] * self.config.n_layer  # none left over from a pass that stopped half way

    def observe(self, layer: int, q: torch.Tensor) -> None:
        """The queries (B, H, T, D) of the chunk that ``layer`` is about to write."""
        check_int("layer", layer, 0, self.config.n_layer - 1)
        like = next((t for t in self.k if t is not None), None)
        check_chunk("q", q, (self.batch_size, self.config.n_head, None, self.config.head_size), like)
        self.queries[layer] = q

    def check_write(self, layer, k, v) -> None:
        """As for every evicting cache, and the queries of the same chunk were observed."""
        super().check_write(layer, k, v)
        q = self.queries[layer]
        if q is None or q.shape != k.shape:
            raise RuntimeError("HeavyHitterCache needs each layer's queries to score the keys: write through the "
                               "model, model(idx, cache=cache) (or generate with "
                               "decoder=cache_decoder(HeavyHitterCache, ...)), which hands them over")

    def written(self, layer: int) -> None:
        q, self.queries[layer] = self.queries[layer], None
        keys = self.k[layer]                                   # (B, H, S, D): kept, then the new T
        T, S = q.shape[2], keys.shape[2]
        att = (q @ keys.transpose(-2, -1)) * keys.shape[-1] ** -0.5  # (B, H, T, S)
        att = att.masked_fill(~causal_mask(T, S, q.device), float("-inf")).softmax(-1)
        old = self.scores[layer]
        old = att.new_zeros(*att.shape[:2], 0) if old is None else old[..., : S - T]
        self.scores[layer] = torch.cat([old, att.new_zeros(*att.shape[:2], T)], dim=2) + att.sum(2)  # (B, H, S)

    def keep(self, layer: int) -> torch.Tensor | None:
        scores = self.scores[layer]
        B, H, K = scores.shape
        if K <= self.budget:
            return None
        older = K - self.recent
        heavy = scores[..., :older].topk(self.budget - self.recent, dim=-1).indices.sort(-1).values
        recent = torch.arange(older, K, device=scores.device).expand(B, H, self.recent)
        return torch.cat([heavy, recent], dim=-1)              # (B, H, budget), ascending

    def _select(self, layer: int, index: torch.Tensor) -> None:
        super()._select(layer, index)
        if self.scores[layer] is not None:
            self.scores[layer] = _take(self.scores[layer], index)

    @property
    def nbytes(self) -> int:
        """Kept keys and values, plus the accumulated scores that rank them."""
        return super().nbytes + sum(s.nbytes for s in self.scores if s is not None)


def forward_with_cache(model, idx: torch.Tensor, cache: EvictingCache, *, last_only: bool = False):
    """``model(idx, cache=cache)`` after the evicting cache's own checks (model, ids, room), each named for
    this cache; returns the model's ``(logits, loss)``."""
    if not isinstance(cache, EvictingCache):
        raise TypeError(f"cache must be an EvictingCache (SlidingWindowCache, SinkCache, HeavyHitterCache), "
                        f"got {type(cache).__name__}")
    cache.check_model(model)
    check_id_tensor(idx, cache.config.vocab_size, batch=cache.batch_size)
    cache.check_room(idx.shape[1], "idx")
    check_bool("last_only", last_only)
    return model(idx, cache=cache, last_only=last_only)  # the cache numbers the positions and sees what it needs
