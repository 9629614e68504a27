"""The command line: demo sections, generate's JSON, and its defaults."""
import json

import pytest

from kvlib.tools.cli import build_parser, main
from kvlib.tools.demo import sections


def test_generate_defaults_match_the_spec():
    args = build_parser().parse_args(["generate"])
    assert (args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed) == (64, 0.8, 40, 0.95, 1337)
    assert args.model == "tang-char" and not args.no_cache


def test_generate_json_reports_verify_and_batch(capsys):
    main(["generate", "--prompt", "春风", "--verify", "--batch-prompts", "春风|大漠孤烟直|床前明月光，疑是地上",
          "--json", "--max-new-tokens", "16"])
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"prompt", "completion", "stop_reason", "verify", "benchmark", "batch_consistent"}
    assert report["prompt"] == "春风" and report["benchmark"] is None
    assert report["stop_reason"] in ("max_new_tokens", "eos")
    assert report["verify"]["passed"] and report["verify"]["tokens_equal"]
    assert report["batch_consistent"] is True


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


def test_demo_prints_the_six_sections(shipped_char):
    model, tok = shipped_char
    lines = list(sections(model, tok))
    headers = [line for line in lines if line.lstrip("\n").startswith("== ")]
    assert [h.lstrip("\n")[:5] for h in headers] == [f"== {i}." for i in range(1, 7)]
    text = "\n".join(lines)
    assert "cached equals uncached" in text
    assert "169 times in 1,187" in text
    assert "4,096 bytes" in text and "512 KB" in text
    for heads in ("春眠不觉", "学无止境"):
        assert heads in text
