"""``python -m kvlib class``: a class of students calling an OpenAI-compatible server at once, measured as they see it.

Each student is a thread with the official ``openai`` client (which retries a 503 by itself, after the
server's ``Retry-After``), streaming a completion so that the time to the first token and the gaps between
tokens are measured on the client's side. About half the class continues one shared start of 静夜思 (each
student writes the last line from a character of their own, as :func:`~kvlib.tools.traces.class_trace`
picks them); the others continue poem openings drawn from the corpus (:func:`~kvlib.tools.traces.make_trace`).
The first of the sharers asks first, and the class starts when its first token is back: by then the shared
start's full blocks are in the server's pool on any machine (a class whose requests all arrive before the
first prefill would have them computed in one pass, where none finds the others' blocks).

:func:`local_server` starts ``python -m kvlib server`` on a free port of 127.0.0.1 for the length of a
``with`` block; :func:`run_class` plays the class against any base URL; :func:`format_class` prints the report.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager

from ..checks import check_int, check_real, check_seed, check_text
from .cli_args import MAX_STUDENTS, students as students_option

# 静夜思's first couplet and the start of its third line: 18 characters, 19 tokens with the separator, so that the
# shared start fills one whole block of 16 (the unit prefix caching shares); each student adds a character of their own.
SHARED_START = "床前明月光，疑是地上霜。举头望明月，"
TEMPERATURE = 0.8
SERVER_EXTRA = 'pip install -e ".[server]"'


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on now (the system picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def local_server(model: str = "tang-char", *, max_in_flight: int = 64, wait_s: float = 90.0):
    """``python -m kvlib server`` in a subprocess on a free port of 127.0.0.1; yields its base URL (``.../v1``).

    Waits for ``/health`` (at most ``wait_s`` seconds: the model loads first) and stops the server when the
    block ends, whatever happens inside it. A server that exits or does not answer in time raises
    ``RuntimeError`` with the end of what it printed.
    """
    max_in_flight = check_int("max_in_flight", max_in_flight, 1, 1_000)
    wait_s = check_real("wait_s", wait_s, 0, 3_600, open_min=True)
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+", encoding="utf-8") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kvlib", "server", "--model", model, "--port", str(port),
                                 "--max-in-flight", str(max_in_flight)], stdout=log, stderr=subprocess.STDOUT)

        def printed() -> str:
            log.seek(0)
            return log.read()[-2_000:].strip() or "(nothing)"

        try:
            deadline = time.monotonic() + wait_s
            while not healthy(root):
                if proc.poll() is not None:
                    raise RuntimeError(f"the server exited with status {proc.returncode}; it printed: {printed()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not answer {root}/health within {wait_s:g} s; "
                                       f"it printed: {printed()}")
                time.sleep(0.2)
            yield f"{root}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def healthy(root: str) -> bool:
    """Whether ``root/health`` answers 200 within a second."""
    try:
        with urllib.request.urlopen(f"{root}/health", timeout=1) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):   # refused, reset, timed out, or 503 while the model loads
        return False


def class_prompts(students: int, shared_share: float, seed: int) -> list[tuple[str, bool]]:
    """(prompt, shares the start) for each student: the sharers first, then openings of corpus poems."""
    from .corpus import load_poems
    from .integrity import verified_path
    from .loading import load_tokenizer
    from .traces import class_trace, make_trace

    tok, poems = load_tokenizer(verified_path("tang-char.tokenizer.json")), load_poems()
    n_shared = int(students * shared_share + 0.5)
    prompts = []
    if n_shared:
        starts = [tok.decode(r.prompt[1:]) for r in class_trace(tok, poems, SHARED_START, n_requests=n_shared)]
        prompts += [(starts[i % len(starts)], True) for i in range(n_shared)]   # the separator, [1:], is the server's
    if students > n_shared:
        prompts += [(tok.decode(r.prompt[1:]), False) for r in make_trace(tok, poems, students - n_shared, seed=seed)]
    return prompts


def api_url(base_url: str) -> str:
    """The OpenAI base URL: ``http://host:port`` gets ``/v1``; a URL with a path is taken as it is."""
    check_text(base_url, "base_url")
    parts = urllib.parse.urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r:.80}")
    return base_url.strip().rstrip("/") + ("/v1" if parts.path in ("", "/") else "")


def served_model(client, url: str) -> str:
    """The first model the server lists; a server that does not answer raises ``ConnectionError``, at once."""
    import openai

    try:
        return client.with_options(max_retries=0, timeout=10.0).models.list().data[0].id
    except openai.AuthenticationError:
        raise PermissionError(f"the server at {url} asks for an API key (api_key, or --api-key KEY)") from None
    except openai.APIConnectionError as e:   # refused, unreachable or silent (a timeout is one)
        raise ConnectionError(f"nothing answers at {url} ({e.__cause__ or e}); start one with python -m kvlib "
                              f"server, or leave out --url to have one started") from None
    except (openai.APIStatusError, IndexError) as e:
        raise ConnectionError(f"{url} does not list a model at /models ({e})") from None


def not_answered() -> dict:
    """A student with nothing back (yet)."""
    return {"outcome": "not answered", "ttft": None, "gaps": [], "tokens": 0, "prompt_tokens": 0, "cached": 0}


def ask(client, model: str, prompt: str, seed: int, max_tokens: int, deadline: float, on_first_token=None) -> dict:
    """One student's streamed request: what came back, and when (seconds on the client's clock).

    ``deadline`` (``time.monotonic``) ends the stream early: the student is then counted as not answered."""
    import openai

    out = not_answered()
    start = last = time.perf_counter()
    try:
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=TEMPERATURE,
                                           seed=seed, stream=True, stream_options={"include_usage": True})
        with stream:
            for chunk in stream:
                now = time.perf_counter()
                if chunk.choices and (chunk.choices[0].text or chunk.choices[0].finish_reason is None):
                    if out["ttft"] is None:
                        out["ttft"] = now - start
                        if on_first_token is not None:
                            on_first_token()
                    else:
                        out["gaps"].append(now - last)
                    last = now
                    out["tokens"] += 1
                if chunk.usage is not None:
                    details = chunk.usage.prompt_tokens_details
                    out.update(tokens=chunk.usage.completion_tokens, prompt_tokens=chunk.usage.prompt_tokens,
                               cached=None if details is None or details.cached_tokens is None else details.cached_tokens)
                if time.monotonic() > deadline:
                    return out | {"outcome": "not answered"}
        out["outcome"] = "answered"
    except openai.APIStatusError as e:
        out.update(outcome="turned away" if e.status_code == 503 else "failed", error=e.message)
    except Exception as e:   # a connection error, a timeout, an error event in the stream: the student got nothing
        late = time.monotonic() > deadline
        out.update(outcome="not answered" if late else "failed", error=f"{type(e).__name__}: {e}")
    return out


def run_class(base_url: str, students: int = 30, *, shared_share: float = 0.5, max_tokens: int = 32, seed: int = 0,
              time_limit: float = 60.0, api_key: str = "unused", model: str | None = None) -> dict:
    """Play ``students`` students calling the server at ``base_url`` at once; the report as a dict.

    Student ``i`` samples at temperature 0.8 with seed ``seed + i`` (modulo 2**63), streaming up to ``max_tokens`` tokens; each
    request has a timeout, and the run ends after ``time_limit`` seconds (students not done by then are counted
    as not answered). ``model``: the name the server serves (default: the first that ``/models`` lists).
    """
    import openai

    students = check_int("students", students, 1, MAX_STUDENTS, f"a whole number of students in [1, {MAX_STUDENTS}]")
    shared_share = check_real("shared_share", shared_share, 0, 1)
    max_tokens = check_int("max_tokens", max_tokens, 1, 100_000)
    seed = check_seed(seed)
    time_limit = check_real("time_limit", time_limit, 0, 3_600, open_min=True)
    check_text(api_key, "api_key")
    url = api_url(base_url)
    client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=2, timeout=min(30.0, time_limit))
    try:
        model = served_model(client, url) if model is None else check_text(model, "model")
        prompts = class_prompts(students, shared_share, seed)
        results: list[dict | None] = [None] * students
        first_back, deadline = threading.Event(), time.monotonic() + time_limit

        def student(i: int) -> None:
            try:
                if i and prompts[0][1]:   # the first sharer asks first; the class follows once its first token is back
                    first_back.wait(max(0.0, deadline - time.monotonic()))
                if time.monotonic() < deadline:
                    results[i] = ask(client, model, prompts[i][0], (seed + i) % 2**63, max_tokens, deadline,
                                     on_first_token=first_back.set if i == 0 else None)
            finally:
                if i == 0:
                    first_back.set()   # also when the first student got no token at all

        start = time.perf_counter()
        threads = [threading.Thread(target=student, args=(i,), daemon=True) for i in range(students)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        wall = time.perf_counter() - start
    finally:
        client.close()   # a student still waiting gets an error now, and is counted as not answered
    done = [not_answered() if r is None else r for r in list(results)]
    return class_report(done, [shared for _, shared in prompts], url, model, wall, time_limit)


OUTCOMES = ("answered", "turned away", "failed", "not answered")


def class_report(results: list[dict], shared: list[bool], url: str, model: str, wall_s: float,
                 time_limit: float) -> dict:
    """The class's numbers from each student's result (see :func:`ask`), with this machine's line."""
    from .timing import describe_machine, machine, percentile

    def spread(values: list[float]) -> dict:
        return {f"p{q}": percentile(values, q) if values else None for q in (50, 90, 99)}

    def cached(rows: list[dict]) -> dict:
        rows = [r for r in rows if r["outcome"] == "answered"]
        prompt = sum(r["prompt_tokens"] for r in rows)
        if not rows or not prompt or any(r["cached"] is None for r in rows):   # a server may not report it
            return {"prompt_tokens": prompt, "cached_tokens": None, "share": None}
        hits = sum(r["cached"] for r in rows)
        return {"prompt_tokens": prompt, "cached_tokens": hits, "share": hits / prompt}

    tokens = sum(r["tokens"] for r in results)
    errors = list(dict.fromkeys(r["error"] for r in results if r.get("error")))
    return {
        "url": url, "model": model, "students": len(results), "sharing": sum(shared), "shared_start": SHARED_START,
        **{outcome.replace(" ", "_"): sum(r["outcome"] == outcome for r in results) for outcome in OUTCOMES},
        "errors": errors[:5], "time_limit_s": time_limit, "wall_s": wall_s, "tokens": tokens,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "ttft_s": spread([r["ttft"] for r in results if r["ttft"] is not None]),
        "itl_s": spread([g for r in results for g in r["gaps"]]),
        "cached": cached(results), "sharers_cached": cached([r for r, s in zip(results, shared) if s]),
        "machine": describe_machine(machine()),
        "per_student": [{"shared": s, **{k: r[k] for k in ("outcome", "ttft", "tokens", "prompt_tokens", "cached")}}
                        for r, s in zip(results, shared)],
    }


def format_class(report: dict) -> str:
    """The report of :func:`run_class` as a few lines of text."""
    def ms(seconds):
        return "-" if seconds is None else f"{1e3 * seconds:,.{1 if seconds < 0.01 else 0}f} ms"

    def share(c: dict) -> str:
        if c["share"] is None:
            return "not reported" if c["prompt_tokens"] else "none answered"
        return f"{c['cached_tokens']:,} of {c['prompt_tokens']:,} ({100 * c['share']:.1f} %)"

    r = report
    who = (f"{r['sharing']} continue “{r['shared_start']}” from a character each, the others poem openings from "
           f"the corpus" if r["sharing"] else "each continues a poem opening from the corpus")
    lines = [f"a class of {r['students']} students at {r['url']} (model {r['model']}): {who}",
             f"answered {r['answered']}, turned away {r['turned_away']} (503 after the client's retries), "
             f"failed {r['failed']}, not answered within {r['time_limit_s']:g} s {r['not_answered']}"]
    lines += [f"  error: {e}" for e in r["errors"]]
    rate = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
    lines += [f"wall time {r['wall_s']:.2f} s: {r['tokens']:,} tokens written, {rate} tokens/s",
              "time to first token:  " + ", ".join(f"{q} {ms(v)}" for q, v in r["ttft_s"].items()),
              "inter-token latency:  " + ", ".join(f"{q} {ms(v)}" for q, v in r["itl_s"].items()),
              f"cached prompt tokens: {share(r['cached'])}"
              + (f"; the {r['sharing']} sharing the start: {share(r['sharers_cached'])}" if r["sharing"] else ""),
              r["machine"]]
    return "\n".join(lines)


def add_command(sub) -> None:
    """``python -m kvlib class``: its options, on the command line's subparsers."""
    p = sub.add_parser("class", help="a class of students calling an OpenAI-compatible server at once (openai client)")
    p.add_argument("--students", type=students_option, default=30, help=f"students, 1 to {MAX_STUDENTS}")
    p.add_argument("--url", help="the server's base URL, e.g. http://HOST:8000/v1 (default: start a server on "
                                 "127.0.0.1 for the class, and stop it after)")
    p.add_argument("--api-key", default="unused", help="the key the server asks for, if it asks for one")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=class_command)


def class_command(args) -> None:
    """``python -m kvlib class``'s body: a server started for the class unless ``--url`` names one, the report."""
    from .cli_args import to_json

    try:
        import openai  # noqa: F401
        if args.url is None:
            import fastapi, prometheus_client, uvicorn  # noqa: F401, E401  (what the server started here needs)
    except ImportError as e:
        raise ImportError(f"the class needs the server extra ({e.name} is missing): {SERVER_EXTRA}") from None
    if args.url is not None:
        report = run_class(args.url, args.students, api_key=args.api_key)
    else:
        print("starting python -m kvlib server on 127.0.0.1 for the class (it stops at the end)", file=sys.stderr,
              flush=True)
        with local_server() as url:
            report = run_class(url, args.students, api_key=args.api_key)
    print(to_json(report) if args.json else format_class(report))
