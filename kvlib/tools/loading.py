"""Loading what ``data/`` ships: ``load_pretrained("tang-char")`` checks sha256, then loads weights only."""
from __future__ import annotations

import json

import torch

from ..model import GPT, GPTConfig
from ..tokenizer import tokenizer_from_dict
from .integrity import DATA_DIR, DamagedFileError, IntegrityError, check_regular_file, verified_path, write_json

MODELS = ("tang-char", "tang-bpe", "tang-char-draft", "tang-char-gqa2", "tang-char-mqa", "tang-char-mla")
# What each shipped name stands for: the GPTConfig fields where it differs from the defaults, and its tokenizer's
# kind (char unless said). training.RECIPES trains them so; a checkpoint that differs is damaged, not another model.
ARCHITECTURES = {"tang-char": {}, "tang-bpe": {}, "tang-char-draft": {"n_layer": 1}, "tang-char-gqa2": {"n_kv_head": 2},
                 "tang-char-mqa": {"n_kv_head": 1}, "tang-char-mla": {"kv_latent": 16}}
TOKENIZER_KINDS = {"tang-bpe": "bpe"}


def save_tokenizer(tokenizer, path) -> None:
    """Write a tokenizer's table (``to_dict``) as JSON, atomically."""
    if not hasattr(tokenizer, "to_dict"):
        raise TypeError(f"tokenizer must be a kvlib tokenizer (with to_dict), got {type(tokenizer).__name__}")
    write_json(path, tokenizer.to_dict())


def load_tokenizer(path):
    """A tokenizer written by :func:`save_tokenizer`; a damaged file raises :class:`DamagedFileError`."""
    path = check_regular_file(path, "tokenizer file")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e).splitlines()[0]
        raise DamagedFileError(f"{path} is not a tokenizer file: not valid JSON in UTF-8 ({reason})") from None
    try:
        return tokenizer_from_dict(d)
    except (ValueError, TypeError) as e:
        raise DamagedFileError(f"{path} is not a valid tokenizer file: {e}") from None


def load_pretrained(name: str = "tang-char", data_dir=DATA_DIR):
    """(model in eval mode, tokenizer) for a shipped model, after checking both files' sha256."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the shipped models are {', '.join(MODELS)}")
    path = verified_path(f"{name}.pt", data_dir)
    try:
        ckpt = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # a file that matches the manifest but will not unpickle as plain weights
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise IntegrityError(f"{path} cannot be loaded as a weights-only checkpoint (truncated, corrupt or "
                             f"holding code): {first}") from e
    model = model_from_checkpoint(ckpt, path)
    tok_name = ckpt["tokenizer"]
    tokenizer = load_tokenizer(verified_path(tok_name, data_dir))
    if tokenizer.vocab_size != model.config.vocab_size:
        raise DamagedFileError(f"{tok_name} ({tokenizer.kind}, {tokenizer.vocab_size} ids) does not belong to "
                               f"{name} ({model.config.vocab_size} ids): the checkpoint names the wrong tokenizer "
                               f"file, or one of the two was replaced")
    check_architecture(name, model.config, tokenizer, path)
    return model, tokenizer


def check_architecture(name: str, config: GPTConfig, tokenizer, path) -> None:
    """The checkpoint behind a shipped name is that name's model: its shape and its tokenizer's kind."""
    defaults = GPTConfig(vocab_size=config.vocab_size)
    want = {field: ARCHITECTURES[name].get(field, getattr(defaults, field))
            for field in ("block_size", "n_layer", "n_head", "n_embd", "n_kv_head", "kv_latent")}
    got = {field: getattr(config, field) for field in want}
    kind = TOKENIZER_KINDS.get(name, "char")
    if got != want or tokenizer.kind != kind:
        differ = ", ".join(f"{f} {got[f]} (not {want[f]})" for f in want if got[f] != want[f])
        differ = differ or f"a {tokenizer.kind} tokenizer (not {kind})"
        raise DamagedFileError(f"{path} does not hold {name}: {differ}; the file was replaced by another model's "
                               f"(restore it with git, or retrain it with python -m kvlib train --model {name})")


def model_from_checkpoint(ckpt, path) -> GPT:
    """The model (eval mode) of a loaded checkpoint dict, after checking its structure and weights."""
    fields = {"config", "model", "tokenizer"}
    if not isinstance(ckpt, dict) or not fields <= ckpt.keys():
        have = sorted(map(str, ckpt)) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise DamagedFileError(f"{path} is not a kvlib checkpoint: expected a dict with config, model and "
                               f"tokenizer, got {have}")
    config, weights, tok_name = ckpt["config"], ckpt["model"], ckpt["tokenizer"]
    if not isinstance(tok_name, str) or not tok_name.endswith(".tokenizer.json") or "/" in tok_name or "\\" in tok_name:
        raise DamagedFileError(f"{path}: 'tokenizer' must name a file <name>.tokenizer.json in the data folder, "
                               f"got {tok_name!r:.60}")
    known = set(GPTConfig.__dataclass_fields__)
    if not isinstance(config, dict) or not config.keys() <= known or "vocab_size" not in config:
        got = sorted(map(str, config)) if isinstance(config, dict) else type(config).__name__
        raise DamagedFileError(f"{path}: 'config' must be a dict with vocab_size and any of {sorted(known)}, got {got}")
    try:
        cfg = GPTConfig(**config)
    except (TypeError, ValueError) as e:
        raise DamagedFileError(f"{path}: its config is not valid: {e}") from None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise DamagedFileError(f"{path}: 'model' must be a state dict (parameter name -> tensor)")
    with torch.random.fork_rng(devices=[]):  # building the model draws initial weights: keep the global RNG
        model = GPT(cfg)
    expected = model.state_dict()
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    if missing or unexpected:
        parts = ([f"missing {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}"] if missing else []) + (
            [f"unexpected {', '.join(map(str, unexpected[:3]))}{' …' if len(unexpected) > 3 else ''}"] if unexpected else [])
        raise DamagedFileError(f"{path}: the weights do not fit its config {config}: {'; '.join(parts)}")
    for k, t in expected.items():
        w = weights[k]
        if tuple(w.shape) != tuple(t.shape) or w.dtype != t.dtype or w.layout != torch.strided:
            raise DamagedFileError(f"{path}: weight {k} is {w.dtype} {tuple(w.shape)}, but the config needs "
                                   f"{t.dtype} {tuple(t.shape)}")
        if w.is_floating_point() and not bool(torch.isfinite(w).all()):
            raise DamagedFileError(f"{path}: weight {k} holds {int((~torch.isfinite(w)).sum())} non-finite "
                                   f"value(s) (NaN or inf); retrain or restore the file with git")
    model.load_state_dict(weights)
    model.eval()
    metrics = ckpt.get("metrics", {})
    model.metrics = metrics if isinstance(metrics, dict) else {}
    return model
