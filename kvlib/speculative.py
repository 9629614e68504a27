"""Speculative decoding: a cheap draft guesses γ tokens, the target checks them all in one forward.

Reading order: the drafts are in :mod:`kvlib.drafts`; here, the acceptance rules
(:func:`accept_greedy`, :func:`accept_sampled`) and the loop that joins a draft to the target
(:class:`SpeculativeDecoder`, one round at a time, and :func:`speculative_generate`).

One round, with the target's cache holding every token but the last one:

1. the draft proposes d1 … dγ after the tokens so far;
2. the target runs once over [last, d1, …, dγ] (γ + 1 new tokens, the bottom-right causal mask:
   ``FastDecoder.extend``, the fast path's step on γ + 1 rows), which gives its next-token logits
   after every prefix: after last, after d1, …, after dγ;
3. the drafted tokens are kept while the target agrees; at the first disagreement the target's own
   token replaces the draft's, and when all γ were kept the logits after dγ give one token more
   (the bonus). Every round therefore writes at least one token, at most γ + 1;
4. the keys and values of rejected drafts are dropped by moving the cache's ``length`` back.

Greedy rounds keep a drafted token when it is the target's argmax, so the output is the target's
own greedy output, token for token. Sampled rounds use the rejection rule of Leviathan et al. (2023)
and Chen et al. (2023), which makes every token follow exactly the target's distribution.
Batch size 1: in a batch, rows accept different numbers of tokens and their caches drift apart.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .checks import check_banned, check_choice, check_id_list, check_int, check_model, check_real
from .sampling import ban, check_generator, check_logits, first_maximum, probabilities, token_mask
from .cache import ContextLimitError, check_multi_head
from .decoding import GenerationResult, check_generate_inputs, stop_reason
from .drafts import SPECULATE_INSTEAD, Draft, NeuralDraft, NgramDraft
from .fast import FastDecoder
from .guards import all_or_nothing, one_thread_at_a_time
from .model import GPT

__all__ = ["Draft", "NgramDraft", "NeuralDraft", "accept_greedy", "accept_sampled",  # the drafts re-exported
           "Round", "SpeculativeDecoder", "SpeculativeResult", "speculative_generate", "expected_tokens_per_round"]


# ---- the acceptance rules ---------------------------------------------------------------------------

def accept_greedy(drafted: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """(how many drafted tokens to keep, the target's own next token). ``target_logits`` is (n + 1, V).

    Keep d_i while it is the target's argmax after the tokens before it; the token that follows is
    the target's argmax at the first disagreement (the correction) or after the last guess (the bonus).
    """
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 2 or not target_logits.is_floating_point():
        got = (f"a {target_logits.dtype} tensor of shape {tuple(target_logits.shape)}"
               if isinstance(target_logits, torch.Tensor) else type(target_logits).__name__)
        raise TypeError(f"target_logits must be a floating tensor of shape (n + 1, V), got {got}")
    n_rows, V = target_logits.shape
    drafted = check_id_list("drafted", drafted, V, min_len=0)
    if n_rows != len(drafted) + 1 or V == 0:
        raise ValueError(f"target_logits must have shape (n + 1, V) = ({len(drafted) + 1}, V >= 1) for "
                         f"{len(drafted)} drafted tokens, got {tuple(target_logits.shape)}")
    check_logits(target_logits, "target_logits")  # no NaN, no +inf, a finite entry in every row
    choice = first_maximum(target_logits).tolist()                   # the target's greedy token after each prefix
    n = 0
    while n < len(drafted) and drafted[n] == choice[n]:
        n += 1
    return n, choice[n]


def accept_sampled(drafted: list[int], q: torch.Tensor | None, p: torch.Tensor,
                   generator: torch.Generator | None) -> tuple[int, int]:
    """The rejection rule: keep d_i with probability min(1, p_i(d_i) / q_i(d_i)), in order.

    ``p`` (n + 1, V) are the target's distributions after each prefix, ``q`` (n, V) the draft's (None:
    one-hot on each guess). At the first rejection the next token is drawn from max(0, p_i − q_i),
    normalised; when all n are kept, the bonus token is drawn from p_n.
    """
    if not isinstance(p, torch.Tensor) or p.dim() != 2 or not p.is_floating_point():
        got = f"a {p.dtype} tensor of shape {tuple(p.shape)}" if isinstance(p, torch.Tensor) else type(p).__name__
        raise TypeError(f"p must be a floating tensor of shape (n + 1, V), got {got}")
    V = p.shape[1]
    drafted = check_id_list("drafted", drafted, V, min_len=0)
    n = len(drafted)
    if p.shape[0] != n + 1 or V == 0:
        raise ValueError(f"p must have shape (n + 1, V) = ({n + 1}, V >= 1) for {n} drafted tokens, got {tuple(p.shape)}")
    check_generator(generator)
    for name, t in (("p", p), ("q", q)):
        if t is None:
            continue
        if name == "q":
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point():
                got = f"a {t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"q must be None or a floating tensor of shape (n, V), got {got}")
            if t.shape[0] < n or t.shape[1] != V:
                raise ValueError(f"q must have shape (n, V) = ({n}, {V}), got {tuple(t.shape)}")
            t = t[:n]
        if t.numel() and (not bool(torch.isfinite(t).all()) or float(t.min()) < 0
                          or bool(((t.sum(-1) - 1).abs() > 1e-3).any())):
            raise ValueError(f"{name} must hold probability distributions: finite, >= 0, each row summing to 1")
    for i, d in enumerate(drafted):
        q_i = F.one_hot(torch.tensor(d), p.shape[-1]).to(p.dtype) if q is None else q[i]
        u = float(torch.rand((), generator=generator))
        if 0 < float(p[i, d]) and u * float(q_i[d]) <= float(p[i, d]):  # u < p / q, without dividing;
            continue                                                   # a token the target bans (p 0) never stays
        residual = (p[i] - q_i).clamp(min=0)
        if float(residual.sum()) <= 0:  # only when p_i == q_i, where no guess is ever rejected: rounding
            residual = p[i]
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return len(drafted), int(torch.multinomial(p[len(drafted)], 1, generator=generator))


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """(1 − α^(γ+1)) / (1 − α): tokens per target call when each guess is kept with probability α."""
    alpha = check_real("alpha", alpha, 0, 1, allowed="a probability, a finite number in [0, 1]")
    gamma = check_int("gamma", gamma, 0)
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


# ---- the loop -------------------------------------------------------------------------------------

@dataclass
class Round:
    """One round: the guesses, how many were kept, and the target's own token after them."""
    drafted: list[int]
    accepted: int
    token: int       # the correction (accepted < len(drafted)) or the bonus (all kept)

    @property
    def bonus(self) -> bool:
        return self.accepted == len(self.drafted)


@dataclass
class SpeculativeResult(GenerationResult):
    rounds: list[Round] = field(default_factory=list)

    @property
    def drafted(self) -> int:
        return sum(len(r.drafted) for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def judged(self) -> int:
        """Guesses the target ruled on: the kept ones, and the first rejected one of each round (the
        guesses after a rejection are discarded unjudged)."""
        return sum(r.accepted + (not r.bonus) for r in self.rounds)

    @property
    def alpha(self) -> float:
        """Acceptance rate α: the share of judged guesses that the target kept."""
        return self.accepted / max(1, self.judged)

    @property
    def tokens_per_call(self) -> float:
        """New tokens per verify pass of the target (the prefill not counted)."""
        return self.new_tokens.shape[1] / max(1, len(self.rounds))


class SpeculativeDecoder:
    """Speculative decoding one round at a time: ``round()`` returns a :class:`Round`.

    ``tokens`` holds the prompt and every token written so far; ``done`` and ``stop_reason`` work
    as in ``generate`` (``"max_new_tokens"``, ``"eos"``, ``"context_limit"``). The target decodes
    with a :class:`FastDecoder`, whose cache holds every token but the last.

    ``banned`` token ids are never written (the ``<unk>`` of text for people, say): the target's
    scores for them are -inf, so it never keeps them nor picks them itself. Greedy rounds also cut the
    draft's guesses before the first banned one, which the target would reject anyway: the same
    tokens, and no banned guess on show.
    """

    @torch.inference_mode()
    def __init__(self, model: GPT, draft: Draft, idx: torch.Tensor, max_new_tokens: int, *, gamma: int = 4,
                 temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None, eos_id: int | None = None, banned=()):
        check_model(model)
        check_int("max_new_tokens", max_new_tokens, 0)
        if eos_id is not None:
            check_int("eos_id", eos_id, 0, model.config.vocab_size - 1,
                      f"None or a token id in [0, {model.config.vocab_size - 1}]")
        _, self.settings = check_generate_inputs(model, idx, max_new_tokens, temperature=temperature, top_k=top_k,
                                                 top_p=top_p, generator=generator, eos_id=eos_id, key_mask=None,
                                                 on_context_limit="stop")
        self.banned = token_mask(check_banned(banned, model.config.vocab_size), model.config.vocab_size)  # (V,)
        if idx.shape[0] != 1:
            raise ValueError(f"idx must hold one prompt (batch size 1) for speculative decoding, got "
                             f"{idx.shape[0]} rows: in a batch, rows keep different numbers of guesses")
        check_multi_head(model.config, "speculative decoding", SPECULATE_INSTEAD)
        if not isinstance(draft, Draft):
            raise TypeError(f"draft must be a kvlib.speculative.Draft (NgramDraft, NeuralDraft), got "
                            f"{type(draft).__name__}")
        V = model.config.vocab_size
        draft_v = V if draft.vocab_size is None else draft.vocab_size
        if draft_v != V:
            raise ValueError(f"draft has a vocabulary of {draft_v} ids but the model has {V}: a draft must share "
                             f"the target's tokenizer")
        block = model.config.block_size
        self.gamma = check_int("gamma", gamma, 1, block, f"an int in [1, {block}] (the model's block size at most)")
        self.model, self.draft, self.generator, self.eos_id = model, draft, generator, eos_id
        self.prompt_length = idx.shape[1]
        self.tokens: list[int] = idx[0].tolist()
        self.max_new_tokens = max_new_tokens
        self.budget = model.config.block_size - self.prompt_length + 1  # as generate: the last token is never fed
        self.target = FastDecoder(model, 1, model.config.block_size)
        if self.prompt_length > 1:
            self.target(idx[:, :-1])                  # prefill all but the last prompt token
        self.rounds: list[Round] = []
        self.finished = False
        self.stop_reason = "max_new_tokens" if max_new_tokens == 0 else None

    @property
    def n_new(self) -> int:
        return len(self.tokens) - self.prompt_length

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @contextmanager
    def rollback_point(self):
        """What a round changes, put back if it raises: the tokens, the rounds, the target's cache, the generator."""
        n_tokens, n_rounds, length = len(self.tokens), len(self.rounds), self.target.cache.length
        state = self.generator.get_state() if self.generator is not None else None
        stop, finished = self.stop_reason, self.finished
        try:
            yield
        except BaseException:
            del self.tokens[n_tokens:], self.rounds[n_rounds:]
            self.stop_reason, self.finished = stop, finished
            if self.target.cache.length > length:
                self.target.cache.truncate(length)
            if state is not None:
                self.generator.set_state(state)
            raise

    @one_thread_at_a_time
    @all_or_nothing
    @torch.inference_mode()
    def round(self) -> Round:
        """One round: the draft guesses, the target checks every guess in one pass, the longest agreeing run is
        kept plus one token of the target's own. Near the end of ``max_new_tokens`` or the block, fewer than
        ``gamma`` guesses are asked for (only those that can still be written)."""
        if self.done:
            raise RuntimeError(f"decoding has stopped ({self.stop_reason}): start a new SpeculativeDecoder")
        N = len(self.tokens)
        room = min(self.max_new_tokens, self.budget) - self.n_new - 1  # guesses that can still be used
        gamma = min(self.gamma, room)
        greedy = self.settings.greedy
        proposal = self.draft.propose(self.tokens, gamma, self.settings, self.generator) if gamma > 0 else ([], None)
        if not (isinstance(proposal, tuple) and len(proposal) == 2 and isinstance(proposal[0], (list, tuple))
                and (proposal[1] is None or isinstance(proposal[1], torch.Tensor))):
            raise TypeError(f"{type(self.draft).__name__}.propose must return a pair (guesses, q): a list of token ids "
                            f"and an (n, V) tensor of the draft's probabilities or None, got {proposal!r:.80}")
        drafted, q = proposal
        drafted = check_id_list("the draft's guesses", list(drafted[:gamma]), self.model.config.vocab_size, min_len=0)
        if greedy:
            drafted = next((drafted[:i] for i, t in enumerate(drafted) if self.banned[t]), drafted)
        if q is not None:
            q = q[: len(drafted)]
        assert self.target.cache.length == N - 1
        logits = self.target.extend(torch.tensor([self.tokens[-1:] + drafted]))[0]  # (n + 1, V), one pass
        logits = ban(logits, self.banned)
        if greedy:
            n, token = accept_greedy(drafted, logits)
        else:
            n, token = accept_sampled(drafted, q, probabilities(logits, *self.settings), self.generator)
        self.target.cache.truncate(N + n)             # keep last, d1 … dn; drop the rest (step 4)
        rnd = Round(drafted=drafted, accepted=n, token=token)
        self.rounds.append(rnd)
        for t in drafted[:n] + [token]:               # write them one by one, checking the stop rules
            self.tokens.append(t)
            self.finished = self.eos_id is not None and t == self.eos_id
            self.stop_reason = stop_reason(self.n_new, self.max_new_tokens, self.budget,
                                           torch.tensor([self.finished]) if self.eos_id is not None else None)
            if self.stop_reason is not None:
                break
        return rnd

    def result(self) -> SpeculativeResult:
        tokens = torch.tensor([self.tokens])
        return SpeculativeResult(tokens, torch.tensor([self.prompt_length]), tokens[:, self.prompt_length:],
                                 self.stop_reason or "max_new_tokens", torch.tensor([self.finished]),
                                 list(self.rounds))


def speculative_generate(model: GPT, draft: Draft, idx: torch.Tensor, max_new_tokens: int, *, gamma: int = 4,
                         temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                         generator: torch.Generator | None = None, eos_id: int | None = None,
                         on_context_limit: str = "stop") -> SpeculativeResult:
    """``generate`` for one prompt, with a draft guessing ``gamma`` tokens a round.

    Greedy (temperature 0) gives exactly ``generate``'s tokens; sampling gives tokens with exactly
    its distribution (not the same draws: the random numbers are used differently). The result is a
    ``GenerationResult`` with the rounds added (``alpha``, ``tokens_per_call``).
    """
    check_choice("on_context_limit", on_context_limit, ("stop", "raise"))
    dec = SpeculativeDecoder(model, draft, idx, max_new_tokens, gamma=gamma, temperature=temperature,
                             top_k=top_k, top_p=top_p, generator=generator, eos_id=eos_id)
    while not dec.done:
        dec.round()
    if dec.stop_reason == "context_limit" and on_context_limit == "raise":
        T, block = dec.prompt_length, model.config.block_size
        raise ContextLimitError.block_full(T, max_new_tokens, block)
    return dec.result()
