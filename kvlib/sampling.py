"""Turning one row of logits into the next token: temperature -> top-k -> top-p -> draw.

Every function takes logits of shape (B, V), B rows of V vocabulary scores, and returns a new
tensor. The filters never renormalise: they set the scores of dropped tokens to -inf, so a
softmax afterwards gives those tokens probability 0 and shares the mass among the rest.
``probabilities`` is the one code path from logits to the distribution; ``sample_next`` draws
from exactly what it returns.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch


__all__ = ["Sampling", "ban", "only", "token_mask", "apply_temperature", "top_k_filter", "top_p_filter", "probabilities", "sample_next",
           "first_maximum"]

_NUMPY_DTYPES = (torch.float16, torch.float32, torch.float64)


class _Settings(NamedTuple):
    temperature: float
    top_k: int | None
    top_p: float | None


class Sampling(_Settings):
    """How the next token is chosen, checked once when made: ``Sampling(temperature, top_k, top_p)``.

    A tuple, so ``sample_next(logits, *sampling, generator=g)`` and ``t, k, p = sampling`` work. Decoding
    loops, drafts and servers make one before they start and pass it down; a bad setting is refused
    there, before any token is written. Temperature 0 is greedy; None switches top-k or top-p off.
    """

    def __new__(cls, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None):
        return super().__new__(cls, check_temperature(temperature), check_top_k(top_k), check_top_p(top_p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def first_maximum(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum, (B, V) -> (B,) int64: ``logits.argmax(-1)``'s answer (a NaN counts as the maximum).

    The greedy token. On the CPU, PyTorch's argmax over the last axis goes through a row's entries one
    at a time, about 15 µs for a row of our 6,289 scores, so a batch of 18 rows or a verify pass of 9
    pays that 18 or 9 times; NumPy's argmax uses vector instructions and takes about 1 µs a row. For a
    CPU tensor NumPy knows (no copy: NumPy reads the tensor's memory), NumPy does it; else PyTorch.
    """
    if logits.device.type == "cpu" and logits.dtype in _NUMPY_DTYPES and logits.dim() == 2 and logits.shape[-1]:
        return torch.from_numpy(logits.detach().numpy().argmax(-1))
    return logits.argmax(-1)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Scale logits (B, V) -> (B, V) so that softmax gives ``softmax(logits / temperature)``.

    ``temperature`` must be a finite number >= 0. Below 1 the distribution sharpens, above 1 it
    flattens. At 0 the limit is returned: 0 for each row's first argmax, -inf everywhere else.
    Every finite value is safe: outside [1e-30, 1e30] the division is done in float64 (float64
    scores are returned), so 1e-300 gives the argmax's one-hot and 1e300 the uniform distribution
    over the tokens that are not banned (-inf stays -inf).
    """
    logits, temperature = check_logits(logits), check_temperature(temperature)
    # Softmax ignores a constant added to a row, so shift each row's maximum to 0 first:
    # the result has the same softmax as logits / T, and a tiny T cannot overflow to +inf.
    shifted = logits - logits.amax(dim=-1, keepdim=True)                  # (B, V), max 0 per row
    if temperature == 0:
        # The T -> 0 limit: only the (first) argmax survives.
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep.scatter_(-1, logits.argmax(dim=-1, keepdim=True), True)       # (B, V)
        return shifted.masked_fill(~keep, float("-inf"))
    if not 1e-30 <= temperature <= 1e30:
        # Far outside float32's range (1e39 is inf there, 1e-300 is 0): divide in float64, so that
        # the limits come out right (one-hot, uniform) and a banned -inf stays -inf, never NaN.
        shifted = shifted.double()
    return shifted / temperature                                           # (B, V)


def top_k_filter(logits: torch.Tensor, k: int | None) -> torch.Tensor:
    """Keep the ``k`` largest logits of each row (B, V) -> (B, V); the rest become -inf.

    ``k`` must be an int >= 1 (None: no filter); ``k`` > V keeps everything. Tokens tied with the k-th
    largest value are all kept, so a row may keep more than ``k`` tokens.
    """
    logits, k = check_logits(logits), check_top_k(k)
    if k is None:
        return logits.clone()
    k = min(k, logits.shape[-1])                                           # k > V keeps everything
    kth = logits.topk(k, dim=-1).values[:, -1:]                            # (B, 1) k-th largest
    return logits.masked_fill(logits < kth, float("-inf"))                # ties with kth are kept


def top_p_filter(logits: torch.Tensor, p: float | None) -> torch.Tensor:
    """Keep the nucleus of each row (B, V) -> (B, V); the rest become -inf.

    The nucleus is the shortest run of tokens, taken by descending probability (stable sort,
    so ties go to the lower token id), whose probability mass is at least ``p``. A token is
    dropped once the mass of the tokens strictly before it has reached ``p``; the most likely
    token is always kept. ``p`` must be in (0, 1] (None: no filter); ``p`` = 1 keeps everything.
    """
    logits, p = check_logits(logits), check_top_p(p)
    if p is None or p == 1:
        return logits.clone()                                              # the whole vocabulary
    probs = logits.softmax(dim=-1, dtype=torch.float32)                   # (B, V)
    # Stable descending sort: among equal probabilities the lower token id comes first.
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # (B, V) each
    before = sorted_probs.cumsum(dim=-1) - sorted_probs                    # mass strictly before each
    drop_sorted = before >= p                                              # the nucleus is already full
    drop_sorted[:, 0] = False                                              # the top token always stays
    drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def ban(logits: torch.Tensor, banned: torch.Tensor) -> torch.Tensor:
    """(B, V) logits with the ``banned`` (V,) tokens set to -inf."""
    check_token_mask(logits, banned, "banned")
    return logits.masked_fill(banned, float("-inf"))


def only(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """(B, V) logits with everything outside ``allowed`` (V,) set to -inf."""
    check_token_mask(logits, allowed, "allowed")
    return logits.masked_fill(~allowed, float("-inf"))


def token_mask(ids, vocab_size: int) -> torch.Tensor:
    """(V,) bool, True at the token ``ids`` (checked ids, such as ``check_banned``'s): the mask ``ban`` takes."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[list(ids)] = True
    return mask


def probabilities(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None) -> torch.Tensor:
    """The distribution (B, V) that ``sample_next`` draws from: rows sum to 1, dropped tokens are 0.

    Order: temperature -> top-k -> top-p -> softmax. At temperature 0 each row is one-hot on its
    (first) argmax and the filters are skipped, though their arguments are still checked.
    Probabilities are float32, or float64 when the logits are float64.
    """
    temperature, top_k, top_p = Sampling(temperature, top_k, top_p)
    scores = apply_temperature(logits, temperature)                       # (B, V)
    if temperature > 0:
        scores = top_p_filter(top_k_filter(scores, top_k), top_p)
    dtype = torch.promote_types(logits.dtype, torch.float32)
    return scores.softmax(dim=-1, dtype=dtype)                             # (B, V)


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick the next token of each row: logits (B, V) -> token ids (B, 1), int64.

    Draws one token from ``probabilities(logits, temperature, top_k, top_p)``. Temperature 0 is
    greedy (argmax) and draws nothing. With a ``generator`` only that generator is consumed, so the
    global RNG (``torch.get_rng_state()``) is left as it was; with ``generator=None`` the draw
    uses the global RNG, as ``torch.multinomial`` does.
    """
    check_generator(generator)
    temperature, top_k, top_p = Sampling(temperature, top_k, top_p)
    if temperature == 0:
        return first_maximum(check_logits(logits)).unsqueeze(-1)           # the first maximum, as one-hot would
    return torch.multinomial(probabilities(logits, temperature, top_k, top_p), 1, generator=generator)  # (B, 1)


# ---- the sampler's own checks ---------------------------------------------------------------------

def check_temperature(temperature) -> float:
    """Any finite number >= 0: 0 is argmax, and sampling stays exact at both extremes (1e-300, 1e300)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number >= 0, got {temperature!r}")
    try:
        temperature = float(temperature)
    except OverflowError:
        raise ValueError(f"temperature must be a finite number >= 0 (0 means argmax), got {temperature!r}") from None
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 means argmax), got {temperature!r}")
    return temperature


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
    # A -inf entry (a banned token) is fine, but NaN, +inf, or a row with nothing left to sample
    # cannot be turned into probabilities. One pass finds all three: a row's maximum is NaN if
    # the row holds a NaN, +inf if it holds +inf, and -inf if every entry is -inf; the lowest and
    # highest of the rows' maxima show any of them (NaN comes out of both). Two calls: this runs
    # on every step of a decoder.
    maxima = logits.amax(dim=-1)                                           # (B,)
    if maxima.numel() and not all(map(math.isfinite, maxima.aminmax())):
        row = int((~torch.isfinite(maxima)).nonzero()[0, 0])
        raise ValueError(f"{name} row {row} cannot be sampled: it contains NaN or +inf, or every "
                         f"entry is -inf; allowed are finite values and -inf for banned tokens")
    return logits


def check_token_mask(logits, mask, name: str) -> None:
    """A (V,) bool mask over the vocabulary of (B, V) logits."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 1 or (
            isinstance(logits, torch.Tensor) and logits.shape[-1:] != mask.shape):
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        v = logits.shape[-1] if isinstance(logits, torch.Tensor) else "V"
        raise ValueError(f"{name} must be a bool tensor of shape (V,) = ({v},), got {got}")


def check_generator(generator) -> torch.Generator | None:
    """A sampling loop draws from ``generator`` (a ``torch.Generator``), or from the global RNG if None."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return generator
