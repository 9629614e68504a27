"""What a KV cache costs in memory, for our model and for real model shapes.

A cache stores one key and one value per layer, key/value head, position and channel::

    bytes = 2 (k, v) x layers x kv_heads x head_dim x dtype_bytes x tokens x batch

Models with grouped-query attention (GQA) share each key/value head among several query heads,
so ``kv_heads`` is smaller than the number of query heads and the cache shrinks by that factor.
Parameter counts are computed from each model's published configuration (the tests pin them to
the published totals), so the weight sizes below follow from the same shapes as the cache sizes.

Sizes use decimal units: 1 MB = 10^6 bytes, 1 GB = 10^9 bytes; KiB (1,024 bytes) only per token.

The picture and the calculator widget built on these numbers are in :mod:`kvlib.notebook.memory_calculator`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import check_int

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1}
MB, GB = 10**6, 10**9


# ---- parameter counts from configurations ---------------------------------------------------

def gpt2_params(n_layer: int, n_embd: int, vocab_size: int = 50257, block_size: int = 1024) -> int:
    """Parameters of a GPT-2-layout model (ours too): tied embeddings, biases, LayerNorm with bias.

    Per block: fused qkv (3C x C + 3C), projection (C x C + C), MLP (4C x C + 4C, C x 4C + C), two
    LayerNorms (2 x 2C): 12 C^2 + 13 C. Plus token and position embeddings and the final LayerNorm.
    """
    for name, value in (("n_layer", n_layer), ("n_embd", n_embd), ("vocab_size", vocab_size),
                        ("block_size", block_size)):
        check_int(name, value, 1)
    block = 12 * n_embd**2 + 13 * n_embd
    return vocab_size * n_embd + block_size * n_embd + n_layer * block + 2 * n_embd


def llama_params(n_layer: int, d_model: int, n_head: int, n_kv_head: int, ffn: int, vocab_size: int, *,
                 head_dim: int | None = None, tied: bool = False, qkv_bias: bool = False) -> int:
    """Parameters of a Llama-layout decoder: RMSNorm (weight only), gated MLP, no biases except
    optional ones on q, k, v (Qwen2), rotary positions (no position table), untied or tied head."""
    for name, value in (("n_layer", n_layer), ("d_model", d_model), ("n_head", n_head), ("n_kv_head", n_kv_head),
                        ("ffn", ffn), ("vocab_size", vocab_size)):
        check_int(name, value, 1)
    if head_dim is not None:
        check_int("head_dim", head_dim, 1)
    head_dim = head_dim or d_model // n_head
    q, kv = n_head * head_dim, n_kv_head * head_dim
    attn = d_model * q + 2 * d_model * kv + q * d_model + (q + 2 * kv if qkv_bias else 0)
    mlp = 3 * d_model * ffn  # gate, up, down
    per_layer = attn + mlp + 2 * d_model  # two RMSNorm weights
    head = 0 if tied else vocab_size * d_model
    return vocab_size * d_model + n_layer * per_layer + d_model + head


# ---- shapes ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """The numbers that decide a model's KV-cache size, and its parameter count for comparison."""

    name: str
    n_layer: int
    n_head: int      # query heads
    n_kv_head: int   # key/value heads; equal to n_head without grouped-query attention
    head_dim: int
    n_params: int
    context: int     # the context length it was trained for

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"ModelShape.name must be a non-empty str, got {self.name!r}")
        for field_name in ("n_layer", "n_head", "n_kv_head", "head_dim", "n_params", "context"):
            check_int(f"ModelShape.{field_name}", getattr(self, field_name), 1)
        if self.n_head % self.n_kv_head:
            raise ValueError(f"ModelShape.n_head ({self.n_head}) must be a multiple of n_kv_head "
                             f"({self.n_kv_head}): each key/value head serves a whole group of query heads")

    @property
    def attention(self) -> str:
        g = self.n_head // self.n_kv_head
        return "MHA" if g == 1 else "MQA" if self.n_kv_head == 1 else f"GQA {g}:1"

    def kv_bytes_per_token(self, dtype: str = "bfloat16") -> int:
        return 2 * self.n_layer * self.n_kv_head * self.head_dim * dtype_bytes(dtype)

    def kv_cache_bytes(self, tokens: int | None = None, batch: int = 1, dtype: str = "bfloat16") -> int:
        tokens = self.context if tokens is None else tokens
        check_int("tokens", tokens, 1)
        check_int("batch", batch, 1)
        return self.kv_bytes_per_token(dtype) * tokens * batch

    def weight_bytes(self, dtype: str = "bfloat16") -> int:
        return self.n_params * dtype_bytes(dtype)

    def crossover_batch(self, tokens: int | None = None, dtype: str = "bfloat16") -> int:
        """The smallest batch whose cache (``tokens`` each) takes more bytes than the weights."""
        per_sequence = self.kv_cache_bytes(tokens, 1, dtype)
        return self.weight_bytes(dtype) // per_sequence + 1


def dtype_bytes(dtype: str) -> int:
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    return DTYPE_BYTES[dtype]


def gpt2_shape(name: str, n_layer: int, n_embd: int, n_head: int) -> ModelShape:
    """A GPT-2-layout model's shape: ``n_head`` heads of ``n_embd / n_head`` channels."""
    check_int("n_head", n_head, 1)
    check_int("n_embd", n_embd, 1)
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head}): the heads split the channels")
    return ModelShape(name, n_layer, n_head, n_head, n_embd // n_head, gpt2_params(n_layer, n_embd), 1024)


def shape_of(name: str, config) -> ModelShape:
    """The shape of one of our models from its ``GPTConfig``: multi-head or grouped-query attention. Its
    parameters are counted on a model of that config built on the meta device (no memory, no random numbers)."""
    from .model import GPT, GPTConfig

    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig (e.g. model.config), got {type(config).__name__}")
    if config.kv_latent:
        raise ValueError(f"shape_of describes caches of key/value heads; this config caches a latent of "
                         f"{config.kv_latent} numbers per layer and position (MLA): its cache holds "
                         f"{config.n_layer} x {config.kv_latent} numbers per token")
    with torch.device("meta"):
        n_params = sum(p.numel() for p in GPT(config).parameters())  # the tied head counted once
    return ModelShape(name, config.n_layer, config.n_head, config.kv_heads, config.head_size, n_params,
                      config.block_size)


SHAPES: dict[str, ModelShape] = {s.name: s for s in [
    gpt2_shape("GPT-2 small", 12, 768, 12),
    gpt2_shape("GPT-2 medium", 24, 1024, 16),
    gpt2_shape("GPT-2 large", 36, 1280, 20),
    gpt2_shape("GPT-2 XL", 48, 1600, 25),
    ModelShape("Llama 2 7B", 32, 32, 32, 128, llama_params(32, 4096, 32, 32, 11008, 32000), 4096),
    ModelShape("Llama 3.2 1B", 16, 32, 8, 64, llama_params(16, 2048, 32, 8, 8192, 128256, tied=True), 131072),
    ModelShape("Llama 3 8B", 32, 32, 8, 128, llama_params(32, 4096, 32, 8, 14336, 128256), 8192),
    ModelShape("Qwen2.5 7B", 28, 28, 4, 128, llama_params(28, 3584, 28, 4, 18944, 152064, qkv_bias=True), 32768),
    ModelShape("Llama 3 70B", 80, 64, 8, 128, llama_params(80, 8192, 64, 8, 28672, 128256), 8192),
]}


# ---- tables and text ------------------------------------------------------------------------

def table_rows(shapes=None, dtype: str = "bfloat16", tokens: int | None = None) -> list[dict]:
    """One dict per model: the cache per token and per full sequence, weights, and the crossover batch."""
    dtype_bytes(dtype)
    if tokens is not None:
        check_int("tokens", tokens, 1)
    shapes = list((SHAPES if shapes is None else shapes).values() if isinstance(shapes, dict | None) else shapes)
    for i, s in enumerate(shapes):
        if not isinstance(s, ModelShape):
            raise TypeError(f"shapes must be ModelShapes (e.g. list(SHAPES.values())), got {type(s).__name__} at {i}")
    rows = []
    for s in shapes:
        n = s.context if tokens is None else tokens
        rows.append({"model": s.name, "attention": s.attention, "layers": s.n_layer,
                     "heads (q/kv)": f"{s.n_head}/{s.n_kv_head}", "head dim": s.head_dim,
                     "params": s.n_params, "weights MB": s.weight_bytes(dtype) / MB,
                     "KiB per token": s.kv_bytes_per_token(dtype) / 1024, "tokens": n,
                     "cache MB": s.kv_cache_bytes(n, 1, dtype) / MB,
                     "cache > weights at batch": s.crossover_batch(n, dtype)})
    return rows


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of :func:`table_rows` (what the notebook prints)."""
    head = (f"{'model':<13} {'attention':<9} {'layers':>6} {'q/kv':>6} {'d':>4} {'params':>14} "
            f"{'weights':>10} {'KiB/token':>9} {'tokens':>7} {'cache/seq':>10} {'batch':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['model']:<13} {r['attention']:<9} {r['layers']:>6} {r['heads (q/kv)']:>6} "
                     f"{r['head dim']:>4} {r['params']:>14,} {_size(r['weights MB'] * MB):>10} "
                     f"{r['KiB per token']:>9,.0f} {r['tokens']:>7,} {_size(r['cache MB'] * MB):>10} "
                     f"{r['cache > weights at batch']:>6,}")
    return "\n".join(lines)


def _size(n_bytes: float) -> str:
    if n_bytes >= GB:
        return f"{n_bytes / GB:,.1f} GB"
    if n_bytes >= MB:
        return f"{n_bytes / MB:,.1f} MB"
    return f"{n_bytes / 1024:,.0f} KiB"


def describe(shape: ModelShape, batch: int = 1, tokens: int | None = None, dtype: str = "bfloat16") -> str:
    """One paragraph: the cache for ``batch`` sequences of ``tokens``, against the weights."""
    if not isinstance(shape, ModelShape):
        raise TypeError(f"shape must be a ModelShape (e.g. SHAPES['GPT-2 small']), got {type(shape).__name__}")
    tokens = shape.context if tokens is None else tokens
    cache, weights = shape.kv_cache_bytes(tokens, batch, dtype), shape.weight_bytes(dtype)
    per_token = shape.kv_bytes_per_token(dtype)
    return (f"{shape.name}, {dtype}, batch {batch:,} x {tokens:,} tokens: KV cache {cache / GB:,.3f} GB "
            f"(2 x {shape.n_layer} layers x {shape.n_kv_head} kv heads x {shape.head_dim} x "
            f"{dtype_bytes(dtype)} bytes = {per_token:,} bytes per token), weights {weights / GB:,.3f} GB, "
            f"together {(cache + weights) / GB:,.3f} GB. The cache is {cache / weights:.2f}x the weights; "
            f"it overtakes them from batch {shape.crossover_batch(tokens, dtype):,}.")


def cat_bytes_copied(bytes_per_token: int, tokens: int) -> int:
    """Bytes a growing cache copies when ``tokens`` positions arrive one at a time: 1 + 2 + ... + n."""
    check_int("bytes_per_token", bytes_per_token, 1)
    check_int("tokens", tokens, 0)
    return bytes_per_token * tokens * (tokens + 1) // 2
