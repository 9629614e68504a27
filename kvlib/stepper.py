"""Step through cached decoding one token at a time and look inside the cache.

:class:`CacheStepper` runs the real model over a real :class:`~kvlib.model.KVCache`: it prefills
the prompt once, then every :meth:`CacheStepper.step` picks one token from the last logits, feeds
that token alone, and records what a learner wants to see:

- the distribution the token was drawn from (its ten most likely entries, as ``probabilities``
  gives it for the sampler's settings: one bar at 100 % at temperature 0) and the token chosen;
- which positions of which layer now hold keys, read from the cache tensor itself;
- how the new token's query spread its attention over the cached positions, one row per head.

The attention weights are not a second copy of the model: :func:`kvlib.model.watching_attention` hands
over each layer's query of the new token, and the keys are the ones stored in ``cache.k``, so
``softmax(q . k / sqrt(D))`` is exactly what the model's attention computed.

:mod:`kvlib.notebook.cache_stepper` draws a :class:`StepView` and wraps the stepper in a widget.
"""
from __future__ import annotations

import math
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .checks import check_int, check_seed, check_text
from .tokenizer import check_pair, decode_complete, token_label
from .cache import ContextLimitError, check_multi_head
from .decoding import check_cache
from .guards import all_or_nothing, one_thread_at_a_time
from .model import GPT, watching_attention
from .sampling import Sampling, probabilities, sample_next
from .poems import encode_prompt, without_unk

TOP = 10  # bars in the distribution panel
_KEEP = object()  # set_sampling: "leave this setting as it is"


@dataclass
class StepView:
    """Everything one picture of the stepper shows (plain tensors and lists, no model)."""

    step: int                # 0 after the prefill, then 1, 2, ... one per Step
    tokens: list[int]        # every token in the cache: the prompt, then the chosen ones
    labels: list[str]        # how each of those tokens is shown
    prompt_length: int
    top_labels: list[str]    # the distribution's most likely tokens (and the chosen one, if not among them)
    top_probs: list[float]   # their probabilities; tokens of probability 0 are left out
    settings: tuple          # (temperature, top_k, top_p) of that distribution
    chosen: int | None       # the token drawn at this step (None before the first Step)
    chosen_label: str | None
    query_position: int      # position of the token whose attention is shown (the last one fed)
    attention: torch.Tensor  # (L, H, S): that token's weights over positions 0..S-1, rows sum to 1
    key_norms: torch.Tensor  # (L, max_len): mean |key| per layer and slot, 0 where nothing is written
    cache_length: int
    max_len: int

    @property
    def filled(self) -> torch.Tensor:
        """(L, max_len) bool: the slots of each layer that hold a key."""
        return self.key_norms > 0


ONE_KEY_PER_HEAD = "it shows one key per query head; step a multi-head model such as the shipped tang-char"
_locks: "weakref.WeakKeyDictionary[GPT, threading.Lock]" = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()


def _model_lock(model: GPT) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(model, threading.Lock())

def last_token_attention(cache, queries: dict[int, torch.Tensor], config) -> torch.Tensor:
    """(L, H, S): softmax(q . k / sqrt(D)) of the last fed token over the S keys of ``cache`` (batch row 0).

    ``queries[layer]`` is that token's query (C,); the keys are read from the cache buffer, what the
    model's attention read.
    """
    S = cache.length
    H, D = config.n_head, config.head_size
    rows = []
    for layer in range(config.n_layer):
        q = queries[layer].view(H, D, 1)                   # (H, D, 1)
        keys = cache.k[layer, 0, :, :S]                    # (H, S, D): what the cache stores
        scores = (keys @ q).squeeze(-1) / math.sqrt(D)     # (H, S); the last token sees all S keys
        rows.append(scores.softmax(-1))
    return torch.stack(rows)


class CacheStepper:
    """Cached decoding of one prompt, one token per :meth:`step`, with its inside on show.

    ``temperature``, ``top_k`` and ``top_p`` are the sampler's settings; temperature 0 is greedy.
    :meth:`set_sampling` changes them between steps: the steps taken stay, the next one uses the new
    settings. Draws use a ``torch.Generator`` seeded with ``seed``, so the global RNG is never touched
    and the same settings give the same tokens as ``generate`` with the ``no_unk`` hook: ``<unk>`` is
    never drawn, since the stepper writes text for people. The bars show what the token is drawn from,
    ``probabilities(logits, temperature, top_k, top_p)``, the sampler's own distribution: at
    temperature 0 one bar at 100 %, the argmax.
    """

    def __init__(self, model: GPT, tokenizer, prompt: str = "", *, temperature: float = 0.8,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 1337,
                 top: int = TOP, max_len: int | None = None):
        check_pair(model, tokenizer)
        check_multi_head(model.config, "CacheStepper", ONE_KEY_PER_HEAD)
        self.settings = Sampling(temperature, top_k, top_p)  # what the next step draws with
        self.model, self.tokenizer = model, tokenizer
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str of Chinese characters, got {prompt!r:.60}")
        check_text(prompt, "prompt")
        self.prompt = prompt
        self.prompt_ids = encode_prompt(tokenizer, prompt)  # the poem separator, then the prompt
        self.seed = check_seed(seed)
        self.top = check_int("top", top, 1, tokenizer.vocab_size)
        self.max_len = check_int("max_len", model.config.block_size if max_len is None else max_len, 1,
                                 model.config.block_size)
        if len(self.prompt_ids) > self.max_len:
            raise ContextLimitError(
                f"the prompt takes {len(self.prompt_ids)} tokens but the cache holds {self.max_len}")
        self.reset()

    # ---- decoding ---------------------------------------------------------------------------

    @one_thread_at_a_time
    def reset(self) -> None:
        """Empty the cache, reseed the generator and prefill the prompt again."""
        self.generator = torch.Generator().manual_seed(self.seed)
        self.cache = self.model.new_cache(1, self.max_len)
        self.tokens = list(self.prompt_ids)
        self.steps = 0
        self.chosen: int | None = None
        self._feed(self.prompt_ids)
        self._shown = self._display_probs(self.logits)  # the upcoming distribution
        self._shown_settings = self.settings

    @property
    def temperature(self) -> float:
        return self.settings.temperature

    @one_thread_at_a_time
    def set_sampling(self, temperature: float | None = None, top_k=_KEEP, top_p=_KEEP) -> None:
        """New sampler settings from the next step on; the steps taken so far stay as they were.

        Arguments left out keep their value (``None`` switches top-k or top-p off). Before the first
        step the bars show the upcoming distribution, so they are redrawn with the new settings; after
        it they show what the last token was drawn from, with the settings it was drawn with.
        """
        old = self.settings
        settings = Sampling(old.temperature if temperature is None else temperature,
                            old.top_k if top_k is _KEEP else top_k, old.top_p if top_p is _KEEP else top_p)
        shown = probabilities(self.logits, *settings)[0] if self.steps == 0 else None
        self.settings = settings
        if shown is not None:
            self._shown, self._shown_settings = shown, settings

    @property
    def can_step(self) -> bool:
        """False once every slot of the cache is written: the next token would have nowhere to go."""
        return self.cache.length < self.cache.max_len

    @contextmanager
    def rollback_point(self):
        """What a step changes before it is done, put back if it raises: the generator's state (the cache
        advances only once every layer has written, and the text only at the end)."""
        before = self.generator.get_state()
        try:
            yield
        except BaseException:
            self.generator.set_state(before)
            raise

    @one_thread_at_a_time
    @all_or_nothing
    def step(self) -> int:
        """Draw the next token from the current logits, feed it through the cache; return its id."""
        check_cache(self.model, self.cache)  # the model may have been converted (model.double()) since
        if not self.can_step:
            raise ContextLimitError(
                f"the cache is full ({self.cache.max_len} positions): reset to start again")
        drawn_from, settings = self._display_probs(self.logits), self.settings
        nxt = int(sample_next(self.logits, *self.settings, self.generator))
        self._feed([nxt])  # advances cache.length only once every layer has written
        self._shown, self._shown_settings, self.chosen = drawn_from, settings, nxt
        self.tokens.append(nxt)
        self.steps += 1
        return nxt

    def run(self, n: int) -> list[int]:
        """``n`` steps (fewer if the cache fills up: the steps stop there, by design); the ids chosen."""
        n = check_int("n", n, 0)
        chosen = []
        while len(chosen) < n and self.can_step:
            chosen.append(self.step())
        return chosen

    def _display_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(V,) what ``sample_next`` draws from with the current settings (one-hot at temperature 0)."""
        return probabilities(logits, *self.settings)[0]

    @torch.inference_mode()
    def _feed(self, ids: list[int]) -> None:
        """Run ``ids`` through the model with the cache; keep the last logits and that token's attention.

        The forward hooks that catch the queries live on the model's modules, so two steppers of one
        model (two threads, two widgets) take turns: a lock per model makes their hooks never overlap.
        """
        with _model_lock(self.model):
            self._feed_locked(ids)

    def _feed_locked(self, ids: list[int]) -> None:
        queries: dict[int, torch.Tensor] = {}
        me = threading.get_ident()

        def keep_query(layer, q, k, v):  # q (1, H, T, D): the fed tokens' queries
            if threading.get_ident() == me:  # not another thread's forward pass through this model
                queries[layer] = q[0, :, -1].reshape(-1).clone()  # the last fed token's query (C,)

        with watching_attention(self.model, keep_query):
            logits, _ = self.model(torch.tensor([ids]), cache=self.cache)
        self.logits = without_unk(self.tokenizer, logits[:, -1])  # (1, V): the scores the next token is drawn by
        self.attention = last_token_attention(self.cache, queries, self.model.config)

    # ---- what to show -----------------------------------------------------------------------

    def key_norms(self) -> torch.Tensor:
        """(L, max_len) mean absolute key per layer and slot, read from the cache buffer."""
        return self.cache.k[:, 0].abs().mean(dim=(1, 3))  # average over heads and channels

    def view(self) -> StepView:
        probs, ids = self._shown.topk(min(self.top, self._shown.numel()))
        kept = [(p, i) for p, i in zip(probs.tolist(), ids.tolist()) if p > 0]  # no bars of probability 0
        probs, ids = [p for p, _ in kept], [i for _, i in kept]
        if self.chosen is not None and self.chosen not in ids:  # a draw from the tail: show it too
            ids.append(self.chosen)
            probs.append(float(self._shown[self.chosen]))
        label = lambda i: token_label(self.tokenizer, i)  # noqa: E731
        return StepView(
            step=self.steps, tokens=list(self.tokens), labels=[label(i) for i in self.tokens],
            prompt_length=len(self.prompt_ids), top_labels=[label(i) for i in ids], top_probs=probs,
            settings=self._shown_settings,
            chosen=self.chosen, chosen_label=None if self.chosen is None else label(self.chosen),
            query_position=self.cache.length - 1, attention=self.attention.clone(),
            key_norms=self.key_norms(), cache_length=self.cache.length, max_len=self.cache.max_len)

    def text(self) -> str:
        """The prompt and everything chosen so far, decoded (poem separators become newlines)."""
        return decode_complete(self.tokenizer, self.tokens[1:])
