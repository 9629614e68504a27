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

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .checks import (check_bool, check_choice, check_generator, check_id_list, check_int, check_logits, check_model,
                     check_real)
from .cache import ContextLimitError, check_multi_head
from .decoding import GenerationResult, check_generate_inputs, stop_reason
from .fast import FastDecoder
from .guards import all_or_nothing, one_thread_at_a_time
from .model import GPT
from .weights import weights_key
from .sampling import check_sampling, first_maximum, probabilities

__all__ = ["Draft", "NgramDraft", "NeuralDraft", "accept_greedy", "accept_sampled",
           "Round", "SpeculativeDecoder", "SpeculativeResult", "speculative_generate", "expected_tokens_per_round"]


# ---- drafts ---------------------------------------------------------------------------------------

SPECULATE_INSTEAD = ("it guesses and verifies on the fast path; decode this model without speculation, with "
                     "generate(..., decoder='model')")


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
        raise NotImplementedError(f"{type(self).__name__} must define propose(tokens, gamma, settings, generator) "
                                  f"-> (guesses, q): a draft is a subclass of Draft that does")


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
        vocab_size = check_int("vocab_size", vocab_size, 1)
        fallback = check_int("fallback", fallback, 0, vocab_size - 1)
        lookup = check_bool("lookup", lookup)
        for name, table, keys in (("trigram", trigram, vocab_size * vocab_size), ("bigram", bigram, vocab_size)):
            if not isinstance(table, dict):
                raise TypeError(f"{name} must be a dict of int context -> int token id, got {type(table).__name__}")
            if table:
                for what, xs, top in (("context", table.keys(), keys), ("token id", table.values(), vocab_size)):
                    if not all(isinstance(x, int) and not isinstance(x, bool) for x in xs):
                        raise TypeError(f"{name} must map int contexts to int token ids, got a {what} that is not an int")
                    if min(xs) < 0 or max(xs) >= top:
                        raise ValueError(f"{name} holds a {what} outside [0, {top}): allowed are ids of a vocabulary "
                                         f"of {vocab_size}")
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
        seq = check_id_list("seq", seq, min_len=0)
        a, b = seq[-2:] if len(seq) > 1 else (None, None)
        for j in range(len(seq) - 3, -1, -1):
            if seq[j] == a and seq[j + 1] == b:
                return seq[j + 2]
        return None

    @classmethod
    def from_ids(cls, ids, vocab_size: int) -> "NgramDraft":
        """Build the tables from one long sequence of token ids (e.g. the training poems, encoded)."""
        V = check_int("vocab_size", vocab_size, 1, 2**31, "an int in [1, 2**31]")
        if isinstance(ids, (str, bytes, dict, set)) or not (isinstance(ids, torch.Tensor) or hasattr(ids, "__len__")):
            raise TypeError(f"ids must be a list or 1-D integer tensor of token ids, got {type(ids).__name__}")
        try:
            ids = torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError("ids must be a list or 1-D integer tensor of token ids (ints)") from None
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"ids must be int token ids, got a {ids.dtype} tensor")
        ids = ids.long()
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
        top = self.vocab_size - 1
        a = None if a is None else check_int("a", a, 0, top, f"None or a token id in [0, {top}]")
        b = check_int("b", b, 0, top)
        if a is not None:
            c = self.trigram.get(a * self.vocab_size + b)
            if c is not None:
                return c
        return self.bigram.get(b, self.fallback)

    def propose(self, tokens, gamma, settings=(0.0, None, None), generator=None):
        tokens, gamma, _ = _check_propose(tokens, gamma, settings, generator, self.vocab_size)
        seq = list(tokens)
        for _ in range(gamma):
            c = self.copied(seq) if self.lookup else None
            if c is None:
                c = self.next_token(seq[-2] if len(seq) > 1 else None, seq[-1])
            seq.append(c)
        return seq[len(tokens):], None


MAX_GAMMA = 1024  # guesses a round: more is a typo (a round's guesses must also fit the block)


def _check_propose(tokens, gamma, settings, generator, vocab_size: int):
    """What a draft's ``propose`` is given: ids so far, a number of guesses, sampler settings, a generator."""
    tokens = check_id_list("tokens", tokens, vocab_size)
    gamma = check_int("gamma", gamma, 0, MAX_GAMMA)
    if not isinstance(settings, (tuple, list)) or len(settings) != 3:
        raise TypeError(f"settings must be a tuple (temperature, top_k, top_p), got {settings!r:.60}")
    settings = check_sampling(*settings)
    check_generator(generator)
    return tokens, gamma, settings


class NeuralDraft(Draft):
    """A small GPT with the target's tokenizer, decoding on the fast path with its own cache.

    The draft remembers which tokens its cache holds. Each call keeps the longest prefix that the
    new ``tokens`` share with them, moves the cache's ``length`` back to it (that drops the keys of
    rejected guesses), feeds the rest, then steps γ times. After a fully accepted round that is two
    tokens to feed (the last guess and the bonus), after a rejection one (the correction).

    Its guesses must fit its own block: ``propose`` returns fewer than ``gamma`` (none at all when
    ``tokens`` fill it) rather than go past it, as the :class:`Draft` contract ("up to gamma") allows.
    If the draft model's weights change (training on, ``load_state_dict``), the next ``propose`` starts
    again from them: a new decoder, an empty cache.
    """

    name = "neural"

    def __init__(self, model: GPT, name: str | None = None):
        check_model(model)
        check_multi_head(model.config, "NeuralDraft", SPECULATE_INSTEAD)
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name must be None or a non-empty str, got {name!r:.60}")
        self.model = model
        self._start()
        if name is not None:
            self.name = name

    def _start(self) -> None:
        """A decoder on the model's weights as they are now, and an empty cache."""
        self.decoder = FastDecoder(self.model, 1, self.model.config.block_size)
        self.weights = weights_key(self.model)
        self.fed: list[int] = []  # the tokens whose keys and values are in the cache, in order

    def _feed(self, new: list[int]) -> torch.Tensor:
        """Append ``new`` to the cache; the (V,) logits after the last of them."""
        if len(new) > 3:  # a prompt: one forward over the chunk
            logits = self.decoder(torch.tensor([new]))
            self.fed += new
            return logits[0]
        for t in new:     # a few tokens: the lean one-token step is cheaper than a chunk forward
            logits = self.decoder(torch.tensor([[t]]))
            self.fed.append(t)  # only once its keys are in the cache
        return logits[0]

    @torch.inference_mode()
    def propose(self, tokens, gamma, settings=(0.0, None, None), generator=None):
        tokens, gamma, settings = _check_propose(tokens, gamma, settings, generator, self.model.config.vocab_size)
        gamma = min(gamma, self.decoder.max_len - len(tokens) + 1)  # what fits in the draft's block (see above)
        if gamma <= 0:
            return [], None
        if weights_key(self.model) != self.weights:  # the model changed since the decoder copied its weights
            self._start()
        keep = 0
        limit = min(len(self.fed), len(tokens) - 1)  # feed at least one token: its logits come next
        while keep < limit and self.fed[keep] == tokens[keep]:
            keep += 1
        self.fed = self.fed[:keep]
        self.decoder.cache.truncate(keep)            # the roll-back: later slots will be overwritten
        logits = self._feed(list(tokens[keep:]))
        temperature = settings[0]
        out, qs = [], []
        for i in range(gamma):
            if temperature == 0:
                t = int(first_maximum(logits[None])[0])
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
        if isinstance(banned, (str, bytes)) or not isinstance(banned, (list, tuple, set, frozenset, range)):
            raise TypeError(f"banned must be a list of token ids, got {banned!r:.60}")
        self.banned = sorted(set(check_id_list("banned", list(banned), model.config.vocab_size, min_len=0)))
        if len(self.banned) >= model.config.vocab_size:
            raise ValueError(f"banned must leave at least one token to write, got all {model.config.vocab_size} ids")
        if idx.shape[0] != 1:
            raise ValueError(f"idx must hold one prompt (batch size 1) for speculative decoding, got "
                             f"{idx.shape[0]} rows: in a batch, rows keep different numbers of guesses")
        check_multi_head(model.config, "speculative decoding", SPECULATE_INSTEAD)
        if not isinstance(draft, Draft):
            raise TypeError(f"draft must be a kvlib.speculative.Draft (NgramDraft, NeuralDraft), got "
                            f"{type(draft).__name__}")
        V = model.config.vocab_size
        draft_v = draft.model.config.vocab_size if isinstance(draft, NeuralDraft) else getattr(draft, "vocab_size", V)
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
        greedy = self.settings[0] == 0
        proposal = self.draft.propose(self.tokens, gamma, self.settings, self.generator) if gamma > 0 else ([], None)
        if not (isinstance(proposal, tuple) and len(proposal) == 2 and isinstance(proposal[0], (list, tuple))
                and (proposal[1] is None or isinstance(proposal[1], torch.Tensor))):
            raise TypeError(f"{type(self.draft).__name__}.propose must return a pair (guesses, q): a list of token ids "
                            f"and an (n, V) tensor of the draft's probabilities or None, got {proposal!r:.80}")
        drafted, q = proposal
        drafted = list(drafted[:gamma])
        if greedy and self.banned:
            drafted = next((drafted[:i] for i, t in enumerate(drafted) if t in self.banned), drafted)
        if q is not None:
            q = q[: len(drafted)]
        drafted = check_id_list("the draft's guesses", drafted, self.model.config.vocab_size, min_len=0)
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
