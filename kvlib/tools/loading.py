"""Loading what ``data/`` ships: ``load_pretrained("tang-char")`` checks sha256, then loads weights only."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..model import GPT, GPTConfig
from ..tokenizer import tokenizer_from_dict
from .integrity import DATA_DIR, IntegrityError, verified_path, write_json

MODELS = ("tang-char", "tang-bpe")


def save_tokenizer(tokenizer, path) -> None:
    """Write a tokenizer's table (``to_dict``) as JSON, atomically."""
    write_json(path, tokenizer.to_dict())


def load_tokenizer(path):
    """A tokenizer written by :func:`save_tokenizer`."""
    d = json.loads(Path(path).read_text(encoding="utf-8"))
    try:
        return tokenizer_from_dict(d)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


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
    if not isinstance(ckpt, dict) or not {"config", "model", "tokenizer"} <= ckpt.keys():
        raise IntegrityError(f"{path} is not a kvlib checkpoint: expected a dict with config, model and tokenizer")
    with torch.random.fork_rng(devices=[]):  # building the model draws initial weights: keep the global RNG
        model = GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    tokenizer = load_tokenizer(verified_path(ckpt["tokenizer"], data_dir))
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(f"{ckpt['tokenizer']} has {tokenizer.vocab_size} ids but {name} expects "
                         f"{model.config.vocab_size}")
    model.metrics = ckpt.get("metrics", {})
    return model, tokenizer
