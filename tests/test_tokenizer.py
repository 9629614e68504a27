"""The two tokenizers: the character vocabulary with <unk> for corpus rarities, and byte-level BPE."""
from __future__ import annotations

import json
import re
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.tools import corpus as data
from kvlib.tokenizer import SEPARATOR, ByteBPETokenizer, CharTokenizer, UnknownCharacterError, is_ideograph
from kvlib.tools.loading import load_tokenizer, save_tokenizer


@pytest.fixture(scope="module")
def poems() -> list[str]:
    return data.load_poems()


@pytest.fixture(scope="module")
def char_counts(poems) -> Counter:
    return Counter("".join(poems))


@pytest.fixture(scope="module")
def char_tok(poems) -> CharTokenizer:
    return CharTokenizer.train(poems)


@pytest.fixture(scope="module")
def bpe(poems) -> ByteBPETokenizer:
    """Trained once on the whole corpus (about a second or two)."""
    t0 = time.perf_counter()
    tok = ByteBPETokenizer.train(poems)
    print(f"\nByteBPETokenizer.train on {len(poems):,} poems: {time.perf_counter() - t0:.2f} s")
    return tok


def ideograph(entry: str) -> bool:
    return len(entry) == 1 and is_ideograph(entry)


# ---- CharTokenizer --------------------------------------------------------------------------

def test_char_vocabulary_is_every_character_seen_twice_plus_separator_and_unk(char_tok, char_counts):
    assert char_tok.vocab_size == 7_184
    assert 7_000 < char_tok.vocab_size < 8_000
    assert char_tok.itos[:2] == [SEPARATOR, CharTokenizer.UNK]
    assert (char_tok.eos_id, char_tok.unk_id) == (0, 1)
    frequent = {ch for ch, n in char_counts.items() if n >= 2}
    assert len(frequent) == 7_182
    assert set(char_tok.itos[2:]) == frequent
    assert len(char_tok.itos) == len(set(char_tok.itos))


def test_char_round_trips_poems(char_tok, poems):
    sample = poems[::97]
    known = [p for p in sample if not char_tok.unknown(p)]
    assert len(known) > 0.9 * len(sample)
    for poem in known:
        ids = char_tok.encode(poem)
        assert len(ids) == len(poem)
        assert char_tok.decode(ids) == poem
    assert char_tok.decode(char_tok.encode("床前看月光，疑是地上霜。")) == "床前看月光，疑是地上霜。"


def test_char_encode_names_the_unknown_characters(char_tok):
    with pytest.raises(UnknownCharacterError) as info:
        char_tok.encode("😀床前🐉看月光😀")
    err = info.value
    assert isinstance(err, ValueError)
    assert err.chars == ["😀", "🐉"]
    assert "😀" in str(err) and "🐉" in str(err)
    assert "2 character(s)" in str(err)
    assert char_tok.unknown("床前看月光") == []


def test_char_encode_rejects_rare_corpus_characters_but_encode_corpus_maps_them_to_unk(
        char_tok, char_counts, poems):
    rare = next(ch for ch, n in char_counts.items() if n == 1)
    poem = next(p for p in poems if rare in p)
    with pytest.raises(UnknownCharacterError, match=re.escape(rare)):
        char_tok.encode(poem)
    ids = char_tok.encode_corpus([poem, "春风"])
    assert len(ids) == len(poem) + 1 + 3
    assert ids[0] == char_tok.eos_id
    assert ids[1 + poem.index(rare)] == char_tok.unk_id
    assert ids[len(poem) + 1] == char_tok.eos_id
    assert char_tok.decode(ids[-2:]) == "春风"


def test_char_punctuation_ids(char_tok):
    punct = set(char_tok.punctuation_ids)
    assert {char_tok.stoi["，"], char_tok.stoi["。"], char_tok.eos_id} <= punct
    assert char_tok.unk_id in punct  # "<unk>" is not an ideograph either
    assert not any(ideograph(char_tok.itos[i]) for i in punct)
    others = set(range(char_tok.vocab_size)) - punct
    assert all(ideograph(char_tok.itos[i]) for i in others)
    assert char_tok.stoi["春"] not in punct


def test_char_save_load_round_trip(char_tok, tmp_path):
    path = tmp_path / "char.json"
    save_tokenizer(char_tok, path)
    loaded = load_tokenizer(path)
    assert isinstance(loaded, CharTokenizer)
    assert loaded.itos == char_tok.itos
    text = "白日依山尽，黄河入海流。"
    assert loaded.encode(text) == char_tok.encode(text)


def test_char_vocabulary_must_start_with_separator_and_unk():
    with pytest.raises(ValueError):
        CharTokenizer(["a", "b"])
    tok = CharTokenizer.train(["甲乙甲", "乙丙"])
    assert tok.itos == [SEPARATOR, "<unk>", "乙", "甲"]


def test_encode_requires_text(char_tok, bpe):
    for tok in (char_tok, bpe):
        with pytest.raises(TypeError):
            tok.encode(b"bytes")


# ---- ByteBPETokenizer -----------------------------------------------------------------------

def test_bpe_has_512_ids_and_the_separator_is_511(bpe):
    assert bpe.vocab_size == 512
    assert bpe.eos_id == 511
    assert len(bpe.merges) == 255
    assert bpe.decode([511]) == "\n"
    assert bpe.token_bytes(511) == b"\n"
    assert bpe.eos_id in bpe.punctuation_ids


def test_bpe_compresses_poems_and_splits_some_characters_between_tokens(bpe, poems):
    poem = "床前看月光，疑是地上霜。举头望山月，低头思故乡。"
    ids = bpe.encode(poem)
    assert len(ids) < len(poem.encode("utf-8"))
    assert bpe.decode(ids) == poem
    partial = 0
    for i in range(256, bpe.eos_id):
        try:
            bpe.token_bytes(i).decode("utf-8")
        except UnicodeDecodeError:
            partial += 1
    assert partial > 0  # merged tokens that end in the middle of a character
    # The commonest punctuation marks are single tokens.
    assert len(bpe.encode("，")) == 1 and len(bpe.encode("。")) == 1
    assert set(bpe.encode("，。")) <= set(bpe.punctuation_ids)


def test_bpe_encode_corpus_separates_poems(bpe, poems):
    ids = bpe.encode_corpus(poems[:3])
    assert ids[0] == bpe.eos_id
    assert ids.count(bpe.eos_id) == 3
    assert bpe.decode(ids) == "".join("\n" + p for p in poems[:3])


def test_bpe_training_is_deterministic(poems):
    subset = poems[:2000]
    assert ByteBPETokenizer.train(subset).merges == ByteBPETokenizer.train(subset).merges


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_bpe_round_trips_any_text(bpe, s):
    assert bpe.decode(bpe.encode(s)) == s


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("床前看月光疑是地上霜举头望山低思故乡，。！？ \n春风ab1😀")), max_size=60))
def test_bpe_round_trips_text_made_of_corpus_characters(bpe, s):
    assert bpe.decode(bpe.encode(s)) == s


def test_bpe_save_load_round_trip(bpe, poems, tmp_path):
    path = tmp_path / "bpe.json"
    save_tokenizer(bpe, path)
    loaded = load_tokenizer(path)
    assert isinstance(loaded, ByteBPETokenizer)
    assert loaded.merges == bpe.merges
    assert loaded.vocab_size == bpe.vocab_size
    for poem in poems[:50]:
        assert loaded.encode(poem) == bpe.encode(poem)


def test_unknown_tokenizer_kind_is_a_clear_error(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"kind": "wordpiece", "vocab": []}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"unknown tokenizer kind 'wordpiece'"):
        load_tokenizer(path)
    path.write_text(json.dumps({"itos": ["\n", "<unk>"]}), encoding="utf-8")
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        load_tokenizer(path)


def test_token_ids_in_a_set_are_refused_for_having_no_order(bpe_tokenizer):
    from kvlib.tokenizer import decode_complete

    for call in (lambda: bpe_tokenizer.decode({1, 2}), lambda: decode_complete(bpe_tokenizer, frozenset([3]))):
        with pytest.raises(TypeError, match="a set has no order"):
            call()
