"""``python -m kvlib shrink``: every way of shrinking the cache, its memory and its cost in quality, in one table.

One run decodes the same validation texts through each cache (or converted model) and compares the
next-token distributions with the full cache's (:mod:`kvlib.quality`). Nothing here is a timing:
bytes are counted and the quality numbers are the same on every machine.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field

import torch

from ..checks import check_int, check_seed, check_text
from ..tokenizer import check_pair, check_tokenizer, decode_complete
from ..model import GPT, GPTConfig, KVCache, check_gpt
from ..compress import grouped, latent
from ..decoding import cache_decoder, generate
from ..poems import encode_prompt, no_unk
from ..evict import HeavyHitterCache, SinkCache, SlidingWindowCache
from ..quality import cache_cost, stepwise_logits
from ..quantized import QuantizedKVCache
from . import corpus
from .loading import load_pretrained
from .training import SMALLER_CACHES, windows

MAX_TEXTS = 256   # validation texts per table, at most
MIN_LENGTH = 16   # tokens per text, at least: the 2-bit row keeps its last 16 in float32
MAX_LENGTH = 1024  # tokens per text, at most (past every shipped block)

# What the papers report, set beside our rows (their models, their tasks: the direction, not the numbers).
PAPERS = {
    "quantised": "KIVI (Liu et al. 2024): 2-bit keys per channel and values per token, both from its error "
                 "analysis, a full-precision recent window; 2.6x less peak memory at comparable quality",
    "evicted": "StreamingLLM (Xiao et al. 2024): a few first 'sink' positions plus a recent window keep language "
               "modelling stable where the window alone fails; H2O (Zhang et al. 2023), SnapKV (Li et al. 2024): "
               "keep the keys attention uses most",
    "fewer heads": "GQA (Ainslie et al. 2023): heads mean-pooled from a multi-head checkpoint, then about 5 % "
                   "uptraining, near multi-head quality",
    "latent": "DeepSeek-V2 (2024): multi-head latent attention, 576 numbers a token and layer where full multi-head "
              "attention with its 128 heads of 128 would keep 32,768, about 98 % fewer (its 93.3 % is against "
              "DeepSeek 67B, which already shares key/value heads)",
}


@dataclass
class Setting:
    """One row: a family, its setting, and how to get the model and the cache it decodes through."""
    family: str
    name: str
    cache: type | None = None             # decode token by token through cache(config, B, T, **options)
    options: dict = field(default_factory=dict)
    model: str | None = None              # a converted model: "pooled:2", "latent:16" or a shipped name
    short: str = ""                       # its name in the figure ("" for the reference, which is not plotted)

    @property
    def label(self) -> str:
        return f"{self.family}: {self.name}"


def settings(length: int) -> list[Setting]:
    """Every row of the table, for texts of ``length`` tokens (eviction keeps half of them)."""
    check_length(length)
    half = length // 2
    return [
        Setting("full cache", "float32", KVCache),
        Setting("quantised", "8-bit", QuantizedKVCache, {"bits": 8}, short="8-bit"),
        Setting("quantised", "4-bit", QuantizedKVCache, {"bits": 4}, short="4-bit"),
        Setting("quantised", "2-bit", QuantizedKVCache, {"bits": 2}, short="2-bit"),
        Setting("quantised", "2-bit, last 16 in float32", QuantizedKVCache, {"bits": 2, "window": 16},
                short="2-bit + float32 window"),
        Setting("evicted", f"window of {half}", SlidingWindowCache, {"window": half}, short="window"),
        Setting("evicted", f"4 sinks + window of {half - 4}", SinkCache, {"sinks": 4, "window": half - 4},
                short="sinks + window"),
        Setting("evicted", f"H2O: {half} kept, {half // 2} recent", HeavyHitterCache,
                {"budget": half, "recent": half // 2}, short="H2O"),
        Setting("fewer heads", "GQA, 2 heads, pooled", model="pooled:2", short="GQA, pooled"),
        Setting("fewer heads", "GQA, 2 heads, pooled + 200 steps", model="tang-char-gqa2", short="GQA, trained"),
        Setting("fewer heads", "MQA, 1 head, pooled", model="pooled:1", short="MQA, pooled"),
        Setting("fewer heads", "MQA, 1 head, pooled + 200 steps", model="tang-char-mqa", short="MQA, trained"),
        Setting("latent", "r = 16, SVD", model="latent:16", short="MLA, SVD"),
        Setting("latent", "r = 16, SVD + 200 steps", model="tang-char-mla", short="MLA, trained"),
    ]


def check_length(length, block_size: int | None = None) -> int:
    """Tokens per text: at least ``MIN_LENGTH``, at most the model's block."""
    top = "" if block_size is None else f", {block_size}"
    return check_int("length", length, MIN_LENGTH, block_size,
                     f"an int in [{MIN_LENGTH}{top or ', block_size'}] (tokens per text)")


def check_spec(spec) -> tuple[str, int | None]:
    """``pooled:n`` or ``latent:r`` with n, r whole numbers >= 1, or the name of a shipped smaller cache."""
    check_text(spec, "spec")
    kind, colon, n = spec.partition(":")
    if spec in SMALLER_CACHES:
        return spec, None
    if kind in ("pooled", "latent") and colon and n.isascii() and n.isdigit() and len(n) <= 6 and int(n) >= 1:
        return kind, int(n)
    raise ValueError(f"spec must be 'pooled:n', 'latent:r' (whole numbers >= 1) or one of {list(SMALLER_CACHES)}, "
                     f"got {spec!r:.60}")


def converted(base: GPT, spec: str) -> GPT:
    """The model a row decodes with: ``pooled:n``, ``latent:r`` (converted now) or a shipped name."""
    check_gpt(base)
    kind, n = check_spec(spec)
    if kind == "pooled":
        return grouped(base, n)
    if kind == "latent":
        return latent(base, n)
    return load_pretrained(spec)[0]


def written(model: GPT, tokenizer, setting: Setting, prompt: str, n_new: int, *, temperature: float = 0.0,
            seed: int = 0) -> str:
    """``prompt`` and the ``n_new`` tokens written after it through ``setting``'s cache (or by its converted model):
    greedy at temperature 0, else sampled with ``seed``; never ``<unk>``, and without stopping at a poem's end."""
    check_pair(model, tokenizer)
    check_gpt(model)
    if not isinstance(setting, Setting):
        raise TypeError(f"setting must be one of shrink_bench.settings(length), got {type(setting).__name__}")
    idx = torch.tensor([encode_prompt(tokenizer, check_text(prompt, "prompt"))])
    n_new = check_int("n_new", n_new, 1, model.config.block_size - idx.shape[1] + 1)
    writer = model if setting.model is None else converted(model, setting.model)
    decoder = "model" if setting.cache is None else cache_decoder(setting.cache, **setting.options)
    out = generate(writer, idx, n_new, temperature=temperature, generator=torch.Generator().manual_seed(check_seed(seed)),
                   logits_hook=no_unk(tokenizer), decoder=decoder)
    return prompt + decode_complete(tokenizer, out.new_tokens[0])


@torch.no_grad()
def texts(tokenizer, n_texts: int = 50, length: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_texts`` windows of the validation split (inputs and next tokens, (n_texts, length) each)."""
    check_tokenizer(tokenizer)
    n_texts = check_int("n_texts", n_texts, 1, MAX_TEXTS)
    length = check_length(length, MAX_LENGTH)
    _, val = corpus.split(corpus.load_poems())
    ids = torch.tensor(tokenizer.encode_corpus(val[: 8 * n_texts]), dtype=torch.long)
    x, y = windows(ids, length)
    if len(x) < n_texts:
        raise ValueError(f"the validation poems give {len(x)} windows of {length} tokens, fewer than n_texts={n_texts}")
    return x[:n_texts], y[:n_texts]


@torch.inference_mode()
def shrink_table(model: GPT, tokenizer, n_texts: int = 50, length: int = 32) -> dict:
    """Every setting's bytes per token (measured ``nbytes`` after the texts), memory cut, nats per
    token, KL against the full cache and top-1 agreement, on the same ``n_texts`` texts."""
    check_pair(model, tokenizer)
    check_gpt(model)
    check_length(length, model.config.block_size)
    x, y = texts(tokenizer, n_texts, length)
    if tokenizer.kind != "char" or model.config != GPTConfig(vocab_size=tokenizer.vocab_size):
        raise ValueError(f"model: shrink_table measures tang-char (the model its converted and retrained rows come "
                         f"from), got a {tokenizer.kind} model of {model.config}")
    B, T = x.shape
    reference = model(x)[0]  # one pass equals decoding through the full cache (tests/test_quality.py)
    full_bytes = KVCache(model.config, 1).bytes_per_token
    rows = []
    for s in settings(length):
        if s.cache is KVCache:  # the reference itself: nothing to decode again
            logits, stored = reference, full_bytes
        elif s.model is None:
            cache = s.cache(model.config, B, T, **s.options)
            logits = stepwise_logits(model, x, cache)
            stored = cache.nbytes / (B * T)
        else:
            m = converted(model, s.model)
            logits = m(x)[0]  # a converted model's cached decoding equals its one pass (tests/test_compress.py)
            stored = m.new_cache(1).bytes_per_token
        rows.append({"family": s.family, "setting": s.name, "label": s.label, "short": s.short, "bytes_per_token": stored,
                     "memory_cut": 1 - stored / full_bytes, **cache_cost(reference, logits, y)})
    return {"texts": B, "length": T, "full_bytes_per_token": full_bytes, "rows": rows, "papers": PAPERS,
            "config": asdict(model.config)}  # the model measured: a view must show the same one


ROW_NUMBERS = ("bytes_per_token", "memory_cut", "nats_per_token", "kl", "top1_agreement")


def check_table(table) -> dict:
    """What :func:`shrink_table` returns: texts, length, the full cache's bytes and rows of finite numbers."""
    what = "table must be what kvlib.tools.shrink_bench.shrink_table returns"
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list) or not table["rows"]:
        raise TypeError(f"{what} (a dict with a non-empty list of rows), got {table!r:.60}")
    check_int("table['texts']", table.get("texts"), 1)
    check_int("table['length']", table.get("length"), MIN_LENGTH)
    _check_number("table['full_bytes_per_token']", table.get("full_bytes_per_token"))
    if not isinstance(table.get("config"), dict):
        raise TypeError(f"{what}: table['config'] must be the measured model's config as a dict, got "
                        f"{table.get('config')!r:.60}")
    for i, row in enumerate(table["rows"]):
        if not isinstance(row, dict) or not isinstance(row.get("label"), str):
            raise TypeError(f"{what}: table['rows'][{i}] must be a dict with a str label, got {row!r:.60}")
        for key in ROW_NUMBERS:
            _check_number(f"table['rows'][{i}][{key!r}]", row.get(key))
    return table


def _check_number(name: str, x) -> None:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a finite number, got {x!r:.40}")
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number, got {x!r}")


def format_table(table: dict) -> str:
    check_table(table)
    lines = [f"{table['texts']} validation texts of {table['length']} tokens, decoded through each cache one "
             f"token at a time; the full cache holds {table['full_bytes_per_token']:,} bytes a token",
             f"{'':46} {'bytes/token':>11} {'cut':>6} {'nats/token':>10} {'KL':>8} {'top-1 same':>10}"]
    for r in table["rows"]:
        lines.append(f"{r['label']:46} {r['bytes_per_token']:11,.0f} {100 * r['memory_cut']:5.1f}% "
                     f"{r['nats_per_token']:10.3f} {r['kl']:8.4f} {100 * r['top1_agreement']:9.1f}%")
    return "\n".join(lines)
