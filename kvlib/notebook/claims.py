"""Prose that cannot drift from its numbers: a sentence that depends on the run is checked where it is shown.

A notebook's markdown says only what holds on every machine; a claim about *this* run ("流 is outside
the top 8", "the cache changes no token") is restated in the code cell that shows the evidence::

    claim(rank > 8, "流 is not among the model's top 8", f"rank {rank}")

It prints the claim with a tick, or fails the cell (and so nbval) with the claim quoted and the
evidence that contradicts it, for example after a retrain. A claim must hold on every machine.

What only this machine decides (which loop was faster, whether two threads helped) is never a claim:
:func:`measured` prints what this run saw, either way, and never stops the notebook::

    measured(with_cache < without, "the prefill behind a cached prefix was faster", f"{with_cache:.1f} ms")

Seeded samples are the same on every run of one machine, but not promised across machines: PyTorch
may draw another stream of random numbers on another processor family. What a few seeded draws show
is reported by :func:`seen`, either way, like a measurement.
"""
from __future__ import annotations


class ClaimError(AssertionError):
    """A sentence of the notebook is contradicted by this run."""


def claim(holds, text: str, evidence: str = "") -> None:
    """Print ``✓ text`` when ``holds`` is true; otherwise raise :class:`ClaimError` quoting it.

    It returns nothing, so a cell that ends with a claim shows its line once.
    """
    if not isinstance(text, str) or not text:
        raise TypeError(f"text must be the sentence being checked, got {text!r}")
    if not bool(holds):
        raise ClaimError(f"the notebook says “{text}”, but this run disagrees"
                         + (f": {evidence}" if evidence else ""))
    print(f"✓ {text}" + (f"  ({evidence})" if evidence else ""))


def measured(holds, text: str, evidence: str = "", *, within_noise: bool = False) -> None:
    """Print what this machine's timings showed: ``text`` if ``holds``, else that it did not, this time.

    Timings move between machines and runs, so the prose never depends on them; this line reports the
    run's own verdict with its evidence, and a teacher's Run All goes on whichever way it fell.
    ``within_noise=True`` (the two timings' spreads overlap, :func:`kvlib.tools.timing.verdict`) says so
    instead of either answer.
    """
    if not isinstance(text, str) or not text:
        raise TypeError(f"text must be the sentence being reported, got {text!r}")
    if within_noise:
        said = f"measured here, within noise this time: {text}"
    else:
        said = f"measured here: {text}" if bool(holds) else f"measured here, not so this time: {text}"
    print(said + (f"  ({evidence})" if evidence else ""))


def seen(holds, text: str, evidence: str = "") -> None:
    """Print what this run's seeded draws showed: ``text`` if ``holds``, else that they did not, this time.

    For a statement about a handful of samples, which another machine's random stream may change;
    it never stops the notebook.
    """
    if not isinstance(text, str) or not text:
        raise TypeError(f"text must be the sentence being reported, got {text!r}")
    said = f"seen in this run: {text}" if bool(holds) else f"not so in this run: {text}"
    print(said + (f"  ({evidence})" if evidence else ""))
