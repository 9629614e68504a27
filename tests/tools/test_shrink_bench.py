"""The shrink table: every setting's measured bytes, its cost against the full cache, and the command."""
import json

import pytest
import torch

from kvlib.tools.shrink_bench import check_table, format_table, settings, shrink_table, texts, written


@pytest.fixture(scope="module")
def table(shipped_char):
    model, tok = shipped_char
    return shrink_table(model, tok, n_texts=3, length=16)


def test_every_setting_has_a_row_with_measured_bytes_and_its_cost(table):
    rows = {r["label"]: r for r in table["rows"]}
    assert list(rows) == [s.label for s in settings(16)]
    full = rows["full cache: float32"]
    assert full["bytes_per_token"] == table["full_bytes_per_token"] == 4 * 2 * 128 * 4  # layers, k and v, C, fp32
    assert full["kl"] == 0.0 and full["top1_agreement"] == 1.0 and full["memory_cut"] == 0.0
    # Codes of b bits and a float16 scale and zero point per group of 16, keys and values, every layer.
    for bits in (8, 4, 2):
        assert rows[f"quantised: {bits}-bit"]["bytes_per_token"] == 4 * 2 * 128 * (bits / 8 + 4 / 16)
    assert rows["evicted: window of 8"]["bytes_per_token"] == full["bytes_per_token"] / 2  # half the positions
    for r in table["rows"]:
        assert r["memory_cut"] == pytest.approx(1 - r["bytes_per_token"] / full["bytes_per_token"])
        assert r["kl"] >= 0 and 0 <= r["top1_agreement"] <= 1 and r["nats_per_token"] > 0
    assert check_table(table) is not None


def test_fewer_bits_cost_more_and_the_untrained_conversions_most(table):
    kl = {r["label"]: r["kl"] for r in table["rows"]}
    assert kl["quantised: 8-bit"] < kl["quantised: 4-bit"] < kl["quantised: 2-bit"]
    assert kl["fewer heads: MQA, 1 head, pooled + 200 steps"] < kl["fewer heads: MQA, 1 head, pooled"]


def test_texts_are_validation_windows_with_their_next_tokens(shipped_char):
    _, tok = shipped_char
    x, y = texts(tok, n_texts=2, length=16)
    assert x.shape == y.shape == (2, 16)
    assert (x[:, 1:] == y[:, :-1]).all()  # y is x moved by one token


def test_the_printed_table_and_the_command(table, capsys):
    text = format_table(table)
    assert all(r["label"] in text for r in table["rows"]) and "bytes a token" in text
    from kvlib.tools.cli import main

    assert main(["shrink", "--texts", "2", "--length", "16", "--json"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["texts"] == 2 and out["length"] == 16 and len(out["rows"]) == len(table["rows"])


def test_written_goes_through_the_setting_and_on_past_a_poems_end(shipped_char):
    from kvlib import generate
    from kvlib.poems import encode_prompt

    model, tok = shipped_char
    by_label = {s.label: s for s in settings(16)}
    full = written(model, tok, by_label["full cache: float32"], "春风", 24)
    idx = torch.tensor([encode_prompt(tok, "春风")])
    assert full == "春风" + tok.decode(generate(model, idx, 24, temperature=0.0, decoder="model").new_tokens[0].tolist())
    assert full.count("\n") >= 1  # greedy from 春风 ends a poem within 24 tokens and starts another
    assert written(model, tok, by_label["quantised: 8-bit"], "春风", 24) == full  # 8 bits: the same greedy text
    assert written(model, tok, by_label["fewer heads: MQA, 1 head, pooled"], "春风", 24) != full
    sampled = written(model, tok, by_label["full cache: float32"], "春风", 24, temperature=0.8, seed=3)
    assert sampled == written(model, tok, by_label["full cache: float32"], "春风", 24, temperature=0.8, seed=3)
    with pytest.raises(TypeError, match="setting must be"):
        written(model, tok, "full cache: float32", "春风", 4)
    with pytest.raises(ValueError, match="n_new"):
        written(model, tok, by_label["full cache: float32"], "春风", 200)


def _grouped_gpt():
    from kvlib.compress import grouped
    from kvlib.model import GPT, GPTConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        multi = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64)).eval()  # heads of 16
    return multi, grouped(multi, 2)


