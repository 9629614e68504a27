"""Notebook 7's engine on screen: the block pool as a grid coloured by what each block's request is doing.

:func:`pool_html` pictures one moment of an :class:`~kvlib.serving.Engine` (HTML and SVG, drawn by
the browser); :class:`ServingView` steps the engine with a Step button, one forward pass per click.
Time in the view is counted in steps, so that arrivals and the picture are the same on every machine.
"""
from __future__ import annotations

import html

from ..checks import check_bool, check_int, check_model
from ..model import GPT
from ..paged import ceil_div
from ..serving import Engine, Request, StepClock, StepRecord, check_requests
from .show import FONT, LiveWidget, display, error_message, frame, message_html, row, step_buttons

STATE_COLORS = {
    "admitted": "#8fb3d9",       # prefilled in this step
    "decoding": "#74b36b",       # a running sequence's own block
    "shared prefix": "#9b6fc3",  # used by more than one sequence (reference count > 1)
    "finished": "#e8c547",       # given back this step by a request that is done
    "preempted": "#e07b39",      # given back this step by a request sent back to the queue
    "cached, free": "#d9d9d9",   # free, but still holding a full block a later prompt may hit
    "free": "#f6f6f6",
}
COLUMNS, CELL_W, CELL_H = 8, 72, 46  # the grid is 576 px wide where there is room, and shrinks where there is not


def block_states(engine: Engine, record: StepRecord | None) -> list[tuple[str, str]]:
    """(state, label) of every block of the pool after ``record`` (None: before the first step)."""
    cache = engine.cache
    blocks = cache.block_manager  # the bookkeeping: tables, reference counts, free lists
    owner = {bid: sid for sid, table in blocks.tables.items() for bid in table.blocks}
    released = {} if record is None else record.released
    gone = {bid: sid for sid, blocks in released.items() for bid in blocks}
    states = []
    for block in blocks.blocks:
        bid = block.id
        if block.ref_count > 1:
            states.append(("shared prefix", f"×{block.ref_count}"))
        elif block.ref_count == 1:
            sid = owner[bid]
            table = blocks.table(sid)
            filled = min(cache.kv_block_size, table.length - table.blocks.index(bid) * cache.kv_block_size)
            state = "admitted" if record is not None and sid in record.admitted else "decoding"
            states.append((state, f"r{sid} {max(filled, 0)}/{cache.kv_block_size}"))
        elif bid in gone and record is not None:
            sid = gone[bid]
            states.append(("preempted" if sid in record.preempted else "finished", f"r{sid}"))
        elif bid in blocks.free_cached:
            states.append(("cached, free", ""))
        else:
            states.append(("free", ""))
    return states


def pool_html(engine: Engine, record: StepRecord | None = None) -> str:
    """The pool as a grid, the legend, the counters and the waiting queue, as one HTML string."""
    states = block_states(engine, record)
    rows = ceil_div(len(states), COLUMNS)
    parts = []
    for i, (state, label) in enumerate(states):
        x, y = (i % COLUMNS) * CELL_W, (i // COLUMNS) * CELL_H
        parts.append(f'<rect x="{x}" y="{y}" width="{CELL_W - 3}" height="{CELL_H - 3}" fill="{STATE_COLORS[state]}" '
                     f'stroke="#bbb"/>')
        parts.append(f'<text x="{x + 4}" y="{y + 17}" font-size="16" fill="#666">{i}</text>')
        owner, _, filled = label.partition(" ") if label.startswith("r") else ("", "", label)
        if owner:  # the request, top right; how full the block is, below
            parts.append(f'<text x="{x + CELL_W - 7}" y="{y + 17}" font-size="16" text-anchor="end" '
                         f'fill="#222">{html.escape(owner)}</text>')
        if filled:
            parts.append(f'<text x="{x + CELL_W / 2 - 1}" y="{y + 38}" font-size="16" text-anchor="middle" '
                         f'fill="#222">{html.escape(filled)}</text>')
    width, height = COLUMNS * CELL_W, rows * CELL_H
    svg = (f'<svg viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="xMinYMin meet" '
           f'style="display:block;max-width:{width}px;height:auto;font-family:sans-serif" '
           f'xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>')
    legend = "".join(f'<span style="white-space:nowrap;margin-right:14px"><span style="display:inline-block;'
                     f'width:14px;height:14px;vertical-align:middle;background:{c};border:1px solid #bbb"></span> '
                     f'{html.escape(s)}</span> ' for s, c in STATE_COLORS.items())
    c, b = engine.cache, engine.cache.kv_block_size
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
    return (f'<div style="font-family:sans-serif;{FONT};max-width:100%;overflow-wrap:anywhere">'
            f'<div style="font-weight:600;font-size:17px;margin-bottom:4px">{html.escape(title)}</div>{svg}'
            f'<div style="margin:6px 0;line-height:1.8">{legend}</div><div>{html.escape(counters)}</div>'
            f'<div>{html.escape(waiting)}</div></div>')


class ServingView:
    """Step / Reset buttons over an :class:`Engine` serving ``requests`` (arrivals in steps).

    ``step_button.click()`` runs one engine step without a browser; ``widget`` is the box to show;
    ``picture()`` is the static picture of the current state, an ordinary HTML output.
    """

    def __init__(self, model: GPT, requests: list[Request], *, num_blocks: int = 16, kv_block_size: int = 16,
                 max_num_seqs: int = 8, enable_prefix_caching: bool = True, start_steps: int = 0):
        import ipywidgets as w

        check_model(model)
        requests = check_requests(requests)
        check_bool("enable_prefix_caching", enable_prefix_caching)
        self.model, self.requests = model, requests
        self.options = dict(num_blocks=num_blocks, kv_block_size=kv_block_size, max_num_seqs=max_num_seqs,
                            enable_prefix_caching=enable_prefix_caching)
        self.start_steps = check_int("start_steps", start_steps, 0)
        self.step_button, self.reset_button = step_buttons()
        self.board = w.HTML(layout=w.Layout(width="100%"))
        self.step_button.on_click(lambda _: self.step())
        self.reset_button.on_click(lambda _: self.reset())
        self.widget = frame(row(self.step_button, self.reset_button), self.board)
        self.engine: Engine | None = None
        self.record: StepRecord | None = None
        self._build()  # a bad setting (too few blocks, say) raises here, before anything is on screen
        self._refresh()

    def _build(self) -> None:
        opts = dict(self.options)
        self.engine = Engine(self.model, opts.pop("num_blocks"), clock=StepClock(), **opts)
        for r in sorted(self.requests, key=lambda r: r.arrival):
            self.engine.add(r)
        self.record = None
        for _ in range(self.start_steps):
            if not self.engine.has_work:
                break
            self._step_engine()

    def _step_engine(self) -> None:
        if self.engine.has_work:
            self.record = self.engine.step()
            self.engine.clock.tick()

    def reset(self) -> None:
        try:
            self._build()
        except Exception as err:  # shown in the widget, in place of the pool
            self.fail(error_message(err))
            return
        self._refresh()

    def step(self, refresh: bool = True) -> StepRecord | None:
        if self.engine is None:  # a failed update: its message stays until Reset
            return None
        try:
            self._step_engine()
        except Exception as err:
            self.fail(error_message(err))
            return None
        if refresh:
            self._refresh()
        return self.record

    def fail(self, message: str) -> None:
        """A message in place of the pool, which no longer shows the engine; Step waits for Reset."""
        self.engine, self.record = None, None
        self.step_button.disabled = True
        self.board.value = message_html(message)

    def _refresh(self) -> None:
        try:
            self.step_button.disabled = not self.engine.has_work
            self.board.value = pool_html(self.engine, self.record)
        except Exception as err:
            self.fail(error_message(err))

    def picture(self):
        """The current state as a static HTML output (what a reader without a kernel sees)."""
        from IPython.display import HTML

        return HTML(self.board.value)

    def show(self) -> None:
        display(LiveWidget(self.widget, self.board.value))
