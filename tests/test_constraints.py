"""Constrained decoding on the shipped char model: acrostics and the fixed-format quatrain."""
from __future__ import annotations

import pytest
import torch

from kvlib.constraints import acrostic, ban, only, quatrain
from kvlib.tokenizer import UnknownCharacterError, is_ideograph

SEEDS = range(20)
RARE = "𠀀"  # U+20000, an ideograph that never occurs in the Tang poems


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_lines(text: str, heads: str, chars_per_line: int):
    """Line i is heads[i], then chars_per_line - 1 ideographs, then ， (even i) or 。 (odd i); nothing else."""
    width = chars_per_line + 1
    assert "\n" not in text
    assert len(text) == len(heads) * width, text
    for i, head in enumerate(heads):
        line = text[i * width:(i + 1) * width]
        assert line[0] == head, f"line {i} of {text!r} does not start with {head}"
        assert all(is_ideograph(ch) for ch in line[:-1]), f"line {i} of {text!r} holds punctuation"
        assert line[-1] == "，。"[i % 2], f"line {i} of {text!r} ends with {line[-1]!r}"


@pytest.mark.parametrize("heads, chars_per_line", [("春眠不觉", 7), ("学无止境", 5)])
def test_acrostic_structure_holds_for_20_seeds(shipped_char, heads, chars_per_line):
    model, tok = shipped_char
    poems = [acrostic(model, tok, heads, chars_per_line, generator=seeded(s)) for s in SEEDS]
    print("\n" + "\n".join(poems[:3]))
    for poem in poems:
        assert_lines(poem, heads, chars_per_line)
    assert len(set(poems)) > 1  # the seed matters: the constraint leaves the model real choices


def test_acrostic_with_top_k_and_top_p_keeps_the_structure(shipped_char):
    model, tok = shipped_char
    for s in range(3):
        poem = acrostic(model, tok, "春眠不觉", 7, temperature=1.0, top_k=5, top_p=0.9, generator=seeded(s))
        assert_lines(poem, "春眠不觉", 7)


def test_quatrain_has_punctuation_exactly_at_8_16_24_32_for_20_seeds(shipped_char):
    model, tok = shipped_char
    poems = [quatrain(model, tok, generator=seeded(s)) for s in SEEDS]
    print("\n" + "\n".join(poems[:3]))
    for poem in poems:
        assert len(poem) == 32, poem
        punctuated = [i + 1 for i, ch in enumerate(poem) if not is_ideograph(ch)]
        assert punctuated == [8, 16, 24, 32], poem
        assert all(poem[i - 1] in "，。" for i in punctuated), poem
        assert poem.endswith("。"), poem
    assert len(set(poems)) > 1


def test_an_acrostic_may_fill_the_whole_block_but_not_more(shipped_char):
    model, tok = shipped_char
    heads = "春眠不觉晓处处闻啼鸟夜来风雨声花落知多少"
    poem = acrostic(model, tok, heads[:16], 7, generator=seeded(0))  # 16 x 8 = 128 tokens: exactly the block
    assert_lines(poem, heads[:16], 7)
    with pytest.raises(ValueError, match="fewer or shorter lines"):
        acrostic(model, tok, heads[:17], 7)  # 136 tokens


def test_a_head_outside_the_vocabulary_is_named(shipped_char):
    model, tok = shipped_char
    with pytest.raises(UnknownCharacterError, match=RARE) as err:
        acrostic(model, tok, f"春{RARE}不觉")
    assert err.value.chars == [RARE]


@pytest.mark.parametrize("heads, chars_per_line, match", [
    ("春，不觉", 7, "Chinese characters"),
    ("", 7, "non-empty"),
    ("春眠不觉", 6, "5 or 7"),
], ids=["punctuation head", "empty heads", "six characters a line"])
def test_bad_acrostic_requests_raise_value_error(shipped_char, heads, chars_per_line, match):
    model, tok = shipped_char
    with pytest.raises(ValueError, match=match) as err:
        acrostic(model, tok, heads, chars_per_line)
    assert not isinstance(err.value, UnknownCharacterError)


def test_acrostic_refuses_the_bpe_tokenizer(shipped_bpe):
    model, tok = shipped_bpe
    with pytest.raises(ValueError, match="char"):
        acrostic(model, tok, "春眠不觉")


def test_quatrain_refuses_the_bpe_tokenizer(shipped_bpe):
    model, tok = shipped_bpe
    with pytest.raises(ValueError, match="char"):
        quatrain(model, tok)


def test_quatrain_rejects_other_line_lengths(shipped_char):
    model, tok = shipped_char
    with pytest.raises(ValueError, match="5 or 7"):
        quatrain(model, tok, 6)


# ---- The pure filters --------------------------------------------------------------------------

@pytest.mark.parametrize("fn, inside", [(ban, False), (only, True)], ids=["ban", "only"])
def test_ban_and_only_keep_shape_and_do_not_mutate(fn, inside):
    logits = torch.randn(3, 10, generator=seeded(0))
    before = logits.clone()
    chosen = torch.zeros(10, dtype=torch.bool)
    chosen[[1, 4, 7]] = True
    out = fn(logits, chosen)
    assert out.shape == logits.shape
    assert torch.equal(logits, before)  # the input is untouched
    dropped = ~chosen if inside else chosen
    assert torch.isneginf(out[:, dropped]).all()
    assert torch.equal(out[:, ~dropped], before[:, ~dropped])
