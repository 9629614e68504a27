"""Two tokenizers over the same corpus: one id per character, and byte-level BPE.

Both share one interface: ``encode``, ``decode``, ``token_bytes``, ``vocab_size``, ``eos_id`` (the
poem separator, shown as a newline) and ``punctuation_ids`` (everything that is not a CJK ideograph).
"""
from __future__ import annotations

import codecs
import re
import unicodedata
from collections import Counter
from functools import cached_property

from .checks import check_int, check_model, check_text, check_token_ids

# ---- input checks of this module ------------------------------------------------------------

def check_char_table(itos, separator: str, unk: str) -> list[str]:
    """A character vocabulary: a list of distinct str, the separator and ``unk`` first, then single characters."""
    if not isinstance(itos, (list, tuple)):
        raise TypeError(f"a char vocabulary (itos) must be a list of str, got {type(itos).__name__}")
    if list(itos[:2]) != [separator, unk]:
        raise ValueError(f"a char vocabulary starts with the separator and <unk> ['\\n', '<unk>'], "
                         f"got {list(itos[:2])!r}")
    seen = set()
    for i, ch in enumerate(itos):
        if i >= 2 and (not isinstance(ch, str) or len(ch) != 1):
            raise ValueError(f"char vocabulary entry {i} must be one character, got {ch!r:.40}")
        if ch in seen:
            raise ValueError(f"char vocabulary entry {i} ({ch!r}) is a duplicate: every character has one id")
        seen.add(ch)
    return list(itos)


def check_merges(merges) -> list[tuple[int, int]]:
    """BPE merges: a list of [a, b] pairs, each id a byte (0-255) or an earlier merge's id."""
    if not isinstance(merges, (list, tuple)):
        raise TypeError(f"BPE merges must be a list of [a, b] id pairs, got {type(merges).__name__}")
    out = []
    for r, m in enumerate(merges):
        if not isinstance(m, (list, tuple)) or len(m) != 2 or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in m):
            raise ValueError(f"BPE merge {r} must be a pair of int ids [a, b], got {m!r:.40}")
        if not all(0 <= x < 256 + r for x in m):
            raise ValueError(f"BPE merge {r} = {list(m)!r} names an id that is not defined yet: allowed are "
                             f"bytes 0-255 and the ids of earlier merges, [0, {256 + r})")
        out.append((int(m[0]), int(m[1])))
    return out


SEPARATOR = "\n"


def invisible_name(ch: str) -> str | None:
    """Words or a code point for a character a message could not show (a space, a control character), else None."""
    names = {" ": "a space", "\t": "a tab", "\n": "a new line", "\u3000": "a wide space",
             "\xa0": "a non-breaking space"}
    if ch in names:
        return names[ch]
    if ch.isspace() or not ch.isprintable():  # an invisible or control character: its code point and name
        return f"U+{ord(ch):04X} ({unicodedata.name(ch, 'a control character').lower()})"
    return None


class UnknownCharacterError(ValueError):
    """Text holds characters that the tokenizer has no id for."""

    def __init__(self, chars: list[str]):
        self.chars = chars
        shown = "".join(f"[{name}]" if (name := invisible_name(ch)) else ch for ch in chars[:20])
        shown += "…" if len(chars) > 20 else ""
        super().__init__(
            f"{len(chars)} character(s) are not in the vocabulary: {shown} "
            "(the model knows only characters that occur at least twice in the Tang poems)"
        )


def is_ideograph(ch: str) -> bool:
    return unicodedata.name(ch, "").startswith(("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH"))


def _check_text(text) -> str:
    return check_text(text)


class CharTokenizer:
    """One id per character seen at least ``min_count`` times, ``<unk>`` for corpus rarities."""

    kind = "char"
    UNK = "<unk>"

    def __init__(self, itos: list[str]):
        self.itos = check_char_table(itos, SEPARATOR, self.UNK)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.eos_id, self.unk_id = 0, 1

    @classmethod
    def train(cls, poems: list[str], min_count: int = 2) -> "CharTokenizer":
        counts = Counter("".join(poems))
        counts.pop(SEPARATOR, None)
        kept = sorted(ch for ch, n in counts.items() if n >= min_count)
        return cls([SEPARATOR, cls.UNK, *kept])

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def unknown(self, text: str) -> list[str]:
        """Characters of ``text`` without an id, in order of first appearance."""
        return list(dict.fromkeys(ch for ch in _check_text(text) if ch not in self.stoi))

    def encode(self, text: str) -> list[int]:
        missing = self.unknown(text)
        if missing:
            raise UnknownCharacterError(missing)
        return [self.stoi[ch] for ch in text]

    def encode_corpus(self, poems: list[str]) -> list[int]:
        """Separator before every poem; rare characters become ``<unk>``."""
        ids = []
        for poem in poems:
            ids.append(self.eos_id)
            ids.extend(self.stoi.get(ch, self.unk_id) for ch in poem)
        return ids

    def decode(self, ids) -> str:
        return "".join(self.itos[i] for i in check_token_ids(ids, self.vocab_size))

    def token_bytes(self, i: int) -> bytes:
        return self.itos[check_int("token id", i, 0, self.vocab_size - 1)].encode("utf-8")

    @cached_property
    def punctuation_ids(self) -> list[int]:
        return [i for i, s in enumerate(self.itos) if not (len(s) == 1 and is_ideograph(s))]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "itos": self.itos}

    @classmethod
    def from_dict(cls, d: dict) -> "CharTokenizer":
        if "itos" not in d:
            raise ValueError("a char tokenizer needs its table 'itos' (the list of characters), which is missing")
        return cls(d["itos"])


# Pre-tokenization: runs of ASCII letters, digits or whitespace stay together; every other
# character (each ideograph, each punctuation mark) is a chunk of its own. Merges stay inside chunks.
_CHUNK = re.compile(r"[A-Za-z]+|[0-9]+|\s+|.", re.S)


class ByteBPETokenizer:
    """Byte-level BPE: ids 0-255 are bytes, then one id per merge, then ``<|endoftext|>``."""

    kind = "bpe"
    EOT = "<|endoftext|>"

    def __init__(self, merges: list[tuple[int, int]]):
        self.merges = check_merges(merges)
        self.ranks = {pair: 256 + r for r, pair in enumerate(self.merges)}
        self.vocab = [bytes([b]) for b in range(256)]
        for a, b in self.merges:
            self.vocab.append(self.vocab[a] + self.vocab[b])
        self.eos_id = len(self.vocab)
        self._chunk_cache: dict[str, list[int]] = {}

    @classmethod
    def train(cls, texts: list[str], vocab_size: int = 512) -> "ByteBPETokenizer":
        """Learn ``vocab_size - 257`` merges, keeping pair counts up to date incrementally."""
        chunk_counts = Counter(c for t in texts for c in _CHUNK.findall(t))
        words = [list(c.encode("utf-8")) for c in chunk_counts]
        freqs = list(chunk_counts.values())
        pair_counts: Counter = Counter()
        where: dict[tuple[int, int], set[int]] = {}
        for w, (word, f) in enumerate(zip(words, freqs)):
            for pair in zip(word, word[1:]):
                pair_counts[pair] += f
                where.setdefault(pair, set()).add(w)
        merges = []
        for new_id in range(256, vocab_size - 1):
            if not pair_counts:
                break
            # The most frequent pair; ties go to the smallest pair so training is deterministic.
            best = max(pair_counts.items(), key=lambda kv: (kv[1], (-kv[0][0], -kv[0][1])))[0]
            merges.append(best)
            for w in where.pop(best, ()):
                word, f = words[w], freqs[w]
                for pair in zip(word, word[1:]):
                    pair_counts[pair] -= f
                    if pair_counts[pair] <= 0:
                        del pair_counts[pair]
                word = _merge(word, best, new_id)
                words[w] = word
                for pair in zip(word, word[1:]):
                    pair_counts[pair] += f
                    where.setdefault(pair, set()).add(w)
        return cls(merges)

    @property
    def vocab_size(self) -> int:
        return self.eos_id + 1

    def _encode_chunk(self, chunk: str) -> list[int]:
        ids = self._chunk_cache.get(chunk)
        if ids is None:
            ids = list(chunk.encode("utf-8"))
            while len(ids) > 1:
                pair = min(zip(ids, ids[1:]), key=lambda p: self.ranks.get(p, 1 << 30))
                if pair not in self.ranks:
                    break
                ids = _merge(ids, pair, self.ranks[pair])
            if len(self._chunk_cache) < 100_000:
                self._chunk_cache[chunk] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        return [i for chunk in _CHUNK.findall(_check_text(text)) for i in self._encode_chunk(chunk)]

    def encode_corpus(self, poems: list[str]) -> list[int]:
        ids = []
        for poem in poems:
            ids.append(self.eos_id)
            ids.extend(self.encode(poem))
        return ids

    def token_bytes(self, i: int) -> bytes:
        i = check_int("token id", i, 0, self.eos_id)
        return SEPARATOR.encode() if i == self.eos_id else self.vocab[i]

    def decode(self, ids, errors: str = "replace") -> str:
        ids = check_token_ids(ids, self.vocab_size)
        return b"".join(SEPARATOR.encode() if i == self.eos_id else self.vocab[i] for i in ids).decode(
            "utf-8", errors=errors)

    def unknown(self, text: str) -> list[str]:
        _check_text(text)
        return []

    @cached_property
    def punctuation_ids(self) -> list[int]:
        """Tokens that are whole characters, none of them an ideograph, plus the separator."""
        out = []
        for i in range(self.vocab_size):
            try:
                s = self.token_bytes(i).decode("utf-8")
            except UnicodeDecodeError:
                continue
            if s and not any(is_ideograph(ch) for ch in s):
                out.append(i)
        return out

    def to_dict(self) -> dict:
        return {"kind": self.kind, "merges": [list(m) for m in self.merges]}

    @classmethod
    def from_dict(cls, d: dict) -> "ByteBPETokenizer":
        if "merges" not in d:
            raise ValueError("a bpe tokenizer needs its 'merges' (the list of merged id pairs), which are missing")
        return cls(d["merges"])


def token_label(tokenizer, token_id: int) -> str:
    """A token as text when its bytes are valid UTF-8, else its bytes in hex (e.g. ``e5 ba``): a label for
    one token, where decoding a byte-level BPE token alone would give "\ufffd"."""
    raw = tokenizer.token_bytes(int(token_id))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.hex(" ")


def _merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


class TextStream:
    """Text from token ids that arrive one at a time: ``push(id)`` returns what is now complete.

    Bytes are held back until they complete a character, so a token that ends mid-character gives
    "" instead of U+FFFD; invalid bytes still become U+FFFD (``errors="replace"``). ``close()``
    returns whatever is left (a cut-off character as U+FFFD).
    """

    def __init__(self, tokenizer):
        check_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if hasattr(token_id, "item"):                      # a 0-d tensor or a numpy integer
            token_id = token_id.item()
        return self._utf8.decode(self.tokenizer.token_bytes(token_id))

    def close(self) -> str:
        return self._utf8.decode(b"", final=True)


def decode_complete(tokenizer, ids) -> str:
    """``tokenizer.decode(ids)`` less the bytes of a last character the ids leave unfinished, which
    ``decode`` would show as U+FFFD: the text of a sample that a token budget may cut mid-character."""
    stream = TextStream(tokenizer)
    return "".join(map(stream.push, check_token_ids(ids, tokenizer.vocab_size)))


def stream_decode(tokenizer, ids):
    """Yield text as tokens arrive; concatenated, the pieces equal ``tokenizer.decode(ids)``."""
    stream = TextStream(tokenizer)
    for i in check_token_ids(ids, tokenizer.vocab_size):
        yield stream.push(i)
    tail = stream.close()
    if tail:
        yield tail


TOKENIZERS = {"char": CharTokenizer, "bpe": ByteBPETokenizer}


def tokenizer_from_dict(d: dict) -> CharTokenizer | ByteBPETokenizer:
    """A tokenizer from what its ``to_dict`` wrote."""
    if not isinstance(d, dict):
        raise ValueError(f"a tokenizer is a JSON object with a 'kind' ({' or '.join(sorted(TOKENIZERS))}) and "
                         f"its table, got a {type(d).__name__}")
    if d.get("kind") not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer kind {d.get('kind')!r}; expected one of {sorted(TOKENIZERS)}")
    return TOKENIZERS[d["kind"]].from_dict(d)


# ---- the contracts of tokenizers and token ids ------------------------------------------------------

def check_tokenizer(tokenizer) -> None:
    """A kvlib tokenizer: CharTokenizer or ByteBPETokenizer (encode, decode, token_bytes, vocab_size)."""
    if not all(hasattr(tokenizer, a) for a in ("encode", "decode", "token_bytes", "vocab_size", "eos_id")):
        raise TypeError(f"tokenizer must be a kvlib tokenizer (CharTokenizer or ByteBPETokenizer), "
                        f"got {type(tokenizer).__name__}")


def check_pair(model, tokenizer) -> None:
    """A tokenizer and a model that belong together: the same number of ids."""
    check_model(model)
    check_tokenizer(tokenizer)
    v = tokenizer.vocab_size
    if v != model.config.vocab_size:
        raise ValueError(f"the tokenizer ({getattr(tokenizer, 'kind', '?')}, {v} ids) does not belong to the "
                         f"model ({model.config.vocab_size} ids): load both with load_pretrained(name)")
