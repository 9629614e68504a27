"""The engine's decode step compiled: the eager engine's tokens on a trace, prefills and other models left to the eager
step, and the serve bench's row for it. Its speed is the bench's to report, never a test's."""
from __future__ import annotations

import pytest
import torch

from kvlib.paged import PagedKVCache
from kvlib.serving import Engine, Request
from kvlib.tools import compiled_paged
from kvlib.tools.compiled_paged import CompiledPagedStep, compiled_engine_step
from kvlib.tools.serve_bench import format_details, run_serve_bench

needs_compiler = pytest.mark.skipif(not compiled_paged.compiler_available(), reason="no C++ compiler on the PATH")


def serve(engine: Engine, requests: list[Request]) -> dict[int, list[int]]:
    for r in requests:
        engine.add(r)
    while engine.has_work:
        engine.step()
    return {s.id: s.output for s in engine.finished}


@pytest.mark.slow
@needs_compiler
def test_an_engine_with_the_compiled_step_writes_the_eager_engines_tokens(shipped_char, random_gpt):
    model, tok = shipped_char
    lines = ["白日依山尽，", "床前明月光，疑是", "春眠", "红豆生南国，春来发几枝。愿君", "故人西辞黄鹤楼，"]
    requests = [Request(i, [tok.eos_id] + tok.encode(line), max_new_tokens=12 + 7 * i, arrival=0.0)
                for i, line in enumerate(lines)]                    # rows of different lengths, finishing apart
    engine = compiled_engine_step(Engine(model, 24, max_num_seqs=4))
    step = engine.cache.step_runner
    assert isinstance(step, CompiledPagedStep) and step.compile_seconds > 0
    assert serve(engine, requests) == serve(Engine(model, 24, max_num_seqs=4), requests)
    assert engine.cache.num_free_blocks == 24                      # every block given back
    pool = PagedKVCache.for_model(model, 4).pool.kv
    idx = torch.tensor([[5]])
    assert step.takes(model, engine.cache.pool.kv, idx)
    assert not step.takes(model, engine.cache.pool.kv, torch.tensor([[5, 6]]))  # a prefill: the eager step's
    assert not step.takes(random_gpt, engine.cache.pool.kv, idx)   # another model's weights
    assert not step.takes(model, pool, idx)                        # a pool of another shape


@pytest.mark.slow
@needs_compiler
def test_the_serve_bench_times_the_compiled_engine_step_beside_the_eager_one(shipped_char):
    model, tok = shipped_char
    poems = ["白日依山尽，黄河入海流。欲穷千里目，更上一层楼。", "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。"]
    report = run_serve_bench(model, tok, poems, n_requests=3, max_new_tokens=4, batch_size=2, repeats=1,
                             step_rounds=1, compiled=True)
    d = report["decode_step"]
    assert d["steps"]["paged_compiled"]["rows"] == 2 and d["compile_s"] > 0
    ratio, verdict = d["compiled_vs_paged"]
    assert ratio > 0 and verdict in ("faster", "slower", "within noise")
    assert f"the engine's step compiled (AOTInductor, built in {d['compile_s']:.0f} s) took {ratio:.2f}x" \
        in format_details(report)
    assert "paged batch, the engine's step compiled" in format_details(report)
    with pytest.raises(TypeError, match="compiled"):
        run_serve_bench(model, tok, poems, compiled="yes")


def test_serve_reports_an_engine_step_that_could_not_be_built(shipped_char, monkeypatch):
    import kvlib.tools.serve_bench as sb

    def broken(*args, **kwargs):
        raise OSError("no OpenMP")

    monkeypatch.setattr(sb, "compiler_available", lambda: True)
    monkeypatch.setattr(sb, "CompiledPagedStep", broken)
    d = sb.decode_steps(shipped_char[0], batch_size=2, context=8, rounds=1, compiled=True)
    assert d["compile_failed"] == "OSError: no OpenMP" and "paged_compiled" not in d["steps"]
    assert "compiled_vs_paged" not in d
