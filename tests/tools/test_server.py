"""The HTTP server, called as a class would call it: a real server process on 127.0.0.1 and the official
``openai`` client (plain HTTP where the client would hide what is checked, such as a 503 or a disconnect)."""
from __future__ import annotations

import concurrent.futures
import re
import socket
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("fastapi", reason="the server extra (FastAPI, uvicorn, prometheus-client) is not installed")
openai = pytest.importorskip("openai", reason="the openai client (the server extra) is not installed")
httpx = pytest.importorskip("httpx", reason="httpx comes with the openai client")

from kvlib.decoding import generate  # noqa: E402
from kvlib.poems import encode_prompt, no_unk  # noqa: E402
from kvlib.verify import greedy_agreement  # noqa: E402

MAX_IN_FLIGHT = 16
QUATRAIN = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"   # 25 tokens with the separator: one full block of 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvlib", "server", "--port", str(port),
                             "--max-in-flight", str(MAX_IN_FLIGHT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            pytest.fail(f"the server exited: {proc.stdout.read()}")
        time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("the server did not answer /health within 90 s")
    yield base
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def metric(base: str, name: str, labels: str = "") -> float:
    text = httpx.get(f"{base}/metrics", timeout=5).text
    any_labels = r"(?:\{[^}]*\})?"   # without labels given: every series of the metric, summed
    found = re.findall(rf"^{re.escape(name)}{re.escape(labels) if labels else any_labels}\s+(\S+)$", text, re.M)
    return sum(float(v) for v in found)


def settled(base: str, timeout: float = 10.0) -> bool:
    """Nothing running or waiting, and no block in use, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (metric(base, "kvlib:num_requests_running") == metric(base, "kvlib:num_requests_waiting") == 0
                and metric(base, "kvlib:kv_cache_usage_perc") == 0):
            return True
        time.sleep(0.1)
    return False


def test_streamed_text_equals_the_whole_answer(client):
    whole = client.completions.create(model="tang-char", prompt="床前明月光，", max_tokens=40, temperature=0)
    stream = client.completions.create(model="tang-char", prompt="床前明月光，", max_tokens=40, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in stream:
        text += "".join(c.text for c in chunk.choices)
        usage = chunk.usage or usage
    assert text == whole.choices[0].text and usage.completion_tokens == whole.usage.completion_tokens


def test_greedy_over_http_writes_what_generate_writes(client, shipped_char):
    model, tok = shipped_char
    for start in ("床前明月光，", "春风", "大漠孤烟直，"):
        got = client.completions.create(model="tang-char", prompt=start, max_tokens=48, temperature=0)
        prompt = encode_prompt(tok, start)
        want = generate(model, torch.tensor([prompt]), 48, temperature=0.0, eos_id=tok.eos_id,
                        logits_hook=no_unk(tok)).new_tokens[0].tolist()
        want = want[: want.index(tok.eos_id) + 1] if tok.eos_id in want else want
        written = tok.encode(got.choices[0].text) + ([tok.eos_id] if got.choices[0].finish_reason == "stop" else [])
        agreement = greedy_agreement(model, torch.tensor(prompt), torch.tensor(written), torch.tensor(want))
        assert agreement != "differ", (start, got.choices[0].text, tok.decode(want))


def test_the_same_seed_writes_the_same_text_and_another_seed_another(client):
    def sample(seed):
        return client.completions.create(model="tang-char", prompt="春风", max_tokens=32, temperature=1.0,
                                         seed=seed, extra_body={"ignore_eos": True}).choices[0].text
    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def test_usage_adds_up_and_a_shared_couplet_is_found_in_the_pool(client):
    first = client.completions.create(model="tang-char", prompt=QUATRAIN, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
    second = client.completions.create(model="tang-char", prompt=QUATRAIN, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    for r in (first, second):
        assert r.usage.prompt_tokens == len(QUATRAIN) + 1 and r.usage.completion_tokens == 8
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= 16  # at least one block of 16


def test_n_choices_share_the_prompts_blocks(client):
    """The first choice is prefilled alone; the others find the prompt's full block in the pool."""
    quatrain = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"   # not asked for before in this server's life
    r = client.completions.create(model="tang-char", prompt=quatrain, n=3, max_tokens=6, temperature=1.0, seed=5,
                                  extra_body={"ignore_eos": True})
    assert len(r.choices) == 3 and len({c.text for c in r.choices}) > 1          # three seeds, three texts
    assert r.usage.completion_tokens == 18 and r.usage.prompt_tokens_details.cached_tokens >= 16


def test_a_bad_parameter_gets_an_openai_400_and_the_server_goes_on(client):
    for bad, param in ((dict(temperature=3), "temperature"), (dict(max_tokens=0), "max_tokens"),
                       (dict(prompt="hello"), "prompt"), (dict(logprobs=50), "logprobs"),
                       (dict(logit_bias={"5": 3}), "logit_bias"), (dict(n=0), "n")):
        settings = dict(model="tang-char", prompt="春风", max_tokens=4) | bad
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(**settings)
        error = info.value.body
        assert error["param"] == param and error["type"] == "invalid_request_error" and param in error["message"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="春风", max_tokens=4)
    assert client.completions.create(model="tang-char", prompt="春风", max_tokens=4).choices[0].text


def test_logprobs_and_banned_tokens(client, shipped_char):
    _, tok = shipped_char
    r = client.completions.create(model="tang-char", prompt="床前明月", max_tokens=6, temperature=0, logprobs=5,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 6 and all(len(top) >= 5 for top in lp.top_logprobs)
    assert lp.tokens[0] == max(lp.top_logprobs[0], key=lp.top_logprobs[0].get)  # greedy: the most likely
    first = tok.encode(r.choices[0].text[0])[0]
    banned = client.completions.create(model="tang-char", prompt="床前明月", max_tokens=6, temperature=0,
                                       logit_bias={str(first): -100})
    assert not banned.choices[0].text.startswith(r.choices[0].text[0])


def test_a_client_that_goes_away_mid_stream_frees_its_blocks(server):
    body = {"model": "tang-char", "prompt": "春风", "max_tokens": 120, "temperature": 1.0, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        for i, _ in enumerate(response.iter_lines()):
            if i == 3:
                break   # leaving the block closes the connection mid-answer
    assert settled(server)   # nothing running, every block back in the pool
    assert metric(server, "kvlib:request_success_total", '{finished_reason="abort"}') >= 1


def test_64_concurrent_streams_are_answered_or_turned_away_and_nothing_leaks(server):
    before = {k: metric(server, f"kvlib:request_{k}_total") for k in ("success", "rejected")}
    body = {"model": "tang-char", "prompt": "春风", "max_tokens": 24, "temperature": 0.8, "stream": True}

    def call(i):
        with httpx.stream("POST", f"{server}/v1/completions", json=body | {"seed": i}, timeout=60) as r:
            text = "".join(r.iter_lines())
            return r.status_code, text, r.headers.get("retry-after")

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(call, range(64)))
    assert time.monotonic() - start < 120
    codes = [code for code, _, _ in results]
    assert set(codes) <= {200, 503} and codes.count(200) >= MAX_IN_FLIGHT // 2
    assert all(text.rstrip().endswith("[DONE]") for code, text, _ in results if code == 200)
    assert all(after == "1" for code, _, after in results if code == 503)
    assert settled(server)
    assert metric(server, "kvlib:request_success_total") - before["success"] == codes.count(200)
    assert metric(server, "kvlib:request_rejected_total") - before["rejected"] == codes.count(503)


def test_models_health_tokenize_and_detokenize(server, shipped_char):
    _, tok = shipped_char
    assert httpx.get(f"{server}/health").status_code == 200
    assert [m["id"] for m in httpx.get(f"{server}/v1/models").json()["data"]] == ["tang-char"]
    ids = httpx.post(f"{server}/tokenize", json={"prompt": "床前"}).json()["tokens"]
    assert ids == encode_prompt(tok, "床前")
    assert httpx.post(f"{server}/detokenize", json={"tokens": ids[1:]}).json()["prompt"] == "床前"
    bad = httpx.post(f"{server}/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
