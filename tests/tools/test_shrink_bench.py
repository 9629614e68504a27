"""The shrink table: every setting's measured bytes, its cost against the full cache, and the command."""
import json

import pytest

from kvlib.tools.shrink_bench import check_table, format_table, settings, shrink_table, texts


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
