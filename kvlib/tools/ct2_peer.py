"""CTranslate2 running our weights: the C++ inference engine that the fast path is measured against.

The model is exported in the Hugging Face GPT-2 layout (:func:`kvlib.tools.export.export`) and converted by
CTranslate2's own converter into a temporary folder. Both do the same arithmetic on the same weights, so
what separates their times is the cost around the arithmetic (operator calls, Python), notebook 5's
lesson. Before any timing, its logits are checked against ours (within 1e-4) and its greedy tokens too
(up to near-ties). ``python -m kvlib bench`` times one stream and a batch of eight with it.
"""
from __future__ import annotations

import importlib.util
import json
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from ..model import GPT
from ..verify import greedy_agreement
from .timing import interleaved, verdict

CT2_EXTRA = "pip install -e .[bench] (ctranslate2 and transformers)"
LOGIT_ATOL = 1e-4


@contextmanager
def quiet_loading():
    """transformers' progress bars off while the block runs (a notebook would show them as a widget), then as before."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def ctranslate2_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("ctranslate2", "transformers"))


class CT2Peer:
    """Our model in CTranslate2; ``greedy(prompts, n)`` writes n tokens after each prompt, all in one batch."""

    def __init__(self, model: GPT, tokenizer):
        import ctranslate2

        from .export import export

        self.model, self.folder = model, Path(tempfile.mkdtemp(prefix="kvlib-ct2-"))
        with torch.random.fork_rng(devices=[]), quiet_loading():  # building the copies draws (then overwritten) weights
            export(model, tokenizer, self.folder / "hf")
            ctranslate2.converters.TransformersConverter(str(self.folder / "hf")).convert(str(self.folder / "ct2"))
        self.vocabulary = json.loads((self.folder / "ct2" / "vocabulary.json").read_text(encoding="utf-8"))
        self.generators: dict[int, object] = {}
        self.version = ctranslate2.__version__

    def generator(self, threads: int):
        """One CTranslate2 generator per thread count (its threads are fixed when it is made)."""
        import ctranslate2

        if threads not in self.generators:
            self.generators[threads] = ctranslate2.Generator(str(self.folder / "ct2"), device="cpu",
                                                             intra_threads=threads, inter_threads=1)
        return self.generators[threads]

    def greedy(self, prompts: list[list[int]], n: int) -> torch.Tensor:
        """(B, P + n) token ids: ``n`` greedy tokens after each prompt (all of one length P), none stopping early,
        on as many threads as PyTorch is set to use (so that interleaved rounds set both)."""
        return torch.tensor([p + new for p, new in zip(prompts, self.greedy_ragged(prompts, n))])

    def greedy_ragged(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        """``n`` greedy new tokens after each prompt (of any lengths), one batch: the new tokens of each."""
        start = [[self.vocabulary[i] for i in p] for p in prompts]
        results = self.generator(torch.get_num_threads()).generate_batch(
            start, max_length=n, sampling_topk=1, include_prompt_in_result=False, end_token=[])
        return [r.sequences_ids[0] for r in results]

    def logits(self, ids: list[int]) -> torch.Tensor:
        """(T, V) logits of every position of ``ids``."""
        import numpy as np

        return torch.from_numpy(np.array(self.generator(1).forward_batch([ids])))[0]

    def check(self, prompt: list[int], n: int) -> dict:
        """Its logits against ours on ``prompt`` and its greedy tokens against our fast path's."""
        with torch.inference_mode():
            ours = self.model(torch.tensor([prompt]))[0][0]
        diff = (self.logits(prompt) - ours).abs().max().item()
        from ..decoding import generate

        theirs = self.greedy([prompt], n)[0, len(prompt):]
        fast = generate(self.model, torch.tensor([prompt]), n, temperature=0.0).new_tokens[0]
        return {"max_abs_logit_diff": diff, "logits_within": diff <= LOGIT_ATOL,
                "greedy_tokens": greedy_agreement(self.model, torch.tensor(prompt), theirs, fast)}


def batch_rows(model: GPT, peer: CT2Peer, prompts: list[list[int]], n: int, rounds: int, threads: int) -> dict:
    """Our batched ``generate`` (the fast path, one batch of len(prompts) rows) against CTranslate2's batch on the
    same prompts, in interleaved rounds; tokens/s, the ratio and the verdict, and whether the tokens agree."""
    from ..decoding import generate

    idx = torch.tensor(prompts)
    ways = {"kvlib generate (fast path, batch)": lambda: generate(model, idx, n, temperature=0.0).tokens,
            "CTranslate2 generate_batch": lambda: peer.greedy(prompts, n)}
    ours, theirs = (way() for way in ways.values())
    agree = [greedy_agreement(model, idx[b], theirs[b, idx.shape[1]:], ours[b, idx.shape[1]:]) for b in range(len(prompts))]
    timed = interleaved(ways, rounds, n_threads=threads, min_run_time=1e-6)
    (a, ta), (b, tb) = timed.items()
    return {"rows": len(prompts), "new_tokens": n, "threads": threads,
            "tokens_per_s": {a: len(prompts) * n / ta.median, b: len(prompts) * n / tb.median},
            "spread_ms": {a: (ta.low * 1e3, ta.high * 1e3), b: (tb.low * 1e3, tb.high * 1e3)},
            "ours_vs_peer": tb.median / ta.median, "verdict": verdict(ta, tb),
            "tokens_agree": all(x != "differ" for x in agree), "near_ties": agree.count("near-tie")}


def format_batch(d: dict) -> str:
    (a, ra), (b, rb) = d["tokens_per_s"].items()
    return "\n".join([
        f"a batch of {d['rows']} prompts, {d['new_tokens']} greedy tokens each, {d['threads']} thread(s), interleaved rounds:",
        f"  {a:38s} {ra:8.0f} tokens/s  ({d['spread_ms'][a][0]:.1f}-{d['spread_ms'][a][1]:.1f} ms a batch)",
        f"  {b:38s} {rb:8.0f} tokens/s  ({d['spread_ms'][b][0]:.1f}-{d['spread_ms'][b][1]:.1f} ms a batch)",
        f"  kvlib ran {d['ours_vs_peer']:.2f}x CTranslate2's speed (ratio of medians): {d['verdict']}; "
        f"same tokens up to near-ties: {d['tokens_agree']} ({d['near_ties']} near-ties)"])
