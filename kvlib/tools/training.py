"""Training: AdamW, warm-up then cosine decay, gradient clipping, resumable atomic checkpoints.

``train(TrainConfig(model="tang-char"))`` builds the tokenizer, trains on the 95 % split, keeps the
whole training state in ``runs/<model>/state.pt`` (model, optimiser, RNGs, step, history) and, at
the end, writes ``data/<model>.pt``, its tokenizer, log and loss curve, and their manifest entries.
"""
from __future__ import annotations

import io
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..model import GPT, GPTConfig
from ..tokenizer import ByteBPETokenizer, CharTokenizer
from . import corpus
from .integrity import DATA_DIR, record, write_bytes, write_json
from .loading import load_tokenizer, save_tokenizer

ROOT = DATA_DIR.parent
TOKENIZERS = {"tang-char": CharTokenizer, "tang-bpe": ByteBPETokenizer}


@dataclass
class TrainConfig:
    model: str = "tang-char"
    steps: int = 3000
    batch_size: int = 32
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
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
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.lr <= 0:
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
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
    total, count = 0.0, 0
    for b, i in enumerate(range(0, len(x), batch_size)):
        if max_batches is not None and b >= max_batches:
            break
        _, loss = model(x[i:i + batch_size], targets=y[i:i + batch_size])
        n = y[i:i + batch_size].numel()
        total, count = total + loss.item() * n, count + n
    return total / count


def build_tokenizer(name: str, poems: list[str]):
    return TOKENIZERS[name].train(poems)


def _save_state(path: Path, state: dict) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    write_bytes(path, buf.getvalue())


def train(cfg: TrainConfig, resume: bool = False, poems: list[str] | None = None, progress: bool = True) -> dict:
    """Train (or resume) and export the model; returns the final metrics.

    Training seeds and draws from torch's global RNG and sets the thread count; both are restored
    afterwards, so a caller's own random state is left as it was.
    """
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]):
            return _train(cfg, resume, poems, progress)
    finally:
        torch.set_num_threads(threads)


def _train(cfg: TrainConfig, resume: bool, poems: list[str] | None, progress: bool) -> dict:
    from tqdm.auto import tqdm

    torch.set_num_threads(cfg.threads)
    out_dir, work_dir = Path(cfg.out_dir), Path(cfg.work_dir)
    state_path = work_dir / "state.pt"
    tok_path = work_dir / "tokenizer.json"
    poems = corpus.load_poems() if poems is None else poems
    train_poems, val_poems = corpus.split(poems)

    if resume:
        if not state_path.exists():
            raise FileNotFoundError(f"--resume: no training state at {state_path}")
        for stale in work_dir.glob(".*.tmp"):  # half-written files of a run that was killed mid-write
            stale.unlink()
        try:
            state = torch.load(state_path, weights_only=True)  # tensors, numbers and strings only
        except Exception as e:
            raise RuntimeError(f"--resume: {state_path} cannot be read ({e.__class__.__name__}: "
                               f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); delete it to "
                               "start again") from e
        saved = TrainConfig(**state["config"])
        if (saved.model, saved.seed, saved.batch_size) != (cfg.model, cfg.seed, cfg.batch_size):
            raise ValueError(f"--resume: {state_path} was started with another configuration: {state['config']}")
        cfg = saved
        tok = load_tokenizer(tok_path)
    else:
        tok = build_tokenizer(cfg.model, poems)
        save_tokenizer(tok, tok_path)
        state = None

    train_ids = torch.tensor(tok.encode_corpus(train_poems), dtype=torch.long)
    val_ids = torch.tensor(tok.encode_corpus(val_poems), dtype=torch.long)
    val_chars = sum(len(p) + 1 for p in val_poems)  # every poem plus its separator
    chars_per_token = val_chars / len(val_ids)

    mcfg = GPTConfig(vocab_size=tok.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                     n_head=cfg.n_head, n_embd=cfg.n_embd)
    torch.manual_seed(cfg.seed)
    model = GPT(mcfg)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    batches = torch.Generator().manual_seed(cfg.seed)  # the data position: which windows come next
    step, history, elapsed = 0, [], 0.0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        batches.set_state(state["batch_rng"])
        torch.set_rng_state(state["torch_rng"])
        step, history, elapsed = state["step"], state["history"], state["elapsed"]

    def checkpoint():
        _save_state(state_path, {
            "config": asdict(cfg), "model": model.state_dict(), "optimizer": opt.state_dict(),
            "batch_rng": batches.get_state(), "torch_rng": torch.get_rng_state(),
            "step": step, "history": history, "elapsed": elapsed})
        write_json(work_dir / "log.json", history)

    def evaluate():
        val = mean_loss(model, val_ids, cfg.batch_size, cfg.eval_batches)
        model.train()
        return val

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
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        row = {"step": step, "lr": lr, "train_loss": loss.item()}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            row["val_loss"] = evaluate()
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
    metrics = {"steps": step, "train_seconds": round(elapsed, 1), "val_loss_per_token": val_loss,
               "val_nats_per_char": val_loss / chars_per_token, "params": model.num_params()}
    export(model, tok, cfg, history, metrics, out_dir)
    return metrics


def export(model: GPT, tok, cfg: TrainConfig, history: list[dict], metrics: dict, out_dir: Path) -> None:
    """Write the shipped checkpoint, tokenizer, log and loss curve, then their manifest entries."""
    name = cfg.model
    ckpt = {"config": asdict(model.config), "model": model.state_dict(), "tokenizer": f"{name}.tokenizer.json",
            "train_config": {k: v for k, v in asdict(cfg).items() if k not in ("out_dir", "work_dir")},
            "metrics": metrics}
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    paths = [out_dir / f"{name}.pt", out_dir / f"{name}.tokenizer.json", out_dir / f"{name}.log.json"]
    write_bytes(paths[0], buf.getvalue())
    save_tokenizer(tok, paths[1])
    write_json(paths[2], {"metrics": metrics, "history": history})
    # The one picture a tool draws: imported here, so that tools never load matplotlib otherwise.
    from ..notebook.plots import plot_loss_curve
    paths.append(plot_loss_curve(history, out_dir / f"{name}.loss.png", title=name))
    if out_dir.resolve() == DATA_DIR.resolve():
        record(*paths)


def evaluate(model: GPT, tokenizer, n_poems: int = 200, temperature: float = 0.8, seed: int = 1337,
             poems: list[str] | None = None) -> dict:
    """Validation loss in nats per character (comparable across tokenizers) and the format score:
    the share of lines with 5 or 7 characters in ``n_poems`` poems sampled at ``temperature``."""
    from ..text import format_score, write

    _, val_poems = corpus.split(corpus.load_poems() if poems is None else poems)
    val_ids = torch.tensor(tokenizer.encode_corpus(val_poems), dtype=torch.long)
    val_chars = sum(len(p) + 1 for p in val_poems)
    per_token = mean_loss(model, val_ids)
    samples = write(model, tokenizer, "", temperature=temperature, seed=seed, n=n_poems)
    return {"val_loss_per_token": per_token, "val_nats_per_char": per_token * len(val_ids) / val_chars,
            "format_score": format_score(samples), "samples": samples}
