"""Streaming decode with the shipped byte-level BPE: whole characters only, and the same text as decode."""
from __future__ import annotations

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvlib.decoding import generate
from kvlib.tokenizer import stream_decode

REPLACEMENT = "\ufffd"
TEXT = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"


def test_characters_split_across_tokens_stream_whole(bpe_tokenizer):
    tok = bpe_tokenizer
    ids = tok.encode(TEXT)
    split = [ch for ch in TEXT if len(tok.encode(ch)) > 1]
    assert split, "the test needs a character that BPE spells with more than one token"
    per_token = "".join(tok.decode([i]) for i in ids)
    assert REPLACEMENT in per_token  # decoding token by token breaks those characters
    pieces = list(stream_decode(tok, ids))
    assert "".join(pieces) == tok.decode(ids) == TEXT
    assert not any(REPLACEMENT in p for p in pieces)
    assert "" in pieces  # a token that ends mid-character shows nothing yet
    shown = ""
    for p in pieces:  # every prefix shown is a prefix of the text, in whole characters
        shown += p
        assert TEXT.startswith(shown)


def test_stream_holds_back_an_unfinished_character_until_its_last_byte(bpe_tokenizer):
    tok = bpe_tokenizer
    ch = next(c for c in TEXT if len(tok.encode(c)) > 1)
    ids = tok.encode(ch)
    assert list(stream_decode(tok, ids)) == [""] * (len(ids) - 1) + [ch]


def test_an_unfinished_character_at_the_end_becomes_one_replacement(bpe_tokenizer):
    tok = bpe_tokenizer
    ch = next(c for c in TEXT if len(tok.encode(c)) > 1)
    ids = tok.encode("春" + ch)[:-1]  # the last character's final token is missing
    text = "".join(stream_decode(tok, ids))
    assert text == tok.decode(ids)
    assert text.endswith(REPLACEMENT) and text.count(REPLACEMENT) == 1


def test_48_sampled_tokens_stream_to_their_decode(shipped_bpe):
    model, tok = shipped_bpe
    out = generate(model, torch.tensor([[tok.eos_id]]), 48, temperature=1.0,
                   generator=torch.Generator().manual_seed(1337))
    ids = out.new_tokens[0].tolist()
    assert len(ids) == 48
    text = "".join(stream_decode(tok, ids))
    print("\n" + text.replace("\n", "⏎"))
    assert text == tok.decode(ids)
    assert text == "".join(stream_decode(tok, out.new_tokens[0]))  # a tensor streams the same


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 511), max_size=40))
@example(ids=[0xFF, 0xFE])            # bytes that never occur in UTF-8
@example(ids=[0xE6, 0x98])            # a character cut short at the end
@example(ids=[0xE6, 0x41, 0x98, 511])  # a character interrupted by ASCII, then the separator
@example(ids=[0x98, 0xE6, 0x98, 0xA5])  # a stray continuation byte, then 春 byte by byte
def test_any_ids_stream_to_their_decode(bpe_tokenizer, ids):
    """Random ids are often invalid UTF-8: the replacements must match decode's too."""
    assert bpe_tokenizer.vocab_size == 512
    assert "".join(stream_decode(bpe_tokenizer, ids)) == bpe_tokenizer.decode(ids)


def test_on_token_sees_step_k_before_step_k_plus_1_runs(tiny_gpt):
    """generate hands out each token as soon as it is chosen, before the next forward pass."""
    events = []

    def factory(model, batch_size, max_len):
        from kvlib.fast import FastDecoder

        dec = FastDecoder(model, batch_size, max_len)

        def call(*args, **kwargs):
            events.append("forward")
            return dec(*args, **kwargs)
        return call

    def on_token(step, new):
        events.append(("token", step, new.tolist()))

    out = generate(tiny_gpt, torch.tensor([[1, 2], [3, 4]]), 6, temperature=0.0, on_token=on_token, decoder=factory)
    assert events[0] == "forward"  # the prefill
    for k in range(6):
        at = events.index(("token", k, out.new_tokens[:, k].tolist()))
        assert "forward" not in events[at + 1:] or events[at + 1] == "forward"
        assert events[:at].count("forward") == k + 1  # step k's token came out after k + 1 forwards, not more
    assert events.count("forward") == 6  # the last token is never fed back


def test_text_stream_joins_to_decode(bpe_tokenizer):
    from kvlib.tokenizer import TextStream

    ids = bpe_tokenizer.encode(TEXT)
    stream = TextStream(bpe_tokenizer)
    assert "".join(stream.push(i) for i in ids) + stream.close() == TEXT
    cut = TextStream(bpe_tokenizer)
    first = next(i for i in ids if bpe_tokenizer.token_bytes(i)[0] >= 0xC0 and len(bpe_tokenizer.token_bytes(i)) < 3)
    assert cut.push(first) == "" and cut.close() == REPLACEMENT  # a cut-off character shows as U+FFFD at the end


def test_decode_complete_drops_only_a_character_cut_off_at_the_end(bpe_tokenizer):
    from kvlib.tokenizer import decode_complete

    tok = bpe_tokenizer
    cut = tok.encode("春风") + list("月".encode()[:2])    # ids 0-255 are single bytes: 月 without its last byte
    assert tok.decode(cut).endswith(REPLACEMENT)
    assert decode_complete(tok, cut) == "春风"
    assert decode_complete(tok, torch.tensor(tok.encode(TEXT))) == TEXT
    assert decode_complete(tok, [0xFF] + tok.encode("春")) == REPLACEMENT + "春"  # bad bytes inside still show


def test_written_samples_never_end_in_a_cut_off_character(shipped_bpe):
    """Budgets of 1 to 8 tokens cut the shipped model's samples mid-character; the text stops before it."""
    from kvlib.poems import completion, write

    model, tok = shipped_bpe
    cut_somewhere = False
    for n in range(1, 9):
        result = generate(model, torch.tensor([tok.encode("\n明")]), n, temperature=0.8,
                          generator=torch.Generator().manual_seed(n))
        cut_somewhere |= tok.decode(result.new_tokens[0]).endswith(REPLACEMENT)
        assert REPLACEMENT not in completion(tok, result)
        assert REPLACEMENT not in "".join(write(model, tok, ["明", "春风"], max_new_tokens=n, seed=n))
    assert cut_somewhere, "no budget cut a character: the test shows nothing"
