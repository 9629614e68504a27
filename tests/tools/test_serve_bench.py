"""The side-by-side serving report: its structure, never its timings."""
import json

import pytest

from kvlib.tools import cli
from kvlib.tools.serve_bench import TARGETS, decode_step_ms, format_report, run_serve_bench

POEMS = ["床前明月光，疑是地上霜。举头望明月，低头思故乡。",
         "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。",
         "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。"]
RUNS = ("one_at_a_time", "static", "continuous", "continuous_block_8")


@pytest.fixture(scope="module")
def report(shipped_char):
    model, tok = shipped_char
    return run_serve_bench(model, tok, POEMS, n_requests=5, max_new_tokens=8, batch_size=2, repeats=2)


def test_the_report_has_every_figure_for_every_way(report):
    assert set(report["runs"]) == set(RUNS)
    for r in report["runs"].values():
        for key in ("tokens_per_s", "mean_latency_s", "p95_latency_s", "mean_ttft_s", "p95_ttft_s", "memory_share"):
            assert isinstance(r[key], float) and r[key] >= 0
        assert r["generated_tokens"] == sum(report["trace"]["answer_tokens"])
    assert report["same_tokens"] is True
    assert report["settings"]["num_blocks"] * report["settings"]["block_size"] == 2 * 128
    assert report["settings"]["repeats"] == 2
    bound = report["memory_share_bound"]
    assert set(bound) == {16, 8} and 0 < bound[16] < bound[8] <= 1  # smaller blocks leave less empty
    assert set(report["targets"]) == set(TARGETS)
    assert all(set(t) == {"target", "kind", "measured", "met"} for t in report["targets"].values())
    json.dumps(report)  # JSON-able


def test_the_printed_report_names_the_targets(report):
    text = format_report(report)
    assert "same tokens in every run: True" in text and "blocks of 8" in text
    assert all(k in text for k in TARGETS) and "this machine's measurement" in text


def test_decode_step_times_both_caches(shipped_char):
    d = decode_step_ms(shipped_char[0], batch_size=2, context=8, steps=2, repeats=1)
    assert d["static_ms"] > 0 and d["paged_ms"] > 0 and d["ratio"] == pytest.approx(d["paged_ms"] / d["static_ms"])


def test_the_command_prints_json(capsys, monkeypatch):
    import kvlib.tools.serve_bench as sb

    calls = {}

    def fake(model, tok, poems, **kw):
        calls.update(kw)
        return {"runs": {}, "fake": True}

    monkeypatch.setattr(sb, "run_serve_bench", fake)
    assert cli.main(["serve", "--requests", "3", "--rate", "50", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"runs": {}, "fake": True}
    assert calls == {"n_requests": 3, "rate": 50.0, "seed": 0}
    with pytest.raises(SystemExit):
        cli.main(["serve", "--requests", "0"])
    for rate in ("0", "-5", "nan"):
        with pytest.raises(SystemExit) as e:
            cli.main(["serve", "--rate", rate])
        assert e.value.code == 2 and "--rate" in capsys.readouterr().err


def test_prefix_reports_count_what_the_cache_saves(shipped_char):
    from kvlib.serving import Request
    from kvlib.text import encode_prompt
    from kvlib.tools.serve_bench import prefill_ms, prefix_cache_report

    model, tok = shipped_char
    reqs = [Request(i, encode_prompt(tok, "床前明月光，疑是地上霜。" + c), 3, 0.05 * i) for i, c in enumerate("举低望")]
    r = prefix_cache_report(model, reqs, block_size=4)
    assert r["same_tokens"] and r["prefill_tokens_without"] == r["prompt_tokens"] == 42
    assert r["prefix_hit_tokens"] > 0 and r["prefill_tokens_with"] < r["prefill_tokens_without"]
    assert prefix_cache_report(model, reqs)["prefix_hit_tokens"] == 0  # 14-token prompts: no full block of 16
    shared = encode_prompt(tok, "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。")  # 25 tokens
    p = prefill_ms(model, shared, [encode_prompt(tok, "春"), encode_prompt(tok, "秋")], repeats=1)
    assert p["computed_without"] == 27 and p["computed_with"] == 27 - 16 and p["ms_with"] > 0
    with pytest.raises(ValueError, match="suffixes"):
        prefill_ms(model, shared, [[1]])


def test_fastest_runs_take_turns_and_keep_the_shortest_makespan():
    from types import SimpleNamespace

    from kvlib.tools.serve_bench import expected_share, fastest_runs

    order, spans = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0])}

    def way(name):
        def run():
            order.append(name)
            return SimpleNamespace(makespan=next(spans[name]))
        return run

    best = fastest_runs({"a": way("a"), "b": way("b")}, 3)
    assert order == ["a", "b"] * 3
    assert best["a"].makespan == 1.0 and best["b"].makespan == 4.0
    r = SimpleNamespace(prompt=[0] * 3, max_new_tokens=2)  # holds 4, then 5 tokens
    assert expected_share([r], 4) == pytest.approx(9 / 12)
    assert expected_share([r], 1) == 1.0
