"""The fast decode path: the teaching GPT's arithmetic, rearranged for a few new tokens at a time.

``model.py`` is written to be read. ``FastDecoder`` computes the same numbers (logits within 1e-4,
the same greedy tokens: ``tests/test_fast.py`` checks it like ``verify_cache`` does) with far less
overhead per token. At batch 1 a decode step is small matrix-vector products, and the time goes as
much to calling operators as to arithmetic, so the changes are about doing fewer, cheaper calls:

- activations are 2-D, (rows, C), so every linear layer is one ``addmm`` (bias included) against a
  weight stored pre-transposed as (in, out): a single row times an (in, out) matrix is much faster
  than ``F.linear`` against the (out, in) layout of ``nn.Linear``;
- the two residual projections (attention out, MLP out) carry their bias as an extra weight row
  that meets a constant 1 appended to their input, so "x + y @ W + b" is a single in-place
  ``x.addmm_(y1, W1)``;
- exact GELU is computed as u (1 + erf(u)) with u = a / sqrt(2): two cheap calls instead of the
  slower GELU kernel, the two factors 1/sqrt(2) folded into the MLP's weights;
- the cache's keys and values are the two halves of one buffer, so one ``index_copy_`` per layer
  writes both;
- the head multiplies a few rows by a (C, V) copy of the tied embedding; four rows or more (a
  batch, a long verify pass) go through oneDNN's product against its own blocked copy, where
  PyTorch has oneDNN (:func:`head_logits`). On the CPUs measured, MKL's product of several rows by
  the wide head cost close to one row's time per row, and oneDNN's grew more slowly, but cost more
  for one to three rows (``python -m kvlib serve`` prints how the products grow on yours);
- every buffer and view a step touches is made once: at construction for one token a row, on
  first use for T tokens a row.

Only short steps are rewritten: one new token a row when decoding, a few (T <= 16) when
speculative decoding checks a round of guesses (notebook 8, :meth:`FastDecoder.extend`) or a short
prompt is prefilled. A step of T tokens is the one-token step on T rows a sequence, with the
bottom-right causal mask of notebook 4 (an additive one, 0 or -inf, sliced from one table).
Everything else (longer prompts, padded batches, explicit positions) runs the teaching model's own
``GPT.forward`` over the decoder's cache buffer, so the forward pass is written once and the step
is tested against it. :class:`PagedStep`, the paged cache's step, takes prefills too: rows there
start at different lengths anyway, and it uses ``GPT.forward``'s own mask.

The step reads copies of the weights in its own layout (:class:`StepWeights`, about 11 MB for the
char model, a few ms to build). They are built once per state of the model and shared by every
decoder made from it: :func:`step_weights` rebuilds them when any parameter was replaced or changed
in place (training, ``load_state_dict``), which it sees from the parameters' version counters.
A decoder keeps the weights it was built with; ``generate`` builds a new decoder on every call.
"""
from __future__ import annotations

import functools
import math
import threading
import weakref

import torch
import torch.nn.functional as F

from .checks import check_int, check_model
from .cache import ContextLimitError, check_cache_shape, check_multi_head
from .guards import one_thread_at_a_time
from .model import GPT, KVCache, attention_mask
from .weights import weights_key

__all__ = ["FastDecoder", "MAX_STEP_TOKENS", "PagedStep", "StepWeights", "additive_mask", "head_logits", "run_blocks",
           "step_weights"]

SQRT_HALF = math.sqrt(0.5)
MAX_STEP_TOKENS = 16  # longer chunks (a prompt) go through GPT.forward
BLOCKED_HEAD_ROWS = 4  # from this many rows on, the head's product goes through oneDNN (see head_logits)


def _copy(*params: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(p.clone() for p in params)


def _transposed(weight: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``scale`` x the (out, in) weight of an ``nn.Linear``, stored contiguous as (in, out)."""
    w = weight.t().contiguous()  # a blocked transpose
    return w if scale == 1.0 else w.mul_(scale)


def _with_bias_row(linear, scale: float = 1.0) -> torch.Tensor:
    """(in + 1, out): ``scale`` x the transposed weight, then the bias as the last row."""
    out_features, in_features = linear.weight.shape
    w1 = torch.empty(in_features + 1, out_features, dtype=linear.weight.dtype, device=linear.weight.device)
    w, b = w1.split(in_features)  # views: (in, out) and (1, out)
    w.copy_(linear.weight.t())    # a blocked transpose, unlike torch.cat of a transposed view
    if scale != 1.0:
        w.mul_(scale)
    b.copy_(linear.bias)
    return w1


def _blocked(weight: torch.Tensor) -> torch.Tensor | None:
    """An (out, in) weight reordered into oneDNN's blocked layout, if this PyTorch has oneDNN for it."""
    if (weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available()
            or not hasattr(torch.ops.mkldnn, "_linear_pointwise")):  # a private op of PyTorch's CPU builds
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def head_logits(h: torch.Tensor, w: "StepWeights") -> torch.Tensor:
    """(R, V) logits of the final-normalised rows ``h`` (R, C): up to three rows by the plain product,
    more by oneDNN's against the blocked head (the same numbers within float rounding)."""
    if h.shape[0] >= BLOCKED_HEAD_ROWS and w.head_blocked is not None:
        return torch.ops.mkldnn._linear_pointwise(h, w.head_blocked, None, "none", [], "")
    return torch.mm(h, w.head)


class _LayerWeights:
    """One block's weights in the decoder's layout (see the module docstring); built in inference mode."""

    __slots__ = ("ln_1", "w_qkv", "b_qkv", "w_proj1", "ln_2", "w_fc", "b_fc", "w_out1")

    def __init__(self, block):
        attn, mlp = block.attn, block.mlp
        self.ln_1 = _copy(block.ln_1.weight, block.ln_1.bias)
        self.w_qkv, self.b_qkv = _transposed(attn.c_attn.weight), attn.c_attn.bias.clone()  # (C, 3C), (3C,)
        self.w_proj1 = _with_bias_row(attn.c_proj)                                       # (C + 1, C)
        self.ln_2 = _copy(block.ln_2.weight, block.ln_2.bias)
        # The MLP computes u = a / sqrt(2) for its pre-activation a, then g = u (1 + erf(u)), which
        # is sqrt(2) GELU(a). The 1/sqrt(2) on either side goes into the weights.
        self.w_fc, self.b_fc = _transposed(mlp.c_fc.weight, SQRT_HALF), mlp.c_fc.bias * SQRT_HALF  # (C, 4C)
        self.w_out1 = _with_bias_row(mlp.c_proj, scale=SQRT_HALF)                        # (4C + 1, C)


class StepWeights:
    """Every weight the one-token step reads, in its layout; built in inference mode, never changed."""

    @torch.inference_mode()
    def __init__(self, model: GPT):
        t = model.transformer
        self.head = _transposed(t.wte.weight)                        # (C, V): the tied head
        self.wte = self.head.t()                                     # (V, C): a view of it, for the inputs
        self.head_blocked = _blocked(t.wte.weight)                   # (V, C) in oneDNN's layout, or None
        self.wpe = t.wpe.weight.clone()                              # (block_size, C)
        self.ln_f = _copy(t.ln_f.weight, t.ln_f.bias)
        self.eps = t.ln_f.eps  # every LayerNorm of the model has the default eps
        self.layers = [_LayerWeights(block) for block in t.h]


_built: "weakref.WeakKeyDictionary[GPT, tuple[tuple, StepWeights]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def step_weights(model: GPT) -> StepWeights:
    """The model's :class:`StepWeights`, rebuilt only when a weight is new or was written to
    (:func:`kvlib.weights.weights_key`)."""
    state = weights_key(model)
    with _lock:
        hit = _built.get(model)
        if hit is None or hit[0] != state:
            hit = (state, StepWeights(model))
            _built[model] = hit
        return hit[1]


def in_inference_mode(method):
    """Run ``method`` under ``torch.inference_mode()``, entering it only when the caller has not (a step
    is a few hundred µs, and entering the mode again costs a few of them)."""
    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return method(*args, **kwargs)
        with torch.inference_mode():
            return method(*args, **kwargs)

    return wrapped


class FastDecoder:
    """A decoder with its own cache: ``dec(idx, key_mask=None, position_ids=None) -> (B, V)``.

    The same contract as ``decoding.CachedDecoder``: ``idx`` (B, T) holds the new tokens, their keys
    and values are appended to the cache, and the logits of the last position come back.
    ``key_mask`` (B, cached + T) marks real keys (True) and left padding; ``position_ids`` (B, T)
    overrides the positions, which otherwise continue from ``cache.length``.

    Up to ``MAX_STEP_TOKENS`` new tokens per row without a mask or explicit positions (unpadded
    decoding, a short prompt) take the lean step; anything else (longer prompts, padded batches)
    runs ``GPT.forward`` over the same cache.
    :meth:`extend` appends a few tokens per row with the lean step and returns the logits after
    each of them (speculative decoding's verify pass). Each call returns a new logits tensor; the
    decoder's other buffers are reused.
    """

    @torch.inference_mode()
    def __init__(self, model: GPT, batch_size: int, max_len: int | None = None):
        check_model(model)
        cfg = model.config
        check_multi_head(cfg, "FastDecoder", "decode it with decoder='model'")
        check_cache_shape(cfg, batch_size, cfg.block_size)  # its cache may grow to the block, at any max_len
        probe = KVCache(cfg, batch_size, max_len, device="meta")  # checks batch_size and max_len, allocates nothing
        B = batch_size
        weight = model.transformer.wte.weight
        like = dict(device=weight.device, dtype=weight.dtype)
        self.model, self.config, self.batch_size, self.max_len = model, cfg, B, probe.max_len

        # Keys and values in one (2, L, B, H, max_len, D) buffer; the KVCache is built around its two halves.
        self.kv = torch.zeros((2,) + tuple(probe.k.shape), **like)
        self.cache = KVCache(cfg, B, self.max_len, buffers=(self.kv[0], self.kv[1]))
        self._kv = self.kv.unbind(1)                                 # per layer: (2, B, H, max_len, D)

        self.weights = w = step_weights(model)
        self.head, self.wte, self.wpe, self.ln_f, self.eps, self.layers = w.head, w.wte, w.wpe, w.ln_f, w.eps, w.layers
        self.positions = torch.arange(self.max_len, device=like["device"])  # slices of it index the cache

        self._buffers = {1: _StepBuffers(B, 1, cfg, like)}         # per T: the step's buffers
        self._causal = None                                          # (max_len, max_len), on first T > 1

    @one_thread_at_a_time
    @in_inference_mode
    def __call__(self, idx: torch.Tensor, key_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The logits after the new tokens ``idx`` (B, V). A call that raises leaves the cache as it was."""
        T = self._check(idx)
        if T <= MAX_STEP_TOKENS and key_mask is None and position_ids is None:
            return self._step(idx, every=False)
        if T == 1 and key_mask is not None and position_ids is not None and self._padded_ok(key_mask, position_ids):
            return self._step(idx, every=False, key_mask=key_mask, position_ids=position_ids)
        logits, _ = self.model(idx, cache=self.cache, key_mask=key_mask, position_ids=position_ids, last_only=True)
        return logits[:, -1]  # (B, V)

    def _padded_ok(self, key_mask, position_ids) -> bool:
        """A padded batch's decode step (what ``generate`` sends) goes the lean way; anything odd goes to
        ``GPT.forward``, which checks it and says what is wrong."""
        B, S = self.batch_size, self.cache.length + 1
        return (isinstance(key_mask, torch.Tensor) and key_mask.dtype == torch.bool and key_mask.shape == (B, S)
                and isinstance(position_ids, torch.Tensor) and position_ids.shape == (B, 1)
                and position_ids.dtype in (torch.long, torch.int) and key_mask.device == self.kv.device
                and position_ids.device == self.kv.device
                and 0 <= int(position_ids.min()) and int(position_ids.max()) < self.config.block_size)

    @one_thread_at_a_time
    @in_inference_mode
    def extend(self, idx: torch.Tensor) -> torch.Tensor:
        """Append ``idx`` (B, T) to the cache in one pass; (B, T, V): the logits after every new token.

        The lean step for T <= ``MAX_STEP_TOKENS``, ``GPT.forward`` for longer chunks.
        """
        T = self._check(idx)
        if T <= MAX_STEP_TOKENS:
            return self._step(idx, every=True).view(self.batch_size, T, -1)
        return self.model(idx, cache=self.cache)[0]

    def _check(self, idx: torch.Tensor) -> int:
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.long, torch.int):
            got = f"a {idx.dtype} tensor of shape {tuple(idx.shape)}" if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise TypeError(f"idx must be an integer tensor of token ids with shape (B, T), got {got}")
        B, T = idx.shape
        if T == 0:
            raise ValueError(f"idx must hold at least one new token per row, got shape {tuple(idx.shape)}")
        V = self.config.vocab_size
        lo, hi = (int(v) for v in idx.aminmax())
        if lo < 0 or hi >= V:
            raise ValueError(f"idx holds token ids {lo}..{hi}; allowed are ids in [0, {V}) (the model's vocabulary)")
        if idx.device != self.kv.device:
            raise ValueError(f"idx is on {idx.device} but the decoder's cache is on {self.kv.device}")
        start = self.cache.length
        if B != self.batch_size:
            raise ValueError(f"idx has {B} rows but the decoder was built for batch_size={self.batch_size}")
        if start + T > self.max_len:
            raise ContextLimitError.cache_full(T, start, self.max_len, "idx")
        return T

    def step_mask(self, pos: int, T: int) -> torch.Tensor | None:
        """(T, pos + T) additive causal mask: new token i sees the cached keys and new tokens 0 … i."""
        if T == 1:
            return None  # one new token sees every key
        if self._causal is None:
            L = self.max_len
            self._causal = torch.zeros(L, L, dtype=self._buffers[1].x.dtype).masked_fill_(
                ~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))  # row p: query at position p
        # SDPA's fused kernel takes an additive mask; a boolean one sends it down a slower path.
        return self._causal.narrow(0, pos, T).narrow(1, 0, pos + T)

    def _step(self, idx: torch.Tensor, every: bool, key_mask: torch.Tensor | None = None,
              position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """T new tokens per row after the cached ones; (B, V) logits of the last, or (B * T, V) of every one.

        Unpadded rows (no ``key_mask``) continue from ``cache.length``: for T = 1, 10 + 11 per layer
        ATen calls (54 for 4). A padded batch's decode step (T = 1) takes each row's own position
        from ``position_ids`` (B, 1) and hides its padding with ``key_mask`` (B, length + 1).
        """
        B, T = idx.shape
        pos = self.cache.length
        buf = self._buffers.get(T)
        if buf is None:
            buf = self._buffers[T] = _StepBuffers(B, T, self.config, dict(device=self.kv.device, dtype=self.kv.dtype))
        at = self.positions.narrow(0, pos, T)                        # (T,): the new tokens' cache slots
        if key_mask is None:
            mask, where = self.step_mask(pos, T), self.wpe.narrow(0, pos, T)   # (T, C): positions shared by all rows
        else:
            mask, where = additive_mask(key_mask, self.kv.dtype), F.embedding(position_ids, self.wpe)  # (B, 1, 1, S), (B, 1, C)
        torch.add(F.embedding(idx, self.wte), where, out=buf.x3)
        keys = self.cache.k.narrow(3, 0, pos + T).unbind(0)          # per layer: (B, H, S, D)
        values = self.cache.v.narrow(3, 0, pos + T).unbind(0)

        def attend(layer: int) -> torch.Tensor:
            self._kv[layer].index_copy_(3, at, buf.new_kv)           # these tokens' keys and values, one copy
            return F.scaled_dot_product_attention(buf.q, keys[layer], values[layer], attn_mask=mask)

        x = run_blocks(self.layers, buf, self.eps, attend)
        self.cache.advance(T)
        last = x if every or T == 1 else buf.x3[:, -1]               # (B * T, C) or (B, C)
        return head_logits(torch.layer_norm(last, x.shape[1:], *self.ln_f, self.eps), self.weights)


def additive_mask(key_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, 1, S): 0 where ``key_mask`` (B, S) is True, -inf where it hides a key.

    SDPA's fused kernel takes an additive mask; a boolean one sends it down a slower path.
    """
    B, S = key_mask.shape
    return torch.zeros(B, 1, 1, S, dtype=dtype, device=key_mask.device).masked_fill_(
        ~key_mask.view(B, 1, 1, S), float("-inf"))


def run_blocks(layers: list, buf: "_StepBuffers", eps: float, attend) -> torch.Tensor:
    """Every transformer block on the residual stream ``buf.x`` (R, C), in place; returns it.

    ``attend(layer)`` stores the layer's new keys and values (in ``buf.qkv``) wherever its cache
    keeps them and returns the attention output (B, H, T, D) over all of a row's keys: the one
    place where the fast decoder's cache and the paged cache differ.
    """
    x, qkv, y, y1, u, erf, g, g1 = buf.x, buf.qkv, buf.y, buf.y1, buf.u, buf.erf, buf.g, buf.g1
    shape = x.shape[1:]
    # torch.layer_norm is what F.layer_norm calls, minus a Python wrapper (a microsecond a call).
    for i, w in enumerate(layers):
        torch.addmm(w.b_qkv, torch.layer_norm(x, shape, *w.ln_1, eps), w.w_qkv, out=qkv)
        y.copy_(attend(i))
        x.addmm_(y1, w.w_proj1)                                      # x += y @ W + b
        torch.addmm(w.b_fc, torch.layer_norm(x, shape, *w.ln_2, eps), w.w_fc, out=u)
        torch.addcmul(u, u, torch.erf(u, out=erf), out=g)            # g = u (1 + erf(u))
        x.addmm_(g1, w.w_out1)                                       # x += g @ W + b
    return x


class _StepBuffers:
    """The buffers of a step of T new tokens for each of B rows, as (B * T)-row matrices and their views.

    ``y1`` and ``g1`` end in a column of ones (the bias inputs of the residual projections).
    """

    def __init__(self, B: int, T: int, cfg, like: dict):
        R, C, H, D = B * T, cfg.n_embd, cfg.n_head, cfg.head_size
        self.x = torch.empty(R, C, **like)                           # the residual stream
        self.x3 = self.x.view(B, T, C)
        self.qkv = torch.empty(R, 3 * C, **like)
        qkv = self.qkv.view(B, T, 3, H, D)
        self.q = qkv[:, :, 0].transpose(1, 2)                        # (B, H, T, D)
        self.new_kv = qkv[:, :, 1:].permute(2, 0, 3, 1, 4)           # (2, B, H, T, D)
        self.new_kv_rows = qkv.view(R, 3, H, D)[:, 1:]               # (B * T, 2, H, D): as a paged pool keeps them
        self.y1 = torch.ones(R, C + 1, **like)
        self.y = self.y1[:, :C].view(B, T, H, D).transpose(1, 2)     # (B, H, T, D): attention's output
        self.u = torch.empty(R, 4 * C, **like)                       # MLP pre-activation / sqrt(2)
        self.erf = torch.empty(R, 4 * C, **like)
        self.g1 = torch.ones(R, 4 * C + 1, **like)
        self.g = self.g1[:, :4 * C]


class PagedStep:
    """The lean step for rows of different lengths whose keys live in a paged pool.

    ``step(model, kv_pool, idx, position_ids, read_slots, key_mask, new_rows, write_slots) -> (B, V)``:
    ``idx`` and ``position_ids`` (B, T) hold each row's new tokens, left-padded; the pool's keys and
    values, (L, slots, 2, H, D), are :class:`kvlib.paged.KVPool`'s. Row ``b`` attends to the slots
    ``read_slots[b]`` (S of them, right-aligned, its new tokens last; ``key_mask`` hides the columns
    left of its own). The real new tokens are the rows ``new_rows`` of the (B * T) new ones (None
    when T = 1: all of them), and their keys and values go to ``write_slots``. The logits of each
    row's last token come back. The same arithmetic as :class:`FastDecoder`'s step
    (:func:`run_blocks`), with ``GPT.forward``'s mask (:func:`kvlib.model.attention_mask`) when
    T > 1; only where keys are kept differs. Like the teaching path it gathers each row's keys and
    values into one tensor per layer (one ``index_select``: a slot keeps them side by side); a
    paged-attention kernel would read them from the pool in place. Decode buffers are kept per
    batch size; one caller at a time (the paged cache that owns it).
    """

    def __init__(self):
        self._buffers: dict[tuple, _StepBuffers] = {}

    @torch.inference_mode()
    def __call__(self, model: GPT, kv_pool: torch.Tensor, idx: torch.Tensor, position_ids: torch.Tensor,
                 read_slots: torch.Tensor, key_mask: torch.Tensor | None, new_rows: torch.Tensor | None,
                 write_slots: torch.Tensor) -> torch.Tensor:
        w, cfg = step_weights(model), model.config
        (B, T), S, (H, D) = idx.shape, read_slots.shape[1], kv_pool.shape[3:]
        like = dict(device=kv_pool.device, dtype=kv_pool.dtype)
        if T == 1:  # a decode step: the same shapes step after step
            buf = self._buffers.get((B, kv_pool.dtype, kv_pool.device))
            if buf is None:
                buf = self._buffers[(B, kv_pool.dtype, kv_pool.device)] = _StepBuffers(B, 1, cfg, like)
            mask = None if key_mask is None else additive_mask(key_mask, kv_pool.dtype)  # (B, 1, 1, S)
        else:       # a prefill: shapes vary, so nothing is kept
            buf = _StepBuffers(B, T, cfg, like)
            allowed = attention_mask(T, S, key_mask, kv_pool.device)  # (B or 1, 1, T, S), bool
            mask = torch.zeros(allowed.shape, **like).masked_fill_(~allowed, float("-inf"))
        read = read_slots.flatten()                                  # (B * S,)
        torch.add(F.embedding(idx, w.wte), F.embedding(position_ids, w.wpe), out=buf.x3)

        def attend(layer: int) -> torch.Tensor:
            pool, new = kv_pool[layer], buf.new_kv_rows             # (slots, 2, H, D), (B * T, 2, H, D)
            pool.index_copy_(0, write_slots, new if new_rows is None else new.index_select(0, new_rows))
            k, v = pool.index_select(0, read).view(B, S, 2, H, D).permute(2, 0, 3, 1, 4)  # (B, H, S, D) each
            return F.scaled_dot_product_attention(buf.q, k, v, attn_mask=mask)

        run_blocks(w.layers, buf, w.eps, attend)
        last = buf.x3[:, -1]                                         # (B, C): each row's last token
        return head_logits(torch.layer_norm(last, last.shape[1:], *w.ln_f, w.eps), w)  # (B, V)
