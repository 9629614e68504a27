"""Notebook 9's widget: pick a way of shrinking the cache, see its bytes and its cost, and read a poem written with it.

The numbers come from the table of :func:`kvlib.tools.shrink_bench.shrink_table`; the poem is written
live, through the chosen cache (or by the converted model), from the same prompt and seed each time.
"""
from __future__ import annotations

import html
from dataclasses import asdict

from ..tokenizer import UnknownCharacterError, check_pair
from ..model import check_gpt
from ..poems import encode_prompt
from ..tools.shrink_bench import check_table, settings, written
from .english import english_html
from .show import (FONT, LiveWidget, check_setting, control_style, display, error_message, frame, in_row, message_html,
                   require_str, row)


class ShrinkView:
    """A dropdown of every setting in ``table``; ``text()`` is the current answer as plain text."""

    def __init__(self, model, tokenizer, table: dict, prompt: str = "春风", n_chars: int = 46, seed: int = 0):
        import ipywidgets as w

        check_pair(model, tokenizer)
        check_gpt(model)
        block = model.config.block_size
        check_table(table)
        if table["length"] > block:
            raise ValueError(f"table['length'] must be at most the model's block of {block}, got {table['length']}")
        if table["config"] != asdict(model.config):
            raise ValueError(f"model must be the model the table was measured on (config {table['config']}), got "
                             f"one with config {asdict(model.config)}: measure it with shrink_table(model, tokenizer)")
        self.prompt = require_str("prompt", prompt)
        try:
            ids = encode_prompt(tokenizer, prompt)
        except UnknownCharacterError as err:
            raise ValueError(f"prompt: {err}") from None
        if len(ids) > block - 1:
            raise ValueError(f"prompt is too long: the model reads {block} tokens, so at most {block - 2} characters "
                             f"leave room for a new one, got {len(ids) - 1}")
        check_setting("n_chars", n_chars, 1, block - len(ids) + 1, integer=True)
        check_setting("seed", seed, 0, 2**63 - 1, integer=True)
        self.model, self.tokenizer, self.table, self.n_chars, self.seed = model, tokenizer, table, n_chars, seed
        self.rows = {r["label"]: r for r in table["rows"]}
        self.settings = {s.label: s for s in settings(table["length"])}
        unknown = sorted(set(self.rows) - set(self.settings))
        if unknown or len(self.rows) != len(table["rows"]):
            raise ValueError(f"table['rows'] must hold each label of shrink_table's settings once, got "
                             f"{unknown[:3] or 'a label twice'}")
        self.choice = w.Dropdown(options=list(self.rows), value=next(iter(self.rows)), description="cache",
                                 style=control_style(), layout=in_row(420, 280, 560))
        self.output = w.HTML(layout=w.Layout(width="100%"))
        self.choice.observe(lambda _: self._refresh(), names="value")
        # The dropdown sits in a row: its layout (in_row) gives it a flex basis of 420 px, which in the frame's
        # column would be its height, leaving a blank gap under it.
        self.widget = frame(row(self.choice), self.output)
        self._refresh()

    def poem(self, label: str) -> str:
        """``n_chars`` characters after the prompt, sampled at temperature 0.8 with the view's seed."""
        return written(self.model, self.tokenizer, self.settings[label], self.prompt, self.n_chars, temperature=0.8,
                       seed=self.seed).replace("\n", " ")

    def text(self) -> str:
        r = self.rows[self.choice.value]
        return (f"{r['label']}: {r['bytes_per_token']:,.0f} bytes a token ({100 * r['memory_cut']:.1f} % less than "
                f"float32), {r['nats_per_token']:.3f} nats/token, KL {r['kl']:.4f}, top-1 the same as the full "
                f"cache at {100 * r['top1_agreement']:.1f} % of positions\n{self.poem(self.choice.value)}")

    def show(self) -> None:
        display(LiveWidget(self.widget, self.output.value))

    def _refresh(self) -> None:
        try:
            numbers, poem = self.text().split("\n", 1)
            self.output.value = (f"<p style='{FONT};margin:4px 0;overflow-wrap:anywhere'>{html.escape(numbers)}</p>"
                                 f"<p style='{FONT};margin:4px 0;overflow-wrap:anywhere'>「{html.escape(poem)}」</p>"
                                 + english_html(poem))  # the translation stored for exactly this text, or none
        except Exception as err:  # shown in place of the answer
            self.output.value = message_html(error_message(err))
