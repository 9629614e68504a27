"""The speculative-decoding benchmark: the report's structure (never its timings) and its statistics."""
import json

import pytest
import torch

from kvlib.model import GPT, GPTConfig
from kvlib.speculative import NeuralDraft, NgramDraft
from kvlib.tools.spec_costs import round_us
from kvlib.tools.timing import VERDICTS, Timing, too_busy
from kvlib.tools import spec_bench
from kvlib.verify import chi_square_homogeneity, total_variation
from kvlib.tools.cli import build_parser


def seeded(config, seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(config).eval()


class Tok:
    """Enough of a tokenizer for the report: decode."""
    vocab_size = 64

    def decode(self, ids):
        return " ".join(map(str, ids))


@pytest.mark.slow
def test_report_structure_and_text():
    target = seeded(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32), 0)
    small = seeded(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_embd=16), 1)
    ids = torch.randint(64, (500,), generator=torch.Generator().manual_seed(0))
    drafts = {"n-gram": NgramDraft.from_ids(ids, 64), "neural": NeuralDraft(small)}
    prompts = [torch.tensor([[0, 5, 9]]), torch.tensor([[0, 7]])]
    report = spec_bench.run_spec_bench(target, Tok(), drafts, prompts, gammas=(1, 2, 3), new_tokens=12, rounds=1,
                                       with_transformers=False, progress=False)
    json.dumps(report, default=str)
    assert set(report) >= {"plain_us_per_token", "costs", "counts", "results", "better_draft", "target_speedup",
                           "target_met", "transformers", "gammas", "drafts", "plain_too_busy"}
    assert set(report["results"]) == {"n-gram", "neural"} and report["better_draft"] in report["results"]
    for res in report["results"].values():
        assert [r["gamma"] for r in res["rows"]] == [1, 2, 3] and res["best_gamma"] in (1, 2, 3)
        for r in res["rows"]:
            assert r["same_tokens"] is True and 0 <= r["alpha"] <= 1
            assert 1 <= r["tokens_per_call"] <= r["gamma"] + 1 and 1 <= r["formula"] <= r["gamma"] + 1
            assert 1 <= r["tokens_per_full_round"] <= r["gamma"] + 1 and 0 <= r["full_rounds"]
            assert r["judged"] >= r["full_rounds"]  # a full round judges at least one guess
            assert r["target_calls"] * r["tokens_per_call"] == pytest.approx(report["total_tokens"])
            assert r["us_per_token"] > 0 and r["speedup"] > 0
            assert r["low_us"] <= r["us_per_token"] <= r["high_us"]
            assert r["verdict"] in ("faster", "slower", "within noise")
            assert r["too_busy"] is None or r["too_busy"].startswith("the machine was too busy")
    for name, res in report["results"].items():  # the α needed and the ceiling are both taken over every γ
        assert (res["alpha_needed"] is None) == (res["perfect_draft_speedup"] < report["target_speedup"]), name
        assert (res["alpha_needed_gamma"] is None) == (res["alpha_needed"] is None)
        if res["alpha_needed"] is not None:
            assert 0 < res["alpha_needed"] <= 1 and res["alpha_needed_gamma"] in (1, 2, 3)
        k = res["counted"]  # the ceiling by the counts: tokens a round over the least a round can cost
        assert k["gamma"] in (1, 2, 3) and k["least_steps"] >= 1 and k["ceiling"] == pytest.approx(k["tokens"] / k["least_steps"])
    assert report["results"]["n-gram"]["counted"]["least_steps"] == 1.0  # free guesses, one read of the weights
    assert report["better_vs_next"] in ("faster", "slower", "within noise")
    assert set(report["costs"]) == {"step_us", "verify_us", "head_us", "guess_us", "guess_steps_spread", "too_busy",
                                    "rounds", "context", "rounds_us"}
    assert report["context"] == report["costs"]["context"] == spec_bench.bench_context(prompts, 12) == 8  # 2.5 + 5.5
    assert list(report["counts"]) == list(range(1, 10))
    for name, (lo, hi) in report["costs"]["guess_steps_spread"].items():
        assert 0 <= lo <= hi, name  # a difference of two timings, never shown below 0
    assert set(report["costs"]["verify_us"]) == {1, 2, 3, 4} and set(report["costs"]["head_us"]) == {1, 4}
    assert set(report["costs"]["too_busy"]) == {"verify/2", "verify/3", "verify/4", "head/4"}
    text = spec_bench.format_report(report)
    assert "medians of 1 rounds, taking turns" in text and "machine: " in text and "timed on 1 thread(s)" in text
    assert "best γ = " in text and "neural " in text and "target >= 1.3x" in text
    assert text.count("over bare decode steps (γ = ") == 2 and "against the next draft's best: " in text
    assert "counted, the same on every machine" in text and "timed, this machine" in text


def test_given_costs_are_used_not_measured_again(monkeypatch):
    target = seeded(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_embd=16), 0)
    drafts = {"n-gram": NgramDraft.from_ids(torch.arange(64).repeat(4), 64)}
    costs = spec_bench.piece_costs(target, drafts, context=8, rounds=1, min_run_time=0.001, passes=(2,))
    counts = spec_bench.pass_counts(target, 8, 2)
    monkeypatch.setattr(spec_bench, "piece_costs", lambda *a, **k: pytest.fail("costs measured twice"))
    monkeypatch.setattr(spec_bench, "pass_counts", lambda *a, **k: pytest.fail("counts made twice"))
    report = spec_bench.run_spec_bench(target, Tok(), drafts, [torch.tensor([[0, 5]])], gammas=(1,), new_tokens=4,
                                       rounds=1, with_transformers=False, progress=False, costs=costs, counts=counts)
    assert report["costs"] is costs and report["counts"] is counts
    # A verify pass of one token is the decode step: one figure for one computation, not two that drift apart.
    assert costs["verify_us"][1] == costs["step_us"] and costs["rounds_us"]["verify"][1] == costs["rounds_us"]["step"]
    text = spec_bench.format_report(report)
    assert "timed, this machine: pieces after 8 cached tokens, medians of 1 rounds" in text
    assert text.count("one decode step in the same rounds") <= 1  # the step's time is printed once, if at all
    lo, hi = report["step_spread_us"]
    assert lo <= report["step_us"] <= hi and report["plain_vs_step"] in VERDICTS
    with pytest.raises(ValueError, match="a verify pass of 3"):  # γ = 2 needs a pass of 3 tokens, not measured
        spec_bench.run_spec_bench(target, Tok(), drafts, [torch.tensor([[0, 5]])], gammas=(2,), new_tokens=4,
                                  rounds=1, with_transformers=False, progress=False, costs=costs)


def fabricated(step_s, plain_s, spec_s, verify_s=None):
    """An ``interleaved`` that runs each function once (the counts come from that call) and returns made-up
    rounds: ``step_s`` seconds a decode step, ``plain_s`` a plain-greedy run, ``spec_s`` a speculative run,
    ``verify_s`` (T -> seconds) a verify pass."""
    def fake(fns, rounds, **_):
        out = {}
        for key, fn in fns.items():
            fn()
            kind = key if isinstance(key, str) else key[0]
            s = {"step": step_s, "plain": plain_s, "verify": (verify_s or {}).get(key[-1], 2 * step_s),
                 "head": step_s / 4, "guess": 0.0}.get(kind, spec_s)
            out[key] = Timing(str(key), (s, 1.1 * s, 0.9 * s))
        return out
    return fake


def test_a_timing_that_contradicts_the_work_it_holds_prints_the_too_busy_line_not_its_number(monkeypatch):
    """Made-up rounds (no clock): a plain greedy token, a speculative round and a verify pass of 2 tokens each
    timed faster than the decode step they hold. The report prints the too-busy line for each, never the figure."""
    target = seeded(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_embd=16), 0)
    drafts = {"n-gram": NgramDraft.from_ids(torch.arange(64).repeat(4), 64)}
    prompts, new = [torch.tensor([[0, 5]])], 6
    monkeypatch.setattr(spec_bench, "interleaved", fabricated(1e-3, 0.5e-3 * new, 1e-6, {2: 0.5e-3, 3: 1.5e-3}))
    report = spec_bench.run_spec_bench(target, Tok(), drafts, prompts, gammas=(1, 2), new_tokens=new, rounds=3,
                                       with_transformers=False, progress=False)
    text = spec_bench.format_report(report)
    assert report["plain_too_busy"] == too_busy(Timing("one decode step", (1,)), Timing("a plain greedy token", (1,)))
    assert "plain greedy: the machine was too busy to measure this: a plain greedy token was timed faster than one " \
           "decode step, a part of its own work" in text
    assert "a greedy token cost" not in text  # the impossible 0.50 decode steps is not printed
    for g in (1, 2):
        assert f"a round of the n-gram draft at γ = {g} was timed faster than one decode step" in text
    assert "µs/token" in text and " 0.00x" not in text  # no time per token for a contradicted row
    assert report["costs"]["too_busy"]["verify/2"].startswith("the machine was too busy")
    assert report["costs"]["too_busy"]["verify/3"] is None
    assert "a verify pass of 2 tokens was timed faster than one decode step" in text
    assert "T=2 0.50" not in text  # the impossible pass is not printed


def test_a_timing_that_holds_prints_its_number(monkeypatch):
    target = seeded(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_embd=16), 0)
    drafts = {"n-gram": NgramDraft.from_ids(torch.arange(64).repeat(4), 64)}
    monkeypatch.setattr(spec_bench, "interleaved", fabricated(1e-3, 1.2e-3 * 6, 20e-3))
    report = spec_bench.run_spec_bench(target, Tok(), drafts, [torch.tensor([[0, 5]])], gammas=(1,), new_tokens=6,
                                       rounds=3, with_transformers=False, progress=False)
    text = spec_bench.format_report(report)
    assert report["plain_too_busy"] is None and "a greedy token cost 1.20 decode steps" in text
    assert "too busy" not in text and "T=2 2.00" in text


def test_statistics():
    assert total_variation([1, 0], [0, 1]) == 1.0
    assert total_variation([2, 2], [10, 10]) == 0.0
    assert chi_square_homogeneity([500, 500], [505, 495]) > 0.5
    assert chi_square_homogeneity([900, 100], [500, 500]) < 1e-6
    assert chi_square_homogeneity([3, 0, 1], [2, 1, 0]) == pytest.approx(1.0)  # all pooled


def test_char_corpus_ids_match_encode_corpus(shipped_char):
    _, tok = shipped_char
    poems = ["白日依山尽，黄河入海流。", "床前明月光，猫", "春"]
    assert spec_bench.corpus_ids(tok, poems).tolist() == tok.encode_corpus(poems)


def test_speculate_command_line():
    args = build_parser().parse_args(["speculate", "--json", "--new-tokens", "8", "--rounds", "1", "--no-transformers"])
    assert (args.json, args.new_tokens, args.rounds, args.no_transformers) == (True, 8, 1, True)
    assert args.func.__name__ == "cmd_speculate"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["speculate", "--rounds", "0"])


def test_the_draft_recipe_shares_the_targets_tokenizer(tmp_path, shipped_char):
    from kvlib.tools import integrity
    from kvlib.tools.loading import load_pretrained, load_tokenizer
    from kvlib.tools.training import config_for, train

    cfg = config_for("tang-char-draft", steps=2, batch_size=2, block_size=16, eval_every=1, eval_batches=1,
                     out_dir=str(tmp_path / "out"), work_dir=str(tmp_path / "run"))
    assert cfg.n_layer == 1 and config_for("tang-char").n_layer == 4
    shipped = (integrity.DATA_DIR / "tang-char.tokenizer.json").read_bytes()
    train(cfg, poems=["白日依山尽，黄河入海流。"] * 40, progress=False)
    ckpt = torch.load(tmp_path / "out" / "tang-char-draft.pt", weights_only=True)
    assert ckpt["tokenizer"] == "tang-char.tokenizer.json" and ckpt["config"]["n_layer"] == 1
    assert (tmp_path / "out" / "tang-char.tokenizer.json").read_bytes() == shipped  # the same vocabulary
    assert (integrity.DATA_DIR / "tang-char.tokenizer.json").read_bytes() == shipped
    draft, tok = load_pretrained("tang-char-draft")  # the shipped draft: in the manifest, the target's ids
    assert draft.config.n_layer == 1 and tok.vocab_size == shipped_char[1].vocab_size == draft.config.vocab_size
    assert load_tokenizer(tmp_path / "out" / "tang-char.tokenizer.json").vocab_size == tok.vocab_size


@pytest.mark.parametrize("kwargs, said", [
    (dict(gammas=()), "gammas must be a non-empty"), (dict(gammas=(20,)), r"gammas\[0\] must be an int in \[1, 8\]"),
    (dict(drafts={}), "drafts must be a non-empty dict"), (dict(prompts=[]), "prompts must be a non-empty"),
    (dict(prompts=[[0, 5]]), r"prompts\[0\] must be a \(1, P\)"), (dict(new_tokens=0), "new_tokens"),
    (dict(costs={}), "costs must be a dict"), (dict(rounds=0), "rounds")])
def test_bad_settings_are_refused_before_anything_is_timed(monkeypatch, kwargs, said):
    target = seeded(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_embd=16), 0)
    monkeypatch.setattr(spec_bench, "_measure", lambda *a: pytest.fail("timed before checking"))
    settings = dict(drafts={"self": NeuralDraft(target)}, prompts=[torch.tensor([[0, 5]])], with_transformers=False,
                    progress=False)
    with pytest.raises((TypeError, ValueError), match=said):
        spec_bench.run_spec_bench(target, Tok(), **{**settings, **kwargs})


def test_a_block_too_small_for_the_verify_passes_is_named():
    target = seeded(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16), 0)
    with pytest.raises(ValueError, match="a block of at least 18 positions"):
        spec_bench.piece_costs(target, {})


def test_the_cost_model_refuses_a_round_longer_than_its_measured_passes():
    costs = {"step_us": 100.0, "verify_us": {1: 100.0, 2: 110.0, 3: 130.0}}
    assert round_us(costs, 5.0, 2) == 2 * 5.0 + 130.0
    with pytest.raises(ValueError, match="not the 4 that γ = 3 needs"):
        round_us(costs, 5.0, 3)


def test_piece_costs_flag_impossible_passes_and_a_guess_is_never_below_zero(monkeypatch):
    """With made-up rounds (no clock): a pass of 9 tokens timed faster than the step inside it is flagged, one of 2
    tokens is not; a guess whose γ = 2 ran quicker than its γ = 1 (noise) counts as 0, not less."""
    target = seeded(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_embd=16), 0)
    drafts = {"n-gram": NgramDraft.from_ids(torch.arange(64).repeat(4), 64)}

    def fake(fns, rounds, **_):
        step = (1.0, 1.1, 0.9)
        out = {}
        for key in fns:
            if key == "step":
                out[key] = Timing("step", step)
            elif key[0] == "verify":
                out[key] = Timing("v", tuple((1.5 if key[1] == 2 else 0.8) * s for s in step))
            elif key[0] == "head":
                out[key] = Timing("h", (0.1, 0.1, 0.1) if key[1] == 1 else (0.05, 0.05, 0.05))
            else:  # a guess: γ = 2 quicker than γ = 1 in the first and last rounds
                out[key] = Timing("g", (0.01, 0.05, 0.03) if key[2] == 2 else (0.02, 0.02, 0.04))
        return out

    monkeypatch.setattr(spec_bench, "interleaved", fake)
    costs = spec_bench.piece_costs(target, drafts, context=8, rounds=3, passes=(9, 2))
    assert list(costs["verify_us"]) == [1, 2, 9] and list(costs["head_us"]) == [1, 9]
    assert costs["too_busy"]["verify/2"] is None
    assert costs["too_busy"]["verify/9"] == ("the machine was too busy to measure this: a verify pass of 9 tokens was "
                                             "timed faster than one decode step, a part of its own work, which no "
                                             "machine can do; close other programs and run the cell again, or read "
                                             "the reference run")
    assert "the head's product over 9 rows was timed faster than the head's product over one row" in costs["too_busy"]["head/9"]
    lo, hi = costs["guess_steps_spread"]["n-gram"]
    assert lo == 0.0 and hi == pytest.approx(0.03 / 1.1)
    # The median of the rounds' differences (0, 0.03, 0), not the difference of the medians (0.03 - 0.02).
    assert costs["guess_us"]["n-gram"] == 0.0
    assert costs["rounds_us"]["guess"]["n-gram"] == pytest.approx([0.0, 0.03e6, 0.0])
    with pytest.raises(ValueError, match="passes"):
        spec_bench.piece_costs(target, drafts, context=8, passes=(1,))


def test_pass_counts_grow_in_flops_not_in_calls_or_weights():
    target = seeded(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_embd=16), 0)
    counts = spec_bench.pass_counts(target, context=5)
    assert list(counts) == list(range(1, 10))
    assert len({c["weight_bytes"] for c in counts.values()}) == 1  # every pass reads every weight once
    assert len({c["aten_calls"] for T, c in counts.items() if T > 1}) == 1  # a wider pass makes the same calls
    assert all(counts[T]["flops"] < counts[T + 1]["flops"] for T in range(1, 9))


def test_the_pieces_are_timed_at_the_runs_mean_context():
    prompts = [torch.tensor([[0] * 3]), torch.tensor([[0] * 8])]
    assert spec_bench.bench_context(prompts, 1) == 6 and spec_bench.bench_context(prompts, 33) == 22
    with pytest.raises(TypeError, match="prompts must be a non-empty list"):
        spec_bench.bench_context([], 4)
    with pytest.raises(ValueError, match="new_tokens"):
        spec_bench.bench_context(prompts, 0)
