"""Shared fixtures: seeded random models (fast, always available) and the two shipped models.

The shipped fixtures load ``data/tang-char.pt`` and ``data/tang-bpe.pt`` through
:func:`kvlib.tools.loading.load_pretrained`, which checks their sha256 against ``data/MANIFEST.json``;
a missing or damaged checkpoint makes the tests that use them fail (not skip) with that message.
"""
from __future__ import annotations

import pytest
import torch

from kvlib.tools import integrity
from kvlib.model import GPT, GPTConfig
from kvlib.tools.loading import load_pretrained
from kvlib.tools.loading import load_tokenizer

# The models under test are tiny: one thread is fastest, and on a machine whose cores are busy (training
# jobs, a parallel CI) a second thread that waits for a core makes every forward pass ~100x slower.
torch.set_num_threads(1)

SHIPPED_SHAPE = GPTConfig(vocab_size=7184)  # the char model: block 128, 4 layers, 4 heads, 128 channels
TINY_SHAPE = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)


def seeded_gpt(config: GPTConfig, seed: int = 0) -> GPT:
    """A GPT with weights drawn from ``seed``, leaving the global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(config)
    return model.eval()


@pytest.fixture(scope="session")
def random_gpt() -> GPT:
    """Untrained, seeded, in the shipped char model's shape."""
    return seeded_gpt(SHIPPED_SHAPE)


@pytest.fixture(scope="session")
def tiny_gpt() -> GPT:
    """Untrained, seeded, 64 ids and a 16-token block: for loops that run many times."""
    return seeded_gpt(TINY_SHAPE)


@pytest.fixture(scope="session")
def tiny_char_tokenizer():
    """A character tokenizer of 64 ids (the size of ``tiny_gpt``'s vocabulary) over common poem characters."""
    from kvlib.tokenizer import CharTokenizer

    chars = list(dict.fromkeys("春风白日依山尽黄河入海流床前明月光疑是地上霜举头望低思故乡，。花落知多少夜来雨声"
                               "处鸟啼眠不觉晓天人云水中千万里秋江寒雪孤舟松石"))
    assert len(chars) >= 62
    return CharTokenizer(["\n", "<unk>", *chars[:62]])


@pytest.fixture(scope="session")
def shipped_char():
    """(model, tokenizer) of the shipped character model."""
    return load_pretrained("tang-char")


@pytest.fixture(scope="session")
def shipped_bpe():
    """(model, tokenizer) of the shipped byte-level BPE model."""
    return load_pretrained("tang-bpe")


@pytest.fixture(scope="session")
def bpe_tokenizer():
    """The shipped BPE tokenizer alone (sha256-checked), for tests that need no model."""
    return load_tokenizer(integrity.verified_path("tang-bpe.tokenizer.json", integrity.DATA_DIR))


# ---- the browser test's latency figures, at the end of the run -------------------------------------------

_SESSION_START = [0.0]


def pytest_collection_modifyitems(items):
    """The tests marked ``slow`` first (in their order): spread over parallel workers, a long test then
    starts early instead of running alone at the end while the other workers wait."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_sessionstart(session):
    import time

    _SESSION_START[0] = time.time()


def pytest_terminal_summary(terminalreporter):
    """Print the medians tests/test_browser.py measured in this run (a figure, never an assertion)."""
    import json
    import statistics
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "artifacts" / "browser"
    path = folder / "latency.json"
    if path.exists() and path.stat().st_mtime >= _SESSION_START[0]:
        terminalreporter.section("browser latency: key press or click until the output changed")
        for what, ms in json.loads(path.read_text(encoding="utf-8")).items():
            terminalreporter.write_line(f"{what:52s} median {statistics.median(ms):5.0f} ms "
                                        f"({len(ms)} times, {min(ms):.0f}-{max(ms):.0f})")
    path = folder / "sizes.json"
    if path.exists() and path.stat().st_mtime >= _SESSION_START[0]:
        terminalreporter.section("browser sizes: presenting at 1280x720, widgets in narrow windows (px)")
        for what, sizes in json.loads(path.read_text(encoding="utf-8")).items():
            terminalreporter.write_line(f"{what}: " + ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}"
                                                                for k, v in sizes.items()))
