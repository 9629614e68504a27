"""The side-by-side serving report: its structure, never its timings."""
import copy
import json

import pytest
import torch

from kvlib.tools.timing import VERDICTS
from kvlib.tools import cli
from kvlib.tools.ct2_peer import ctranslate2_available
from kvlib.tools.serve_bench import (TARGETS, decode_steps, format_details, format_report, format_summary,
                                     run_serve_bench, step_flops)

POEMS = ["床前明月光，疑是地上霜。举头望明月，低头思故乡。",
         "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。",
         "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。"]
RUNS = ("one_at_a_time", "static", "continuous", "continuous_block_8")
PEER = ("ctranslate2_static",) if ctranslate2_available() else ()  # CTranslate2's static batches, with the bench extra


@pytest.fixture(scope="module")
def report(shipped_char):
    model, tok = shipped_char
    return run_serve_bench(model, tok, POEMS, n_requests=5, max_new_tokens=8, batch_size=2, repeats=2, step_rounds=1)


def test_the_report_has_every_figure_for_every_way(report):
    assert set(report["runs"]) == set(RUNS + PEER)
    for r in report["runs"].values():
        for key in ("tokens_per_s", "mean_latency_s", "p95_latency_s", "mean_ttft_s", "p95_ttft_s", "memory_share"):
            assert isinstance(r[key], float) and r[key] >= 0
        assert r["tokens_per_s_low"] <= r["tokens_per_s"] <= r["tokens_per_s_high"]
        assert r["generated_tokens"] == sum(report["trace"]["answer_tokens"])
    assert report["same_tokens"] is True
    assert report["settings"]["num_blocks"] * report["settings"]["kv_block_size"] == 2 * 128
    assert report["settings"]["repeats"] == 2
    expected = report["memory_share_from_lengths"]
    assert set(expected) == {16, 8} and 0 < expected[16] < expected[8] <= 1  # smaller blocks leave less empty
    assert set(report["targets"]) == set(TARGETS) - (set() if PEER else {"continuous_vs_ctranslate2_static_tokens_per_s"})
    assert set(report["verdicts"].values()) <= {"faster", "slower", "within noise"}
    assert set(report["ttft_verdicts"]) == set(report["verdicts"]) - {"continuous_vs_ctranslate2_static"}  # each run's mean
    assert set(report["ttft_verdicts"].values()) <= {"faster", "slower", "within noise"}
    assert all(set(t) == {"target", "kind", "measured", "met", "bound"} for t in report["targets"].values())
    share = report["targets"]["paged_memory_share"]  # a goal the lengths cannot reach is printed as their bound
    lengths_allow = report["memory_share_from_lengths"][16]
    assert share["bound"] == (lengths_allow < 0.90) and share["target"] == min(0.90, lengths_allow)
    json.dumps(report)  # JSON-able


def test_the_printed_report_names_the_targets(report):
    text = format_report(report)
    assert "same tokens in every run: True" in text and "blocks of 8" in text
    assert "weight products alone" in text and "matrix library" in text
    assert all(k in text for k in TARGETS) and "this machine's measurement" in text
    assert "machine: " in text and "timed on 1 thread(s)" in text


def test_a_bound_is_printed_as_a_bound_never_as_a_goal_missed(report):
    """The KV share at blocks of 16 cannot pass what the lengths allow: the summary says so, under bounds."""
    r = copy.deepcopy(report)
    share = r["targets"]["paged_memory_share"]
    share.update(bound=True, target=0.838, measured=0.838, met=True)
    text = format_summary(r)
    targets, bounds = text.split("\nbounds (", 1)
    assert "paged_memory_share " not in targets and "paged_memory_share" in bounds
    line = next(x for x in bounds.splitlines() if "paged_memory_share" in x)
    assert "not met" not in line and " met" not in line and "cannot be reached" in line
    assert format_report(r) == text + "\n" + format_details(r)
    assert "where each way's time went" not in text  # the details are apart


def test_the_peer_comparison_splits_into_the_schedule_and_the_step(report):
    """Continuous batching over CTranslate2's static batches is exactly (continuous over our static batches, the
    same steps) times (our static batches over CTranslate2's, the same schedule)."""
    r = copy.deepcopy(report)
    r["runs"].setdefault("ctranslate2_static", dict(r["runs"]["static"]))  # without the extra: a stand-in row
    r["runs"]["continuous"]["tokens_per_s"], r["runs"]["static"]["tokens_per_s"] = 4500.0, 3000.0
    r["runs"]["ctranslate2_static"]["tokens_per_s"] = 4000.0
    assert "against CTranslate2: 1.12x = 1.50x (the schedule: continuous over our static batches) x 0.75x (the step: " \
        "our static batches over CTranslate2's, the same schedule)" in format_summary(r)
    del r["runs"]["ctranslate2_static"]
    assert "against CTranslate2" not in format_summary(r)


def test_decode_steps_time_four_steps_beside_their_counts(shipped_char):
    model = shipped_char[0]
    d = decode_steps(model, batch_size=2, context=8, rounds=1)
    assert set(d["steps"]) == {"single_row", "static", "paged", "paged_model"}
    for name, v in d["steps"].items():
        assert v["low_ms"] <= v["ms"] <= v["high_ms"] and v["floor_ms"] > 0
        assert v["flops"] == step_flops(model.config, v["rows"], 8)
    assert d["batch_vs_single_row"] == pytest.approx(d["steps"]["paged"]["ms"] / d["steps"]["single_row"]["ms"])
    assert d["weight_bytes"] == 4 * sum(p.numel() for p in model.parameters())
    p = d["products"]  # the step's weight products alone, in the same rounds: what a batch's rows cost here
    assert p["rows"] == 2 and p["calls"] == 4 * model.config.n_layer + 1
    assert p["ratio"] == pytest.approx(p["ms_batch"] / p["ms_1"])
    single = d["steps"]["single_row"]["ms"]
    assert 0 < p["share_of_single_step"] and 0 < p["share_of_batch_step"]
    assert p["lowest_batch_vs_single_row"] == pytest.approx((single - p["ms_1"] + p["ms_batch"]) / single)
    assert p["batch_step_vs_estimate"] in VERDICTS


def test_the_step_against_the_products_estimate_is_worded_by_its_verdict(report):
    """The batch step is set beside what the products alone allow by a verdict, never by a bare comparison."""
    said = {}
    for word in VERDICTS:
        r = copy.deepcopy(report)
        r["decode_step"]["products"]["batch_step_vs_estimate"] = word
        said[word] = format_report(r)
    assert "costs more (every round)" in said["slower"] and "within noise of this estimate" in said["within noise"]
    assert "came in below it (every round)" in said["faster"]
    assert len({text for text in said.values()}) == 3


def test_the_report_says_whether_requests_queued(report):
    """The last arrival against the shortest run: tokens/s measure the server only when requests waited."""
    pace = report["pace"]
    assert pace["last_arrival_s"] == report["trace"]["last_arrival_s"]
    assert pace["shortest_run"] in RUNS + PEER and pace["shortest_makespan_s"] > 0
    assert pace["server_bound"] == (pace["last_arrival_s"] <= 0.5 * pace["shortest_makespan_s"])
    said = {}
    for bound in (True, False):
        r = copy.deepcopy(report)
        r["pace"]["server_bound"] = bound
        said[bound] = format_report(r)
    assert "requests queued, so tokens/s measure the server" in said[True]
    assert "raise the rate to measure the server" in said[False]


def test_the_report_splits_each_ways_time_into_prefills_and_decode_passes(report):
    """The whole-run ratios mix two things; the report gives the decode passes' pace and the prefills' share apart."""
    runs, n = report["runs"], len(report["trace"]["answer_tokens"])
    for key, r in runs.items():
        if key in PEER:  # CTranslate2 hands a batch back whole: no prefill of its own is timed
            assert r["prefill_share"] == 0 and r["decode_tokens_per_s"] > 0
            continue
        assert 0 < r["prefill_share"] < 1 and r["decode_tokens_per_s"] > 0
        assert r["prefill_passes"] <= r["forward_passes"]
    assert runs["one_at_a_time"]["prefill_passes"] == n                    # one prefill a request
    assert runs["one_at_a_time"]["decode_tokens_per_pass"] == 1
    assert runs["static"]["decode_tokens_per_pass"] <= report["settings"]["static_batch_size"]
    ps = report["passes"]
    assert ps["decode_vs_static"] == pytest.approx(runs["continuous"]["decode_tokens_per_s"]
                                                   / runs["static"]["decode_tokens_per_s"])
    assert ps["recomputed_tokens"] == runs["continuous"]["prefill_tokens"] - sum(report["trace"]["prompt_tokens"])
    text = format_report(report)
    assert "where each way's time went" in text and "decode passes alone" in text


def test_step_products_are_the_steps_products(shipped_char, monkeypatch):
    """The products timed alone are every weight product of the lean step, with its shapes, and the
    head through the step's own head_logits."""
    import kvlib.tools.serve_bench as sb

    model, calls = shipped_char[0], []
    run = sb.step_products(model, 3, torch.Generator().manual_seed(0))
    real_mm, real_addmm = torch.mm, torch.addmm
    monkeypatch.setattr(sb, "head_logits", lambda h, w: calls.append((tuple(h.shape), "head")))
    try:
        torch.mm = lambda x, m, out: calls.append((tuple(x.shape), tuple(m.shape))) or real_mm(x, m, out=out)
        torch.addmm = lambda b, x, m, out: calls.append((tuple(x.shape), tuple(m.shape))) or real_addmm(b, x, m, out=out)
        run()
    finally:
        torch.mm, torch.addmm = real_mm, real_addmm
    C = model.config.n_embd
    layer = [((3, C), (C, 3 * C)), ((3, C + 1), (C + 1, C)), ((3, C), (C, 4 * C)), ((3, 4 * C + 1), (4 * C + 1, C))]
    assert calls == layer * model.config.n_layer + [((3, C), "head")]


def test_step_flops_count_layers_head_and_attention():
    from kvlib.model import GPTConfig
    cfg = GPTConfig(vocab_size=10, n_layer=1, n_head=1, n_embd=2)
    # per row: 2 x 12 x 2 x 2 (layers) + 2 x 10 x 2 (head) + 4 x 2 x 1 x 4 keys (attention)
    assert step_flops(cfg, 3, 3) == 3 * (96 + 40 + 32)


def test_the_command_prints_json(capsys, monkeypatch):
    import kvlib.tools.serve_bench as sb

    calls = {}

    def fake(model, tok, poems, **kw):
        calls.update(kw)
        return {"runs": {}, "fake": True}

    monkeypatch.setattr(sb, "run_serve_bench", fake)
    assert cli.main(["serve", "--requests", "3", "--rate", "50", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"runs": {}, "fake": True}
    assert calls == {"n_requests": 3, "rate": 50.0, "seed": 0, "compiled": True}
    with pytest.raises(SystemExit):
        cli.main(["serve", "--requests", "0"])
    for rate in ("0", "-5", "nan"):
        with pytest.raises(SystemExit) as e:
            cli.main(["serve", "--rate", rate])
        assert e.value.code == 2 and "--rate" in capsys.readouterr().err


def test_prefix_reports_count_what_the_cache_saves(shipped_char):
    from kvlib.serving import Request
    from kvlib.poems import encode_prompt
    from kvlib.tools.prefix_bench import prefill_ms, prefix_cache_report

    model, tok = shipped_char
    reqs = [Request(i, encode_prompt(tok, "床前明月光，疑是地上霜。" + c), 3, 0.05 * i) for i, c in enumerate("举低望")]
    r = prefix_cache_report(model, reqs, kv_block_size=4)
    assert r["same_tokens"] and r["prefill_tokens_without"] == r["prompt_tokens"] == 42
    # Arrivals count in steps: the first prompt is prefilled alone at step 0 and fills three blocks of 4;
    # the other two arrive by step 1 and find those 12 tokens each, on every machine.
    assert r["prefix_hit_tokens"] == 2 * 12 and r["prefill_tokens_with"] == 42 - 24
    assert prefix_cache_report(model, reqs)["prefix_hit_tokens"] == 0  # 14-token prompts: no full block of 16
    shared = encode_prompt(tok, "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。")  # 25 tokens
    p = prefill_ms(model, shared, [encode_prompt(tok, "春"), encode_prompt(tok, "秋")], repeats=1)
    assert p["computed_without"] == 27 and p["computed_with"] == 27 - 16 and p["ms_with"] > 0
    with pytest.raises(ValueError, match="suffixes"):
        prefill_ms(model, shared, [[1]])


def test_without_preemption_the_engine_holds_the_share_the_lengths_give(shipped_char):
    from kvlib.serving import Request
    from kvlib.tools.serving_runs import run_continuous
    from kvlib.tools.serve_bench import expected_share

    model, _ = shipped_char
    reqs = [Request(i, list(range(5, 5 + p)), a, 0.0) for i, (p, a) in enumerate([(3, 9), (7, 5), (12, 14)])]
    for block in (1, 4, 16):
        run = run_continuous(model, reqs, 2 * 128 // block, kv_block_size=block)
        assert run.preemptions == 0
        assert run.memory_share == pytest.approx(expected_share(reqs, block))


def test_runs_take_turns_and_the_median_run_is_reported():
    from types import SimpleNamespace

    from kvlib.tools.serve_bench import expected_share, median_run, runs_in_turns

    order, spans = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0])}

    def way(name):
        def run():
            order.append(name)
            return SimpleNamespace(makespan=next(spans[name]))
        return run

    every = runs_in_turns({"a": way("a"), "b": way("b")}, 3)
    assert order == ["a", "b", "b", "a", "a", "b"]  # turns rotate: no way always goes first
    assert [r.makespan for r in every["a"]] == [3.0, 1.0, 2.0]
    assert median_run(every["a"]).makespan == 2.0 and median_run(every["b"]).makespan == 5.0
    assert median_run(every["a"][:2]).makespan == 1.0  # the lower middle of an even count
    r = SimpleNamespace(prompt=[0] * 3, max_new_tokens=3)  # decode steps hold 4, then 5 tokens (the 3rd is never fed)
    assert expected_share([r], 4) == pytest.approx(9 / 12)
    assert expected_share([r], 1) == 1.0
    assert expected_share([SimpleNamespace(prompt=[0] * 3, max_new_tokens=1)], 4) == 1.0  # no decode step at all


def test_the_decode_pace_ratio_splits_into_busy_rows_and_a_rows_cost(report):
    """Continuous batching's decode pace over another way's is the product of its two printed factors."""
    runs, f = report["runs"], report["passes"]["factors"]
    assert runs["one_at_a_time"]["decode_busy_share"] == 1 and runs["one_at_a_time"]["decode_rows_per_pass"] == 1
    assert runs["continuous"]["decode_busy_share"] == 1                  # its finished rows leave at once
    assert 0 < runs["static"]["decode_busy_share"] < 1                   # a static batch keeps its finished rows
    assert runs["static"]["decode_rows_per_pass"] <= report["settings"]["static_batch_size"]
    for key in ("one_at_a_time", "static"):
        pace = runs["continuous"]["decode_tokens_per_s"] / runs[key]["decode_tokens_per_s"]
        assert f[key]["pace"] == pytest.approx(pace) == pytest.approx(f[key]["busy"] * f[key]["row_cost"])
    assert "rows writing a kept token" in format_report(report)


@pytest.mark.parametrize("bad, said", [(dict(max_new_tokens=1), "max_new_tokens must be an int >= 2"),
                                       (dict(repeats=0), "repeats must be an int >= 1")])
def test_settings_that_leave_nothing_to_compare_are_refused(shipped_char, bad, said):
    model, tok = shipped_char
    with pytest.raises(ValueError, match=said):
        run_serve_bench(model, tok, ["床前明月光，疑是地上霜。举头望明月，低头思故乡。"], n_requests=2, **bad)


def test_answers_that_part_only_at_a_near_tie_count_as_the_same_and_are_counted(shipped_char):
    from types import SimpleNamespace

    from kvlib.decoding import generate
    from kvlib.poems import encode_prompt
    from kvlib.serving import Request
    from kvlib.tools.serve_bench import token_agreement

    model, tok = shipped_char
    req = Request(0, encode_prompt(tok, "春风"), 6)
    ref = generate(model, torch.tensor([req.prompt]), 6, temperature=0.0).new_tokens[0].tolist()
    with torch.inference_mode():
        top2 = model(torch.tensor([req.prompt + ref[:2]]))[0][0, -1].topk(2)
    margin = float(top2.values[0] - top2.values[1])
    parted = SimpleNamespace(tokens={0: ref[:2] + [int(top2.indices[1])] + ref[3:]})
    reference = SimpleNamespace(tokens={0: ref})
    assert token_agreement(model, [req], [reference], reference) == {"same_tokens": True, "near_ties": 0}
    assert token_agreement(model, [req], [parted], reference, atol=margin / 2) == {"same_tokens": False, "near_ties": 0}
    assert token_agreement(model, [req], [parted, reference], reference, atol=2 * margin) == {"same_tokens": True,
                                                                                             "near_ties": 1}
