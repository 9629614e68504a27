"""Drafts for speculative decoding: cheap guesses of what the target writes next.

:class:`Draft` is what the loop of :mod:`kvlib.speculative` asks of a draft. Two drafts: one that is
not a network at all (:class:`NgramDraft`, the most frequent next token after the last one or two,
counted in a corpus), and a small network with the target's tokenizer (:class:`NeuralDraft`).
"""
from __future__ import annotations

import torch

from .cache import check_multi_head
from .checks import check_bool, check_id_list, check_int, check_model
from .sampling import Sampling, check_generator, first_maximum, probabilities
from .fast import FastDecoder
from .model import GPT
from .weights import weights_key

__all__ = ["Draft", "NgramDraft", "NeuralDraft"]


SPECULATE_INSTEAD = ("it guesses and verifies on the fast path; decode this model without speculation, with "
                     "generate(..., decoder='model')")


class Draft:
    """What speculative decoding asks of a draft: ``propose(tokens, gamma, settings, generator)``.

    ``tokens`` is the whole sequence so far (prompt and accepted tokens, a list of ids); the draft
    returns up to ``gamma`` guesses of what follows and, when sampling, the (n, V) distributions q it
    drew them from (None: each guess was certain, q one-hot). ``settings`` is a ``Sampling`` (temperature,
    top_k, top_p); temperature 0 asks for the draft's most likely tokens. A draft may keep state between
    calls (a cache) but must give the same answer for the same tokens.
    """

    name = "draft"
    vocab_size: int | None = None  # the ids it guesses in; None: not known (the target's is assumed)

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
    settings = Sampling(*settings)
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

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

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
        out, qs = [], []
        for i in range(gamma):
            if settings.greedy:
                t = int(first_maximum(logits[None])[0])
            else:
                q = probabilities(logits[None], *settings)[0]
                t = int(torch.multinomial(q, 1, generator=generator))
                qs.append(q)
            out.append(t)
            if i < gamma - 1:
                logits = self._feed([t])
        return out, (torch.stack(qs) if qs else None)
