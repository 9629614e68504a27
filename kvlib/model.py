"""A small GPT (GPT-2 layout) and the static KV cache it writes into.

Data flows top to bottom: the two caches (``KVCache``, preallocated, and ``GrowingKVCache``, the
simple one it is compared with) -> ``CausalSelfAttention`` -> ``MLP`` -> ``Block`` -> masks -> ``GPT``.
Shapes: B batch, T new tokens, S = cache length + T keys, C channels, H heads, D head size.
The caches follow :class:`kvlib.cache.Cache`; ``GPT.forward``'s input checks sit at the end of the file, in
:func:`check_forward_inputs`, so that what is read first is the arithmetic.
"""
from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cache import (Cache, ContextLimitError, PositionsFromLength, check_cache_made_for, check_cache_shape,
                    check_truncate)
from .checks import check_config, check_device, check_dtype, check_int, describe
from .weights import check_weights


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    n_kv_head: int = 0   # key/value heads; 0: one per query head. Fewer: grouped-query attention (1: multi-query)
    kv_latent: int = 0   # > 0: keys and values come from one latent vector of this size per position (MLA)

    def __post_init__(self):
        for name, value in asdict(self).items():
            check_int(f"GPTConfig.{name}", value, 0 if name in ("n_kv_head", "kv_latent") else 1)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head and self.n_head % self.n_kv_head:
            raise ValueError(f"n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head}): each key/value "
                             f"head serves a group of query heads")
        if self.n_kv_head and self.kv_latent:
            raise ValueError("n_kv_head and kv_latent exclude each other: fewer key/value heads, or one latent")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_head``, or one per query head."""
        return self.n_kv_head or self.n_head

    @property
    def multi_head(self) -> bool:
        """Plain multi-head attention: one key/value head per query head, no latent."""
        return self.kv_heads == self.n_head and not self.kv_latent

    @property
    def cache_shape(self) -> tuple[int, int, int]:
        """What one position of one layer stores: (heads, key size, value size). A latent is kept once, as
        a one-head key of its size with an empty value."""
        if self.kv_latent:
            return 1, self.kv_latent, 0
        return self.kv_heads, self.head_size, self.head_size

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.float32) -> int:
        """Bytes one position takes in a full-precision cache: every layer's ``cache_shape`` in ``dtype``."""
        heads, key, value = self.cache_shape
        return self.n_layer * heads * (key + value) * check_dtype(dtype, optional=False).itemsize


class KVCache(PositionsFromLength):
    """Preallocated keys and values for every layer: ``k``, ``v`` are (L, B, H, max_len, D).

    ``length`` counts the positions already written. Each layer writes the new chunk at
    ``[length : length + T]`` and reads ``[: length + T]``; the model advances ``length`` once,
    after its last layer. ``buffers=(k, v)`` builds the cache around given tensors of that shape
    (the fast decoder keeps both halves in one tensor).
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int | None = None,
                 device=None, dtype=None, *, buffers: tuple[torch.Tensor, torch.Tensor] | None = None):
        check_config(config, GPTConfig)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype (e.g. torch.float32) or None, got {dtype!r}")
        device = check_device(device)
        batch_size, max_len = check_cache_shape(config, batch_size, max_len)  # at most 2**31 numbers in all
        heads, key_size, value_size = config.cache_shape
        shape = (config.n_layer, batch_size, heads, max_len, key_size)
        v_shape = shape[:-1] + (value_size,)
        if buffers is None:
            buffers = torch.zeros(shape, device=device, dtype=dtype), torch.zeros(v_shape, device=device, dtype=dtype)
        elif not (isinstance(buffers, tuple) and len(buffers) == 2
                  and all(isinstance(t, torch.Tensor) and tuple(t.shape) == want for t, want in zip(buffers, (shape, v_shape)))):
            raise ValueError(f"buffers must be a tuple (k, v) of two tensors of shape {shape}")
        self.config = config
        self.k, self.v = buffers
        self.length = 0

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    @property
    def bytes_per_token(self) -> int:
        """Bytes one position of one sequence takes: 2 (k, v) x layers x channels x dtype size."""
        return self.config.kv_bytes_per_token(self.k.dtype)

    def reset(self) -> None:
        self.length = 0

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store a chunk (B, H, T, D) after the cached positions; return all keys and values so far."""
        end = self.length + k.shape[2]
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, H, S, D)

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions; the later slots are overwritten by the next writes."""
        self.length = check_truncate(self, n)


class GrowingKVCache(PositionsFromLength):
    """Keys and values kept as one growing tensor per layer, extended with ``torch.cat`` each step.

    It implements :class:`Cache` (``length``, ``max_len``, ``write``, ``advance``, ``truncate``), so
    ``model(idx, cache=GrowingKVCache(config))`` runs the real model. Every ``torch.cat`` copies all
    the keys so far into a new tensor: ``bytes_copied`` counts that traffic, which grows with the
    square of the length, while the static cache writes each position once.
    """

    def __init__(self, config: GPTConfig, batch_size: int = 1, max_len: int | None = None):
        check_config(config, GPTConfig)
        self.config = config
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.max_len = check_int("max_len", config.block_size if max_len is None else max_len, 1,
                                 config.block_size)
        self.n_layer = config.n_layer
        self.reset()

    def reset(self) -> None:
        self.k: list[torch.Tensor | None] = [None] * self.n_layer
        self.v: list[torch.Tensor | None] = [None] * self.n_layer
        self.length = 0
        self.bytes_copied = 0

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)  # (B, H, S, D), a fresh copy
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        self.bytes_copied += self.k[layer].nbytes + self.v[layer].nbytes
        return self.k[layer], self.v[layer]

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions: each layer's tensors are cut to ``n`` (a view, no copy)."""
        n = check_truncate(self, n)
        for layer in range(self.n_layer):
            if self.k[layer] is not None:
                self.k[layer], self.v[layer] = self.k[layer][:, :, :n], self.v[layer][:, :, :n]
        self.length = n

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.k + self.v if t is not None)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads
        kv = 2 * self.n_kv_head * config.head_size  # keys and values: n_embd each unless heads are shared
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + kv)  # fused q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, mask=None, cache: Cache | None = None, layer: int = 0):
        B, T, C = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, C // self.n_head
        q, k, v = self.c_attn(x).split([C, Hkv * D, Hkv * D], dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)                                         # (B, H, T, D)
        k, v = (t.view(B, T, Hkv, D).transpose(1, 2) for t in (k, v))                  # (B, Hkv, T, D)
        if cache is not None:
            k, v = cache.write(layer, k, v)  # (B, Hkv, S, D): the past never changes, so it is reused
        # With fewer key/value heads (grouped-query attention) each serves H / Hkv query heads.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=Hkv < H)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))  # mask (B, 1, T, S) or None: plain causal


@contextmanager
def watching_attention(model: "GPT", seen: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]):
    """While inside, each forward pass of ``model`` (multi-head attention) hands ``seen(layer, q, k, v)`` every
    layer's queries, keys and values of the new tokens, (B, H, T, D) each, as its fused ``c_attn`` made them:
    before the layer attends, so a cache that scores its keys by attention (H2O) sees them in time."""
    H = model.config.n_head

    def hook_for(layer: int):
        def hook(module, inputs, out):  # out (B, T, 3C): q, k, v side by side
            B, T, C = out.shape[0], out.shape[1], out.shape[2] // 3
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in out.split(C, dim=2))  # (B, H, T, D)
            seen(layer, q, k, v)
        return hook

    handles = [block.attn.c_attn.register_forward_hook(hook_for(i)) for i, block in enumerate(model.transformer.h)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class LatentSelfAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, without its rotary part): each position stores one latent
    vector c (size r) from which every head's key and value are made, k_h = W_k,h c and v_h = W_v,h c.

    Training computes keys and values explicitly. Decoding with a cache never makes them: since
    q_h . (W_k,h c) = (W_k,h^T q_h) . c and sum_j a_j W_v,h c_j = W_v,h sum_j a_j c_j, the two
    up-projections move to the query and to the output, and attention runs on the cached latents
    (one head of size r) directly. Our positions are learned and added at the input, so keys carry no
    position-dependent rotation and this absorption is exact; with RoPE it would not be.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.latent = config.n_head, config.kv_latent
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + self.latent)    # queries, and the latent
        self.kv_up = nn.Linear(self.latent, 2 * config.n_embd, bias=False)     # latent -> every key and value
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, mask=None, cache: Cache | None = None, layer: int = 0):
        B, T, C = x.shape
        H, D, r = self.n_head, C // self.n_head, self.latent
        q, c = self.c_attn(x).split([C, r], dim=2)
        q, c = q.view(B, T, H, D).transpose(1, 2), c[:, None]                         # (B, H, T, D), (B, 1, T, r)
        w_k, w_v = (w.view(H, D, r) for w in self.kv_up.weight.split(C))             # per head: (D, r) each
        if cache is None:  # explicit keys and values
            k, v = (c @ w.transpose(1, 2) for w in (w_k, w_v))                       # (B, H, T, D)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        else:              # absorbed: attention over the cached latents, (B, 1, S, r)
            c, _ = cache.write(layer, c, c[..., :0])
            y = F.scaled_dot_product_attention(q @ w_k, c, c, attn_mask=mask, is_causal=mask is None,
                                               scale=D ** -0.5, enable_gqa=True)      # (B, H, T, r)
            y = y @ w_v.transpose(1, 2)                                               # (B, H, T, D)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))  # exact (erf) GELU


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = LatentSelfAttention(config) if config.kv_latent else CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, mask=None, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), mask, cache, layer)
        return x + self.mlp(self.ln_2(x))


def causal_mask(T: int, S: int, device=None) -> torch.Tensor:
    """(T, S) bool: query i (the i-th new token) sees key j when j <= S - T + i (bottom-right aligned)."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)


def attention_mask(T: int, S: int, key_mask: torch.Tensor | None, device=None) -> torch.Tensor:
    """(B or 1, 1, T, S) bool: causal, and padded keys hidden.

    Each token always sees itself, so a padding row never has all keys hidden (its output is unused).
    """
    mask = causal_mask(T, S, device)  # (T, S)
    if key_mask is None:
        return mask[None, None]
    diagonal = torch.zeros(T, S, dtype=torch.bool, device=device)
    diagonal[torch.arange(T), torch.arange(S - T, S)] = True
    return (mask & key_mask[:, None, None, :].bool()) | diagonal  # (B, 1, T, S)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        check_config(config, GPTConfig)
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),  # learned positions
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied embeddings
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: scale the residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch_size: int = 1, max_len: int | None = None) -> KVCache:
        p = self.lm_head.weight
        return KVCache(self.config, batch_size, max_len, device=p.device, dtype=p.dtype)

    def forward(self, idx, cache: Cache | None = None, key_mask=None, position_ids=None, targets=None,
                last_only: bool = False):
        """idx (B, T) -> logits (B, T, V) for every position, and the loss when ``targets`` is given.

        With ``cache``, idx holds only the new tokens: positions start at ``cache.length`` and the
        keys seen are the cached ones plus these. ``key_mask`` (B, S) marks real (1) and padding (0)
        keys over all S = cache.length + T positions; ``position_ids`` (B, T) overrides positions.
        ``last_only`` computes the head for the last position only, (B, 1, V): nanoGPT's shortcut
        for a loop that recomputes everything and needs only the next token.
        """
        check_forward_inputs(self.config, idx, cache, key_mask, position_ids, targets, last_only)
        B, T = idx.shape
        start = cache.length if cache is not None else 0  # positions already in the cache
        S = start + T
        if position_ids is None:  # (1, T): after the cached ones, as the cache numbers them
            position_ids = (cache.next_positions(T, idx.device) if cache is not None
                            else torch.arange(T, device=idx.device)[None])

        x = self.transformer.wte(idx) + self.transformer.wpe(position_ids)  # (B, T, C)
        # A fresh sequence without padding needs only the plain causal mask (SDPA's is_causal);
        # new tokens after cached ones, or padding, need the full (bottom-right aligned) mask.
        mask = None if (start == 0 and key_mask is None) else attention_mask(T, S, key_mask, idx.device)
        with cache.attending(self) if cache is not None else nullcontext():  # H2O's cache sees the queries here
            for layer, block in enumerate(self.transformer.h):
                x = block(x, mask, cache, layer)
        if cache is not None:
            cache.advance(T)  # once, after the last layer
        if last_only:
            x = x[:, -1:]  # (B, 1, C)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss


def check_forward_inputs(config, idx, cache, key_mask, position_ids, targets, last_only) -> None:
    """What ``GPT.forward`` needs: token ids (B, T), room in the cache and the block, matching masks."""
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.long, torch.int):
        raise TypeError(f"idx must be an integer tensor of token ids with shape (B, T), got {describe(idx)}")
    B, T = idx.shape
    if idx.numel():
        lo, hi = (int(v) for v in idx.aminmax())
        if lo < 0 or hi >= config.vocab_size:
            raise ValueError(f"idx holds token ids {lo}..{hi}; allowed are ids in [0, {config.vocab_size}) "
                             f"(the model's vocabulary; is the tokenizer the model's own?)")
    for name, t in (("key_mask", key_mask), ("position_ids", position_ids), ("targets", targets)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if cache is not None:
        if isinstance(cache, type) or not isinstance(cache, Cache):
            raise TypeError(f"cache must be a kvlib cache (KVCache, QuantizedKVCache, SlidingWindowCache, ...), "
                            f"got {cache!r:.60}")
        check_cache_made_for(config, cache)
        if cache.batch_size != B:
            raise ValueError(f"the cache holds {cache.batch_size} sequence(s) but idx has {B} row(s)")
        if key_mask is not None and not cache.takes_padding:
            raise ValueError(f"key_mask: {type(cache).__name__} decodes rows of equal length; padded rows "
                             f"(a key_mask) need a cache that keeps every position (KVCache, say)")
    start = cache.length if cache is not None else 0
    S = start + T
    if cache is not None and S > cache.max_len:
        raise ContextLimitError.cache_full(T, start, cache.max_len)
    if position_ids is None and S > config.block_size:
        raise ContextLimitError(
            f"position {S - 1} is past the block size {config.block_size}: crop the input "
            f"to the last {config.block_size} tokens")
    if position_ids is not None and position_ids.numel() and int(position_ids.max()) >= config.block_size:
        raise ContextLimitError(
            f"position_ids hold position id {int(position_ids.max())}, past the block size {config.block_size}")
    if key_mask is not None and key_mask.shape != (B, S):
        raise ValueError(f"key_mask must have shape (B, cached + new) = {(B, S)}, got {tuple(key_mask.shape)}")
    if position_ids is not None and (position_ids.dim() != 2 or position_ids.shape[1] != T
                                     or position_ids.shape[0] not in (1, B) or position_ids.is_floating_point()):
        raise ValueError(f"position_ids must be an integer tensor of shape (B, T) = {(B, T)} or (1, T), got "
                         f"{describe(position_ids)}")
    if position_ids is not None and position_ids.numel() and int(position_ids.min()) < 0:
        raise ValueError(f"position_ids must be >= 0 (position ids count from 0), got {int(position_ids.min())}")
    if targets is not None and last_only:
        raise ValueError("targets need the logits of every position: pass last_only=False to compute a loss")
    if targets is not None:
        if targets.shape != idx.shape or targets.dtype != torch.long:
            raise ValueError(f"targets must be an int64 tensor of the shape of idx {(B, T)}, got {describe(targets)}")
        if targets.numel():
            lo, hi = (int(v) for v in targets.aminmax())
            if lo < -1 or hi >= config.vocab_size:
                raise ValueError(f"targets hold ids {lo}..{hi}; allowed are ids in [0, {config.vocab_size}) "
                                 f"and -1 (ignored)")


def check_gpt(model) -> None:
    """A kvlib GPT itself (its modules are read, not only called), with finite weights."""
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a kvlib GPT (e.g. from load_pretrained), got {type(model).__name__}")
    check_weights(model)
