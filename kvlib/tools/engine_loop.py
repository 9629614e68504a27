"""One thread owns the engine; many clients wait on their tokens.

An :class:`~kvlib.serving.Engine` is stepped by one thread at a time (its methods refuse a second). An
:class:`EngineLoop` is that thread: clients ``submit`` requests from any thread (an HTTP server's event loop,
say) and read what happens to each from its :class:`Ticket`: the new tokens as soon as the step that chose
them ends, then how the request finished. ``abort`` stops a request (its client went away) and gives its
blocks back; a bounded number of requests in flight turns the next one away with :class:`Busy`.
"""
from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..checks import check_int
from ..serving import Engine, Request, RequestState

DONE = ("finished", "aborted")


class Busy(Exception):
    """Too many requests in flight: the client should try again later (HTTP 503 with Retry-After)."""


@dataclass
class Event:
    """What happened to a request since the last event: new tokens (with their top log-probabilities when
    asked), and at the end how it finished, or the error that refused it."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None   # "stop", "length" or "abort" on the last event
    cached_tokens: int = 0             # prompt tokens found in the pool (prefix caching)
    error: Exception | None = None     # the engine refused the request (nothing was computed)


class Ticket:
    """A client's hold on one request: its events arrive in order on ``events`` (an ``asyncio.Queue`` when
    submitted from an event loop, else a ``queue.Queue``)."""

    def __init__(self, request_id: int, loop: asyncio.AbstractEventLoop | None = None):
        self.id, self.loop, self.sent = request_id, loop, 0
        self.events: asyncio.Queue | queue.Queue = asyncio.Queue() if loop is not None else queue.Queue()
        self.started = asyncio.Event() if loop is not None else threading.Event()  # set by its first event
        self.submitted = time.perf_counter()

    def put(self, event: Event) -> None:
        """Called by the engine's thread: hand ``event`` to the client's thread or event loop."""
        if self.loop is None:
            self.events.put(event)
            self.started.set()
        else:
            self.loop.call_soon_threadsafe(self.deliver, event)

    def deliver(self, event: Event) -> None:
        """In the client's event loop: queue ``event`` and mark the request started (its prefill has run)."""
        self.events.put_nowait(event)
        self.started.set()


class EngineLoop:
    """The thread that steps ``engine``; at most ``max_in_flight`` requests waiting or running at once."""

    def __init__(self, engine: Engine, max_in_flight: int = 64, on_step: Callable | None = None):
        if not isinstance(engine, Engine):
            raise TypeError(f"engine must be a kvlib.serving.Engine, got {type(engine).__name__}")
        self.engine = engine
        self.max_in_flight = check_int("max_in_flight", max_in_flight, 1)
        self.on_step = on_step                    # on_step(record) after every step, in the engine's thread
        self.tickets: dict[int, Ticket] = {}
        self.inbox: queue.Queue = queue.Queue()
        self.ids = itertools.count()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, name="kvlib-engine", daemon=True)
        self.stopped = threading.Event()

    def start(self) -> "EngineLoop":
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the step in progress, abort every request left, and end the thread."""
        self.inbox.put(("stop", None))
        self.thread.join(timeout)

    @property
    def in_flight(self) -> int:
        return len(self.tickets)

    def submit(self, make_request: Callable[[int], Request], loop: asyncio.AbstractEventLoop | None = None) -> Ticket:
        """Queue ``make_request(id)`` (the loop picks a fresh id) and return its ticket; :class:`Busy` when
        ``max_in_flight`` requests are already waiting or running."""
        with self.lock:
            if self.stopped.is_set():
                raise Busy("the server is shutting down")
            if len(self.tickets) >= self.max_in_flight:
                raise Busy(f"{len(self.tickets)} requests are in flight, the most this server takes at once")
            ticket = Ticket(next(self.ids), loop)
            self.tickets[ticket.id] = ticket
        try:
            request = make_request(ticket.id)
        except BaseException:
            with self.lock:
                del self.tickets[ticket.id]
            raise
        self.inbox.put(("add", request))
        return ticket

    def abort(self, request_id: int) -> None:
        """Stop a request at the next chance (between two steps); its ticket then gets its last event."""
        self.inbox.put(("abort", request_id))

    # ---- the engine's thread ---------------------------------------------------------------------

    def run(self) -> None:
        states: dict[int, RequestState] = {}
        while not self.stopped.is_set():
            self.take_inbox(states, wait=not self.engine.has_work)
            if self.engine.has_work and not self.stopped.is_set():
                record = self.engine.step()
                if self.on_step is not None:
                    self.on_step(record)
            self.publish(states)
        for rid in list(states):   # shutting down: whatever is left is aborted
            self.engine.abort(rid)
        self.publish(states)

    def take_inbox(self, states: dict[int, RequestState], wait: bool) -> None:
        """Every message waiting in the inbox (blocking a little for the first one when the engine is idle)."""
        try:
            message = self.inbox.get(timeout=0.05) if wait else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = message
            if kind == "add":
                try:
                    states[payload.id] = self.engine.add(payload)
                except (TypeError, ValueError) as err:
                    self.finish(payload.id, Event(error=err))
            elif kind == "abort":
                self.engine.abort(payload)
            else:
                self.stopped.set()
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                return

    def publish(self, states: dict[int, RequestState]) -> None:
        """Each request's new tokens to its ticket; a finished or aborted one gets its last event and leaves."""
        for rid, seq in list(states.items()):
            ticket = self.tickets[rid]
            new = seq.output[ticket.sent:]
            done = seq.state in DONE
            if new or done:
                event = Event(new, seq.logprobs[ticket.sent: ticket.sent + len(new)],
                              seq.finish_reason if done else None, seq.cached_tokens)
                ticket.sent += len(new)
                if done:
                    del states[rid]
                    self.finish(rid, event)
                else:
                    ticket.put(event)
        self.engine.finished.clear()   # a live server keeps no record of finished requests
        self.engine.history.clear()

    def finish(self, rid: int, event: Event) -> None:
        with self.lock:
            ticket = self.tickets.pop(rid)
        ticket.put(event)
