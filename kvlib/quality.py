"""What a smaller cache costs in quality: decode through it token by token and compare with the full cache.

:func:`stepwise_logits` feeds a batch of texts through a cache one token at a time, as decoding does,
so that everything the cache drops or rounds shows in the next logits (a single pass over a whole
text would never read the cache). :func:`cache_cost` compares those logits with the full cache's:

- **nats per token**: the mean next-token loss on the text (for tang-char one token is one character);
- **KL**: the mean Kullback-Leibler divergence KL(full || smaller) of the next-token distributions, in
  nats, 0 when the two agree exactly;
- **top-1 agreement**: the share of positions where both put the same token first (what greedy
  decoding would write, given the same text so far).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .checks import check_tensor
from .cache import check_id_tensor
from .decoding import CacheDecoder, check_cache
from .model import GPT, check_gpt, watching_attention

__all__ = ["stepwise_logits", "cache_cost", "attention_weights"]


@torch.inference_mode()
def stepwise_logits(model: GPT, idx: torch.Tensor, cache) -> torch.Tensor:
    """(B, T, V): the logits after each token of ``idx`` (B, T), fed one token a step through ``cache``."""
    check_cache(model, cache)
    if cache.length:
        raise ValueError(f"cache must be empty (every token of idx is fed through it), got one holding "
                         f"{cache.length} position(s): pass a new cache, or call cache.reset()")
    check_id_tensor(idx, model.config.vocab_size, batch=cache.batch_size, room=cache.max_len)
    dec = CacheDecoder(model, cache)
    return torch.stack([dec(idx[:, t: t + 1]) for t in range(idx.shape[1])], dim=1)


def cache_cost(reference: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> dict:
    """Compare ``logits`` with the full cache's ``reference`` (both (B, T, V)) on ``targets`` (B, T)."""
    check_cost_inputs(reference, logits, targets)
    log_p, log_q = F.log_softmax(reference.float(), -1), F.log_softmax(logits.float(), -1)  # (B, T, V)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1, dtype=torch.float64)              # (B, T)
    kl = kl.clamp(min=0)  # KL >= 0: a negative sum is float32 rounding of two near-equal distributions
    if not bool(torch.isfinite(kl).all()):  # any NaN or inf logit makes its position's KL NaN or inf
        for name, t in (("reference", reference), ("logits", logits)):
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name} holds NaN or inf; allowed are finite logits")
    nats = F.nll_loss(log_q.flatten(0, 1), targets.flatten()).double()            # cross-entropy, log_q reused
    agree = (reference.argmax(-1) == logits.argmax(-1)).double().mean()
    return {"nats_per_token": float(nats), "kl": float(kl.mean()), "top1_agreement": float(agree)}


def check_cost_inputs(reference, logits, targets) -> None:
    """Floating logits (B, T, V), the same shape twice, and int64 targets (B, T) in [0, V).

    Finiteness is checked by :func:`cache_cost` on its result (a NaN or inf logit shows in the KL), sparing
    a pass over two large tensors."""
    for name, t in (("reference", reference), ("logits", logits)):
        check_tensor(name, t, "a floating tensor of shape (B, T, V)", lambda t: t.is_floating_point() and t.dim() == 3)
        if 0 in t.shape:
            raise ValueError(f"{name} must have B, T and V >= 1, got shape {tuple(t.shape)}")
    if logits.shape != reference.shape:
        raise ValueError(f"logits must have the shape of reference {tuple(reference.shape)}, got {tuple(logits.shape)}")
    check_tensor("targets", targets, "an int64 tensor of shape (B, T)", lambda t: t.dtype == torch.long)
    if targets.shape != logits.shape[:2]:
        raise ValueError(f"targets must have shape (B, T) = {tuple(logits.shape[:2])}, got {tuple(targets.shape)}")
    lo, hi = (int(v) for v in targets.aminmax())
    if lo < 0 or hi >= logits.shape[2]:
        raise ValueError(f"targets hold ids {lo}..{hi}; allowed are ids in [0, {logits.shape[2]})")


@torch.inference_mode()
def attention_weights(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """(L, B, H, T, T): every layer's causal attention weights over ``idx`` (B, T), multi-head models.

    Each layer's queries and keys, as :func:`kvlib.model.watching_attention` hands them over; the weights are
    softmax(q k^T / sqrt(D)) under the causal mask, what the model's attention computes inside its fused kernel.
    """
    check_gpt(model)
    if not model.config.multi_head:
        raise ValueError("model must be a multi-head attention model (one key/value head per query head): "
                         f"attention_weights reads its fused q, k, v, got {model.config}")
    check_id_tensor(idx, model.config.vocab_size, room=model.config.block_size)
    captured = []
    with watching_attention(model, lambda layer, q, k, v: captured.append((q, k))):
        model(idx)
    T, D = idx.shape[1], model.config.head_size
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    weights = []
    for q, k in captured:                                                  # (B, H, T, D) each
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        weights.append(scores.masked_fill(~causal, float("-inf")).softmax(-1))
    return torch.stack(weights)
