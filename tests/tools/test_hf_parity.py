"""Our weights in transformers' GPT2LMHeadModel give the same logits and the same greedy tokens.

Skipped without ``transformers`` (``pip install -e .[bench]``), except with
``KVLIB_REQUIRE_TRANSFORMERS=1`` (set by ``.ci/run``), where a missing ``transformers`` fails.
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("transformers") is None:
    if os.environ.get("KVLIB_REQUIRE_TRANSFORMERS") == "1":
        raise ImportError("the parity test is required (KVLIB_REQUIRE_TRANSFORMERS=1) but transformers is "
                          "not installed: pip install -e .[bench]")
    pytest.skip("transformers is not installed: pip install -e .[bench]", allow_module_level=True)

from kvlib.tools import bench  # noqa: E402
from kvlib.decoding import generate  # noqa: E402
from kvlib.model import GPT, GPTConfig  # noqa: E402

ATOL = 1e-4


def tiny_model() -> GPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)).eval()


@pytest.fixture(scope="module", params=["random", "shipped"])
def pair(request, random_gpt):
    """(our model, the same weights in GPT2LMHeadModel, a 16-token prompt)."""
    if request.param == "random":
        model = random_gpt
        idx = torch.randint(model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    else:
        model, tokenizer = request.getfixturevalue("shipped_char")
        idx = torch.tensor([tokenizer.encode(bench.PROMPT)])
    return model, bench.to_transformers(model), idx


def test_logits_agree_at_every_position(pair):
    model, hf, idx = pair
    with torch.inference_mode():
        ours, _ = model(idx)
        theirs = hf(idx).logits
    assert theirs.shape == ours.shape
    assert (theirs - ours).abs().max().item() <= ATOL


def test_greedy_tokens_agree_over_the_whole_block(pair):
    model, hf, idx = pair
    n = model.config.block_size - idx.shape[1]  # 112 new tokens: every position of the block
    theirs = bench.transformers_generate(hf, idx, n)
    ours = generate(model, idx, n, temperature=0.0)
    assert theirs.shape == (1, model.config.block_size)
    assert torch.equal(theirs, ours.tokens)


def test_the_benchmark_runs_transformers_when_it_is_installed():
    report = bench.run_bench(model=tiny_model(), threads=(1,), prompt_length=4, new_tokens=(2,), rounds=1,
                             max_seconds=0.001, peak_n=32, peak_seconds=0.001, progress=False, with_compiled=False)
    assert report["paths"][-1] == "transformers"
    assert report["transformers"]["used"] and report["transformers"]["installed"]
    assert report["tokens_equal"]["transformers"]
    assert report["rows"][0]["speedup_vs_transformers"] > 0


def test_speculate_times_transformers_in_interleaved_rounds_and_reports_a_broken_case(monkeypatch):
    from kvlib.speculative import NeuralDraft, NgramDraft
    from kvlib.tools import spec_bench

    target = tiny_model()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        small = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    drafts = {"neural": NeuralDraft(small), "n-gram + lookup": NgramDraft.from_ids(torch.arange(64).repeat(3), 64).with_lookup()}
    prompts, new = [torch.tensor([[0, 5, 9]]), torch.tensor([[0, 7]])], 6
    reference = [generate(target, p, new, temperature=0.0).tokens for p in prompts]
    best = {"neural": {"best_gamma": 2}, "n-gram + lookup": {"best_gamma": 1}}
    out = spec_bench._transformers_rows(target, drafts, prompts, new, best, reference, 2 * new, rounds=2)
    assert set(out["rows"]) == {"plain generate", "assisted (neural draft)", "prompt lookup"}
    for name, row in out["rows"].items():
        assert "error" not in row and row["same_tokens"] is True, name
        lo, hi = row["spread_us"]
        assert 0 < lo <= row["us_per_token"] <= hi
    assert [out["rows"][n]["gamma"] for n in ("plain generate", "assisted (neural draft)", "prompt lookup")] == [None, 2, 1]
    assert "vs_plain" not in out["rows"]["plain generate"]
    for name in ("assisted (neural draft)", "prompt lookup"):  # judged against the library's own plain loop
        assert out["rows"][name]["vs_plain"] in ("faster", "slower", "within noise")

    def broken(*args, **kwargs):
        raise TypeError("generate() got an unexpected keyword argument\nsecond line")

    monkeypatch.setattr(spec_bench, "_hf_assisted", broken)
    out = spec_bench._transformers_rows(target, drafts, prompts, new, best, reference, 2 * new, rounds=2)
    assert out["rows"]["prompt lookup"] == {"gamma": 1, "error": "TypeError: generate() got an unexpected keyword argument"}
    assert "us_per_token" in out["rows"]["plain generate"]
