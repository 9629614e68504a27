"""The command line: demo sections, generate's JSON, and its defaults."""
import json
import re

import pytest

from kvlib.tools.cli import build_parser, main
from kvlib.tools.timing import VERDICTS
from kvlib.tools.demo import sections


def test_generate_defaults_match_the_spec():
    args = build_parser().parse_args(["generate"])
    assert (args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed) == (64, 0.8, 40, 0.95, 1337)
    assert args.model == "tang-char" and not args.no_cache


def test_generate_json_reports_the_full_verify_report(capsys):
    main(["generate", "--prompt", "春风", "--verify", "--json", "--max-new-tokens", "16"])
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"prompt", "completion", "stop_reason", "note", "batch_consistent", "consistency", "verify",
                           "benchmark"}
    assert report["prompt"] == "春风" and report["benchmark"] is None and report["note"] is None
    assert report["stop_reason"] in ("max_new_tokens", "eos")
    v = report["verify"]
    assert v["passed"] and v["tokens_equal"] and v["first_divergence"] is None and v["divergence_margin"] is None
    assert v["steps"] == 64 and len(v["margins"]) == len(v["step_diffs"]) == 64 and len(v["chunk_maxima"]) == 4
    assert v["max_abs_logit_diff"] == max(v["chunk_maxima"]) == max(v["step_diffs"])
    assert v["min_margin"] == min(v["margins"]) and v["atol"] == 1e-4


def test_generate_text_prints_the_verify_report(capsys):
    main(["generate", "--prompt", "春风", "--verify", "--max-new-tokens", "8"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("春风")
    assert out[1].startswith("verify: passed: 64 greedy steps")
    assert out[2].startswith("  max |diff| per 16 steps: ") and len(out[2].split(": ")[1].split()) == 4
    assert out[3].startswith("  top-1 minus top-2 margin per step: ") and "smallest" in out[3]
    assert out[4] == "  first divergence: none: the greedy tokens agree at every step"


BATCH = "春风|大漠孤烟直|床前明月光，疑是地上"


def test_batch_prompts_print_every_completion_and_the_verdict(capsys):
    main(["generate", "--batch-prompts", BATCH, "--max-new-tokens", "16"])
    out = capsys.readouterr().out.splitlines()
    prompts = BATCH.split("|")
    assert len(out) == 4
    for line, p in zip(out, prompts):
        assert line.startswith(p) and len(line) > len(p)
    assert out[3].startswith("batch consistent: yes: greedy, 16 steps")


def test_batch_prompts_json_carries_completions_and_consistency(capsys):
    main(["generate", "--verify", "--batch-prompts", BATCH, "--json", "--max-new-tokens", "16"])
    report = json.loads(capsys.readouterr().out)
    prompts = BATCH.split("|")
    assert report["prompts"] == prompts and len(report["completions"]) == 3 and all(report["completions"])
    assert report["batch_consistent"] is True and report["consistency"]["consistent"] is True
    assert [r["prompt_length"] for r in report["consistency"]["rows"]] == [len(p) + 1 for p in prompts]
    assert len(report["verify"]) == 3 and all(v["passed"] for v in report["verify"])


def test_batch_completions_equal_the_same_rows_written_together(capsys):
    """What --batch-prompts prints is the library's left-padded batch, seeded like the CLI."""
    import torch

    from kvlib.poems import completion, write_ids
    from kvlib.tools.loading import load_pretrained

    main(["generate", "--batch-prompts", BATCH, "--json", "--max-new-tokens", "12", "--seed", "5"])
    report = json.loads(capsys.readouterr().out)
    model, tok = load_pretrained("tang-char")
    r = write_ids(model, tok, BATCH.split("|"), 12, temperature=0.8, top_k=40, top_p=0.95,
                  generator=torch.Generator().manual_seed(5))
    assert report["completions"] == [completion(tok, r, b) for b in range(3)]


def test_the_context_limit_is_said_with_and_without_the_cache(capsys, monkeypatch, shipped_char):
    import torch

    from kvlib.model import GPT, GPTConfig
    from kvlib.tools import cli

    _, tok = shipped_char
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # a random model: it never ends a poem early, so the limit is reached
        model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=128, n_layer=1, n_head=2, n_embd=16)).eval()
    monkeypatch.setattr(cli, "_load", lambda name: (model, tok))
    prompt = "床前明月光，疑是地上霜。" * 9 + "床前明月光，疑是地上"  # 118 characters: 119 tokens
    main(["generate", "--prompt", prompt, "--max-new-tokens", "40", "--temperature", "0"])
    cached = capsys.readouterr()
    assert "note: stopped after 10 new token(s) at the context limit" in cached.err
    assert "119 of the block's 128 positions" in cached.err
    main(["generate", "--prompt", prompt, "--max-new-tokens", "40", "--temperature", "0", "--no-cache", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["stop_reason"] == "max_new_tokens" and len(report["completion"]) == 40
    assert "the recompute loop slid" in report["note"] and "only the last 128 tokens" in report["note"]


def test_cached_and_uncached_cli_runs_write_the_same_poem(capsys):
    main(["generate", "--prompt", "大漠孤烟直", "--json", "--max-new-tokens", "24"])
    cached = json.loads(capsys.readouterr().out)["completion"]
    main(["generate", "--prompt", "大漠孤烟直", "--json", "--max-new-tokens", "24", "--no-cache"])
    assert json.loads(capsys.readouterr().out)["completion"] == cached
    assert cached


def test_stream_prints_what_plain_output_prints(capsys):
    args = ["generate", "--prompt", "床前明月光", "--max-new-tokens", "40", "--model", "tang-bpe"]
    main(args)
    plain = capsys.readouterr().out
    main(args + ["--stream"])
    assert capsys.readouterr().out == plain
    assert plain.startswith("床前明月光")


class Events:
    """A stream that logs its writes between the decoder's forward passes."""

    def __init__(self, log):
        self.log = log

    def write(self, text):
        if text:
            self.log.append(("write", text))

    def flush(self):
        pass


@pytest.mark.parametrize("extra", [[], ["--no-cache"], ["--json"]])
def test_stream_writes_while_tokens_are_still_being_generated(monkeypatch, capsys, extra):
    """Each piece is written before the next forward pass: streamed, not replayed at the end."""
    from kvlib.fast import FastDecoder
    from kvlib.model import GPT

    log = []
    step = FastDecoder.__call__
    forward = GPT.forward
    monkeypatch.setattr(FastDecoder, "__call__", lambda self, *a, **k: log.append(("forward", None)) or step(self, *a, **k))
    if "--no-cache" in extra:
        monkeypatch.setattr(GPT, "forward", lambda self, *a, **k: log.append(("forward", None)) or forward(self, *a, **k))
    stream = "stderr" if "--json" in extra else "stdout"
    monkeypatch.setattr(f"sys.{stream}", Events(log))
    main(["generate", "--prompt", "床前明月光", "--max-new-tokens", "20", "--temperature", "0", "--stream"] + extra)
    kinds = [k for k, _ in log]
    writes = [i for i, k in enumerate(kinds) if k == "write"]
    forwards = [i for i, k in enumerate(kinds) if k == "forward"]
    assert len(forwards) >= 5 and len(writes) >= 5
    assert writes[1] < forwards[-1]  # the first generated piece came out long before the last forward pass
    between = sum(1 for a, b in zip(forwards, forwards[1:]) if any(a < w < b for w in writes))
    assert between >= len(forwards) // 2  # pieces interleave with the forward passes
    if "--json" in extra:
        report = json.loads(capsys.readouterr().out)  # stdout stays clean JSON
        assert "".join(t for k, t in log if k == "write").startswith("床前明月光" + report["completion"])


def test_unknown_prompt_character_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--prompt", "hello"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not in the vocabulary" in err


@pytest.mark.slow
def test_demo_prints_the_six_sections(shipped_char):
    model, tok = shipped_char
    lines = list(sections(model, tok, timing_runs=2))  # the command runs demo.TIMING_RUNS; two give a spread
    headers = [line for line in lines if line.lstrip("\n").startswith("== ")]
    assert [h.lstrip("\n")[:5] for h in headers] == [f"== {i}." for i in range(1, 7)]
    text = "\n".join(lines)
    assert "cached equals uncached" in text
    assert "without the poem separator" in text and "notebook 1" in text  # why its top 8 differ from notebook 1's
    assert "169 times in 1,177" in text
    assert "4,096 bytes" in text and "512 KiB" in text
    timings = [line for line in lines if "characters: cached:" in line]
    assert [line.split()[0] for line in timings] == ["32", "64", "120"]
    for line in timings:  # a verdict from the runs' spreads, never a bare ratio
        assert "against recompute:" in line and line.endswith(VERDICTS)
    assert any(line.strip().startswith("machine: ") for line in lines)
    for heads in ("春眠不觉", "学无止境"):
        assert heads in text


@pytest.mark.parametrize("runs", [0, -1, 2.0, True, "3"])
def test_demo_refuses_a_timing_run_count_that_is_not_a_positive_int(shipped_char, runs):
    with pytest.raises((TypeError, ValueError), match="timing_runs"):
        next(sections(*shipped_char, timing_runs=runs))


def test_demo_timing_is_one_timeline_per_run():
    """Section 6 reads the time to the 32nd and 64th character off the 120-character runs' timelines."""
    from kvlib.tools.demo import timed

    calls = []
    result, stamps = timed(lambda on_token: [on_token(i, None) or calls.append(i) for i in range(5)])
    assert calls == list(range(5)) and len(stamps) == 5 and stamps == sorted(stamps) and stamps[0] >= 0


def test_json_floats_are_rounded_for_reading():
    from kvlib.tools.cli_args import rounded, to_json

    assert rounded({"a": 0.123456789, "b": [1.0 / 3, 2], "c": (1234567.0, "x"), "d": 3.7314711104592822e-06}) == \
        {"a": 0.1235, "b": [0.3333, 2], "c": [1235000.0, "x"], "d": 3.731e-06}
    assert to_json({"k": 2 / 3}, indent=None) == '{"k": 0.6667}'


# ---- bad numbers: refused at the edge, status 2, one line that names the option and what it allows ----

@pytest.fixture
def no_runs(monkeypatch):
    """Training and evaluation made impossible: a value that got past the checks fails, never runs."""
    from kvlib.tools import training

    def run(*args, **kwargs):
        raise AssertionError("a refused value started a run")

    monkeypatch.setattr(training, "train", run)
    monkeypatch.setattr(training, "evaluate", run)


def refused(capsys, argv) -> str:
    """The one line main prints for ``argv``, after checking it exits 2 without a traceback."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def number_options():
    """(command, option) for every option with a type (each parses a number), so one added later is swept too."""
    commands = build_parser()._subparsers._group_actions[0].choices
    return [(name, a.option_strings[-1]) for name, sub in commands.items() for a in sub._actions if a.type is not None]


HUGE = "99999999999999999999"  # past every bound: `train --threads` once overflowed C's long long


@pytest.mark.parametrize("command, option", [o for o in number_options() if o[1] not in ("--temperature", "--lr")])
def test_every_number_option_refuses_a_value_past_its_bound_naming_it(no_runs, capsys, command, option):
    for value in (HUGE, "-" + HUGE):
        err = refused(capsys, [command, option, value])
        assert f"argument {option}: must be" in err and "got " in err, err


def test_the_sweep_finds_every_number_option():
    found = set(number_options())
    assert {("train", "--threads"), ("train", "--steps"), ("train", "--batch-size"), ("train", "--lr"),
            ("evaluate", "--poems"), ("evaluate", "--show"), ("generate", "--max-new-tokens"),
            ("generate", "--temperature"), ("generate", "--top-p"), ("serve", "--requests")} <= found
    assert len(found) == 22  # with --top-k, --seed (3), --rate, --new-tokens, --rounds, --texts, --length,
    #                           server's --port and --max-in-flight, class's --students


@pytest.mark.parametrize("argv, allowed", [
    (["train", "--threads", "257"], r"a whole number of threads in \[1, 256\], got 257"),
    (["train", "--threads", "100000"], r"in \[1, 256\], got 100000"),
    (["train", "--threads", "0"], r"in \[1, 256\], got 0"),
    (["train", "--steps", "0"], r"--steps: must be a whole number of steps in \[1, 1,000,000\], got 0"),
    (["train", "--steps", "-1"], r"--steps: .* in \[1, 1,000,000\], got -1"),
    (["train", "--batch-size", "0"], r"--batch-size: must be a whole number of windows in \[1, 1,024\], got 0"),
    (["train", "--lr", "0"], r"--lr: must be a number in \(0, 10\] \(AdamW.s step size\), got 0.0"),
    (["train", "--lr", "-1"], r"--lr: must be a number in \(0, 10\] \(AdamW.s step size\), got -1.0"),
    (["train", "--lr", "nan"], r"--lr: must be a number in \(0, 10\] \(AdamW.s step size\), got nan"),
    (["train", "--lr", "inf"], r"--lr: must be a number in \(0, 10\] \(AdamW.s step size\), got inf"),
    (["evaluate", "--poems", "1000000000000"], r"--poems: must be a whole number of poems in \[1, 1,000\]"),
    (["evaluate", "--poems", "-3"], r"--poems: .* in \[1, 1,000\], got -3"),
    (["evaluate", "--poems", "0"], r"--poems: .* in \[1, 1,000\], got 0"),
    (["evaluate", "--show", "1001"], r"--show: must be a whole number of poems in \[0, 1,000\], got 1001"),
    (["generate", "--temperature", "-1"], r"--temperature: must be a finite number >= 0 \(0: greedy\), got -1.0"),
    (["generate", "--temperature", "1e999"], r"--temperature: must be a finite number >= 0 .*, got inf"),
    (["generate", "--top-p", "0"], r"--top-p: must be a number in \(0, 1\] \(1: no top-p filter\), got 0.0"),
    (["generate", "--top-p", "nan"], r"--top-p: must be a number in \(0, 1\] .*, got nan"),
    (["generate", "--max-new-tokens", "0"], r"--max-new-tokens: must be a whole number of tokens in \[1, 100,000\]"),
    (["generate", "--benchmark", "--max-new-tokens", "0"], r"--max-new-tokens: .* in \[1, 100,000\], got 0"),
])
def test_a_bad_number_is_refused_naming_the_option_and_its_true_range(no_runs, capsys, argv, allowed):
    err = refused(capsys, argv)
    assert re.search(allowed, err), err
    assert not re.search(r"\b(top_p|batch_size|n_poems)\b|None", err), err  # the typed flag, never a field name


@pytest.mark.parametrize("argv, attr, value", [
    (["train", "--threads", "256"], "threads", 256), (["train", "--steps", "1000000"], "steps", 1_000_000),
    (["train", "--batch-size", "1024"], "batch_size", 1024), (["train", "--lr", "1e-4"], "lr", 1e-4),
    (["evaluate", "--poems", "1000"], "poems", 1000), (["evaluate", "--show", "0"], "show", 0),
    (["generate", "--max-new-tokens", "1"], "max_new_tokens", 1),
    (["generate", "--temperature", "0"], "temperature", 0.0), (["generate", "--top-p", "1"], "top_p", 1.0),
])
def test_the_ends_of_each_range_are_accepted(argv, attr, value):
    assert getattr(build_parser().parse_args(argv), attr) == value


def command_help(command: str) -> str:
    return build_parser()._subparsers._group_actions[0].choices[command].format_help()


def test_help_states_each_bound_and_each_default_once():
    text = {c: " ".join(command_help(c).split()) for c in ("generate", "evaluate", "train")}
    for command, bound in [("train", "torch threads, 1 to 256"), ("train", "optimiser steps, 1 to 1,000,000"),
                           ("train", "windows per step, 1 to 1,024"), ("train", "a number in (0, 10]"),
                           ("evaluate", "for the format score, 1 to 1,000"), ("evaluate", "to print, 0 to 1,000"),
                           ("generate", "tokens to write, 1 to 100,000"), ("generate", "a finite number >= 0")]:
        assert bound in text[command], (command, bound)
    for command in ("demo", "generate", "evaluate", "bench", "serve", "speculate", "train", "shrink"):
        options = re.split(r"\n  (?=-)", command_help(command))
        for option in options:
            assert option.count("(default") <= 1 and "(default: None)" not in option, option
    assert "(default: the model's recipe)" in text["train"] and "(default: 1337)" in text["train"]


# ---- a character the token budget cut off: dropped, never printed as U+FFFD -----------------------

@pytest.mark.parametrize("extra", [[], ["--json"], ["--stream"], ["--stream", "--json"], ["--no-cache"]])
def test_a_character_cut_off_by_the_budget_is_not_printed(monkeypatch, capsys, shipped_bpe, extra):
    """The last token holds only the first bytes of 月: what is printed stops before it, everywhere."""
    import torch

    from kvlib import decoding
    from kvlib.tools import cli

    model, tok = shipped_bpe
    ids = tok.encode("春风") + list("月".encode()[:2])  # ids 0-255 are single bytes
    assert tok.decode(ids).endswith("\ufffd")  # what the library's decode makes of them

    def fake(model, idx, max_new_tokens, on_token=None, **kwargs):
        new = torch.tensor([ids])
        for step in range(len(ids)):
            if on_token is not None:
                on_token(step, new[:, step])
        return decoding.GenerationResult(tokens=torch.cat([idx, new], 1), prompt_lengths=torch.tensor([idx.shape[1]]),
                                         new_tokens=new, stop_reason="max_new_tokens", finished=torch.tensor([False]))

    monkeypatch.setattr(cli, "_load", lambda name: (model, tok))
    monkeypatch.setattr(decoding, "generate", fake)
    monkeypatch.setattr(decoding, "generate_uncached", fake)
    main(["generate", "--model", "tang-bpe", "--prompt", "明", "--max-new-tokens", str(len(ids))] + extra)
    out, err = capsys.readouterr()
    printed = err if extra == ["--stream", "--json"] else out
    assert "\ufffd" not in out + err
    if "--json" in extra:
        assert json.loads(out)["completion"] == "春风"
    if extra != ["--json"]:
        assert printed == "明春风\n"


@pytest.mark.parametrize("extra", [[], ["--json"], ["--stream"], ["--batch-prompts", "春风|明月", "--json"]])
def test_the_shipped_bpe_model_never_prints_the_replacement_character(capsys, extra):
    for n in ("1", "2", "3"):  # three tokens end mid-character (the tester's "兴\ufffd")
        main(["generate", "--model", "tang-bpe", "--max-new-tokens", n] + extra)
        out, err = capsys.readouterr()
        assert "\ufffd" not in out + err and "\\ufffd" not in out


# ---- evaluate --before: the folder the user names --------------------------------------------------

@pytest.mark.parametrize("manifest, reason", [
    ("not json", "MANIFEST.json is not valid JSON"), ("{}", "tang-char.pt is not listed in"),
    ("[]", "must map file names"), ('{"tang-char.pt": {"sha256": "' + "a" * 64 + '"}}', "tang-char.pt is missing"),
    (None, "not a data folder"),
])
def test_a_bad_before_folder_is_a_usage_error_saying_what_it_must_hold(no_runs, tmp_path, capsys, manifest, reason):
    if manifest is not None:
        (tmp_path / "MANIFEST.json").write_text(manifest)
    err = refused(capsys, ["evaluate", "--before", str(tmp_path)])
    assert err.startswith(f"python -m kvlib evaluate: error: --before {tmp_path}: ") and reason in err, err
    assert "an earlier tang-char.pt, its tokenizer file and a MANIFEST.json" in err
    assert "git" not in err  # the user's folder, not data/: nothing to restore with git


@pytest.mark.parametrize("value", [" 5", "1_0", "\uff11", "5 "])
def test_numbers_must_be_written_in_plain_digits(capsys, value):
    for args in (["generate", "--max-new-tokens", value], ["speculate", "--rounds", value], ["serve", "--rate", value]):
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == 2 and "plain digits" in capsys.readouterr().err


def test_generate_json_always_carries_the_same_keys(capsys):
    """One prompt or a batch: the same report keys, null where not asked for (batch_consistent included)."""
    main(["generate", "--prompt", "春风", "--json", "--max-new-tokens", "4"])
    single = json.loads(capsys.readouterr().out)
    main(["generate", "--batch-prompts", "春风|明月", "--json", "--max-new-tokens", "4"])
    batch = json.loads(capsys.readouterr().out)
    common = {"stop_reason", "note", "batch_consistent", "consistency", "verify", "benchmark"}
    assert set(single) == common | {"prompt", "completion"} and set(batch) == common | {"prompts", "completions"}
    assert single["batch_consistent"] is None and single["consistency"] is None and batch["batch_consistent"] is True
