"""Serving many users: requests over time and a continuous-batching engine on the paged cache.

Reading order: ``Request`` (who asks what, when, and how to choose its tokens; ``kvlib.tools.traces`` draws them
from the corpus) -> ``Clock`` (time that skips idle waits; ``StepClock`` counts steps instead) -> ``Engine`` (the
scheduler: admit, decode everyone in one forward, retire, preempt, abort). ``kvlib.tools.serving_runs`` serves one
trace three ways with it and its baselines; ``kvlib.tools.server`` puts it behind HTTP. Parallel sampling on the
same cache is :func:`kvlib.paged.parallel_sample`.

A request is greedy unless it says otherwise: then it writes exactly the tokens ``generate`` writes. A sampled
request draws from its own generator, seeded by its ``seed``, so its tokens do not depend on who else is served.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from .checks import (check_banned, check_bool, check_choice, check_id_list, check_int, check_list, check_model,
                     check_real, check_seed)
from .guards import all_or_nothing, one_thread_at_a_time
from .decoding import DECODERS
from .model import GPT
from .weights import check_weights
from .paged import KV_BLOCK_SIZE, PagedKVCache, ceil_div
from .sampling import Sampling, ban, first_maximum, sample_next, token_mask


@dataclass
class Request:
    """One user's request; checked when made (ids, lengths, time, sampling), and by ``Engine.add`` against the model."""
    id: int
    prompt: list[int]       # token ids, the poem separator first
    max_new_tokens: int     # the answer's length at most: the request is done after this many tokens
    arrival: float = 0.0    # seconds after the start of the trace
    sampling: Sampling = Sampling(0.0)  # how its tokens are chosen: greedy unless told otherwise
    seed: int = 0           # its own generator's seed (a sampled request's draws depend on nothing else)
    stop_token_ids: tuple[int, ...] = ()  # a token that ends the request (kept as its last token)
    banned: tuple[int, ...] = ()          # tokens it never writes
    logprobs: int = 0       # keep the model's log-probabilities (before temperature) of this many top tokens a step

    def __post_init__(self):
        self.id = check_int("id", self.id, 0)
        self.prompt = check_id_list("prompt", self.prompt)
        self.max_new_tokens = check_int("max_new_tokens", self.max_new_tokens, 1)
        self.arrival = check_real("arrival", self.arrival, 0, allowed="a finite number of seconds >= 0")
        if not isinstance(self.sampling, Sampling):
            raise TypeError(f"sampling must be a kvlib.sampling.Sampling, got {type(self.sampling).__name__}")
        self.seed = check_seed(self.seed)
        self.stop_token_ids = tuple(check_id_list("stop_token_ids", list(self.stop_token_ids), min_len=0))
        self.banned = tuple(check_id_list("banned", list(self.banned), min_len=0))
        self.logprobs = check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)


MAX_LOGPROBS = 20  # as OpenAI's API: the top 20 at most


class Clock:
    """Seconds since the start; a wait for the next arrival is skipped, not slept (and still counted)."""

    def __init__(self):
        self.start, self.skipped = time.perf_counter(), 0.0

    def now(self) -> float:
        return time.perf_counter() - self.start + self.skipped

    def wait_until(self, t: float) -> None:
        self.skipped += max(0.0, t - self.now())


class StepClock:
    """Time counted in steps, the same on every machine: ``now()`` moves only by ``tick()`` and ``wait_until``.

    Arrivals are then in steps too. Pass ``on_step=lambda engine, record: clock.tick()`` to
    :func:`run_continuous` (or tick after each ``Engine.step()``) so that one step is one unit of time.
    """

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def tick(self) -> None:
        self.t += 1

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)


@dataclass
class RequestState:
    """A request inside the engine: its tokens so far, how they are chosen, and what happened to it."""
    request: Request
    output: list[int] = field(default_factory=list)
    state: str = "waiting"           # waiting -> running -> finished (or aborted); running -> waiting when preempted
    first_token: float | None = None
    finish: float | None = None
    preemptions: int = 0
    logprobs: list[dict[int, float]] = field(default_factory=list)  # per new token: the top ``request.logprobs``
    cached_tokens: int = 0           # prompt tokens its first prefill found in the pool (prefix caching)
    generator: torch.Generator = field(init=False)
    banned: torch.Tensor | None = field(init=False)   # (V,) mask, None when nothing is banned

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(self.request.seed)
        self.banned = None

    @property
    def finish_reason(self) -> str | None:
        """"stop" (a stop token), "length" (max_new_tokens), "abort", or None while it runs."""
        if self.state == "aborted":
            return "abort"
        if self.output and self.output[-1] in self.request.stop_token_ids:
            return "stop"
        return "length" if len(self.output) >= self.request.max_new_tokens else None

    @property
    def id(self) -> int:
        return self.request.id

    @property
    def tokens(self) -> list[int]:
        return self.request.prompt + self.output

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.request.prompt[-1]

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def choose(self, logits: torch.Tensor, greedy_token: int) -> int:
        """This request's next token from its row of logits (1, V): the batch's argmax when it is greedy and bans
        nothing, else a draw with its own settings and generator; the model's top log-probabilities kept if asked."""
        if self.banned is not None:
            logits = ban(logits, self.banned)
        if self.request.sampling.greedy and self.banned is None:
            token = greedy_token
        else:
            token = int(sample_next(logits, *self.request.sampling, generator=self.generator))
        if self.request.logprobs:  # the top ones, and the chosen token's (it may be outside them when sampled)
            logp = logits.float().log_softmax(-1)[0]                                   # (V,)
            top = logp.topk(self.request.logprobs)
            self.logprobs.append(dict(zip(top.indices.tolist(), top.values.tolist())) | {token: float(logp[token])})
        return token


@dataclass
class StepRecord:
    kind: str                          # "prefill", "decode" or "idle"
    time: float
    running: list[int]
    admitted: list[int] = field(default_factory=list)
    retired: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    computed_tokens: int = 0           # tokens that went through the model this step
    used_positions: int = 0            # block positions the pass's sequences held, before any retired
    real_tokens: int = 0               # of which hold a token
    released: dict[int, list[int]] = field(default_factory=dict)  # blocks given back, per sequence


class Engine:
    """Continuous batching (iteration-level scheduling) over a :class:`PagedKVCache`.

    Each ``step()`` is one forward pass. If waiting requests have arrived and fit (free blocks for
    their tokens with ``watermark`` of the pool still free after them, at most ``max_num_seqs``
    running, at most ``max_num_batched_tokens`` in one prefill), they are admitted and prefilled together; otherwise every running sequence decodes one
    token in one batched forward. A sequence that reaches its length is retired at once and its
    blocks go back to the pool. When the running sequences need more blocks than are free, the
    newest one is preempted: its blocks are freed and it waits again at the head of the queue, to
    be recomputed (prompt and tokens so far, as one prefill) when blocks are free. The watermark
    (vLLM's scheduler keeps one too) leaves the running sequences room to grow, so that a new
    admission does not cause a preemption at the next block boundary; a pool with nothing running
    admits without it.
    """

    def __init__(self, model: GPT, num_blocks: int, *, kv_block_size: int = KV_BLOCK_SIZE, max_num_seqs: int = 32,
                 max_num_batched_tokens: int = 1024, watermark: float = 0.05, enable_prefix_caching: bool = False,
                 clock: Clock | None = None, decoder: str = "fast"):
        check_model(model)
        check_weights(model)
        self.model = model
        check_choice("decoder", decoder, tuple(DECODERS))
        self.decoder = decoder
        block = model.config.block_size
        kv_block_size = check_int("kv_block_size", kv_block_size, 1, block,
                                  f"an int in [1, {block}] (the model's block size at most)")
        enable_prefix_caching = check_bool("enable_prefix_caching", enable_prefix_caching)
        if clock is not None and not (callable(getattr(clock, "now", None)) and callable(getattr(clock, "wait_until", None))):
            raise TypeError(f"clock must be None or have now() and wait_until(t) (a kvlib.serving.Clock), "
                            f"got {type(clock).__name__}")
        num_blocks = check_int("num_blocks", num_blocks, ceil_div(block, kv_block_size), None,
                               f"an int >= {ceil_div(block, kv_block_size)}: the pool must hold one sequence of "
                               f"{block} tokens")
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, 1)
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", max_num_batched_tokens, block, None,
                                                f"an int >= the block size {block}")
        watermark = check_real("watermark", watermark, 0, 1, open_max=True,
                               allowed="the share of blocks kept free at admission, a number in [0, 1)")
        self.watermark_blocks = int(watermark * num_blocks)
        self.cache = PagedKVCache.for_model(model, num_blocks, kv_block_size,
                                            enable_prefix_caching=enable_prefix_caching)
        self.clock = clock or Clock()
        self.waiting: deque[RequestState] = deque()   # in arrival order; preempted ones go back to the front
        self.running: list[RequestState] = []         # in admission order: the last is the newest
        self.finished: list[RequestState] = []
        self.history: list[StepRecord] = []
        self.released: dict[int, list[int]] = {}      # blocks given back in the current step, per sequence

    @one_thread_at_a_time
    def add(self, request: Request) -> RequestState:
        """Queue a copy of the request (changing it afterwards changes nothing here) and return its state, which
        the engine updates as it runs; refused, and nothing queued, if it cannot fit the model or repeats an id."""
        if not isinstance(request, Request):
            raise TypeError(f"request must be a kvlib.serving.Request, got {type(request).__name__}")
        request.__post_init__()  # again: its fields may have been changed since it was made
        check_fits(self.model.config, request, f"request {request.id}")
        if any(s.id == request.id for s in (*self.waiting, *self.running, *self.finished)):
            raise ValueError(f"request id {request.id} is already in this engine; ids must be unique")
        seq = RequestState(replace(request, prompt=list(request.prompt)))
        if request.banned:
            V = self.model.config.vocab_size
            seq.banned = token_mask(check_banned(list(request.banned), V), V)
        self.waiting.append(seq)
        return seq

    @one_thread_at_a_time
    def abort(self, request_id: int) -> bool:
        """Stop request ``request_id`` now: it leaves the queue or the batch and its blocks go back to the pool.
        False if it is not waiting or running (finished, aborted before, or never added)."""
        seq = next((s for s in (*self.waiting, *self.running) if s.id == request_id), None)
        if seq is None:
            return False
        if seq in self.running:
            self.running.remove(seq)
            self.release(seq.id)
        else:
            self.waiting.remove(seq)
        seq.state, seq.finish = "aborted", self.clock.now()
        self.finished.append(seq)
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def arrived(self) -> list[RequestState]:
        now = self.clock.now()
        return [s for s in self.waiting if s.request.arrival <= now]

    def plan_admission(self) -> list[RequestState]:
        """The waiting requests the next ``step()`` admits, in order; changes nothing.

        From the head of the queue, while each has arrived, fits the token budget of one prefill and
        finds blocks for its tokens with the watermark left free (no watermark when nothing runs).
        """
        admitted, budget, now = [], self.max_num_batched_tokens, self.clock.now()
        free = self.cache.num_free_blocks
        for seq in self.waiting:
            if len(self.running) + len(admitted) >= self.max_num_seqs:
                break
            n = len(seq.tokens)
            blocks = self.cache.blocks_needed(n + 1)  # +1: room for the token the prefill chooses
            keep = self.watermark_blocks if self.running or admitted else 0  # room for the running to grow
            if seq.request.arrival > now or n > budget or blocks + keep > free:
                break
            admitted.append(seq)
            budget, free = budget - n, free - blocks
        return admitted

    @one_thread_at_a_time
    @all_or_nothing
    @torch.inference_mode()
    def step(self) -> StepRecord:
        """One forward pass: schedule (admit and prefill the arrived, or decode the running, preempting the
        newest while blocks are short), run the model on that batch, then postprocess (append each row's
        token, retire the finished and give their blocks back)."""
        if not self.has_work:
            raise RuntimeError("Engine.step has no work: every request is finished (or none was added); "
                               "check has_work first")
        batch = self.schedule()
        if batch.kind == "idle":
            return self.record(batch, now=self.skip_to_next_arrival())
        logits = self.cache.forward(self.model, [s.id for s in batch.seqs], batch.new_tokens, self.decoder)
        return self.postprocess(batch, logits)

    def schedule(self) -> "Scheduled":
        """What the next pass computes: a prefill of the admitted, else a decode of every running sequence."""
        self.released = {}
        admitted = self.plan_admission()
        for _ in admitted:
            self.waiting.popleft()
        if admitted:
            new = []
            for seq in admitted:
                hits = self.cache.add_sequence(seq.id, seq.tokens)
                seq.cached_tokens = seq.cached_tokens if seq.preemptions else hits  # what the first prefill found
                new.append(seq.tokens[hits:])                                        # computed past the hits
            return Scheduled("prefill", admitted, new, admitted=admitted)
        if self.running:
            preempted = self.preempt_for_decode()
            return Scheduled("decode", self.running, [[s.last_token] for s in self.running], preempted=preempted)
        return Scheduled("idle", [], [])  # nothing has arrived yet

    def preempt_for_decode(self) -> list[int]:
        """Preempt the newest running sequences, back to the head of the queue, until the decode's blocks are free."""
        preempted = []
        while not self.cache.can_append([s.id for s in self.running], [[0]] * len(self.running)):
            victim = self.running.pop()
            self.release(victim.id)
            victim.state, victim.preemptions = "waiting", victim.preemptions + 1
            self.waiting.appendleft(victim)
            preempted.append(victim.id)
        return preempted

    def postprocess(self, batch: "Scheduled", logits: torch.Tensor) -> StepRecord:
        """Each row's token chosen and appended; finished sequences retired, their blocks back in the pool."""
        if batch.kind == "prefill":
            for seq in batch.admitted:
                seq.state = "running"
            self.running.extend(batch.admitted)
        # What the pass held, read before finished sequences give their blocks back (as a static batch counts
        # its rows on the step that finishes them).
        used, stored = self.cache.used_blocks() * self.cache.kv_block_size, self.cache.stored_tokens()
        now = self.clock.now()
        for row, (seq, greedy) in enumerate(zip(batch.seqs, first_maximum(logits).tolist())):
            seq.output.append(seq.choose(logits[row: row + 1], greedy))
            if seq.first_token is None:
                seq.first_token = now
            if seq.done:
                seq.state, seq.finish = "finished", now
                self.release(seq.id)
                batch.retired.append(seq.id)
        if batch.retired:
            self.finished.extend(s for s in self.running if s.state == "finished")
            self.running = [s for s in self.running if s.state == "running"]
        return self.record(batch, now, sum(len(t) for t in batch.new_tokens), used, stored)

    def release(self, sid: int) -> None:
        """Give sequence ``sid``'s blocks back to the pool (noted in this step's record)."""
        self.released[sid] = self.cache.block_manager.blocks_of(sid)
        self.cache.free(sid)

    def skip_to_next_arrival(self) -> float:
        arrival = self.waiting[0].request.arrival
        self.clock.wait_until(arrival)
        if (now := self.clock.now()) < arrival:
            raise RuntimeError(f"the clock stood still: after wait_until({arrival:g}) its now() is {now:g}, so "
                               f"the engine would wait forever; a clock's wait_until(t) must bring now() to t")
        return now

    def record(self, batch: "Scheduled", now: float, computed: int = 0, used: int = 0, stored: int = 0) -> StepRecord:
        record = StepRecord(batch.kind, now, [s.id for s in self.running], [s.id for s in batch.admitted],
                            batch.retired, batch.preempted, computed, used, stored, self.released)
        self.history.append(record)
        return record

    @contextmanager
    def rollback_point(self):
        """What a step changes, put back if it raises (a refusal, an interrupt): every request's state and
        output, the queues, the history, and the cache (its own transaction)."""
        before = [(s, s.state, s.preemptions, len(s.output), len(s.logprobs), s.generator.get_state(), s.first_token,
                   s.finish, s.cached_tokens) for s in (*self.waiting, *self.running)]
        queues = (deque(self.waiting), list(self.running), len(self.finished), len(self.history), self.released)
        try:
            with self.cache.transaction():
                yield
        except BaseException:
            for seq, state, preemptions, n_out, n_logprobs, drawn, first, finish, cached in before:
                seq.state, seq.preemptions, seq.first_token, seq.finish = state, preemptions, first, finish
                seq.cached_tokens = cached
                del seq.output[n_out:], seq.logprobs[n_logprobs:]
                seq.generator.set_state(drawn)
            self.waiting, self.running, n_finished, n_history, self.released = queues
            del self.finished[n_finished:], self.history[n_history:]
            raise


@dataclass
class Scheduled:
    """One step's plan: which sequences go through the model, with which new tokens."""
    kind: str                                  # "prefill", "decode" or "idle"
    seqs: list[RequestState]
    new_tokens: list[list[int]]
    admitted: list[RequestState] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    retired: list[int] = field(default_factory=list)   # filled in by postprocess


def check_requests(requests) -> list[Request]:
    """A non-empty list of Requests with distinct ids."""
    requests = check_list("requests", requests, Request, "kvlib.serving.Request objects")
    seen = set()
    for i, r in enumerate(requests):
        r.__post_init__()
        if r.id in seen:
            raise ValueError(f"requests[{i}] repeats the id {r.id}; ids must be unique")
        seen.add(r.id)
    return requests


def check_fits(config, request: Request, what: str) -> None:
    """The request fits the model: its prompt and answer in the block, its token ids in the vocabulary."""
    total = len(request.prompt) + request.max_new_tokens
    if total > config.block_size:
        raise ValueError(f"{what}: prompt ({len(request.prompt)} tokens) + max_new_tokens ({request.max_new_tokens}) "
                         f"= {total}; allowed is at most the model's block of {config.block_size}")
    if max(request.prompt) >= config.vocab_size:
        raise ValueError(f"{what}: prompt holds token id {max(request.prompt)}; allowed are ids "
                         f"in [0, {config.vocab_size})")
