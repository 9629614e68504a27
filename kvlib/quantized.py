"""A quantised KV cache in KIVI's layout: keys per channel, values per token, codes packed into bytes.

Each stored number becomes a ``bits``-bit integer code (2, 4 or 8 bits) inside a group of
``group_size`` numbers that share a scale and a zero point (asymmetric min/max quantisation):
``x ~ zero + code * scale``, with ``zero`` the group's minimum and ``scale = (max - min) / (2**bits - 1)``.

- Keys are grouped along the token axis: one scale and zero point per channel for every
  ``group_size`` consecutive positions. A few key channels are much larger than the rest, so
  grouping by channel keeps each channel's own range.
- Values are grouped along the channel axis: one scale and zero point per position for every
  ``group_size`` channels. A position's value is read as a whole (weighted by its attention), so
  grouping by position keeps each one's error its own.

Keys form a group only once ``group_size`` positions exist, so the newest keys wait in full
precision until their group is complete; values can be quantised one position at a time. On top
of that an optional ``window`` of the most recent positions always stays in full precision. Scales
and zero points are stored as float16 (the zero point rounded down and the scale rounded up, so the
stored range still covers the group and every error is at most half a step); codes are packed
``8 // bits`` to a byte. ``nbytes`` is the size of the tensors that hold the cache.

``write`` appends the new chunk in full precision and returns every position, the older ones
dequantised; ``advance``, after the last layer, moves whatever has left the window into the
quantised store. So a chunk is always attended in full precision in its own forward pass (a prompt
prefilled in one pass is exact, as in KIVI) and read back quantised from the next pass on: to
measure what quantisation costs, feed the tokens one at a time (or in short chunks).
"""
from __future__ import annotations

import torch

from .checks import check_config, check_dtype, check_int, check_tensor
from .cache import (ContextLimitError, PositionsFromLength, check_cache_shape, check_chunk, check_multi_head,
                    check_truncate)
from .model import GPTConfig

__all__ = ["QuantizedKVCache", "QuantizedStore", "quantize", "dequantize", "pack", "unpack",
           "quantized_bytes_per_token", "check_bits"]

BITS = (2, 4, 8)
PARAM_DTYPE = torch.float16  # scales and zero points
PARAM_MAX = torch.finfo(PARAM_DTYPE).max  # 65504: larger values would give an infinite zero point or scale


def check_bits(bits) -> int:
    """Bits per code: 2, 4 or 8 (a whole number of codes fits in a byte)."""
    bits = check_int("bits", bits, allowed="2, 4 or 8")
    if bits not in BITS:
        raise ValueError(f"bits must be 2, 4 or 8, got {bits!r}")
    return bits


def _check_codes(name: str, t) -> None:
    """uint8 codes (or packed bytes), at least one dimension."""
    check_tensor(name, t, "a uint8 tensor with at least one dimension", lambda t: t.dtype == torch.uint8 and t.dim())


def _check_groups(x, dim, group, what: str) -> tuple[int, int]:
    """``dim`` an axis of ``x`` and ``group`` a divisor of its size; returns both (dim made non-negative)."""
    dim = check_int("dim", dim, -x.dim(), x.dim() - 1, f"an axis of {what} in [{-x.dim()}, {x.dim() - 1}]")
    size = x.shape[dim]
    group = check_int("group", group, 1, allowed=f"a positive int that divides {what}'s size {size} along dim {dim}")
    if size % group:
        raise ValueError(f"group must divide {what}'s size {size} along dim {dim}, got {group}")
    return dim % x.dim(), group


def check_quantize(x, bits, dim, group) -> None:
    """What :func:`quantize` takes: a finite floating tensor, 2, 4 or 8 bits, an axis that ``group`` divides."""
    check_tensor("x", x, "a floating tensor with at least one dimension", lambda t: t.is_floating_point() and t.dim())
    check_bits(bits)
    _check_groups(x, dim, group, "x")
    if x.device.type != "meta" and not bool(torch.isfinite(x).all()):
        raise ValueError("x holds NaN or inf; allowed are finite values (a group's range must be finite)")
    check_in_param_range("x", x)


def check_in_param_range(name: str, x: torch.Tensor) -> None:
    """Values a float16 zero point and scale can describe: within ±65504, the largest float16."""
    if x.numel() and x.device.type != "meta" and (big := float(x.abs().max())) > PARAM_MAX:
        raise ValueError(f"{name} holds a value of size {big:.4g}; allowed are values within ±{PARAM_MAX:g} (each "
                         f"group's zero point and scale are stored in float16)")


def check_dequantize(codes, scale, zero, dim, group, dtype) -> None:
    """What :func:`dequantize` takes: codes, and a scale and zero point per group of ``group`` along ``dim``."""
    _check_codes("codes", codes)
    dim, group = _check_groups(codes, dim, group, "codes")
    want = list(codes.shape)
    want[dim] //= group
    for name, t in (("scale", scale), ("zero", zero)):
        check_tensor(name, t, f"a floating tensor of shape {tuple(want)}", torch.is_floating_point)
        if list(t.shape) != want:
            raise ValueError(f"{name} must have shape {tuple(want)} (one per group of {group} codes along dim {dim}), "
                             f"got {tuple(t.shape)}")
    check_dtype(dtype, optional=False)


def check_pack(codes, bits) -> None:
    """What :func:`pack` takes: uint8 codes below ``2**bits``, the last dimension a multiple of ``8 // bits``."""
    _check_codes("codes", codes)
    bits = check_bits(bits)
    if codes.shape[-1] % (8 // bits):
        raise ValueError(f"codes' last dimension must be a multiple of {8 // bits} ({8 // bits} codes of {bits} bits "
                         f"a byte), got {codes.shape[-1]}")
    if codes.numel() and codes.device.type != "meta" and int(codes.max()) >= 2**bits:
        raise ValueError(f"codes must be below 2**bits = {2**bits}, got a code of {int(codes.max())}")


def check_group_size(config: GPTConfig, group_size) -> int:
    """Numbers that share a scale and zero point: a divisor of the head size (values are grouped along channels)."""
    D = config.head_size
    group_size = check_int("group_size", group_size, 1, D, f"a divisor of the head size {D}")
    if D % group_size:
        raise ValueError(f"group_size must be a divisor of the head size {D} (values are grouped along "
                         f"channels), got {group_size!r}")
    return group_size


# ---- pure functions: quantise, dequantise, pack, unpack -------------------------------------------

def _round_to_param(x: torch.Tensor, down: bool) -> torch.Tensor:
    """``x`` in float16, rounded towards -inf (``down``) or +inf, never to the other side of ``x``."""
    p = x.to(PARAM_DTYPE)
    off = p.float() > x if down else p.float() < x
    return torch.where(off, torch.nextafter(p, torch.full_like(p, float("-inf") if down else float("inf"))), p)


def quantize(x: torch.Tensor, bits: int, dim: int, group: int):
    """Codes (uint8, the shape of ``x``), scale and zero (float16) for groups of ``group`` along ``dim``.

    ``scale`` and ``zero`` have the shape of ``x`` with ``dim`` divided by ``group``. Dequantising
    gives ``zero + code * scale``, within ``scale / 2`` of ``x``.
    """
    check_quantize(x, bits, dim, group)
    dim = dim % x.dim()
    levels = 2**bits - 1
    xg = x.float().unflatten(dim, (-1, group))                     # the group's members along dim + 1
    lo, hi = xg.amin(dim + 1, keepdim=True), xg.amax(dim + 1, keepdim=True)
    zero = _round_to_param(lo, down=True)
    scale = _round_to_param((hi - zero.float()) / levels, down=False)
    step = scale.float().clamp_min(torch.finfo(torch.float32).tiny)  # a constant group: every code 0
    codes = ((xg - zero.float()) / step).round_().clamp_(0, levels).to(torch.uint8)
    return codes.flatten(dim, dim + 1), scale.squeeze(dim + 1), zero.squeeze(dim + 1)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dim: int, group: int,
               dtype=torch.float32) -> torch.Tensor:
    """``zero + code * scale`` in ``dtype``, each group of ``group`` codes along ``dim`` with its own pair."""
    check_dequantize(codes, scale, zero, dim, group, dtype)
    dim = dim % codes.dim()
    c = codes.to(dtype).unflatten(dim, (-1, group))
    x = c * scale.to(dtype).unsqueeze(dim + 1) + zero.to(dtype).unsqueeze(dim + 1)
    return x.flatten(dim, dim + 1)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes below ``2**bits`` (uint8, last dim n) -> bytes (uint8, last dim n * bits / 8), first code lowest."""
    check_pack(codes, bits)
    per = 8 // bits
    c = codes.unflatten(-1, (-1, per))                             # (..., n / per, per)
    out = c[..., 0].clone()
    for i in range(1, per):
        out |= c[..., i] << (bits * i)
    return out


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of :func:`pack`: bytes (..., m) -> codes (..., m * 8 / bits)."""
    _check_codes("packed", packed)
    bits = check_bits(bits)
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    codes = (packed.unsqueeze(-1) >> shifts) & (2**bits - 1)       # (..., m, 8 / bits)
    return codes.flatten(-2)


# ---- sizes -------------------------------------------------------------------------------------

def quantized_bytes_per_token(config: GPTConfig, bits: int, group_size: int) -> float:
    """Bytes one quantised position takes, the full-precision window and the unfinished key group left out.

    Per layer and key/value head: keys and values ``bits / 8`` bytes a channel each, plus float16 scale and
    zero point (4 bytes) per channel every ``group_size`` positions (keys) and per position every
    ``group_size`` channels (values).
    """
    check_config(config, GPTConfig)
    check_multi_head(config, "QuantizedKVCache", grouped_ok=True)
    bits = check_bits(bits)
    group_size = check_group_size(config, group_size)
    param = 2 * torch.empty(0, dtype=PARAM_DTYPE).element_size()   # scale + zero point
    per_channel = 2 * bits / 8 + 2 * param / group_size              # keys and values
    return config.n_layer * config.kv_heads * config.head_size * per_channel


# ---- one layer's keys or values ------------------------------------------------------------------

class QuantizedStore:
    """One layer's keys (or values), (B, H, positions, D): a quantised prefix, then a full-precision rest.

    Codes are grouped by ``group`` along ``dim`` (2: positions, for keys; 3: channels, for values)
    and move into the quantised prefix ``step`` positions at a time (``group`` for keys, 1 for values),
    once they are older than the newest ``window`` positions.
    """

    def __init__(self, bits: int, group: int, dim: int, window: int):
        bits = check_bits(bits)
        dim = check_int("dim", dim, 2, 3, "2 (keys, grouped along positions) or 3 (values, along channels)")
        group = check_int("group", group, 1)
        window = check_int("window", window, 0)
        self.bits, self.group, self.dim, self.window = bits, group, dim, window
        self.step = group if dim == 2 else 1
        self.codes = self.scale = self.zero = self.residual = None  # made on the first append

    @property
    def quantized(self) -> int:
        return 0 if self.codes is None else self.codes.shape[2]

    @property
    def length(self) -> int:
        return 0 if self.residual is None else self.quantized + self.residual.shape[2]

    def _start(self, x: torch.Tensor) -> None:
        B, H, _, D = x.shape
        self.codes = torch.empty(B, H, 0, D * self.bits // 8, dtype=torch.uint8, device=x.device)
        shape = (B, H, 0, D if self.dim == 2 else D // self.group)
        self.scale = torch.empty(shape, dtype=PARAM_DTYPE, device=x.device)
        self.zero = torch.empty(shape, dtype=PARAM_DTYPE, device=x.device)
        self.residual = x[:, :, :0].clone()

    def check_append(self, x, name: str = "x") -> None:
        """``x`` (B, H, T, D) fits the store: finite floats, the shape, dtype and device of what it holds."""
        check_in_param_range(name, check_chunk(name, x, (None,) * 4))
        if self.residual is not None:
            B, H, _, D = self.residual.shape
            check_chunk(name, x, (B, H, None, D), self.residual)
            return
        D = x.shape[3]
        if (D * self.bits) % 8 or (self.dim == 3 and D % self.group):
            rule = f"a multiple of {8 // self.bits}" + (f" and of group={self.group}" if self.dim == 3 else "")
            raise ValueError(f"{name}'s last dimension D must be {rule}, got {D}")

    def append(self, x: torch.Tensor) -> None:
        """Add positions (B, H, T, D) to the full-precision rest."""
        self.check_append(x)
        if self.residual is None:
            self._start(x)
        self.residual = torch.cat([self.residual, x], dim=2)       # (B, H, R, D)

    def flush(self) -> None:
        """Quantise the whole steps of the rest that have left the window."""
        n = max(0, self.residual.shape[2] - self.window) // self.step * self.step if self.residual is not None else 0
        if n:
            codes, scale, zero = quantize(self.residual[:, :, :n], self.bits, self.dim, self.group)
            self.codes = torch.cat([self.codes, pack(codes, self.bits)], dim=2)
            self.scale = torch.cat([self.scale, scale], dim=2)
            self.zero = torch.cat([self.zero, zero], dim=2)
            self.residual = self.residual[:, :, n:].clone()        # a copy: the quantised part is freed

    def _dequantized(self, start: int, end: int) -> torch.Tensor:
        """Positions [start, end) of the quantised prefix (both multiples of ``step``), as floats."""
        s = slice(start // self.step, end // self.step)
        codes = unpack(self.codes[:, :, start:end], self.bits)     # (B, H, end - start, D)
        return dequantize(codes, self.scale[:, :, s], self.zero[:, :, s], self.dim, self.group,
                          self.residual.dtype)

    def read(self) -> torch.Tensor:
        """Every position, (B, H, length, D): the dequantised prefix, then the full-precision rest."""
        if self.residual is None:
            raise RuntimeError("read: the store is empty (nothing appended yet), so it has no shape to return")
        return torch.cat([self._dequantized(0, self.quantized), self.residual], dim=2)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions. Positions already quantised stay as they were read."""
        n = check_truncate(self, n)
        if self.residual is None:
            return
        q = self.quantized
        if n >= q:
            self.residual = self.residual[:, :, : n - q].clone()
            return
        keep = n // self.step * self.step                          # whole groups stay quantised
        partial = self._dequantized(keep, keep + self.step) if n > keep else self.residual
        self.residual = partial[:, :, : n - keep].clone()          # the cut group's first positions, as read
        s = keep // self.step
        self.codes = self.codes[:, :, :keep].clone()
        self.scale, self.zero = self.scale[:, :, :s].clone(), self.zero[:, :, :s].clone()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.codes, self.scale, self.zero, self.residual) if t is not None)


# ---- the cache -----------------------------------------------------------------------------------

class QuantizedKVCache(PositionsFromLength):
    """A KV cache that stores keys and values as ``bits``-bit codes (see the module docstring).

    Per layer, ``keys[layer]`` and ``values[layer]`` are :class:`QuantizedStore`.

    Implements :class:`kvlib.model.Cache`, so ``model(idx, cache=QuantizedKVCache(cfg, 1, bits=4))``
    runs the model on it. ``window`` recent positions stay in full precision (0: none beyond the
    unfinished key group); ``group_size`` numbers share a scale and zero point and must divide the
    head size. ``window = max_len`` keeps everything exact.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int | None = None, *, bits: int = 4,
                 group_size: int = 16, window: int = 0):
        check_config(config, GPTConfig)
        check_multi_head(config, "QuantizedKVCache", grouped_ok=True)  # per head: any number of key/value heads
        self.batch_size, self.max_len = check_cache_shape(config, batch_size, max_len)
        self.bits = check_bits(bits)
        self.group_size = check_group_size(config, group_size)
        self.window = check_int("window", window, 0, self.max_len,
                                f"an int in [0, max_len={self.max_len}] (recent positions kept in full precision)")
        self.config = config
        self.keys = [QuantizedStore(self.bits, group_size, 2, window) for _ in range(config.n_layer)]
        self.values = [QuantizedStore(self.bits, group_size, 3, window) for _ in range(config.n_layer)]
        self.length = 0

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append a chunk (B, H, T, D) in full precision; return every position, (B, H, S, D), the older dequantised."""
        self.check_write(layer, k, v)
        keys, values = self.keys[layer], self.values[layer]
        if keys.length != self.length:  # a forward pass that stopped half way wrote this layer only
            keys.truncate(self.length)
            values.truncate(self.length)
        keys.append(k)
        values.append(v)
        return keys.read(), values.read()

    def check_write(self, layer, k, v) -> None:
        """``layer`` in [0, L), k and v finite (B, H, T, D) chunks that fit the cache's room."""
        check_int("layer", layer, 0, self.config.n_layer - 1)
        shape = (self.batch_size, self.config.kv_heads, None, self.config.head_size)
        like = next((s.residual for s in self.keys if s.residual is not None), None)
        check_in_param_range("k", check_chunk("k", k, shape, like))
        check_in_param_range("v", check_chunk("v", v, (*shape[:2], k.shape[2], shape[3]), like))
        if self.length + k.shape[2] > self.max_len:
            raise ContextLimitError.cache_full(k.shape[2], self.length, self.max_len)

    def advance(self, n: int) -> None:
        """``n`` positions were written to every layer: count them, then quantise what left the window."""
        n = check_int("n", n, 0)
        held = {store.length for store in self.keys}
        if held != {self.length + n}:
            raise ValueError(f"advance(n) comes after writing n new positions to every layer; n = {n!r}, "
                             f"but the layers hold {sorted(held)} after {self.length}")
        self.length += n
        for store in self.keys + self.values:
            store.flush()

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions (already quantised ones stay quantised)."""
        n = check_truncate(self, n)
        for store in self.keys + self.values:
            store.truncate(n)
        self.length = n

    def reset(self) -> None:
        self.truncate(0)

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor the cache holds: packed codes, float16 scales and zero points, the float window."""
        return sum(store.nbytes for store in self.keys + self.values)

    @property
    def bytes_per_token(self) -> float:
        """``nbytes`` per stored position of one sequence (0.0 when empty)."""
        return self.nbytes / (self.batch_size * self.length) if self.length else 0.0
