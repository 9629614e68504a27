"""Proof that the cache changes nothing: cached decoding against full recomputation."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .checks import check_int, check_model, check_real, check_token_ids, describe
from .cache import ContextLimitError
from .decoding import CachedDecoder, check_token_lists, generate, generate_uncached, pad_prompts
from .model import GPT
from .paged import KV_BLOCK_SIZE, PagedKVCache, ceil_div

# ---- input checks of this module ------------------------------------------------------------

def check_verify_inputs(model, idx, steps) -> None:
    """``verify_cache``: one int64 prompt (1, P) that fits the block, and 1 <= steps <= block - P + 1."""
    check_model(model)
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long:
        raise TypeError(f"idx must be an int64 tensor of token ids (1, P), got {describe(idx)}")
    if idx.dim() != 2 or idx.shape[0] != 1:
        raise ValueError(f"idx must hold one prompt, shape (1, P), got shape {tuple(idx.shape)}")
    block = model.config.block_size
    P = idx.shape[1]
    if P == 0:
        raise ValueError("verify_cache needs a prompt of at least one token, got shape (1, 0)")
    if P > block:
        raise ContextLimitError(f"the prompt has {P} tokens but the model's block holds {block}: no step fits; "
                                f"keep the last {block} tokens at most")
    check_int("steps", steps, 1, block - P + 1,
              f"an int in [1, {block - P + 1}] for a {P}-token prompt and block size {block}")


ATOL = 1e-4             # for float32 and float64 models
ROUNDING_STEPS = 4      # a difference this many of the dtype's spacings apart may be rounding alone


def check_batch_inputs(model, prompts, steps) -> None:
    """``check_batch_consistency``: token-id lists that fit the block, and steps >= 1."""
    check_model(model)
    prompts = check_token_lists(prompts, 0)
    block = model.config.block_size
    longest = max(len(p) for p in prompts)
    if longest > block:
        raise ContextLimitError(f"prompt {max(range(len(prompts)), key=lambda i: len(prompts[i]))} has {longest} "
                                f"tokens but the model's block holds {block}")
    check_int("steps", steps, 1, block - longest + 1,
              f"an int in [1, {block - longest + 1}] for a longest prompt of {longest} tokens and block size {block}")
    for i, p in enumerate(prompts):
        if max(p) >= model.config.vocab_size:
            raise ValueError(f"prompt {i} holds token id {max(p)}, outside the vocabulary [0, {model.config.vocab_size})")


def check_atol(atol) -> float:
    """A tolerance on logits: a finite number > 0 (inf would pass anything, 0 or less nothing)."""
    return check_real("atol", atol, 0.0, open_min=True)


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
    dtype: str = "torch.float32"   # the model's
    rounding_step: float = 0.0     # the dtype's spacing at the largest recomputed |logit|

    @property
    def passed(self) -> bool:
        """Logits within atol, and any divergence excused only by a near-tie (:func:`is_near_tie`)."""
        excused = self.first_divergence is None or is_near_tie(self.divergence_margin, self.atol)
        return self.max_abs_logit_diff <= self.atol and excused

    @property
    def hint(self) -> str | None:
        """Why a failure may be rounding alone: an atol finer than the model's dtype can tell apart."""
        step = self.rounding_step
        sixteen_bit = self.dtype in ("torch.float16", "torch.bfloat16")  # a float32 copy rounds finer only then
        if not sixteen_bit or self.passed or self.atol >= step or self.max_abs_logit_diff > ROUNDING_STEPS * step:
            return None
        return (f"the largest difference, {self.max_abs_logit_diff:.3g}, is within {ROUNDING_STEPS} rounding steps of "
                f"{self.dtype} at these logits (a step is {self.rounding_step:.3g} there), while atol is "
                f"{self.atol:g}: the cached and recomputed passes round differently, so this tolerance cannot pass "
                f"in {self.dtype}; verify a float32 copy (copy.deepcopy(model).float()) or pass "
                f"atol={ROUNDING_STEPS * self.rounding_step:.3g}")


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
    check_verify_inputs(model, idx, steps)
    atol = check_atol(atol)
    P = idx.shape[1]
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
        tokens=seq[0, P:].tolist(), atol=atol, dtype=str(recomputed.dtype), rounding_step=spacing(recomputed))


def spacing(x: torch.Tensor) -> float:
    """The distance between neighbouring values of ``x``'s floating dtype at its largest finite magnitude
    (0.0 when it holds none but zeros)."""
    finite = x[x.isfinite()].abs()
    largest = float(finite.max()) if finite.numel() else 0.0
    return torch.finfo(x.dtype).eps * 2.0 ** math.floor(math.log2(largest)) if largest > 0 else 0.0


def is_near_tie(gap: float, atol: float = ATOL) -> bool:
    """Whether two scores ``gap`` apart are a near-tie: closer than ``atol``, so rounding may order them either way.

    The one rule by which every proof here (``verify_cache``, batches, ``greedy_agreement``, ``verify_paged``)
    excuses two greedy runs that part.
    """
    return abs(gap) < atol


def _margins(logits: torch.Tensor) -> list[float]:
    """Top-1 minus top-2 logit of each row of (n, V) logits."""
    top2 = logits.topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


@torch.inference_mode()
def greedy_agreement(model: GPT, prompt, a, b, atol: float = ATOL) -> str:
    """How two greedy continuations of ``prompt`` agree when different arithmetic wrote them (a batch and a
    single row, a verify pass and single steps): "same"; "near-tie", if they part where the model's scores
    for their two tokens lie within ``atol``, so that rounding may pick either (``verify_cache``'s excuse);
    else "differ". Token ids as lists or 1-D tensors, the prompt not repeated in ``a`` and ``b``."""
    check_model(model)
    atol = check_atol(atol)
    vocab = model.config.vocab_size
    prompt, a, b = (check_token_ids(x, vocab, name) for x, name in ((prompt, "prompt"), (a, "a"), (b, "b")))
    first = next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None:
        return "same" if len(a) == len(b) else "differ"
    context = prompt + a[:first]
    if not 0 < len(context) <= model.config.block_size:
        raise ContextLimitError(f"the continuations part after {len(context)} tokens, where the model's block holds "
                                f"{model.config.block_size}: nothing to compare them by")
    logits = model(torch.tensor([context], device=model.lm_head.weight.device))[0][0, -1]  # (V,)
    return "near-tie" if is_near_tie(float(logits[a[first]] - logits[b[first]]), atol) else "differ"


def near_tie_note(n: int, atol: float = ATOL) -> str:
    """A report's words for ``n`` continuations that :func:`greedy_agreement` found parting at a near-tie."""
    check_int("n", n, 0)
    return (f" ({n} answer{'s' * (n != 1)} parted where the model's two best scores were within {atol:g}, so "
            f"rounding may pick either: the same up to rounding)") if n else ""


def _compare(tokens, logits, ref_tokens, ref_logits, ref_margins, atol) -> dict:
    """One row of one loop against the same prompt's reference run: tokens, logits, and the excuse.

    Over the steps both runs made (a padded batch may reach the block's end sooner), logits are
    compared up to and including the first step whose token differs (the prefixes are equal until
    then); a differing token is excused only if the reference margin there is below atol.
    """
    n = min(len(tokens), len(ref_tokens))
    first = next((t for t in range(n) if tokens[t] != ref_tokens[t]), None)
    upto = n if first is None else first + 1
    diff = (logits[:upto] - ref_logits[:upto]).abs().max().item() if upto else 0.0
    margin = None if first is None else ref_margins[first]
    return {"equal": first is None, "first_divergence": first,
            "divergence_margin": margin, "excused": first is not None and is_near_tie(margin, atol),
            "max_abs_logit_diff": diff}


@torch.no_grad()
def check_batch_consistency(model: GPT, prompts: list[list[int]], steps: int, *, decoder=None,
                            atol: float = ATOL) -> dict:
    """Greedy: a left-padded batch against each prompt alone, and cached against recomputed.

    Four runs per prompt: the batch with the cache, the batch recomputed (``generate_uncached`` with
    the key mask), the prompt alone with the cache and alone recomputed. Batched runs are compared
    with the same loop alone, and the cached single run with the recomputed one. Logits must agree
    within ``atol``; a differing token is excused only where the single prompt's margin (top-1 minus
    top-2 logit) at that step is below ``atol``, as in ``verify_cache``: a near-tie rounding can flip.
    """
    check_batch_inputs(model, prompts, steps)
    atol = check_atol(atol)
    idx, mask = pad_prompts(prompts)
    block = model.config.block_size

    def run(loop, x, m):
        logits = []
        kwargs = {} if m is None else {"key_mask": m}
        if loop == "cached":
            out = generate(model, x, steps, temperature=0.0, logits_hook=_record_logits(logits),
                           decoder=decoder, **kwargs)
        else:
            out = generate_uncached(model, x, steps, block_size=block, temperature=0.0,
                                    logits_hook=_record_logits(logits), **kwargs)
        return out.new_tokens.tolist(), torch.stack(logits, 1)  # (B, n), (B, n, V)

    batch = {loop: run(loop, idx, mask) for loop in ("cached", "uncached")}
    rows = []
    for b, p in enumerate(prompts):
        one = torch.tensor([p])
        single = {loop: run(loop, one, None) for loop in ("cached", "uncached")}
        tokens = {k: v[0][0] for k, v in single.items()}
        logits = {k: v[1][0] for k, v in single.items()}
        margins = {k: _margins(v) for k, v in logits.items()}
        pairs = {
            "batch vs single (cached)": _compare(batch["cached"][0][b], batch["cached"][1][b],
                                                 tokens["cached"], logits["cached"], margins["cached"], atol),
            "batch vs single (uncached)": _compare(batch["uncached"][0][b], batch["uncached"][1][b],
                                                   tokens["uncached"], logits["uncached"], margins["uncached"], atol),
            "cached vs uncached (single)": _compare(tokens["cached"], logits["cached"], tokens["uncached"],
                                                    logits["uncached"], margins["uncached"], atol),
        }
        rows.append({
            "prompt_length": len(p),
            "batch_equals_single": pairs["batch vs single (cached)"]["equal"],
            "batch_uncached_equals_single": pairs["batch vs single (uncached)"]["equal"],
            "cached_equals_uncached": pairs["cached vs uncached (single)"]["equal"],
            "comparisons": pairs,
            "margins": margins["uncached"],
            "min_margin": min(margins["uncached"]),
            "max_abs_logit_diff": max(c["max_abs_logit_diff"] for c in pairs.values())})
    diff = max(r["max_abs_logit_diff"] for r in rows)
    ok = all(c["equal"] or c["excused"] for r in rows for c in r["comparisons"].values())
    return {"steps": steps, "rows": rows, "atol": atol, "consistent": ok and diff <= atol,
            "tokens_equal": all(c["equal"] for r in rows for c in r["comparisons"].values()),
            "max_abs_logit_diff": diff, "min_margin": min(r["min_margin"] for r in rows)}


# ---- two samples, one distribution? (notebook 8: sampled speculative decoding) ---------------------

def total_variation(a, b) -> float:
    """Half the L1 distance between two distributions, given as counts or probabilities."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return 0.5 * float((a / a.sum() - b / b.sum()).abs().sum())


def chi_square_homogeneity(a, b, min_expected: float = 5.0) -> float:
    """p-value of Pearson's test that two count vectors come from one distribution.

    Cells expected to hold fewer than ``min_expected`` counts in either sample are pooled into one.
    """
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    A, B = float(a.sum()), float(b.sum())
    n = a + b
    big = (n * min(A, B) / (A + B)) >= min_expected
    rows_a = torch.cat([a[big], a[~big].sum()[None]]) if (~big).any() else a[big]
    rows_b = torch.cat([b[big], b[~big].sum()[None]]) if (~big).any() else b[big]
    n = rows_a + rows_b
    keep = n > 0
    rows_a, rows_b, n = rows_a[keep], rows_b[keep], n[keep]
    if len(n) < 2:
        return 1.0
    ea, eb = n * A / (A + B), n * B / (A + B)
    stat = float(((rows_a - ea) ** 2 / ea + (rows_b - eb) ** 2 / eb).sum())
    df = len(n) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))


@dataclass
class PagedReport:
    """One request decoded through the paged cache against the static cache."""
    prompt_length: int
    steps: int
    max_abs_logit_diff: float
    tokens_equal: bool
    atol: float = ATOL
    parted: int = 0        # steps where the static cache's own greedy token differs from the paged one's
    near_ties: int = 0     # of which the two tokens' static scores lie within atol (rounding may pick either)

    @property
    def passed(self) -> bool:
        """Logits within ``atol`` at every step, and the same tokens except at near-ties."""
        return self.max_abs_logit_diff <= self.atol and self.parted == self.near_ties


@torch.inference_mode()
def verify_paged(model: GPT, prompts: list[list[int]], steps: int, *, num_blocks: int | None = None,
                 kv_block_size: int = KV_BLOCK_SIZE, atol: float = ATOL) -> list[PagedReport]:
    """Greedy-decode all ``prompts`` together through one paged cache; compare each with the static cache.

    For every request, its ``steps`` logits (paged, batched with the others) against the teaching model's
    over a ``KVCache`` (the request alone, fed the paged run's tokens), and the greedy tokens: the same,
    or parted only at near-ties (two scores within ``atol``, which rounding may order either way).
    """
    check_batch_inputs(model, prompts, steps)
    prompts = [list(map(int, p)) for p in prompts]
    kv_block_size = check_int("kv_block_size", kv_block_size, 1, model.config.block_size,
                              f"an int in [1, {model.config.block_size}] (the model's block size at most)")
    atol = check_atol(atol)
    need = sum(ceil_div(len(p) + steps, kv_block_size) for p in prompts)
    if num_blocks is None:
        num_blocks = need
    num_blocks = check_int("num_blocks", num_blocks, need, None,
                           f"None or an int >= {need} (blocks these prompts and steps need)")
    cache = PagedKVCache.for_model(model, num_blocks, kv_block_size, enable_prefix_caching=False)
    sids = list(range(len(prompts)))
    for sid, p in zip(sids, prompts):
        cache.add_sequence(sid, p)
    paged_logits, paged_tokens = [], []
    logits = cache.forward(model, sids, prompts)                               # prefill, all at once
    for n in range(steps):
        paged_logits.append(logits)
        nxt = logits.argmax(-1)
        paged_tokens.append(nxt)
        if n + 1 < steps:
            logits = cache.forward(model, sids, [[int(t)] for t in nxt])
    paged_logits, paged_tokens = torch.stack(paged_logits, 1), torch.stack(paged_tokens, 1)  # (B, steps, V)
    reports = []
    for r, p in enumerate(prompts):
        # The request alone, through the teaching model and a KVCache, fed the paged run's own tokens: both
        # see the same text at every step, even where rounding sent a near-tie the other way.
        fed = paged_tokens[r].tolist()
        alone = CachedDecoder(model, 1, len(p) + steps)
        static = torch.cat([alone(torch.tensor([p]))] + [alone(torch.tensor([[t]])) for t in fed[:-1]])  # (steps, V)
        diff = (static - paged_logits[r]).abs().max().item()
        own = static.argmax(-1).tolist()
        parted = [n for n in range(steps) if own[n] != fed[n]]
        ties = sum(is_near_tie(float(static[n, own[n]] - static[n, fed[n]]), atol) for n in parted)
        reports.append(PagedReport(len(p), steps, diff, not parted, atol, len(parted), ties))
    return reports
