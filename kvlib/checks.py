"""Input checks at the public edges, kept apart so that the functions learners read hold only the idea.

Every check is named ``check_<what>``, raises one exception whose message names the parameter, the
value received and what is allowed, and returns the value in the form the caller goes on with.
Deeper code trusts what passed here.
"""
from __future__ import annotations

import math
import numbers

import torch


class ContextLimitError(ValueError):
    """More positions than the model's block (or a cache) holds: crop the input or ask for fewer tokens.

    Its two messages are written once, here: :meth:`cache_full` before a forward pass that would not
    fit, :meth:`block_full` when generation stops at the block's end.
    """

    @classmethod
    def cache_full(cls, new: int, cached: int, room: int, name: str = "") -> "ContextLimitError":
        return cls(f"{name + ': ' if name else ''}{new} new token(s) after {cached} cached ones need {cached + new} "
                   f"positions; the cache holds {room}")

    @classmethod
    def block_full(cls, prompt: int, new: int, block: int) -> "ContextLimitError":
        budget = block - prompt + 1  # the last new token is never fed back
        return cls(f"{prompt} prompt tokens + {new} new ones need {prompt + new} tokens; the block holds {block} "
                   f"positions, so at most {budget} new tokens fit")


# ---- numbers -----------------------------------------------------------------------------------

def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None,
              allowed: str | None = None) -> int:
    """An int (not a bool) in ``[minimum, maximum]``; ``allowed`` words the rule for the message."""
    if type(value) is int and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return value  # the common case, without building the message (hot paths check every step)
    if allowed is None:
        if minimum is not None and maximum is not None:
            allowed = f"an int in [{minimum}, {maximum}]"
        elif minimum == 1:
            allowed = "a positive int"
        elif minimum is not None:
            allowed = f"an int >= {minimum}"
        else:
            allowed = "an int" if maximum is None else f"an int <= {maximum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


SEED_MAX = 2**64 - 1  # what torch.Generator.manual_seed takes


def check_seed(seed, name: str = "seed") -> int:
    """A seed for ``torch.Generator().manual_seed``: an int in [0, 2**64 - 1]."""
    return check_int(name, seed, 0, SEED_MAX, "an int in [0, 2**64 - 1]")


def check_choice(name: str, value, choices) -> object:
    """One of ``choices`` exactly (7.0 is not 7, True is not 1)."""
    if not any(type(value) is type(c) and value == c for c in choices):
        shown = [repr(c) for c in choices]
        shown = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
        raise (TypeError if all(type(value) is not type(c) for c in choices) else ValueError)(
            f"{name} must be {shown}, got {value!r}")
    return value


def check_text(text, name: str = "text") -> str:
    """A str of valid Unicode: no lone surrogates (what bytes that were not UTF-8 turn into)."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} is not valid Unicode text: {text[e.start]!a} at index {e.start} is a lone "
                         f"surrogate (bytes that were not UTF-8?); allowed is text that encodes as UTF-8") from None
    return text


def check_token_ids(ids, vocab_size: int, name: str = "ids") -> list[int]:
    """Token ids as a list of ints in [0, vocab_size): a list, tuple, range or 1-D integer tensor."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() > 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"{name} must be a 1-D integer tensor or a list of ints, got {_describe(ids)}")
        ids = ids.tolist() if ids.dim() else [ids.item()]
    elif hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):  # a numpy array
        ids = ids.tolist()
        ids = ids if isinstance(ids, list) else [ids]
    elif isinstance(ids, (str, bytes, dict, set, frozenset)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{name} must be a list of token ids (ints), got {type(ids).__name__}"
                        + (" (a set has no order)" if isinstance(ids, (set, frozenset)) else ""))
    else:
        ids = list(ids)                                                # a tuple, range, generator, ...
    if _plain_ids(ids, vocab_size):
        return list(ids)  # the common case; the loop below names the first bad entry
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"{name}[{i}] must be an int token id in [0, {vocab_size}), got {t!r}")
        if not 0 <= t < vocab_size:
            raise ValueError(f"{name}[{i}] = {t!r} is not a token id: allowed are ints in [0, {vocab_size})")
    return [int(t) for t in ids]


def check_token_lists(prompts, pad_id) -> list[list[int]]:
    """A non-empty list of non-empty token-id lists (ints >= 0), and a pad id (an int >= 0)."""
    check_int("pad_id", pad_id, 0)
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, (list, tuple)) or not prompts:
        got = _describe(prompts) if isinstance(prompts, torch.Tensor) else f"{prompts!r:.60}"
        raise (ValueError if isinstance(prompts, (list, tuple)) else TypeError)(
            f"prompts must be a non-empty list of token-id lists, got {got}")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, torch.Tensor):
            if p.dim() != 1 or p.is_floating_point() or p.dtype == torch.bool:
                raise TypeError(f"prompt {i} must be a list of int token ids (or a 1-D integer tensor), "
                                f"got {_describe(p)}")
            p = p.tolist()
        if isinstance(p, (str, bytes)) or not isinstance(p, (list, tuple)):
            raise TypeError(f"prompt {i} must be a list of int token ids, got {p!r:.60}")
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: every row needs at least one token")
        for j, t in enumerate(p):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise TypeError(f"prompt {i}, token {j} must be an int token id, got {t!r}")
            if t < 0 or t >= 2**63:
                raise ValueError(f"prompt {i}, token {j} must be a token id (an int >= 0), got {t!r}")
        out.append([int(t) for t in p])
    return out


def check_model(model) -> None:
    """A kvlib GPT (anything with a GPTConfig as ``config`` that can be called on token ids)."""
    config = getattr(model, "config", None)
    if not callable(model) or not all(hasattr(config, a) for a in ("vocab_size", "block_size", "n_layer")):
        raise TypeError(f"model must be a kvlib GPT (e.g. from load_pretrained), got {type(model).__name__}")


def check_tokenizer(tokenizer) -> None:
    """A kvlib tokenizer: CharTokenizer or ByteBPETokenizer (encode, decode, token_bytes, vocab_size)."""
    if not all(hasattr(tokenizer, a) for a in ("encode", "decode", "token_bytes", "vocab_size", "eos_id")):
        raise TypeError(f"tokenizer must be a kvlib tokenizer (CharTokenizer or ByteBPETokenizer), "
                        f"got {type(tokenizer).__name__}")


def check_pair(model, tokenizer) -> None:
    """A tokenizer and a model that belong together: the same number of ids."""
    check_model(model)
    check_tokenizer(tokenizer)
    v = tokenizer.vocab_size
    if v != model.config.vocab_size:
        raise ValueError(f"the tokenizer ({getattr(tokenizer, 'kind', '?')}, {v} ids) does not belong to the "
                         f"model ({model.config.vocab_size} ids): load both with load_pretrained(name)")


def check_config(config, cls) -> None:
    """A model configuration of class ``cls`` (a GPTConfig), not a dict or a number."""
    if not isinstance(config, cls):
        hint = f" (use {cls.__name__}(**d) for a dict)" if isinstance(config, dict) else ""
        raise TypeError(f"config must be a {cls.__name__}, got {type(config).__name__}{hint}")


def check_generator(generator) -> torch.Generator | None:
    """A sampling loop draws from ``generator`` (a ``torch.Generator``), or from the global RNG if None."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return generator


# ---- tensors -----------------------------------------------------------------------------------

def check_logits(logits, name: str = "logits") -> torch.Tensor:
    """A floating (B, V) tensor with no NaN, no +inf, and at least one finite entry per row."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, V), got {type(logits).__name__}")
    if logits.dim() != 2:
        hint = " (for a single row use logits[None, :])" if logits.dim() == 1 else ""
        raise ValueError(f"{name} must have shape (B, V), got shape {tuple(logits.shape)}{hint}")
    if logits.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one vocabulary entry, got V = 0")
    if not logits.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {logits.dtype}")
    # A -inf entry (a banned token) is fine, but NaN, +inf, or a row with nothing left to sample
    # cannot be turned into probabilities. One pass finds all three: a row's maximum is NaN if
    # the row holds a NaN, +inf if it holds +inf, and -inf if every entry is -inf; the lowest and
    # highest of the rows' maxima show any of them (NaN comes out of both). Two calls: this runs
    # on every step of a decoder.
    maxima = logits.amax(dim=-1)                                           # (B,)
    if maxima.numel() and not all(map(math.isfinite, maxima.aminmax())):
        row = int((~torch.isfinite(maxima)).nonzero()[0, 0])
        raise ValueError(f"{name} row {row} cannot be sampled: it contains NaN or +inf, or every "
                         f"entry is -inf; allowed are finite values and -inf for banned tokens")
    return logits


def _describe(x) -> str:
    return f"a {x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def check_cache_made_for(config, cache) -> None:
    """A cache made for a model of ``config``: its own config if it keeps one, else (a ``KVCache``, which keeps
    (L, B, H, max_len, D) tensors) its tensors' layers, heads and sizes."""
    made_for = getattr(cache, "config", None)
    if made_for is not None:
        same = made_for == config
    else:
        k, v = getattr(cache, "k", None), getattr(cache, "v", None)
        same = not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == v.dim() == 5) or (
            (*k.shape[::2], v.shape[-1]) == (config.n_layer, *config.cache_shape))
    if not same:
        raise ValueError(f"the cache was made for another configuration than the model's {config}: build it from "
                         f"model.config (or with model.new_cache)")


def check_forward_inputs(config, idx, cache, key_mask, position_ids, targets, last_only) -> None:
    """What ``GPT.forward`` needs: token ids (B, T), room in the cache and the block, matching masks."""
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.long, torch.int):
        raise TypeError(f"idx must be an integer tensor of token ids with shape (B, T), got {_describe(idx)}")
    B, T = idx.shape
    if idx.numel():
        lo, hi = (int(v) for v in idx.aminmax())
        if lo < 0 or hi >= config.vocab_size:
            raise ValueError(f"idx holds token ids {lo}..{hi}; allowed are ids in [0, {config.vocab_size}) "
                             f"(the model's vocabulary; is the tokenizer the model's own?)")
    for name, t in (("key_mask", key_mask), ("position_ids", position_ids), ("targets", targets)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if cache is not None:
        check_cache_made_for(config, cache)
        if cache.batch_size != B:
            raise ValueError(f"the cache holds {cache.batch_size} sequence(s) but idx has {B} row(s)")
        written = getattr(cache, "position", None)  # a cache that drops positions numbers the next one itself
        if position_ids is None and written is not None and written != cache.length:
            raise ValueError(f"this cache keeps {cache.length} of the {written} positions written, so the new tokens "
                             f"start at position {written}, not {cache.length}: pass position_ids="
                             f"cache.next_positions(T) (kvlib.evict.forward_with_cache does)")
    start = cache.length if cache is not None else 0
    S = start + T
    if cache is not None and S > cache.max_len:
        raise ContextLimitError.cache_full(T, start, cache.max_len)
    if position_ids is None and S > config.block_size:
        raise ContextLimitError(
            f"position {S - 1} is past the block size {config.block_size}: crop the input "
            f"to the last {config.block_size} tokens")
    if position_ids is not None and position_ids.numel() and int(position_ids.max()) >= config.block_size:
        raise ContextLimitError(
            f"position_ids hold position id {int(position_ids.max())}, past the block size {config.block_size}")
    if key_mask is not None and key_mask.shape != (B, S):
        raise ValueError(f"key_mask must have shape (B, cached + new) = {(B, S)}, got {tuple(key_mask.shape)}")
    if position_ids is not None and (position_ids.dim() != 2 or position_ids.shape[1] != T
                                     or position_ids.shape[0] not in (1, B) or position_ids.is_floating_point()):
        raise ValueError(f"position_ids must be an integer tensor of shape (B, T) = {(B, T)} or (1, T), got "
                         f"{_describe(position_ids)}")
    if position_ids is not None and position_ids.numel() and int(position_ids.min()) < 0:
        raise ValueError(f"position_ids must be >= 0 (position ids count from 0), got {int(position_ids.min())}")
    if targets is not None and last_only:
        raise ValueError("targets need the logits of every position: pass last_only=False to compute a loss")
    if targets is not None:
        if targets.shape != idx.shape or targets.dtype != torch.long:
            raise ValueError(f"targets must be an int64 tensor of the shape of idx {(B, T)}, got {_describe(targets)}")
        if targets.numel():
            lo, hi = (int(v) for v in targets.aminmax())
            if lo < -1 or hi >= config.vocab_size:
                raise ValueError(f"targets hold ids {lo}..{hi}; allowed are ids in [0, {config.vocab_size}) "
                                 f"and -1 (ignored)")


def check_prompt(idx, key_mask, max_new_tokens, vocab_size: int | None) -> torch.Tensor | None:
    """Token ids (B, T) int64 in the vocabulary, and an optional key mask of the same shape; returns the mask as bool."""
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
        raise TypeError(f"idx must be an int64 tensor of shape (B, T); use pad_prompts for a list of prompts; "
                        f"got {_describe(idx)}")
    if idx.shape[0] == 0 or idx.shape[1] == 0:
        raise ValueError(f"idx must hold at least one token in at least one row, got shape {tuple(idx.shape)}")
    check_int("max_new_tokens", max_new_tokens, 0)
    if int(idx.min()) < 0 or (vocab_size is not None and int(idx.max()) >= vocab_size):
        top = "" if vocab_size is None else f", {vocab_size}"
        hint = "" if vocab_size is None else " (the model's vocabulary: were the ids made by another model's tokenizer?)"
        raise ValueError(f"idx: token ids must lie in [0{top}), got {int(idx.min())}..{int(idx.max())}{hint}")
    if key_mask is None:
        return None
    if not isinstance(key_mask, torch.Tensor) or key_mask.shape != idx.shape:
        got = tuple(key_mask.shape) if isinstance(key_mask, torch.Tensor) else type(key_mask).__name__
        raise ValueError(f"key_mask must have the shape of idx {tuple(idx.shape)}, got {got}")
    if key_mask.dtype != torch.bool:
        if key_mask.is_complex() or not bool(((key_mask == 0) | (key_mask == 1)).all()):
            raise ValueError(f"key_mask must hold only True/False (or 1/0), got {_describe(key_mask)} "
                             f"with other values")
        key_mask = key_mask.bool()
    if int(key_mask.sum(-1).min()) == 0:
        raise ValueError("every row of key_mask needs at least one real token")
    # Left padding: in each row the padding (False) comes first, then only real tokens (True).
    bad = (key_mask[:, :-1] & ~key_mask[:, 1:]).any(-1)                  # a real token followed by padding
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"key_mask row {row} is {key_mask[row].int().tolist()!r:.80}: padding after a real "
                         f"token (right padding); the decoding loop reads each row's last column, so pad on "
                         f"the left (pad_prompts does)")
    return key_mask


def check_batch_inputs(model, prompts, steps) -> None:
    """``check_batch_consistency``: token-id lists that fit the block, and steps >= 1."""
    check_model(model)
    prompts = check_token_lists(prompts, 0)
    block = model.config.block_size
    longest = max(len(p) for p in prompts)
    if longest > block:
        raise ContextLimitError(f"prompt {max(range(len(prompts)), key=lambda i: len(prompts[i]))} has {longest} "
                                f"tokens but the model's block holds {block}")
    check_int("steps", steps, 1, block - longest + 1,
              f"an int in [1, {block - longest + 1}] for a longest prompt of {longest} tokens and block size {block}")
    for i, p in enumerate(prompts):
        if max(p) >= model.config.vocab_size:
            raise ValueError(f"prompt {i} holds token id {max(p)}, outside the vocabulary [0, {model.config.vocab_size})")


# ---- more edges: flags, finite numbers, lists, keys, dtypes ---------------------------------------

def check_bool(name: str, value) -> bool:
    """True or False exactly (1, "yes" and None are not flags)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r:.60}")
    return value


def check_real(name: str, value, minimum: float | None = None, maximum: float | None = None, *,
               open_min: bool = False, open_max: bool = False, allowed: str | None = None) -> float:
    """A finite real number (not a bool) in the given range; ``open_*`` leave an end out."""
    if allowed is None:
        lo = "" if minimum is None else f"{'>' if open_min else '>='} {minimum:g}"
        hi = "" if maximum is None else f"{'<' if open_max else '<='} {maximum:g}"
        allowed = "a finite number" + (f" {lo}" if lo else "") + (" and" if lo and hi else "") + (f" {hi}" if hi else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {allowed}, got {value!r:.60}")
    try:
        x = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be {allowed}, got {value!r:.60}") from None
    if not math.isfinite(x) or (minimum is not None and (x <= minimum if open_min else x < minimum)) or (
            maximum is not None and (x >= maximum if open_max else x > maximum)):
        raise ValueError(f"{name} must be {allowed}, got {value!r:.60}")
    return x


def _plain_ids(ids, vocab_size: int | None) -> bool:
    """Every entry a plain int in [0, vocab_size): a few C-speed passes instead of a check per entry."""
    return all(type(t) is int for t in ids) and (not ids or (min(ids) >= 0 and (vocab_size is None
                                                                                 or max(ids) < vocab_size)))


def check_id_list(name: str, ids, vocab_size: int | None = None, *, min_len: int = 1,
                  max_len: int | None = None) -> list[int]:
    """A list (or tuple) of int token ids in [0, vocab_size), with ``min_len`` to ``max_len`` entries.

    Unlike :func:`check_token_ids`, no tensors, ranges or generators: what a queue or a table keeps.
    """
    top = "" if vocab_size is None else f" in [0, {vocab_size})"
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
        raise TypeError(f"{name} must be a list of int token ids{top}, got {ids!r:.60}")
    if len(ids) < min_len or (max_len is not None and len(ids) > max_len):
        rule = f"at least {min_len}" if max_len is None else f"{min_len} to {max_len}"
        raise ValueError(f"{name} must hold {rule} token ids, got {len(ids)}")
    if _plain_ids(ids, vocab_size):
        return list(ids)  # the common case; the loop below names the first bad entry
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"{name}[{i}] must be an int token id{top}, got {t!r:.40}")
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            raise ValueError(f"{name}[{i}] = {t!r} is not a token id: allowed are ints{top or ' >= 0'}")
    return [int(t) for t in ids]


def check_key(name: str, key) -> object:
    """A key for a dict (a sequence id, say): hashable, and neither a bool nor a float, which would equal an int key
    (True == 1, 0.0 == 0) or, as NaN, never equal itself."""
    try:
        hash(key)
    except TypeError:
        raise TypeError(f"{name} must be hashable (an int or a str, say), got {type(key).__name__}") from None
    if isinstance(key, (bool, float)):
        raise TypeError(f"{name} must be an int or a str, say, not a {type(key).__name__} (True equals the id 1, 0.0 "
                        f"the id 0, NaN not even itself), got {key!r}")
    return key


def check_list(name: str, value, of: type | tuple, what: str, *, min_len: int = 1) -> list:
    """A list (or tuple) of at least ``min_len`` instances of ``of``; ``what`` names one for the message."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of {what}, got {value!r:.60}")
    if len(value) < min_len:
        raise ValueError(f"{name} must hold at least {min_len} {what}, got {len(value)}")
    for i, x in enumerate(value):
        if not isinstance(x, of):
            raise TypeError(f"{name}[{i}] must be {what}, got {type(x).__name__}")
    return list(value)


def check_dtype(dtype, name: str = "dtype"):
    """None or a floating torch.dtype."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{name} must be a floating torch.dtype (e.g. torch.float32) or None, got {dtype!r:.60}")
    return dtype


def check_device(device, name: str = "device"):
    """None, a str such as "cpu", or a torch.device."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name} must be None, a str (e.g. 'cpu') or a torch.device, got {device!r:.60}")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"{name} must name a device (e.g. 'cpu', 'cuda:0'), got {device!r:.60}") from None
    if device.type not in ("cpu", "meta"):
        try:
            torch.empty(0, device=device)  # a device this PyTorch build and machine have
        except (RuntimeError, AssertionError) as e:
            raise ValueError(f"{name} {str(device)!r} is not available here ({str(e).splitlines()[0]}); "
                             f"'cpu' always is") from None
    return device


# ---- caches: sizes, chunks of keys and values, token-id tensors ------------------------------------

CACHE_ELEMENTS_MAX = 2**31  # keys and values of one cache, at most (as FastDecoder's)


def check_cache_shape(config, batch_size, max_len) -> tuple[int, int]:
    """``batch_size`` and ``max_len`` (None: the block) of a cache of at most 2**31 numbers for ``config``."""
    max_len = check_int("max_len", config.block_size if max_len is None else max_len, 1, config.block_size,
                        f"an int in [1, block_size={config.block_size}]")
    top = max(1, CACHE_ELEMENTS_MAX // (2 * config.n_layer * config.n_embd * max_len))
    batch_size = check_int("batch_size", batch_size, 1, top, f"an int in [1, {top}] (a cache of at most 2**31 numbers)")
    return batch_size, max_len


def check_multi_head(config, what: str, instead: str = "") -> None:
    """``what`` keeps one key/value head per query head: grouped-query and latent models are refused, with
    what to use ``instead`` if there is something."""
    if not config.multi_head:
        kind = f"a latent of {config.kv_latent}" if config.kv_latent else f"{config.kv_heads} key/value head(s)"
        raise ValueError(f"{what} needs a multi-head attention model's config (one key/value head per query head: "
                         f"n_kv_head=0, kv_latent=0); this config has {config.n_head} query heads and {kind}"
                         + (f": {instead}" if instead else ""))


def check_tensor(name: str, t, what: str, ok=lambda t: True) -> torch.Tensor:
    """A tensor for which ``ok(t)`` holds; else TypeError: "``name`` must be ``what``, got <its dtype and shape>"."""
    if not isinstance(t, torch.Tensor) or not ok(t):
        raise TypeError(f"{name} must be {what}, got {_describe(t)}")
    return t


def check_chunk(name: str, t, shape: tuple, like: torch.Tensor | None = None) -> torch.Tensor:
    """A floating tensor of ``shape`` (None: any size) with finite values; ``like``: its dtype and device."""
    want = "(" + ", ".join("T" if s is None else str(s) for s in shape) + ")"
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor of shape {want}, got {_describe(t)}")
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if like is not None and t.dtype != like.dtype:
        raise TypeError(f"{name} must be {like.dtype} like the values stored before it, got {t.dtype}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{name} must be on {like.device} like the values stored before it, got {t.device}")
    if t.device.type != "meta" and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} holds NaN or inf; allowed are finite values")
    return t


def check_id_tensor(idx, vocab_size: int, *, batch: int | None = None, room: int | None = None,
                    name: str = "idx") -> torch.Tensor:
    """Token ids: an int64 tensor (B, T), B and T >= 1, ids in [0, vocab_size); ``batch`` rows, ``room`` tokens at most."""
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long or idx.dim() != 2:
        raise TypeError(f"{name} must be an int64 tensor of token ids with shape (B, T), got {_describe(idx)}")
    if 0 in idx.shape:
        raise ValueError(f"{name} must hold at least one token in at least one row, got shape {tuple(idx.shape)}")
    if batch is not None and idx.shape[0] != batch:
        raise ValueError(f"{name} must have {batch} row(s), one per sequence of the cache, got {idx.shape[0]}")
    lo, hi = (int(v) for v in idx.aminmax())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} holds token ids {lo}..{hi}; allowed are ids in [0, {vocab_size})")
    if room is not None and idx.shape[1] > room:
        raise ContextLimitError(f"{name} has {idx.shape[1]} tokens; room is left for {room}")
    return idx
