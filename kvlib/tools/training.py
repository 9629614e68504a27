"""Training: AdamW, warm-up then cosine decay, gradient clipping, resumable atomic checkpoints.

``train(TrainConfig(model="tang-char"))`` builds the tokenizer, trains on the 95 % split, keeps the
whole training state in ``runs/<model>/state.pt`` (model, optimiser, RNGs, step, history) and, at
the end, writes ``data/<model>.pt``, its tokenizer, log and loss curve, and their manifest entries.
"""
from __future__ import annotations

import io
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch

from ..checks import check_seed
from ..model import GPT, GPTConfig
from ..tokenizer import ByteBPETokenizer, CharTokenizer
from . import corpus
from .integrity import (DATA_DIR, MANIFEST_NAME, check_regular_file, record, remove_stale_temporaries, write_bytes,
                        write_json)
from .loading import ARCHITECTURES, load_tokenizer, save_tokenizer

ROOT = DATA_DIR.parent
# Notebook 9's smaller caches start from the shipped tang-char (init_from) and train on for 5 % of its steps.
SMALLER_CACHES = ("tang-char-gqa2", "tang-char-mqa", "tang-char-mla")
TOKENIZERS = {"tang-char": CharTokenizer, "tang-bpe": ByteBPETokenizer, "tang-char-draft": CharTokenizer,
              **{name: CharTokenizer for name in SMALLER_CACHES}}
# A draft model for speculative decoding must share its target's ids: it reuses the target's shipped
# tokenizer file (checked against the manifest) instead of building a vocabulary of its own; so do the
# models converted from tang-char.
SHARED_TOKENIZER = {"tang-char-draft": "tang-char", **{name: "tang-char" for name in SMALLER_CACHES}}
MAX_LR = 10.0  # a learning rate past this only overflows float32 in AdamW's update
UPTRAINING = {"init_from": "tang-char", "steps": 200, "lr": 1e-3, "min_lr": 1e-4, "warmup": 20, "eval_every": 50}
# Each shipped model's recipe where it differs from TrainConfig's defaults. The draft is one layer, so
# that a step costs little; the clean corpus's tang-char trains 4,000 steps to reach 4.60 nats/char.
RECIPES = {
    "tang-char": {"steps": 4000},
    "tang-bpe": {"steps": 4000},
    "tang-char-draft": {**ARCHITECTURES["tang-char-draft"], "steps": 800, "batch_size": 16},
    # key/value heads mean-pooled 4 -> 2 and 4 -> 1, or keys and values from a 16-number latent (SVD)
    **{name: {**UPTRAINING, **ARCHITECTURES[name]} for name in SMALLER_CACHES},
}


def config_for(model: str, **overrides) -> "TrainConfig":
    """The TrainConfig of a model's recipe, with ``overrides`` (e.g. steps) on top."""
    return TrainConfig(model=model, **{**RECIPES.get(model, {}), **overrides})


@dataclass
class TrainConfig:
    model: str = "tang-char"
    steps: int = 3000
    batch_size: int = 32
    block_size: int = GPTConfig.block_size     # the model's shape: GPTConfig's defaults unless a recipe says
    n_layer: int = GPTConfig.n_layer
    n_head: int = GPTConfig.n_head
    n_embd: int = GPTConfig.n_embd
    n_kv_head: int = GPTConfig.n_kv_head       # 0: one key/value head per query head
    kv_latent: int = GPTConfig.kv_latent       # 0: no latent
    init_from: str = ""       # a shipped model to convert (compress.grouped / latent) and train on from
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 200
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_batches: int = 16
    save_every: int = 50
    seed: int = 1337
    threads: int = 1
    out_dir: str = str(DATA_DIR)
    work_dir: str = field(default="")

    def __post_init__(self):
        if self.model not in TOKENIZERS:
            raise ValueError(f"model must be one of {sorted(TOKENIZERS)}, got {self.model!r}")
        for name in ("steps", "batch_size", "block_size", "n_layer", "n_head", "n_embd", "eval_every",
                     "eval_batches", "save_every", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        try:
            check_seed(self.seed)
        except TypeError as e:
            raise ValueError(str(e)) from None
        for name in ("n_kv_head", "kv_latent"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0 (0: off), got {value!r}")
        if self.init_from not in ("", "tang-char"):
            raise ValueError(f"init_from must be '' (random weights) or 'tang-char', got {self.init_from!r}")
        if self.init_from and SHARED_TOKENIZER.get(self.model) != self.init_from:
            raise ValueError(f"init_from={self.init_from!r} needs a model that shares its tokenizer; "
                             f"{self.model!r} does not")
        for name in ("out_dir", "work_dir", "init_from"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a str (a folder), got {getattr(self, name)!r}")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not 0 < self.lr <= MAX_LR or self.min_lr > MAX_LR:
            raise ValueError(f"lr and min_lr must be numbers in (0, {MAX_LR:g}] (AdamW's step size; ours is 3e-3), "
                             f"got lr={self.lr!r}, min_lr={self.min_lr!r}")
        if not self.work_dir:
            self.work_dir = str(ROOT / "runs" / self.model)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr`` at ``steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def windows(ids: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping (inputs, targets) windows covering ``ids``, each (N, block_size)."""
    n = (len(ids) - 1) // block_size
    x = ids[: n * block_size].view(n, block_size)
    y = ids[1: n * block_size + 1].view(n, block_size)
    return x, y


@torch.no_grad()
def mean_loss(model: GPT, ids: torch.Tensor, batch_size: int = 32, max_batches: int | None = None) -> float:
    """Mean next-token loss in nats over non-overlapping windows of ``ids``."""
    model.eval()
    x, y = windows(ids, model.config.block_size)
    if len(x) == 0:
        raise ValueError(f"ids: {len(ids)} tokens hold no window of block_size + 1 = {model.config.block_size + 1}; "
                         f"give more text")
    total, count = 0.0, 0
    for b, i in enumerate(range(0, len(x), batch_size)):
        if max_batches is not None and b >= max_batches:
            break
        _, loss = model(x[i:i + batch_size], targets=y[i:i + batch_size])
        n = y[i:i + batch_size].numel()
        total, count = total + loss.item() * n, count + n
    return total / count


def build_tokenizer(name: str, poems: list[str]):
    if name in SHARED_TOKENIZER:  # the target's vocabulary, exactly as shipped
        from .integrity import verified_path
        return load_tokenizer(verified_path(f"{SHARED_TOKENIZER[name]}.tokenizer.json", DATA_DIR))
    return TOKENIZERS[name].train(poems)


def _save_state(path: Path, state: dict) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    write_bytes(path, buf.getvalue())


# What names a model: a run resumed under another name, or holding another shape, is another model's run.
RECIPE_FIELDS = ("model", "init_from", "block_size", "n_layer", "n_head", "n_embd", "n_kv_head", "kv_latent")
# Settings that may differ between a run and its resumption: where files go, and the thread count.
RESUMABLE_CHANGES = ("out_dir", "work_dir", "threads")


class UnfinishedRunError(FileExistsError):
    """A fresh run would overwrite the resumable state of an unfinished one."""


def read_state(state_path: Path) -> dict:
    """A saved training state (weights only), or RuntimeError saying why it cannot be read."""
    check_regular_file(state_path, "training state")  # a FIFO would block torch.load forever
    try:
        state = torch.load(state_path, weights_only=True)  # tensors, numbers and strings only
        if not isinstance(state, dict) or not isinstance(state.get("config"), dict):
            raise ValueError("not a training state (a dict with config, model, optimizer, step, ...)")
        TrainConfig(**state["config"])
        for key, kind in (("step", int), ("history", list), ("elapsed", float), ("model", dict),
                          ("optimizer", dict), ("batch_rng", torch.Tensor), ("torch_rng", torch.Tensor)):
            if not isinstance(state.get(key), kind):
                raise ValueError(f"its {key!r} is missing or not a {kind.__name__}")
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise RuntimeError(f"{state_path} cannot be read ({e.__class__.__name__}: {first}); delete it to "
                           "start again (or use --restart)") from e
    return state


def saved_config(work_dir) -> TrainConfig | None:
    """The configuration of the run saved in ``work_dir``, or None if there is none."""
    path = Path(work_dir) / "state.pt"
    return TrainConfig(**read_state(path)["config"]) if os.path.lexists(path) else None


def config_differences(saved: TrainConfig, cfg: TrainConfig) -> list[str]:
    """``name: saved -> given`` for every setting that a resumed run must keep but ``cfg`` changes."""
    return [f"{f.name}: {getattr(saved, f.name)!r} -> {getattr(cfg, f.name)!r}" for f in fields(TrainConfig)
            if f.name not in RESUMABLE_CHANGES and getattr(saved, f.name) != getattr(cfg, f.name)]


def check_state_fits(model: GPT, weights: dict, state_path) -> None:
    """The saved weights are the model's own: the same names and shapes (before any step runs)."""
    own = model.state_dict()
    wrong = [f"{k} {tuple(weights[k].shape) if k in weights else 'missing'} (model {tuple(v.shape)})"
             for k, v in own.items() if k not in weights or not isinstance(weights[k], torch.Tensor)
             or weights[k].shape != v.shape]
    wrong += [f"{k} (not in the model)" for k in weights if k not in own]
    if wrong:
        raise ValueError(f"--resume: the weights in {state_path} do not fit the model its settings describe "
                         f"({model.config}): {'; '.join(wrong[:3])}{' ...' if len(wrong) > 3 else ''}; start over "
                         f"with --restart")


def check_poems(poems) -> list[str]:
    """A corpus to train on: a list of non-empty str."""
    if isinstance(poems, str) or not isinstance(poems, (list, tuple)):
        raise TypeError(f"poems must be a list of str (one poem each), got {poems!r:.60}")
    for i, p in enumerate(poems):
        if not isinstance(p, str) or not p:
            raise ValueError(f"poems[{i}] must be a non-empty str, got {p!r:.60}")
    return list(poems)


def train(cfg: TrainConfig, resume: bool = False, poems: list[str] | None = None, progress: bool = True,
          restart: bool = False) -> dict:
    """Train (or resume) and export the model; returns the final metrics.

    A fresh run refuses to replace the state of an unfinished one in ``cfg.work_dir``: pass
    ``resume=True`` to continue it, or ``restart=True`` to start over and discard it. Resuming
    refuses settings other than the saved ones (except ``RESUMABLE_CHANGES``) and lists the
    differences. A non-finite loss or gradient stops the run (FloatingPointError) before anything
    non-finite is saved or exported. Temporaries left by a killed write are removed at every start.

    Training seeds and draws from torch's global RNG and sets the thread count; both are restored
    afterwards, so a caller's own random state is left as it was.
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    for name, flag in (("resume", resume), ("restart", restart), ("progress", progress)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if resume and restart:
        raise ValueError("resume and restart exclude each other: continue the saved run, or start over")
    if poems is not None:
        poems = check_poems(poems)
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]):
            return _train(cfg, resume, poems, progress, restart)
    finally:
        torch.set_num_threads(threads)


def _not_finite(what: str, value, step: int, lr: float, saved: int) -> FloatingPointError:
    return FloatingPointError(
        f"training stopped: the {what} is {value} at step {step} (lr {lr:g}): the run diverged; nothing "
        f"was exported and the state saved at step {saved} is kept; lower the learning rate (--lr) and "
        f"start over (--restart)")


def _finite_weights(model: GPT) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def converted(cfg: TrainConfig, mcfg: GPTConfig) -> GPT:
    """The shipped ``cfg.init_from`` (sha256-checked) turned into ``mcfg``'s shape by :mod:`kvlib.compress`."""
    from ..compress import grouped, latent
    from .loading import load_pretrained

    base, _ = load_pretrained(cfg.init_from)
    model = latent(base, mcfg.kv_latent) if mcfg.kv_latent else grouped(base, mcfg.kv_heads)
    if model.config != mcfg:
        raise ValueError(f"init_from={cfg.init_from!r} has the shape {base.config}; the recipe asks for {mcfg}")
    return model


def _train(cfg: TrainConfig, resume: bool, poems: list[str] | None, progress: bool, restart: bool = False) -> dict:
    from tqdm.auto import tqdm

    torch.set_num_threads(cfg.threads)
    out_dir, work_dir = Path(cfg.out_dir), Path(cfg.work_dir)
    state_path = work_dir / "state.pt"
    tok_path = work_dir / "tokenizer.json"
    # Half-written files of a run that was killed mid-write: the work folder is the run's own; in the
    # output folder only this model's files (others may write there), the manifest's once it is stale.
    remove_stale_temporaries(work_dir)
    outputs = [f"{cfg.model}{ext}" for ext in (".pt", ".tokenizer.json", ".log.json", ".loss.png")]
    remove_stale_temporaries(out_dir, outputs)
    remove_stale_temporaries(out_dir, [MANIFEST_NAME], older_than=600)

    if resume:
        if not state_path.exists():
            raise FileNotFoundError(f"--resume: no training state at {state_path}")
        state = read_state(state_path)
        saved = TrainConfig(**state["config"])
        differences = config_differences(saved, cfg)
        if differences:
            raise ValueError(f"--resume: {state_path} was started with another configuration: "
                             f"{'; '.join(differences)} (saved -> given); resume with the saved settings, "
                             f"or start over with --restart")
        cfg = replace(saved, **{k: getattr(cfg, k) for k in RESUMABLE_CHANGES})
        tok = load_tokenizer(tok_path)
    else:
        if state_path.exists() and not restart:
            try:
                old = read_state(state_path)
            except RuntimeError as e:
                raise UnfinishedRunError(f"{e}; a fresh run would replace it: use --restart to start over") from None
            if old["step"] < old["config"]["steps"]:
                raise UnfinishedRunError(
                    f"{state_path} holds an unfinished run (step {old['step']} of {old['config']['steps']}): "
                    f"continue it with --resume (train(..., resume=True)) or discard it and start over with "
                    f"--restart (train(..., restart=True))")
        state = None
    poems = corpus.load_poems() if poems is None else poems
    train_poems, val_poems = corpus.split(poems)
    if state is None:
        tok = build_tokenizer(cfg.model, poems)
        save_tokenizer(tok, tok_path)

    train_ids = torch.tensor(tok.encode_corpus(train_poems), dtype=torch.long)
    val_ids = torch.tensor(tok.encode_corpus(val_poems), dtype=torch.long)
    need = cfg.block_size + 2
    if len(val_poems) == 0 or len(train_ids) < need or len(val_ids) < need:
        raise ValueError(f"poems: {len(poems)} poems give {len(train_ids)} training and {len(val_ids)} validation "
                         f"tokens (every 20th poem is held out); training needs at least block_size + 2 = {need} "
                         f"of each: give more poems (at least 20) or a smaller block_size")
    val_chars = sum(len(p) + 1 for p in val_poems)  # every poem plus its separator
    chars_per_token = val_chars / len(val_ids)

    mcfg = GPTConfig(vocab_size=tok.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                     n_head=cfg.n_head, n_embd=cfg.n_embd, n_kv_head=cfg.n_kv_head, kv_latent=cfg.kv_latent)
    torch.manual_seed(cfg.seed)
    model = GPT(mcfg) if not cfg.init_from else converted(cfg, mcfg)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    batches = torch.Generator().manual_seed(cfg.seed)  # the data position: which windows come next
    step, history, elapsed = 0, [], 0.0
    if state is not None:
        check_state_fits(model, state["model"], state_path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        batches.set_state(state["batch_rng"])
        torch.set_rng_state(state["torch_rng"])
        step, history, elapsed = state["step"], state["history"], state["elapsed"]

    saved_at = [step]  # the step of the last state on disk

    def checkpoint():
        if not _finite_weights(model):
            raise _not_finite("model's weights", "not finite", step, lr, saved_at[0])
        saved_at[0] = step
        _save_state(state_path, {
            "config": asdict(cfg), "model": model.state_dict(), "optimizer": opt.state_dict(),
            "batch_rng": batches.get_state(), "torch_rng": torch.get_rng_state(),
            "step": step, "history": history, "elapsed": elapsed})
        write_json(work_dir / "log.json", history)

    def evaluate():
        val = mean_loss(model, val_ids, cfg.batch_size, cfg.eval_batches)
        model.train()
        return val

    if step == 0 and cfg.init_from:  # where the converted model starts, before any training
        start = evaluate()
        history.append({"step": 0, "val_loss": start, "val_nats_per_char": start / chars_per_token, "elapsed_s": 0.0})
    bar = tqdm(total=cfg.steps, initial=step, desc=cfg.model, disable=not progress, mininterval=2)
    model.train()
    t0 = time.perf_counter()
    while step < cfg.steps:
        lr = lr_at(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(len(train_ids) - cfg.block_size - 1, (cfg.batch_size,), generator=batches)
        offsets = torch.arange(cfg.block_size + 1)
        chunk = train_ids[starts[:, None] + offsets]  # (B, T + 1)
        _, loss = model(chunk[:, :-1], targets=chunk[:, 1:])
        opt.zero_grad(set_to_none=True)
        if not math.isfinite(loss.item()):
            raise _not_finite("training loss", loss.item(), step + 1, lr, saved_at[0])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if not math.isfinite(norm.item()):
            raise _not_finite("gradient norm", norm.item(), step + 1, lr, saved_at[0])
        opt.step()
        step += 1
        row = {"step": step, "lr": lr, "train_loss": loss.item()}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            row["val_loss"] = evaluate()
            if not math.isfinite(row["val_loss"]):
                raise _not_finite("validation loss", row["val_loss"], step, lr, saved_at[0])
            row["val_nats_per_char"] = row["val_loss"] / chars_per_token
        elapsed += time.perf_counter() - t0
        t0 = time.perf_counter()
        row["elapsed_s"] = round(elapsed, 2)
        history.append(row)
        bar.set_postfix(loss=f"{loss.item():.3f}", **({"val": f"{row['val_loss']:.3f}"} if "val_loss" in row else {}))
        bar.update(1)
        if step % cfg.save_every == 0 or step == cfg.steps:
            checkpoint()
    bar.close()

    val_loss = mean_loss(model, val_ids, cfg.batch_size)  # the whole validation split
    if not math.isfinite(val_loss) or not _finite_weights(model):
        raise _not_finite("final validation loss", val_loss, step, lr_at(step, cfg), saved_at[0])
    metrics = {"steps": step, "train_seconds": round(elapsed, 1), "val_loss_per_token": val_loss,
               "val_nats_per_char": val_loss / chars_per_token, "params": model.num_params()}
    if cfg.init_from:
        metrics["converted_from"] = cfg.init_from
    export(model, tok, cfg, history, metrics, out_dir)
    return metrics


def export(model: GPT, tok, cfg: TrainConfig, history: list[dict], metrics: dict, out_dir: Path) -> None:
    """Write the shipped checkpoint, tokenizer, log and loss curve, then their manifest entries."""
    if not _finite_weights(model):
        raise FloatingPointError(f"export: {cfg.model}'s weights hold NaN or inf values; a checkpoint is never "
                                 f"written with them (retrain with a lower learning rate)")
    name = cfg.model
    tok_name = SHARED_TOKENIZER.get(name, name)  # a draft points at its target's tokenizer file
    ckpt = {"config": asdict(model.config), "model": model.state_dict(), "tokenizer": f"{tok_name}.tokenizer.json",
            "train_config": {k: v for k, v in asdict(cfg).items() if k not in ("out_dir", "work_dir")},
            "metrics": metrics}
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    ckpt_path, tok_path, log_path = out_dir / f"{name}.pt", out_dir / f"{tok_name}.tokenizer.json", out_dir / f"{name}.log.json"
    write_bytes(ckpt_path, buf.getvalue())
    paths = [ckpt_path, log_path]
    if not (name in SHARED_TOKENIZER and out_dir.resolve() == DATA_DIR.resolve()):
        save_tokenizer(tok, tok_path)  # a draft's shared file, when shipped, is left untouched
        paths.append(tok_path)
    write_json(log_path, {"metrics": metrics, "history": history})
    # The one picture a tool draws: imported here, so that tools never load matplotlib otherwise.
    from ..notebook.plots import plot_loss_curve
    paths.append(plot_loss_curve(history, out_dir / f"{name}.loss.png", title=name))
    if out_dir.resolve() == DATA_DIR.resolve():
        record(*paths)


def evaluate(model: GPT, tokenizer, n_poems: int = 200, temperature: float = 0.8, seed: int = 1337,
             poems: list[str] | None = None) -> dict:
    """Validation loss in nats per character (comparable across tokenizers) and the format score:
    the share of lines with 5 or 7 characters in ``n_poems`` poems sampled at ``temperature``."""
    from ..tokenizer import check_pair
    from ..poems import format_score, write

    check_pair(model, tokenizer)
    _, val_poems = corpus.split(corpus.load_poems() if poems is None else poems)
    val_ids = torch.tensor(tokenizer.encode_corpus(val_poems), dtype=torch.long)
    val_chars = sum(len(p) + 1 for p in val_poems)
    per_token = mean_loss(model, val_ids)
    samples = write(model, tokenizer, "", temperature=temperature, seed=seed, n=n_poems)
    return {"val_loss_per_token": per_token, "val_nats_per_char": per_token * len(val_ids) / val_chars,
            "format_score": format_score(samples), "samples": samples}
