"""Smaller caches from a trained model: fewer key/value heads, or one low-rank latent per position.

Both start from a trained multi-head model and return a new one (the original is left as it was),
close to it before any further training:

- :func:`grouped` mean-pools the key and value heads of each group of query heads (Ainslie et al.
  2023, grouped-query attention; one group is multi-query attention). The cache keeps ``n_kv_head``
  heads instead of ``n_head``.
- :func:`latent` factorises each layer's stacked key and value projection, (2C, C), by a truncated
  SVD: W ~ U_r S_r V_r^T. The down-projection S_r^(1/2) V_r^T makes the latent c (size r) and the
  up-projection U_r S_r^(1/2) makes every head's key and value from it (DeepSeek-V2's multi-head
  latent attention). The cache keeps r numbers a position instead of 2C.

Biases: a key bias adds q . b_k to every score of a query alike, which softmax ignores, so it is
dropped; a value bias adds b_v to every head's output (the attention weights sum to 1), so it moves
into the output projection's bias. Only the low-rank cut and the pooling change the model.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import torch

from .checks import check_int
from .cache import check_multi_head
from .model import GPT, GPTConfig, check_gpt

__all__ = ["grouped", "latent"]


def _empty(config: GPTConfig, like: GPT) -> GPT:
    """A model of ``config`` whose weights are about to be replaced, with ``like``'s dtype and device: its random
    start leaves the global RNG alone."""
    weight = like.lm_head.weight
    with torch.random.fork_rng(devices=[]):
        return GPT(config).to(dtype=weight.dtype, device=weight.device)


def _multi_head(model: GPT) -> GPTConfig:
    check_gpt(model)
    check_multi_head(model.config, "converting a model")
    return model.config


@torch.no_grad()
def grouped(model: GPT, n_kv_head: int) -> GPT:
    """A copy of ``model`` with ``n_kv_head`` key/value heads, each the mean of its group's heads."""
    cfg = _multi_head(model)
    H, D, C = cfg.n_head, cfg.head_size, cfg.n_embd
    n_kv_head = check_int("n_kv_head", n_kv_head, 1, H, f"an int in [1, {H}] that divides n_head = {H}")
    if H % n_kv_head:
        raise ValueError(f"n_kv_head must divide n_head = {H}, got {n_kv_head}")
    out = _empty(replace(cfg, n_kv_head=n_kv_head if n_kv_head < H else 0), model)
    state = copy.deepcopy(model.state_dict())
    for i in range(cfg.n_layer):
        for name in ("weight", "bias"):
            key = f"transformer.h.{i}.attn.c_attn.{name}"
            q, k, v = state[key].split(C)                       # (C, ...) each: heads stacked by rows
            pool = lambda t: t.view(n_kv_head, H // n_kv_head, D, *t.shape[1:]).mean(1).flatten(0, 1)  # noqa: E731
            state[key] = torch.cat([q, pool(k), pool(v)])       # (C + 2 n_kv_head D, ...)
    out.load_state_dict(state)
    return out.eval()


@torch.no_grad()
def latent(model: GPT, rank: int) -> GPT:
    """A copy of ``model`` whose keys and values come from a latent of size ``rank`` (truncated SVD)."""
    cfg = _multi_head(model)
    C = cfg.n_embd
    # The stacked (2C, C) projection has rank C at most: a latent of C already reproduces it exactly.
    rank = check_int("rank", rank, 1, C, f"an int in [1, {C}] (n_embd: the rank of the key/value projection)")
    out = _empty(replace(cfg, kv_latent=rank), model)
    state = copy.deepcopy(model.state_dict())
    for i in range(cfg.n_layer):
        pre = f"transformer.h.{i}.attn."
        w, b = state.pop(pre + "c_attn.weight"), state.pop(pre + "c_attn.bias")   # (3C, C), (3C,)
        U, S, Vh = torch.linalg.svd(w[C:].double(), full_matrices=False)         # the stacked (2C, C) k, v
        root = S[:rank].sqrt()
        down = root[:, None] * Vh[:rank]                                          # (r, C): x -> c
        up = U[:, :rank] * root                                                   # (2C, r): c -> k, v
        state[pre + "c_attn.weight"] = torch.cat([w[:C], down.to(w.dtype)])
        state[pre + "c_attn.bias"] = torch.cat([b[:C], b.new_zeros(rank)])
        state[pre + "kv_up.weight"] = up.to(w.dtype)
        out_w = state[pre + "c_proj.weight"]
        state[pre + "c_proj.bias"] = state[pre + "c_proj.bias"] + out_w @ b[2 * C:]  # the value bias
    out.load_state_dict(state)
    return out.eval()
