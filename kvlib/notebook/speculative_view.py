"""Notebook 8's round-by-round view: a :class:`~kvlib.speculative.SpeculativeDecoder` on screen.

Each round is one line: the draft's guesses, green where the target kept them, struck through in
red for the first one it rejected and in grey for those after it (never judged), then the target's
own token, orange when it corrects a guess and blue when it is the bonus after γ kept guesses.
Above the rounds: the text so far, its English (the translation stored for exactly that text, else the
glosses of the new characters that have one) and the running acceptance rate α. ``step_button.click()``
works without a browser.
"""
from __future__ import annotations

import html

import torch

from ..checks import check_int
from ..tokenizer import check_pair, decode_complete, token_label
from ..cache import check_multi_head
from ..speculative import SPECULATE_INSTEAD, Draft, NeuralDraft, Round, SpeculativeDecoder
from ..poems import encode_prompt, unk_ids
from .english import GLOSSES, TRANSLATIONS, glossed
from .show import (FONT, HIGHLIGHT_COLOR, LiveWidget, check_setting, control_style, display, error_message, frame,
                   html_label, in_row, message_html, row, show_refusals, slider, step_buttons, too_long_message)

KEPT, REJECTED, BONUS = "#2e7d32", "#c62828", "#1565c0"
UNJUDGED = "#8a8a8a"
STYLES = {"kept": f"background:#e3f2e1;color:{KEPT}", "rejected": f"color:{REJECTED};text-decoration:line-through",
          "unjudged": f"color:{UNJUDGED};text-decoration:line-through",
          "correction": f"background:#fbe3d3;color:{HIGHLIGHT_COLOR};font-weight:700",
          "bonus": f"background:#dde8f7;color:{BONUS};font-weight:700"}


def _span(token: str, kind: str) -> str:
    return (f'<span class="spec-{kind}" style="{STYLES[kind]};font-size:20px;padding:0 2px;'
            f'margin-right:1px">{html_label(token)}</span>')


def round_html(tokenizer, r: Round, number: int) -> str:
    """One round as a line of coloured tokens."""
    kinds = ["kept" if i < r.accepted else "rejected" if i == r.accepted else "unjudged" for i in range(len(r.drafted))]
    parts = [_span(token_label(tokenizer, t), kind) for t, kind in zip(r.drafted, kinds)]
    parts.append(" → " + _span(token_label(tokenizer, r.token), "bonus" if r.bonus else "correction"))
    verdict = (f"all {len(r.drafted)} kept, plus the bonus" if r.bonus and r.drafted else
               "no guess (the block is nearly full)" if not r.drafted else
               f"{r.accepted} of {len(r.drafted)} kept, then the target's own token")
    return (f'<div style="font-family:sans-serif;{FONT};margin:2px 0;overflow-wrap:anywhere">'
            f'<span style="display:inline-block;min-width:5.5em;color:#777">round {number}</span>{"".join(parts)} '
            f'<span style="color:#666;{FONT};white-space:nowrap">{verdict}</span></div>')


def english_html(text: str, new: str) -> str:
    """The English of ``text``: its stored translation, else glosses of the characters of ``new`` that have one."""
    if text in TRANSLATIONS:
        return f'<div style="{FONT};margin:0 0 4px">→ {html.escape(TRANSLATIONS[text])}</div>'
    known = [ch for ch in dict.fromkeys(new) if ch in GLOSSES and ch.isalpha()]  # characters, not punctuation
    if not known:
        return ""
    return (f'<div style="{FONT};margin:0 0 4px;color:#555">new characters with a gloss: '
            f'{html.escape(glossed(known))}</div>')


def legend_html() -> str:
    return (f'<div style="{FONT};font-family:sans-serif;margin:4px 0;line-height:1.8">'
            + " ".join(f'<span style="white-space:nowrap;margin-right:10px">{_span(label, kind)} {kind}</span>'
                       for label, kind in (("字", "kept"), ("字", "rejected"), ("字", "unjudged"), ("字", "correction"),
                                           ("字", "bonus")))
            + "</div>")


class SpeculativeView:
    """A prompt box, a draft menu, a γ slider and Round / Reset buttons around a speculative decoder.

    ``widget`` is the ipywidgets box; ``decoder`` the current :class:`SpeculativeDecoder` (None while
    the prompt is invalid). Greedy, so the text is exactly the target's own greedy text. The view
    starts after ``start_rounds`` rounds, so that its default state already shows some.
    """

    def __init__(self, model, tokenizer, drafts: dict[str, Draft], prompt: str = "床前明月光，", *,
                 gamma: int = 4, max_new_tokens: int = 48, start_rounds: int = 3):
        import ipywidgets as w

        check_pair(model, tokenizer)
        check_multi_head(model.config, "SpeculativeView", SPECULATE_INSTEAD)
        if not isinstance(drafts, dict):
            raise TypeError(f"drafts must be a dict of name -> Draft, e.g. {{'n-gram': NgramDraft(...)}}, "
                            f"got {type(drafts).__name__}")
        if not drafts:
            raise ValueError("drafts must name at least one draft, e.g. {'n-gram': NgramDraft(...)}")
        for name, d in drafts.items():
            if not isinstance(name, str) or not isinstance(d, Draft):
                raise TypeError(f"drafts must map str names to kvlib.speculative.Draft objects, got "
                                f"{name!r:.40}: {type(d).__name__}")
            size = d.model.config.vocab_size if isinstance(d, NeuralDraft) else getattr(d, "vocab_size", None)
            if size not in (None, tokenizer.vocab_size):
                raise ValueError(f"drafts[{name!r}] guesses among {size} token ids, but the model's tokenizer has "
                                 f"{tokenizer.vocab_size}: a draft must share the model's tokenizer")
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str of Chinese characters, got {prompt!r:.60}")
        check_setting("gamma", gamma, 1, 8, integer=True)
        self.model, self.tokenizer, self.drafts = model, tokenizer, drafts
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1, model.config.block_size)
        self.start_rounds = check_int("start_rounds", start_rounds, 0)
        self.prompt_box = w.Text(value=prompt, description="prompt", continuous_update=False,
                                 style=control_style(font_size="16px"),
                                 layout=in_row(340, 240, 460))
        self.draft_menu = w.Dropdown(options=list(drafts), value=next(iter(drafts)), description="draft",
                                     style=control_style(), layout=in_row(300, 240, 420))
        self.gamma = slider("int", value=gamma, min=1, max=8, description="γ", continuous_update=False,
                            layout=in_row(300, 240, 420))
        self.step_button, self.reset_button = step_buttons("Round")
        self.output = w.HTML(layout=w.Layout(width="100%"))
        show_refusals(self.output, self.gamma)
        self.step_button.on_click(lambda _: self.step())
        self.reset_button.on_click(lambda _: self.restart())
        for control in (self.prompt_box, self.draft_menu, self.gamma):
            control.observe(lambda _: self.restart(), names="value")
        self.widget = frame(row(self.prompt_box, self.draft_menu),
                            row(self.gamma, row(self.step_button, self.reset_button, width="auto")), self.output)
        self.decoder: SpeculativeDecoder | None = None
        self.restart()

    # ---- state ----------------------------------------------------------------------------------

    def restart(self) -> None:
        try:
            ids = encode_prompt(self.tokenizer, self.prompt_box.value)
            if len(ids) > (block := self.model.config.block_size):  # the poem separator takes one
                self.fail(too_long_message(block, block - 1))
                return
            self.decoder = SpeculativeDecoder(self.model, self.drafts[self.draft_menu.value], torch.tensor([ids]),
                                              self.max_new_tokens, gamma=self.gamma.value,
                                              banned=unk_ids(self.tokenizer))  # text for people: never <unk>
            for _ in range(self.start_rounds):
                if self.decoder.done:
                    break
                self.decoder.round()
        except Exception as err:  # an unknown character, a prompt too long for the block, ...
            self.fail(error_message(err))
            return
        self.refresh()

    def step(self) -> None:
        if self.decoder is None or self.decoder.done:
            return
        try:
            self.decoder.round()
        except Exception as err:
            self.fail(error_message(err))
            return
        self.refresh()

    def fail(self, message: str) -> None:
        """A message in place of the rounds, which no longer match the controls; Round waits for a fix."""
        self.decoder = None
        self.step_button.disabled = True
        self.output.value = message_html(message)

    @property
    def alpha(self) -> float:
        return self.decoder.result().alpha if self.decoder is not None else float("nan")

    def summary(self) -> str:
        d = self.decoder
        if d is None:
            return "no decoder: fix the prompt"
        res = d.result()
        return (f"{len(d.rounds)} rounds, {d.n_new} tokens ({res.tokens_per_call:.2f} per target call), "
                f"α = {res.accepted}/{res.judged} = {res.alpha:.2f}")

    # ---- drawing --------------------------------------------------------------------------------

    def html(self) -> str:
        d = self.decoder
        if d is None:
            return self.output.value
        tok = self.tokenizer
        prompt = html.escape(decode_complete(tok, d.tokens[1:d.prompt_length])).replace("\n", "⏎")
        new = html.escape(decode_complete(tok, d.tokens[d.prompt_length:])).replace("\n", "⏎")
        done = f" — stopped: {d.stop_reason}; press Reset" if d.done else ""
        rounds = "".join(round_html(tok, r, i + 1) for i, r in enumerate(d.rounds)) or \
            f'<div style="color:#666;{FONT}">press Round to let the draft guess</div>'
        return (f'<div style="font-family:sans-serif;{FONT};max-width:100%;overflow-wrap:anywhere">'
                f'<div style="font-size:20px;margin:4px 0"><span style="color:#777">{prompt}</span>{new}</div>'
                f'{english_html(decode_complete(tok, d.tokens[1:]), decode_complete(tok, d.tokens[d.prompt_length:]))}'
                f'<div style="{FONT};margin-bottom:4px">draft <b>{html.escape(self.draft_menu.value)}</b>, '
                f"γ = {d.gamma}: {html.escape(self.summary())}{done}</div>{legend_html()}{rounds}</div>")

    def refresh(self) -> None:
        try:
            self.step_button.disabled = self.decoder is None or self.decoder.done
            self.output.value = self.html()
        except Exception as err:
            self.fail(error_message(err))

    def show(self) -> None:
        """The live widget, followed by a static HTML copy of its current state for readers without a kernel."""
        display(LiveWidget(self.widget, self.html()))
