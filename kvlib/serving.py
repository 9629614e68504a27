"""Serving many users: requests over time, a continuous-batching engine on the paged cache, and baselines.

Reading order: ``Request`` (who asks what, when; ``kvlib.tools.traces`` draws them from the corpus) -> ``Clock`` (time that skips
idle waits; ``StepClock`` counts steps instead) -> ``Engine`` (the scheduler: admit, decode everyone in one forward, retire, preempt)
-> ``run_continuous``, ``run_one_at_a_time`` and ``run_static_batching`` (the same trace three
ways, each returning a :class:`RunResult`). Parallel sampling on the same cache is :func:`kvlib.paged.parallel_sample`.

Every request here is greedy and writes exactly its ``max_new_tokens`` (the answer length taken from
a real poem), so the three ways do the same work and must write the same tokens.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from .checks import check_bool, check_choice, check_id_list, check_int, check_list, check_model, check_real
from .guards import all_or_nothing, one_thread_at_a_time
from .decoding import DECODERS, generate, pad_prompts
from .model import GPT
from .weights import check_weights
from .paged import KV_BLOCK_SIZE, PagedKVCache, ceil_div
from .sampling import first_maximum


@dataclass
class Request:
    """One user's request; checked when made (ids, lengths, time), and by ``Engine.add`` against the model."""
    id: int
    prompt: list[int]       # token ids, the poem separator first
    max_new_tokens: int     # the answer length: the request is done after this many tokens
    arrival: float = 0.0    # seconds after the start of the trace

    def __post_init__(self):
        self.id = check_int("id", self.id, 0)
        self.prompt = check_id_list("prompt", self.prompt)
        self.max_new_tokens = check_int("max_new_tokens", self.max_new_tokens, 1)
        self.arrival = check_real("arrival", self.arrival, 0, allowed="a finite number of seconds >= 0")


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
    """A request inside the engine: its tokens so far and what happened to it."""
    request: Request
    output: list[int] = field(default_factory=list)
    state: str = "waiting"           # waiting -> running -> finished; running -> waiting when preempted
    first_token: float | None = None
    finish: float | None = None
    preemptions: int = 0

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
        return len(self.output) >= self.request.max_new_tokens


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
    def add(self, request: Request) -> None:
        """Queue a copy of the request (changing it afterwards changes nothing here); refused, and nothing queued,
        if it cannot fit the model or repeats an id."""
        if not isinstance(request, Request):
            raise TypeError(f"request must be a kvlib.serving.Request, got {type(request).__name__}")
        request.__post_init__()  # again: its fields may have been changed since it was made
        check_fits(self.model.config, request, f"request {request.id}")
        if any(s.id == request.id for s in (*self.waiting, *self.running, *self.finished)):
            raise ValueError(f"request id {request.id} is already in this engine; ids must be unique")
        self.waiting.append(RequestState(replace(request, prompt=list(request.prompt))))

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
            new = [seq.tokens[self.cache.add_sequence(seq.id, seq.tokens):] for seq in admitted]  # past prefix hits
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
        """Each row's greedy token appended; finished sequences retired, their blocks back in the pool."""
        if batch.kind == "prefill":
            for seq in batch.admitted:
                seq.state = "running"
            self.running.extend(batch.admitted)
        # What the pass held, read before finished sequences give their blocks back (as a static batch counts
        # its rows on the step that finishes them).
        used, stored = self.cache.used_blocks() * self.cache.kv_block_size, self.cache.stored_tokens()
        now = self.clock.now()
        for seq, token in zip(batch.seqs, first_maximum(logits).tolist()):
            seq.output.append(token)
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
        before = [(s, s.state, s.preemptions, len(s.output), s.first_token, s.finish)
                  for s in (*self.waiting, *self.running)]
        queues = (deque(self.waiting), list(self.running), len(self.finished), len(self.history), self.released)
        try:
            with self.cache.transaction():
                yield
        except BaseException:
            for seq, state, preemptions, n_out, first, finish in before:
                seq.state, seq.preemptions, seq.first_token, seq.finish = state, preemptions, first, finish
                del seq.output[n_out:]
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


@dataclass
class RunResult:
    """One way of serving a trace: every request's tokens and times, and what the KV memory held."""
    name: str
    tokens: dict[int, list[int]]
    arrival: dict[int, float]
    first_token: dict[int, float]
    finish: dict[int, float]
    used_positions: int = 0     # summed over decode steps: positions reserved for running requests
    real_tokens: int = 0        # of which held a token
    computed_tokens: int = 0    # tokens that went through the model (prefill and decode)
    prefill_tokens: int = 0     # of which in prefills (prompts, and recomputation after preemption)
    prefix_hit_tokens: int = 0  # prompt tokens found in the pool instead of computed
    preemptions: int = 0
    steps: int = 0              # forward passes
    prefill_passes: int = 0     # of which prefills
    prefill_seconds: float = 0.0  # wall time of the prefill passes (with the work around each)
    decode_seconds: float = 0.0   # and of the decode passes
    decode_tokens: int = 0      # tokens the decode passes wrote that a request kept
    decode_rows: int = 0        # rows the decode passes computed: kept tokens, and a static batch's finished rows

    @property
    def generated(self) -> int:
        return sum(len(t) for t in self.tokens.values())

    @property
    def makespan(self) -> float:
        return max(self.finish.values())

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.makespan

    @property
    def memory_share(self) -> float:
        return self.real_tokens / self.used_positions if self.used_positions else 0.0

    def latencies(self) -> list[float]:
        return [self.finish[i] - self.arrival[i] for i in sorted(self.finish)]

    def ttfts(self) -> list[float]:
        return [self.first_token[i] - self.arrival[i] for i in sorted(self.first_token)]


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


def _result(name: str, requests: list[Request]) -> RunResult:
    return RunResult(name, {}, {r.id: r.arrival for r in requests}, {}, {})


def run_continuous(model: GPT, requests: list[Request], num_blocks: int, *, on_step=None,
                   **engine_options) -> RunResult:
    """Serve the trace with the :class:`Engine`; ``on_step(engine, record)`` after every step."""
    requests = check_requests(requests)
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be None or a function (engine, record), got {type(on_step).__name__}")
    engine = Engine(model, num_blocks, **engine_options)
    for r in sorted(requests, key=lambda r: r.arrival):
        engine.add(r)
    while engine.has_work:
        record = engine.step()
        if on_step is not None:
            on_step(engine, record)
    out = _result("continuous batching, paged cache", requests)
    for s in engine.finished:
        out.tokens[s.id], out.first_token[s.id], out.finish[s.id] = s.output, s.first_token, s.finish
        out.preemptions += s.preemptions
    out.prefix_hit_tokens = engine.cache.prefix_hit_tokens
    before = 0.0  # the engine's clock when the pass began: the end of the one before
    for rec in engine.history:
        out.computed_tokens += rec.computed_tokens
        if rec.kind == "prefill":
            out.prefill_tokens += rec.computed_tokens
            out.prefill_passes += 1
            out.prefill_seconds += rec.time - before
        if rec.kind == "decode":
            out.used_positions += rec.used_positions
            out.real_tokens += rec.real_tokens
            out.decode_tokens += rec.computed_tokens  # one a running sequence, each kept
            out.decode_rows += rec.computed_tokens
            out.decode_seconds += rec.time - before
        before = rec.time
    out.steps = sum(rec.kind != "idle" for rec in engine.history)
    return out


def _run_static(model: GPT, batch: list[Request], out: RunResult, clock: Clock, decoder: str) -> None:
    """One fixed batch through ``generate``: a static cache, the fast decode step or the teaching model's.

    ``generate`` reserves ``block_size`` positions for every row, and the batch runs until its
    longest answer is written: shorter rows keep their rows (and compute) until then.
    """
    block = model.config.block_size
    idx, mask = pad_prompts([r.prompt for r in batch])
    longest = max(r.max_new_tokens for r in batch)
    start = clock.now()

    def on_token(step, new):
        now = clock.now()
        if step == 0:  # the prefill's token: the pass that chose it has ended
            out.prefill_seconds += now - start
            for r in batch:
                out.first_token[r.id] = now
        out.used_positions += len(batch) * block
        out.real_tokens += sum(len(r.prompt) + min(step + 1, r.max_new_tokens) for r in batch)

    result = generate(model, idx, longest, temperature=0.0, key_mask=None if len(batch) == 1 else mask,
                      decoder=decoder, on_token=on_token)
    now = clock.now()
    for b, r in enumerate(batch):
        out.tokens[r.id] = result.new_tokens[b, :r.max_new_tokens].tolist()
        out.finish[r.id] = now
    out.decode_seconds += now - out.first_token[batch[0].id]
    out.computed_tokens += idx.numel() + len(batch) * (longest - 1)
    out.prefill_tokens += idx.numel()
    out.decode_tokens += sum(r.max_new_tokens - 1 for r in batch)
    out.decode_rows += len(batch) * (longest - 1)
    out.steps += longest
    out.prefill_passes += 1


def run_static_batching(model: GPT, requests: list[Request], batch_size: int = 8, decoder: str = "fast") -> RunResult:
    """Fixed batches in arrival order: when the server is free it takes up to ``batch_size`` arrived requests, as
    many as fit the block together (padded to the longest prompt, run until the longest answer).

    ``decoder`` as in ``generate``: "fast" (the lean step, as the engine's decode) or "model".
    """
    check_model(model)
    requests = check_requests(requests)
    for i, r in enumerate(requests):
        check_fits(model.config, r, f"requests[{i}] (id {r.id})")
    batch_size = check_int("batch_size", batch_size, 1)
    check_choice("decoder", decoder, tuple(DECODERS))
    clock, out = Clock(), _result(f"static batches of {batch_size}, static cache", requests)
    queue = deque(sorted(requests, key=lambda r: r.arrival))
    while queue:
        clock.wait_until(queue[0].arrival)
        now, batch = clock.now(), []
        while (queue and len(batch) < batch_size and queue[0].arrival <= now
               and _fits_together(batch + [queue[0]], model.config.block_size)):
            batch.append(queue.popleft())
        _run_static(model, batch, out, clock, decoder)
    return out


def _fits_together(batch: list[Request], block_size: int) -> bool:
    """Whether one padded batch writes every answer: its prompts are padded to the longest, and the batch runs
    until its longest answer is written (the last token never fed back). One request alone always fits
    (``check_fits``); the next one that would not waits for the next batch."""
    return max(len(r.prompt) for r in batch) + max(r.max_new_tokens for r in batch) - 1 <= block_size


def run_one_at_a_time(model: GPT, requests: list[Request], decoder: str = "fast") -> RunResult:
    """Each request alone, in arrival order, through ``generate`` with a static cache (the single-stream path)."""
    out = run_static_batching(model, requests, batch_size=1, decoder=decoder)
    out.name = "one at a time, static cache"
    return out
