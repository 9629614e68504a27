"""Proof that the cache changes nothing: cached decoding against full recomputation."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .decoding import generate, generate_uncached, pad_prompts
from .model import GPT

ATOL = 1e-4


@dataclass
class CacheReport:
    steps: int
    max_abs_logit_diff: float
    step_diffs: list[float]        # max |cached - recomputed| logit per step
    chunk_maxima: list[float]      # the same, per 16 steps
    margins: list[float]           # top-1 minus top-2 recomputed logit per step
    tokens_equal: bool             # greedy tokens agree with the recomputed argmax at every step
    first_divergence: int | None   # first step where they differ
    divergence_margin: float | None
    tokens: list[int] = field(repr=False)
    atol: float = ATOL

    @property
    def passed(self) -> bool:
        """Logits within atol, and any divergence excused only by a near-tie (margin < atol)."""
        excused = self.first_divergence is None or self.divergence_margin < self.atol
        return self.max_abs_logit_diff <= self.atol and excused


def _record_logits(store: list):
    def hook(step, tokens, logits):
        store.append(logits.clone())
        return logits
    return hook


@torch.no_grad()
def verify_cache(model: GPT, idx: torch.Tensor, steps: int, *, decoder=None, atol: float = ATOL) -> CacheReport:
    """Decode ``steps`` greedy tokens after ``idx`` (1, P) with the cache; recompute each step's logits.

    One uncached forward over the final sequence gives every step's recomputed logits at once,
    since the causal mask makes position t depend on tokens up to t only.
    """
    if idx.dim() != 2 or idx.shape[0] != 1:
        raise ValueError(f"verify_cache takes one prompt of shape (1, P), got {tuple(idx.shape)}")
    P = idx.shape[1]
    if not 1 <= steps <= model.config.block_size - P + 1:
        raise ValueError(f"steps must be in [1, {model.config.block_size - P + 1}] for a {P}-token prompt "
                         f"and block size {model.config.block_size}, got {steps}")
    cached = []
    result = generate(model, idx, steps, temperature=0.0, logits_hook=_record_logits(cached), decoder=decoder)
    cached = torch.cat(cached)  # (steps, V)
    seq = result.tokens  # (1, P + steps)
    recomputed, _ = model(seq[:, :-1])
    recomputed = recomputed[0, P - 1:]  # (steps, V): the logits that chose each new token
    diffs = (cached - recomputed).abs().amax(-1)
    top2 = recomputed.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    agree = recomputed.argmax(-1) == seq[0, P:]
    first = None if bool(agree.all()) else int((~agree).nonzero()[0])
    step_diffs = diffs.tolist()
    return CacheReport(
        steps=steps, max_abs_logit_diff=max(step_diffs), step_diffs=step_diffs,
        chunk_maxima=[max(step_diffs[i:i + 16]) for i in range(0, steps, 16)],
        margins=margins.tolist(), tokens_equal=first is None, first_divergence=first,
        divergence_margin=None if first is None else float(margins[first]),
        tokens=seq[0, P:].tolist(), atol=atol)


@torch.no_grad()
def check_batch_consistency(model: GPT, prompts: list[list[int]], steps: int, *, decoder=None) -> dict:
    """Greedy: a left-padded batch against each prompt alone, and cached against recomputed."""
    idx, mask = pad_prompts(prompts)
    batch_logits = []
    batch = generate(model, idx, steps, temperature=0.0, key_mask=mask,
                     logits_hook=_record_logits(batch_logits), decoder=decoder)
    batch_logits = torch.stack(batch_logits, 1)  # (B, n, V)
    rows = []
    for b, p in enumerate(prompts):
        single_logits = []
        one = torch.tensor([p])
        single = generate(model, one, steps, temperature=0.0, logits_hook=_record_logits(single_logits),
                          decoder=decoder)
        plain = generate_uncached(model, one, steps, block_size=model.config.block_size, temperature=0.0)
        n = min(len(single_logits), batch_logits.shape[1])
        diff = (torch.cat(single_logits)[:n] - batch_logits[b, :n]).abs().max().item()
        rows.append({
            "prompt_length": len(p),
            "batch_equals_single": batch.new_tokens[b].tolist() == single.new_tokens[0].tolist(),
            "cached_equals_uncached": single.new_tokens[0].tolist() == plain.new_tokens[0].tolist(),
            "max_abs_logit_diff": diff})
    return {"steps": steps, "rows": rows,
            "consistent": all(r["batch_equals_single"] and r["cached_equals_uncached"] for r in rows),
            "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in rows)}
