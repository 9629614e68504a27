"""Input checks at the public edges, kept apart so that the functions learners read hold only the idea.

Every check is named ``check_<what>``, raises one exception whose message names the parameter, the
value received and what is allowed, and returns the value in the form the caller goes on with.
Deeper code trusts what passed here.
"""
from __future__ import annotations

import math
import numbers

import torch


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
            raise TypeError(f"{name} must be a 1-D integer tensor or a list of ints, got {describe(ids)}")
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


def check_model(model) -> None:
    """A kvlib GPT (anything with a GPTConfig as ``config`` that can be called on token ids)."""
    config = getattr(model, "config", None)
    if not callable(model) or not all(hasattr(config, a) for a in ("vocab_size", "block_size", "n_layer")):
        raise TypeError(f"model must be a kvlib GPT (e.g. from load_pretrained), got {type(model).__name__}")


def check_config(config, cls) -> None:
    """A model configuration of class ``cls`` (a GPTConfig), not a dict or a number."""
    if not isinstance(config, cls):
        hint = f" (use {cls.__name__}(**d) for a dict)" if isinstance(config, dict) else ""
        raise TypeError(f"config must be a {cls.__name__}, got {type(config).__name__}{hint}")


# ---- tensors -----------------------------------------------------------------------------------

def describe(x) -> str:
    return f"a {x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


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


def check_banned(banned, vocab_size: int) -> list[int]:
    """Token ids never to write: a list, tuple, set or range of ids in [0, vocab_size) that leaves at least one;
    returns them sorted, each once."""
    if isinstance(banned, (str, bytes)) or not isinstance(banned, (list, tuple, set, frozenset, range)):
        raise TypeError(f"banned must be a list of token ids, got {banned!r:.60}")
    banned = sorted(set(check_id_list("banned", list(banned), vocab_size, min_len=0)))
    if len(banned) >= vocab_size:
        raise ValueError(f"banned must leave at least one token to write, got all {vocab_size} ids")
    return banned


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


def check_dtype(dtype, name: str = "dtype", optional: bool = True):
    """A floating torch.dtype, or None where ``optional``."""
    if not (optional and dtype is None) and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{name} must be a floating torch.dtype (e.g. torch.float32){' or None' * optional}, "
                        f"got {dtype!r:.60}")
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


def check_tensor(name: str, t, what: str, ok=lambda t: True) -> torch.Tensor:
    """A tensor for which ``ok(t)`` holds; else TypeError: "``name`` must be ``what``, got <its dtype and shape>"."""
    if not isinstance(t, torch.Tensor) or not ok(t):
        raise TypeError(f"{name} must be {what}, got {describe(t)}")
    return t
