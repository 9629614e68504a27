"""Speculative decoding: a cheap draft guesses γ tokens, the target checks them all in one forward.

Reading order: the draft interface (:class:`Draft`) and two drafts, one that is not a network at all
(:class:`NgramDraft`, the most frequent next token after the last one or two, counted in a corpus)
and a small network with the target's tokenizer (:class:`NeuralDraft`); the acceptance rules
(:func:`accept_greedy`, :func:`accept_sampled`); and the loop that joins them
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

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .checks import ContextLimitError, check_generate_inputs, check_int
from .decoding import GenerationResult
from .fast import FastDecoder
from .model import GPT
from .sampling import probabilities

__all__ = ["Draft", "NgramDraft", "NeuralDraft", "accept_greedy", "accept_sampled",
           "Round", "SpeculativeDecoder", "SpeculativeResult", "speculative_generate", "expected_tokens_per_round"]


# ---- drafts ---------------------------------------------------------------------------------------

class Draft:
    """What speculative decoding asks of a draft: ``propose(tokens, gamma, settings, generator)``.

    ``tokens`` is the whole sequence so far (prompt and accepted tokens, a list of ids); the draft
    returns up to ``gamma`` guesses of what follows and, when sampling, the (n, V) distributions q it
    drew them from (None: each guess was certain, q one-hot). ``settings`` is (temperature, top_k,
    top_p); temperature 0 asks for the draft's most likely tokens. A draft may keep state between
    calls (a cache) but must give the same answer for the same tokens.
    """

    name = "draft"

    def propose(self, tokens: list[int], gamma: int, settings=(0.0, None, None),
                generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor | None]:
        raise NotImplementedError


class NgramDraft(Draft):
    """The most frequent next token after the last two tokens (else the last one), from corpus counts.

    The same counting as notebook 1's ``count_followers``, done for every context at once and
    reduced to its winner: a table of "after a, b comes c most often" and "after b comes c most
    often". Ties go to the lower id. Proposing a token is a dictionary look-up, nearly free next to
    a forward pass; the guesses are certain (q one-hot).
    """

    name = "n-gram"

    def __init__(self, trigram: dict[int, int], bigram: dict[int, int], fallback: int, vocab_size: int,
                 lookup: bool = False):
        self.trigram, self.bigram, self.fallback, self.vocab_size = trigram, bigram, fallback, vocab_size
        self.lookup = lookup
        if lookup:
            self.name = "n-gram + lookup"

    def with_lookup(self) -> "NgramDraft":
        """The same tables, but first copying from the text so far (see :meth:`copied`)."""
        return NgramDraft(self.trigram, self.bigram, self.fallback, self.vocab_size, lookup=True)

    @staticmethod
    def copied(seq: list[int]) -> int | None:
        """What followed the latest earlier occurrence of the last two tokens of ``seq``, if any.

        Text repeats itself (a refrain, a greedy loop): the counts of the text so far can beat the
        corpus's. Large systems use the same trick as "prompt lookup" drafting.
        """
        a, b = seq[-2:] if len(seq) > 1 else (None, None)
        for j in range(len(seq) - 3, -1, -1):
            if seq[j] == a and seq[j + 1] == b:
                return seq[j + 2]
        return None

    @classmethod
    def from_ids(cls, ids, vocab_size: int) -> "NgramDraft":
        """Build the tables from one long sequence of token ids (e.g. the training poems, encoded)."""
        V = check_int("vocab_size", vocab_size, 1)
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.dim() != 1 or len(ids) < 3:
            raise ValueError(f"ids must be a 1-D sequence of at least 3 token ids, got shape {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= V:
            raise ValueError(f"ids must be token ids in [0, {V - 1}], got values in [{int(ids.min())}, {int(ids.max())}]")

        def winners(context: torch.Tensor, nxt: torch.Tensor) -> dict[int, int]:
            pairs, counts = torch.unique(context * V + nxt, return_counts=True)  # sorted by (context, next)
            ctx, follower = pairs // V, pairs % V
            order = torch.sort(-counts, stable=True).indices                    # most frequent first ...
            order = order[torch.sort(ctx[order], stable=True).indices]          # ... within each context
            ctx, follower = ctx[order], follower[order]
            first = torch.ones_like(ctx, dtype=torch.bool)
            first[1:] = ctx[1:] != ctx[:-1]                                      # each context's winner
            return dict(zip(ctx[first].tolist(), follower[first].tolist()))

        trigram = winners(ids[:-2] * V + ids[1:-1], ids[2:])
        bigram = winners(ids[:-1], ids[1:])
        fallback = int(torch.bincount(ids, minlength=V).argmax())
        return cls(trigram, bigram, fallback, V)

    def next_token(self, a: int | None, b: int) -> int:
        """The guess after ``a, b`` (``a`` None: only one token known)."""
        if a is not None:
            c = self.trigram.get(a * self.vocab_size + b)
            if c is not None:
                return c
        return self.bigram.get(b, self.fallback)

    def propose(self, tokens, gamma, settings=(0.0, None, None), generator=None):
        seq = list(tokens)
        for _ in range(gamma):
            c = self.copied(seq) if self.lookup else None
            if c is None:
                c = self.next_token(seq[-2] if len(seq) > 1 else None, seq[-1])
            seq.append(c)
        return seq[len(tokens):], None


class NeuralDraft(Draft):
    """A small GPT with the target's tokenizer, decoding on the fast path with its own cache.

    The draft remembers which tokens its cache holds. Each call keeps the longest prefix that the
    new ``tokens`` share with them, moves the cache's ``length`` back to it (that drops the keys of
    rejected guesses), feeds the rest, then steps γ times. After a fully accepted round that is two
    tokens to feed (the last guess and the bonus), after a rejection one (the correction).
    """

    name = "neural"

    def __init__(self, model: GPT, name: str | None = None):
        self.model = model
        self.decoder = FastDecoder(model, 1, model.config.block_size)
        self.fed: list[int] = []  # the tokens whose keys and values are in the cache, in order
        if name is not None:
            self.name = name

    def _feed(self, new: list[int]) -> torch.Tensor:
        """Append ``new`` to the cache; the (V,) logits after the last of them."""
        self.fed += new
        if len(new) > 3:  # a prompt: one forward over the chunk
            return self.decoder(torch.tensor([new]))[0]
        for t in new:     # a few tokens: the lean one-token step is cheaper than a chunk forward
            logits = self.decoder(torch.tensor([[t]]))
        return logits[0]

    @torch.inference_mode()
    def propose(self, tokens, gamma, settings=(0.0, None, None), generator=None):
        keep = 0
        limit = min(len(self.fed), len(tokens) - 1)  # feed at least one token: its logits come next
        while keep < limit and self.fed[keep] == tokens[keep]:
            keep += 1
        self.fed = self.fed[:keep]
        self.decoder.cache.truncate(keep)            # the roll-back: later slots will be overwritten
        gamma = min(gamma, self.decoder.max_len - len(tokens) + 1)  # what fits in the draft's block
        logits = self._feed(list(tokens[keep:]))
        temperature = settings[0]
        out, qs = [], []
        for i in range(gamma):
            if temperature == 0:
                t = int(logits.argmax())
            else:
                q = probabilities(logits[None], *settings)[0]
                t = int(torch.multinomial(q, 1, generator=generator))
                qs.append(q)
            out.append(t)
            if i < gamma - 1:
                logits = self._feed([t])
        return out, (torch.stack(qs) if qs else None)


# ---- the acceptance rules ---------------------------------------------------------------------------

def accept_greedy(drafted: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """(how many drafted tokens to keep, the target's own next token). ``target_logits`` is (n + 1, V).

    Keep d_i while it is the target's argmax after the tokens before it; the token that follows is
    the target's argmax at the first disagreement (the correction) or after the last guess (the bonus).
    """
    choice = target_logits.argmax(dim=-1).tolist()                   # the target's greedy token after each prefix
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
        _, self.settings = check_generate_inputs(model, idx, max_new_tokens, None, eos_id, "stop", generator,
                                                 temperature, top_k, top_p)
        self.banned = sorted({check_int("banned token id", t, 0, model.config.vocab_size - 1) for t in banned})
        if idx.shape[0] != 1:
            raise ValueError(f"idx must hold one prompt (batch size 1) for speculative decoding, got "
                             f"{idx.shape[0]} rows: in a batch, rows keep different numbers of guesses")
        if not isinstance(draft, Draft):
            raise TypeError(f"draft must be a kvlib.speculative.Draft (NgramDraft, NeuralDraft), got "
                            f"{type(draft).__name__}")
        self.gamma = check_int("gamma", gamma, 1)
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

    @torch.inference_mode()
    def round(self) -> Round:
        if self.done:
            raise RuntimeError(f"decoding has stopped ({self.stop_reason}): start a new SpeculativeDecoder")
        N = len(self.tokens)
        room = min(self.max_new_tokens, self.budget) - self.n_new - 1  # guesses that can still be used
        gamma = min(self.gamma, room)
        greedy = self.settings[0] == 0
        drafted, q = self.draft.propose(self.tokens, gamma, self.settings, self.generator) if gamma > 0 else ([], None)
        drafted = list(drafted[:gamma])
        if greedy and self.banned:
            drafted = next((drafted[:i] for i, t in enumerate(drafted) if t in self.banned), drafted)
        if q is not None:
            q = q[: len(drafted)]
        assert self.target.cache.length == N - 1
        logits = self.target.extend(torch.tensor([self.tokens[-1:] + drafted]))[0]  # (n + 1, V), one pass
        if self.banned:
            logits = logits.clone()
            logits[:, self.banned] = float("-inf")
        if greedy:
            n, token = accept_greedy(drafted, logits)
        else:
            n, token = accept_sampled(drafted, q, probabilities(logits, *self.settings), self.generator)
        self.target.cache.truncate(N + n)             # keep last, d1 … dn; drop the rest (step 4)
        rnd = Round(drafted=drafted, accepted=n, token=token)
        self.rounds.append(rnd)
        for t in drafted[:n] + [token]:               # write them one by one, checking the stop rules
            self.tokens.append(t)
            if self.eos_id is not None and t == self.eos_id:
                self.finished, self.stop_reason = True, "eos"
            elif self.n_new == self.max_new_tokens:
                self.stop_reason = "max_new_tokens"
            elif self.n_new == self.budget:
                self.stop_reason = "context_limit"
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
    if on_context_limit not in ("stop", "raise"):
        raise ValueError(f"on_context_limit must be 'stop' or 'raise', got {on_context_limit!r}")
    dec = SpeculativeDecoder(model, draft, idx, max_new_tokens, gamma=gamma, temperature=temperature,
                             top_k=top_k, top_p=top_p, generator=generator, eos_id=eos_id)
    while not dec.done:
        dec.round()
    if dec.stop_reason == "context_limit" and on_context_limit == "raise":
        T, block = dec.prompt_length, model.config.block_size
        raise ContextLimitError(
            f"{T} prompt tokens + {max_new_tokens} new ones need {T + max_new_tokens} tokens; the "
            f"block holds {block} positions, so at most {dec.budget} new tokens fit")
    return dec.result()
