"""Notebook 7's engine on screen: the block pool as a grid coloured by what each block's request is doing.

:func:`pool_html` pictures one moment of an :class:`~kvlib.serving.Engine` (HTML and SVG, drawn by
the browser); :class:`ServingView` steps the engine with a Step button, one forward pass per click.
Time in the view is counted in steps, so that arrivals and the picture are the same on every machine.
"""
from __future__ import annotations

import html

from ..model import GPT
from ..serving import Engine, Request, StepRecord
from .show import LiveWidget, display

STATE_COLORS = {
    "admitted": "#8fb3d9",       # prefilled in this step
    "decoding": "#74b36b",       # a running sequence's own block
    "shared prefix": "#9b6fc3",  # used by more than one sequence (reference count > 1)
    "finished": "#e8c547",       # given back this step by a request that is done
    "preempted": "#e07b39",      # given back this step by a request sent back to the queue
    "cached, free": "#d9d9d9",   # free, but still holding a full block a later prompt may hit
    "free": "#f6f6f6",
}
COLUMNS, CELL_W, CELL_H = 8, 74, 40


class StepClock:
    """The engine's clock in steps: ``now()`` is the number of steps taken (arrivals are in steps too)."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)


def block_states(engine: Engine, record: StepRecord | None) -> list[tuple[str, str]]:
    """(state, label) of every block of the pool after ``record`` (None: before the first step)."""
    pool, cache = engine.cache.pool, engine.cache
    owner = {bid: sid for sid, table in cache.tables.items() for bid in table.blocks}
    released = {} if record is None else record.released
    gone = {bid: sid for sid, blocks in released.items() for bid in blocks}
    states = []
    for block in pool.blocks:
        bid = block.id
        if block.ref_count > 1:
            states.append(("shared prefix", f"×{block.ref_count}"))
        elif block.ref_count == 1:
            sid = owner[bid]
            table = cache.tables[sid]
            filled = min(cache.block_size, table.length - table.blocks.index(bid) * cache.block_size)
            state = "admitted" if record is not None and sid in record.admitted else "decoding"
            states.append((state, f"r{sid} {max(filled, 0)}/{cache.block_size}"))
        elif bid in gone and record is not None:
            sid = gone[bid]
            states.append(("preempted" if sid in record.preempted else "finished", f"r{sid}"))
        elif bid in pool.free_cached:
            states.append(("cached, free", ""))
        else:
            states.append(("free", ""))
    return states


def pool_html(engine: Engine, record: StepRecord | None = None) -> str:
    """The pool as a grid, the legend, the counters and the waiting queue, as one HTML string."""
    states = block_states(engine, record)
    rows = -(-len(states) // COLUMNS)
    parts = []
    for i, (state, label) in enumerate(states):
        x, y = (i % COLUMNS) * CELL_W, (i // COLUMNS) * CELL_H
        parts.append(f'<rect x="{x}" y="{y}" width="{CELL_W - 3}" height="{CELL_H - 3}" fill="{STATE_COLORS[state]}" '
                     f'stroke="#bbb"/>')
        parts.append(f'<text x="{x + 4}" y="{y + 14}" font-size="11" fill="#666">{i}</text>')
        if label:
            parts.append(f'<text x="{x + CELL_W / 2 - 1}" y="{y + 30}" font-size="13" text-anchor="middle" '
                         f'fill="#222">{html.escape(label)}</text>')
    svg = (f'<svg width="{COLUMNS * CELL_W}" height="{rows * CELL_H}" xmlns="http://www.w3.org/2000/svg">'
           f'{"".join(parts)}</svg>')
    legend = " ".join(f'<span style="display:inline-block;width:12px;height:12px;background:{c};'
                      f'border:1px solid #bbb"></span> {html.escape(s)}' for s, c in STATE_COLORS.items())
    c, b = engine.cache, engine.cache.block_size
    used, real = c.used_blocks() * b, c.stored_tokens()
    share = f"{100 * real / used:.0f} %" if used else "–"
    now = engine.clock.now()
    queue = [f"r{s.id}" + (" (preempted)" if s.preemptions else "") for s in engine.waiting
             if s.request.arrival <= now]
    later = sum(s.request.arrival > now for s in engine.waiting)
    title = "before the first step" if record is None else f"step {len(engine.history)}: {record.kind}"
    if record is not None and record.kind != "idle":
        events = [f"admitted {', '.join(f'r{i}' for i in record.admitted)}" if record.admitted else "",
                  f"retired {', '.join(f'r{i}' for i in record.retired)}" if record.retired else "",
                  f"preempted {', '.join(f'r{i}' for i in record.preempted)}" if record.preempted else ""]
        title += "; " + "; ".join(e for e in events if e) if any(events) else ""
    counters = (f"blocks in use {c.used_blocks()} of {c.pool.num_blocks}; reserved positions {used}, holding a "
                f"token {real} ({share}); running {len(engine.running)}, finished {len(engine.finished)}")
    waiting = (f"waiting: {', '.join(queue) if queue else 'nobody'}" + (f"; {later} not arrived yet" if later else ""))
    return (f'<div style="font-family:sans-serif;font-size:14px">'
            f'<div style="font-weight:600;font-size:15px">{html.escape(title)}</div>{svg}'
            f'<div style="margin:4px 0">{legend}</div><div>{html.escape(counters)}</div>'
            f'<div>{html.escape(waiting)}</div></div>')


class ServingView:
    """Step / Reset buttons over an :class:`Engine` serving ``requests`` (arrivals in steps).

    ``step_button.click()`` runs one engine step without a browser; ``widget`` is the box to show;
    ``picture()`` is the static picture of the current state, an ordinary HTML output.
    """

    def __init__(self, model: GPT, requests: list[Request], *, num_blocks: int = 16, block_size: int = 16,
                 max_num_seqs: int = 8, enable_prefix_caching: bool = True, start_steps: int = 0):
        import ipywidgets as w

        self.model, self.requests = model, requests
        self.options = dict(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                            enable_prefix_caching=enable_prefix_caching)
        self.start_steps = start_steps
        self.step_button = w.Button(description="Step", button_style="primary", icon="forward")
        self.reset_button = w.Button(description="Reset", icon="refresh")
        self.board = w.HTML()
        self.step_button.on_click(lambda _: self.step())
        self.reset_button.on_click(lambda _: self.reset())
        self.widget = w.VBox([w.HBox([self.step_button, self.reset_button]), self.board])
        self.reset()

    def reset(self) -> None:
        opts = dict(self.options)
        self.engine = Engine(self.model, opts.pop("num_blocks"), clock=StepClock(), **opts)
        for r in sorted(self.requests, key=lambda r: r.arrival):
            self.engine.add(r)
        self.record: StepRecord | None = None
        for _ in range(self.start_steps):
            self.step(refresh=False)
        self._refresh()

    def step(self, refresh: bool = True) -> StepRecord | None:
        if self.engine.has_work:
            self.record = self.engine.step()
            self.engine.clock.t += 1
        self.step_button.disabled = not self.engine.has_work
        if refresh:
            self._refresh()
        return self.record

    def _refresh(self) -> None:
        self.board.value = pool_html(self.engine, self.record)

    def picture(self):
        """The current state as a static HTML output (what a reader without a kernel sees)."""
        from IPython.display import HTML

        return HTML(self.board.value)

    def show(self) -> None:
        display(LiveWidget(self.widget, self.board.value))
