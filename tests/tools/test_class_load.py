"""``python -m kvlib class``: a class of students calling a real server process through the official ``openai``
client, and the report adding up; bad input refused at once."""
from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi", reason="the server extra (FastAPI, uvicorn, prometheus-client) is not installed")
openai = pytest.importorskip("openai", reason="the openai client (the server extra) is not installed")
httpx = pytest.importorskip("httpx", reason="httpx comes with the openai client")

from kvlib.tools.class_load import SHARED_START, format_class, free_port, local_server, run_class  # noqa: E402

from .test_server import metric as server_metric, settled as server_settled  # noqa: E402

STUDENTS = 12
BLOCK = 16  # the server's KV block: prefix caching shares whole blocks only


@pytest.fixture(scope="module")
def server():
    with local_server() as url:   # python -m kvlib server on a free port of 127.0.0.1, stopped after the module
        yield url


@pytest.fixture(scope="module")
def report(server):
    return run_class(server, STUDENTS, time_limit=60.0)


def metric(url: str, name: str) -> float:
    return server_metric(url.removesuffix("/v1"), name)


def settled(url: str, timeout: float = 10.0) -> bool:
    return server_settled(url.removesuffix("/v1"), timeout)


def test_the_shared_start_fills_a_whole_block(shipped_char):
    _, tok = shipped_char
    assert len(tok.encode(SHARED_START)) + 1 >= BLOCK   # with the poem separator the server puts first


def test_every_student_is_answered_or_turned_away(report):
    outcomes = [s["outcome"] for s in report["per_student"]]
    assert report["students"] == len(outcomes) == STUDENTS
    assert report["answered"] + report["turned_away"] + report["failed"] + report["not_answered"] == STUDENTS
    assert set(outcomes) <= {"answered", "turned away"}, report["errors"]
    assert report["answered"] >= 1 and report["answered"] == outcomes.count("answered")


def test_the_reports_numbers_add_up(report):
    students = report["per_student"]
    assert report["tokens"] > 0 and report["tokens"] == sum(s["tokens"] for s in students)
    assert report["tokens_per_s"] == pytest.approx(report["tokens"] / report["wall_s"])
    assert 0 < report["wall_s"] <= report["time_limit_s"]
    for key in ("ttft_s", "itl_s"):
        p = report[key]
        assert 0 <= p["p50"] <= p["p90"] <= p["p99"], (key, p)
    answered = [s for s in students if s["outcome"] == "answered"]
    assert report["cached"]["prompt_tokens"] == sum(s["prompt_tokens"] for s in answered)
    assert report["cached"]["cached_tokens"] == sum(s["cached"] for s in answered)
    assert report["sharing"] == sum(s["shared"] for s in students) == STUDENTS // 2


def test_the_students_sharing_the_start_find_its_block_in_the_pool(report):
    sharers = [s for s in report["per_student"] if s["shared"] and s["outcome"] == "answered"]
    assert len(sharers) >= 2 and report["sharers_cached"]["share"] > 0
    # the first sharer's prefill is done before the others ask: each of them finds at least the first block
    assert all(s["cached"] >= BLOCK for s in sharers[1:]), sharers


def test_the_server_is_left_with_nothing_running_and_its_pool_free(server, report):
    assert report["answered"] >= 1
    assert settled(server)


def test_the_run_ends_at_its_time_limit_and_the_students_cut_off_leave_nothing_running(server, report):
    start = time.monotonic()
    cut = run_class(server, STUDENTS, time_limit=0.3, max_tokens=120, seed=7)
    assert time.monotonic() - start < 15 and cut["wall_s"] < 5
    assert cut["answered"] + cut["turned_away"] + cut["failed"] + cut["not_answered"] == STUDENTS
    assert cut["answered"] + cut["not_answered"] >= 1
    assert settled(server)   # the streams closed at the limit were aborted and their blocks freed


def test_the_printed_report_names_each_number(report):
    text = format_class(report)
    for words in (f"a class of {STUDENTS} students", f"answered {report['answered']}", "turned away",
                  "tokens/s", "time to first token:  p50", "inter-token latency:  p50", "cached prompt tokens",
                  f"the {STUDENTS // 2} sharing the start", "machine: "):
        assert words in text, (words, text)


@pytest.mark.parametrize("students", [0, 301, -1])
def test_a_class_outside_1_to_300_is_refused_naming_students(students):
    with pytest.raises(ValueError, match=r"students.*\[1, 300\]"):
        run_class("http://127.0.0.1:9/v1", students)


@pytest.mark.parametrize("bad", [2.0, True, "30"])
def test_a_student_count_that_is_not_an_int_is_refused(bad):
    with pytest.raises(TypeError, match="students"):
        run_class("http://127.0.0.1:9/v1", bad)


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://127.0.0.1/v1", ""])
def test_a_url_that_is_no_http_url_is_refused(url):
    with pytest.raises(ValueError, match="base_url"):
        run_class(url, 3)


def test_a_url_that_does_not_answer_is_a_clear_error_soon():
    url = f"http://127.0.0.1:{free_port()}/v1"   # nothing listens there
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=f"nothing answers at {re.escape(url)}"):
        run_class(url, 3)
    assert time.monotonic() - start < 15


def test_the_command_calls_a_server_given_by_its_url(server):
    out = subprocess.run([sys.executable, "-m", "kvlib", "class", "--students", "4", "--url", server],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "a class of 4 students" in out.stdout and re.search(r"^answered \d+, turned away \d+", out.stdout, re.M)


def test_the_command_says_in_one_line_when_nothing_answers():
    url = f"http://127.0.0.1:{free_port()}/v1"
    out = subprocess.run([sys.executable, "-m", "kvlib", "class", "--url", url], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"nothing answers at {url}" in out.stderr


@pytest.mark.slow
def test_the_command_starts_a_server_for_the_class_and_stops_it():
    out = subprocess.run([sys.executable, "-m", "kvlib", "class", "--students", "3"], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    url = re.search(r"students at (\S+/v1)", out.stdout).group(1)
    assert "answered 3, turned away 0" in out.stdout, out.stdout
    with pytest.raises(httpx.HTTPError):   # the server was stopped with the command
        httpx.get(f"{url.removesuffix('/v1')}/health", timeout=2)
