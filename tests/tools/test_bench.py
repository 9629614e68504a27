"""The benchmark's counting and its report: structure only, never timings."""
from __future__ import annotations

import json

import pytest
import torch

from kvlib.tools import bench
from kvlib.fast import FastDecoder
from kvlib.decoding import CachedDecoder, generate
from kvlib.model import GPT, GPTConfig

TINY = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
QUICK = dict(threads=(1,), prompt_length=4, new_tokens=(2, 3), rounds=1, max_seconds=0.001, with_compiled=False,
             peak_n=32, peak_seconds=0.001, progress=False)


def tiny_model(seed: int = 0) -> GPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(TINY).eval()


def step_calls(decoder, model) -> int:
    """ATen calls of one unpadded decode step after a 16-token prefill."""
    dec = decoder(model, 1)
    with torch.inference_mode():
        dec(torch.zeros(1, 16, dtype=torch.long))
    return bench.aten_calls(lambda: dec(torch.zeros(1, 1, dtype=torch.long)))


# ---- counting ATen calls -------------------------------------------------------------------------

def test_the_counter_sees_calls_and_names_them():
    with torch.inference_mode(), bench.CountOps() as ops:
        torch.ones(3).add(1).sum()
    assert ops.count == 3
    assert ops.names == ["ones", "add", "sum"]


def test_the_fast_step_makes_fewer_calls_than_the_plain_cached_step(random_gpt):
    fast, plain = step_calls(FastDecoder, random_gpt), step_calls(CachedDecoder, random_gpt)
    assert 0 < fast < plain
    assert fast <= bench.TARGETS["aten_calls"]


def test_calls_per_loop_step_include_sampling_and_stay_within_the_goal(random_gpt):
    idx = torch.zeros(1, 16, dtype=torch.long)
    per_step = bench.aten_calls_per_step(lambda n: generate(random_gpt, idx, n, temperature=0.0), steps=4)
    assert step_calls(FastDecoder, random_gpt) < per_step <= bench.TARGETS["aten_calls"]


# ---- the compute floor --------------------------------------------------------------------------

def test_decode_flops_counts_layers_head_and_attention():
    cfg = GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=2)
    # prompt 2, 2 new tokens: 3 positions through the layers, the head twice, 1 + 2 + 3 keys seen
    layers = 2 * 12 * 2 * 2 * 3
    head = 2 * 10 * 2 * 2
    attention = 4 * 2 * (1 + 2 + 3)
    assert bench.decode_flops(cfg, 2, 2) == (layers + head + attention) / 2


def test_forward_flops_of_a_chunk_after_a_cache():
    cfg = GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=2)
    # 3 new tokens after 4 cached: they see 5, 6 and 7 keys; the head on all 3 rows, or on the last only
    layers, attention, head = 3 * 2 * 12 * 2 * 2, 4 * 2 * (5 + 6 + 7), 2 * 10 * 2
    assert bench.forward_flops(cfg, 3, 4) == layers + attention + 3 * head
    assert bench.forward_flops(cfg, 3, 4, head_rows=1) == layers + attention + head
    with pytest.raises(ValueError, match="head_rows"):
        bench.forward_flops(cfg, 3, 4, head_rows=4)


def test_the_cost_model_fits_one_time_and_predicts_from_counts():
    m = bench.CostModel.fit(seconds=3e-3, calls=100, flops=2e6, peak=1e9)  # 2 ms of FLOPs, 1 ms of calls
    assert m.per_call == pytest.approx(1e-5) and m.predict(100, 2e6) == pytest.approx(3e-3)
    assert m.predict(200, 0) == pytest.approx(2e-3) and m.predict(0, 4e6) == pytest.approx(4e-3)
    assert bench.CostModel.fit(1e-3, 10, 5e6, 1e9).per_call == 0.0  # quicker than its FLOPs: no time left for calls
    with pytest.raises(ValueError, match="calls must be a finite number > 0"):
        bench.CostModel.fit(1e-3, 0, 1.0, 1e9)


# ---- the report ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def report():
    return bench.run_bench(model=tiny_model(), with_transformers=False, **QUICK)


def test_report_has_a_row_per_thread_count_length_and_path(report):
    assert report["paths"] == ["fast", "model", "recompute"]
    assert [(r["threads"], r["new_tokens"], r["path"]) for r in report["rows"]] == [
        (1, n, p) for n in (2, 3) for p in ("fast", "model", "recompute")]
    for r in report["rows"]:
        assert 0 < r["low_s"] <= r["median_s"] <= r["high_s"] and r["rounds"] >= 1
        assert r["verdict_vs_recompute"] in ("faster", "slower", "within noise")
        assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["median_s"])
        assert r["x_floor"] == pytest.approx(r["us_per_token"] / r["floor_us_per_token"])
        assert r["speedup_vs_transformers"] is None
    recompute = [r for r in report["rows"] if r["path"] == "recompute"]
    assert all(r["speedup_vs_recompute"] == 1.0 and r["verdict_vs_recompute"] == "within noise" for r in recompute)


def test_report_says_how_to_install_transformers_when_it_is_missing(report, monkeypatch):
    assert report["transformers"]["used"] is False
    assert report["targets"]["vs_transformers"]["met"] is None
    monkeypatch.setattr(bench, "transformers_available", lambda: False)
    missing = bench.run_bench(model=tiny_model(), **dict(QUICK, new_tokens=(2,)))
    assert missing["transformers"] == {"used": False, "installed": False, "install": "pip install -e .[bench]"}
    assert "transformers generate                       2  not installed: pip install -e .[bench]" in \
        bench.format_report(missing)


def test_report_counts_calls_checks_tokens_and_names_the_targets(report):
    calls = report["aten_calls_per_step"]
    assert set(calls) == {"fast", "model", "recompute"}
    assert 0 < calls["fast"] < calls["model"]
    assert report["tokens_equal"] == {"fast": True, "model": True, "recompute": True}
    targets = report["targets"]
    assert (targets["threads"], targets["new_tokens"]) == (1, 3)
    assert set(targets) >= {"vs_recompute", "vs_transformers", "aten_calls"}
    assert report["peak_matmul_gflops"]["1"] > 0


def test_report_is_json_and_formats_as_text_or_json(report):
    assert json.loads(json.dumps(report)) == report
    text = bench.format_report(report)
    for name in ("fast path", "cached loop", "recompute loop", "ATen calls per decode step", "targets"):
        assert name in text
    assert json.loads(json.dumps(report)) == report


def test_a_request_past_the_block_is_refused():
    with pytest.raises(ValueError, match="do not fit"):
        bench.run_bench(model=tiny_model(), **dict(QUICK, new_tokens=(13,)))


def test_without_the_shipped_checkpoint_the_bench_uses_random_weights(monkeypatch, tmp_path):
    from kvlib.tools import integrity

    monkeypatch.setattr(integrity, "DATA_DIR", tmp_path)
    model, idx, note = bench.bench_model()
    assert model.config == bench.SHIPPED_SHAPE
    assert idx.shape == (1, 16)
    assert "random weights" in note


@pytest.mark.parametrize("kwargs, said", [
    (dict(threads=1), "threads must be a non-empty tuple"), (dict(threads=()), "threads must be a non-empty tuple"),
    (dict(threads=(0,)), r"threads\[0\]"), (dict(threads=(1000,)), r"threads\[0\] .*\[1, 256\]"),
    (dict(new_tokens=()), "new_tokens must be"), (dict(new_tokens=(2.7,)), r"new_tokens\[0\]"),
    (dict(new_tokens=(True,)), r"new_tokens\[0\]"), (dict(new_tokens=(0,)), r"new_tokens\[0\]"),
    (dict(peak_n=0), "peak_n"), (dict(idx=torch.tensor([1, 2])), r"idx must be one int64 prompt")])
def test_run_bench_refuses_settings_it_cannot_time(kwargs, said):
    with pytest.raises((TypeError, ValueError), match=said):
        bench.run_bench(model=tiny_model(), **{**QUICK, **kwargs})


def test_run_bench_times_float32_only_and_leaves_the_models_mode_alone():
    model = tiny_model().train()
    with pytest.raises(ValueError, match="float32 models .*bfloat16"):
        bench.run_bench(model=tiny_model().to(torch.bfloat16), **QUICK)
    bench.run_bench(model=model, with_transformers=False, **QUICK)
    assert model.training


def test_compare_writes_the_same_tokens_both_ways_and_gives_a_verdict():
    model = tiny_model()
    idx = torch.tensor([[0, 1, 2]])
    room = model.config.block_size - 3 + 1
    out = bench.compare(model, idx, room, min_run_time=0.003)
    assert out["new_tokens"] == room and out["verdict"] in ("faster", "slower", "within noise")
    with pytest.raises(ValueError, match=rf"max_new_tokens must be an int in \[1, {room}\]"):
        bench.compare(model, idx, room + 1)
