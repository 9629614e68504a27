"""The same trace served three ways, timed and counted: one request at a time, static batches, and the
continuous-batching :class:`~kvlib.serving.Engine`, each returning a :class:`RunResult`.

``python -m kvlib serve`` (``kvlib.tools.serve_bench``) and notebook 7 compare them; every request is greedy and
writes exactly its ``max_new_tokens``, so the three ways do the same work and must write the same tokens.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..checks import check_choice, check_int, check_model
from ..decoding import DECODERS, generate, pad_prompts
from ..model import GPT
from ..serving import Clock, Engine, Request, check_fits, check_requests


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


def run_static_batching(model: GPT, requests: list[Request], batch_size: int = 8, decoder: str = "fast",
                        peer=None) -> RunResult:
    """Fixed batches in arrival order: when the server is free it takes up to ``batch_size`` arrived requests, as
    many as fit the block together (padded to the longest prompt, run until the longest answer).

    ``decoder`` as in ``generate``: "fast" (the lean step, as the engine's decode) or "model". With ``peer``
    (a :class:`~kvlib.tools.ct2_peer.CT2Peer`) the batches run in CTranslate2 instead, on the same schedule.
    """
    check_model(model)
    requests = check_requests(requests)
    for i, r in enumerate(requests):
        check_fits(model.config, r, f"requests[{i}] (id {r.id})")
    batch_size = check_int("batch_size", batch_size, 1)
    check_choice("decoder", decoder, tuple(DECODERS))
    name = f"static batches of {batch_size}, " + ("CTranslate2" if peer is not None else "static cache")
    clock, out = Clock(), _result(name, requests)
    queue = deque(sorted(requests, key=lambda r: r.arrival))
    while queue:
        clock.wait_until(queue[0].arrival)
        now, batch = clock.now(), []
        while (queue and len(batch) < batch_size and queue[0].arrival <= now
               and _fits_together(batch + [queue[0]], model.config.block_size)):
            batch.append(queue.popleft())
        if peer is None:
            _run_static(model, batch, out, clock, decoder)
        else:
            _run_static_peer(peer, batch, out, clock)
    return out


def _run_static_peer(peer, batch: list[Request], out: RunResult, clock: Clock) -> None:
    """One fixed batch through CTranslate2, run until its longest answer; its first tokens are timed when the
    batch returns (CTranslate2 hands the batch back whole), so its time to first token is an upper bound."""
    longest = max(r.max_new_tokens for r in batch)
    start = clock.now()
    written = peer.greedy_ragged([r.prompt for r in batch], longest)
    now = clock.now()
    for r, tokens in zip(batch, written):
        out.tokens[r.id], out.first_token[r.id], out.finish[r.id] = tokens[: r.max_new_tokens], now, now
    out.decode_seconds += now - start
    out.steps += longest
    out.computed_tokens += sum(len(r.prompt) for r in batch) + len(batch) * (longest - 1)
    out.decode_tokens += sum(r.max_new_tokens - 1 for r in batch)
    out.decode_rows += len(batch) * (longest - 1)


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
