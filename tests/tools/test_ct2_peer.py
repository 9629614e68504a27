"""CTranslate2 as the fast path's peer: the same model (logits within 1e-4, the same greedy tokens), timed beside ours."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("ctranslate2", reason="CTranslate2 is not installed (pip install -e .[bench])")
pytest.importorskip("transformers", reason="the export needs transformers (pip install -e .[bench])")

from kvlib.decoding import generate  # noqa: E402
from kvlib.poems import encode_prompt  # noqa: E402
from kvlib.tools.ct2_peer import CT2Peer, batch_rows, format_batch  # noqa: E402


@pytest.fixture(scope="module")
def peer(shipped_char):
    model, tok = shipped_char
    return CT2Peer(model, tok)


def test_the_peer_runs_our_model(peer, shipped_char):
    model, tok = shipped_char
    prompt = encode_prompt(tok, "白日依山尽，黄河入海流。")
    check = peer.check(prompt, 40)
    assert check["logits_within"] and check["max_abs_logit_diff"] <= 1e-4
    assert check["greedy_tokens"] in ("same", "near-tie")
    written = peer.greedy([prompt, prompt], 12)
    assert written.shape == (2, len(prompt) + 12) and torch.equal(written[0], written[1])
    ours = generate(model, torch.tensor([prompt]), 12, temperature=0.0).tokens[0]
    assert written[0, : len(prompt)].tolist() == prompt and written.shape[1] == ours.shape[0]


def test_a_batch_is_timed_beside_ours_with_its_tokens_checked(peer, shipped_char):
    model, tok = shipped_char
    prompts = [encode_prompt(tok, t) for t in ("床前明月光，", "春眠不觉晓，", "白日依山尽，")]
    d = batch_rows(model, peer, prompts, 8, rounds=3, threads=1)
    assert d["rows"] == 3 and d["tokens_agree"] and d["verdict"] in ("faster", "slower", "within noise")
    assert all(v > 0 for v in d["tokens_per_s"].values()) and d["ours_vs_peer"] > 0
    text = format_batch(d)
    assert "CTranslate2 generate_batch" in text and "tokens/s" in text and d["verdict"] in text
