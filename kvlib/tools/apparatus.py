"""Separate a poem's text from its editors' apparatus (notes, emendation marks, lacunae).

The Complete Tang Poems and its supplements carry the editors' work inside the poem text:
bibliographic and textual notes in （ ） and 〖 〗 (nested in each other), notes and footnotes after
the verse, numbered footnote markers ``[一]``, emended characters in ``[ ]``, modern quotation and
title marks, □ for characters lost from the source and ``{…}`` descriptions of characters Unicode
lacks. ``separate`` applies one rule after another to the traditional-script text of one poem and
says which rules fired, so that ``prepare`` can count them. Every function here is pure.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

NOTE_BRACKETS = {"（": "）", "〖": "〗", "(": ")"}  # opener -> closer; notes nest in one another
_CLOSERS = {closer: opener for opener, closer in NOTE_BRACKETS.items()}

# Entries of the supplements that are the editors' own front or back matter, not poems.
FRONT_MATTER_TITLES = re.compile(r"^(前言|自序|後記)$|考釋")

# A footnote marker: Chinese numerals in square brackets, e.g. [一], [二八], [一○].
_NUMERALS = "一二三四五六七八九十百○〇"
FOOTNOTE_MARKER = re.compile(rf"\[([{_NUMERALS}]+)\]")
# A note that follows the verse without brackets: 按：… / 今按：… / ○今按：… / 附按：…
TRAILING_NOTE = re.compile(r"○?(?:今|附|望)?按：")
# A sentence that cites a source: 見《太平廣記》卷四八九引。 / 《五代會要》七《廟樂》曰：… / 以上各句見…
CITATION = re.compile(rf"見《|校錄|以上\S{{0,4}}見|《[^》]{{1,30}}》(?:卷|[{_NUMERALS}]+|引|曰|云)")
SENTENCE = re.compile(r"[^。！？]*[。！？]?")
EMENDATION = re.compile(r"\[([^\[\]]*)\]")  # [春]: a character the editors supplied or corrected
QUOTE_MARKS = re.compile(r"[「」『』《》〈〉]")
# A note that says the text has a gap: （下缺）, （上缺）, （闕）, （此句缺一字）, （此字原殘）, （此間似脫一句）
LACUNA_NOTE = re.compile(r"[上下中前後]缺|以下\S{0,4}[缺闕]|[缺闕脫]\S{0,3}[字句]|^[（〖][缺闕殘脫][）〗]|殘損|原殘|脫一")
FILLED_GAP = re.compile(r"補")  # （缺字據《永樂大典》補）: the gap was filled from another source
LOST = re.compile(r"[□●]")  # a character lost from the source
UNENCODED = re.compile(r"[{}⿰-⿻]")  # {氵|/凡}, ⿰亻丸: a character described by its parts
POEM_PUNCTUATION = "，。！？；：、"
STRAY = re.compile(r"[^\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f" + POEM_PUNCTUATION + "]")

# （見《…》。）。 leaves 。。 behind: the punctuation that followed a note is dropped with it
LEFTOVER_PUNCTUATION = re.compile(f"([{POEM_PUNCTUATION}])[{POEM_PUNCTUATION}]+")


@dataclass
class Separated:
    """One poem's text without its apparatus, or ``None`` when the poem is dropped."""

    text: str | None
    fired: dict[str, int] = field(default_factory=dict)  # rule -> characters it removed
    dropped: str | None = None  # the rule that dropped the poem


def strip_bracketed_notes(text: str) -> tuple[str, list[str]]:
    """Remove notes in （ ） and 〖 〗, nested to any depth; an unclosed note runs to the end."""
    kept, notes, note, depth = [], [], [], 0
    for ch in text:
        if ch in NOTE_BRACKETS:
            depth += 1
            note.append(ch)
        elif ch in _CLOSERS and depth:
            depth -= 1
            note.append(ch)
            if depth == 0:
                notes.append("".join(note))
                note = []
        elif depth:
            note.append(ch)
        else:
            kept.append(ch)
    if note:
        notes.append("".join(note))
    return "".join(kept), notes


def trailing_notes_start(text: str) -> int:
    """Where the notes after the verse begin: a 按： note, or a footnote marker's second use."""
    cut = len(text)
    if m := TRAILING_NOTE.search(text):
        cut = m.start()
    seen = set()
    for m in FOOTNOTE_MARKER.finditer(text):
        if m.group(1) in seen:  # [一] in the verse refers to the note that starts with [一]
            return min(cut, m.start())
        seen.add(m.group(1))
    return cut


def says_lacuna(note: str) -> bool:
    """Whether an editors' note says the text has a gap that was not filled."""
    return bool(LACUNA_NOTE.search(note)) and not FILLED_GAP.search(note)


def separate(text: str, title: str = "") -> Separated:
    """Apply the rules in order to one poem's traditional-script text (whitespace already removed)."""
    fired: dict[str, int] = {}

    def rule(name: str, before: str, after: str) -> str:
        if len(after) != len(before):
            fired[name] = len(before) - len(after)
        return after

    if not text:
        return Separated(None, fired, "no text")
    if FRONT_MATTER_TITLES.search(title):
        return Separated(None, fired, "editors' front or back matter")
    body, notes = strip_bracketed_notes(text)
    body = rule("notes in brackets", text, body)
    if any(says_lacuna(n) for n in notes):
        return Separated(None, fired, "a note says the text has a gap")
    body = rule("notes after the poem", body, body[:trailing_notes_start(body)])
    body = rule("sentences citing a source", body, "".join(
        x for x in SENTENCE.findall(body) if not CITATION.search(x)))
    body = rule("footnote markers", body, FOOTNOTE_MARKER.sub("", body))
    body = rule("emendation brackets", body, EMENDATION.sub(r"\1", body))
    body = rule("quotation and title marks", body, QUOTE_MARKS.sub("", body))
    if LOST.search(body):
        return Separated(None, fired, "lost characters (□)")
    if UNENCODED.search(body):
        return Separated(None, fired, "characters Unicode lacks ({…})")
    body = rule("stray symbols", body, STRAY.sub("", body))
    body = rule("punctuation left doubled", body, LEFTOVER_PUNCTUATION.sub(r"\1", body).lstrip(POEM_PUNCTUATION))
    if not body.strip(POEM_PUNCTUATION):
        return Separated(None, fired, "only notes")
    return Separated(body, fired)
