"""Training on a tiny configuration: the loss falls, the schedule, resuming, and the exported files.

Every run writes under pytest's tmp_path; a guard fails any write into data/ or runs/.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from kvlib.tools import integrity
from kvlib.tools import training as train_mod
from kvlib.model import GPT, GPTConfig
from kvlib.tokenizer import CharTokenizer
from kvlib.tools.loading import load_tokenizer
from kvlib.tools.training import TrainConfig, lr_at, train, windows

STEPS = 40
FORBIDDEN = [integrity.DATA_DIR.resolve(), (integrity.DATA_DIR.parent / "runs").resolve()]


def synthetic_poems(n: int = 200, seed: int = 0) -> list[str]:
    """Quatrains whose lines come from a dozen real ones: a structure a tiny model learns fast."""
    rng = random.Random(seed)
    lines = ["床前看月光", "疑是地上霜", "举头望山月", "低头思故乡", "白日依山尽", "黄河入海流",
             "欲穷千里目", "更上一层楼", "春眠不觉晓", "处处闻啼鸟", "夜来风雨声", "花落知多少"]
    return ["{}，{}。{}，{}。".format(*rng.choices(lines, k=4)) for _ in range(n)]


POEMS = synthetic_poems()


def tiny_config(root: Path, name: str, **overrides) -> TrainConfig:
    settings = dict(model="tang-char", steps=STEPS, batch_size=8, block_size=16, n_layer=1, n_head=2,
                    n_embd=32, lr=1e-2, min_lr=1e-3, warmup=5, eval_every=20, eval_batches=4,
                    save_every=10, seed=7, threads=1,
                    out_dir=str(root / name / "out"), work_dir=str(root / name / "work"))
    settings.update(overrides)
    return TrainConfig(**settings)


@pytest.fixture(scope="module", autouse=True)
def guard_shipped_folders():
    """Fail any atomic write into data/ or runs/; keep the process's thread count as it was."""
    real = integrity.atomic_write
    threads = torch.get_num_threads()

    def guarded(path, *args, **kwargs):
        resolved = Path(path).resolve()
        for forbidden in FORBIDDEN:
            if resolved == forbidden or forbidden in resolved.parents:
                raise AssertionError(f"a test tried to write {resolved}")
        return real(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(integrity, "atomic_write", guarded)
        mp.setattr(train_mod, "record", _no_record)
        yield
    torch.set_num_threads(threads)


def _no_record(*paths, **kwargs):
    raise AssertionError(f"export recorded {paths} in a manifest although out_dir is not data/")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One uninterrupted run of STEPS steps, shared by several tests."""
    root = tmp_path_factory.mktemp("train")
    cfg = tiny_config(root, "full")
    metrics = train(cfg, poems=POEMS, progress=False)
    return cfg, metrics


def train_losses(cfg: TrainConfig) -> list[float]:
    log = json.loads((Path(cfg.out_dir) / f"{cfg.model}.log.json").read_text(encoding="utf-8"))
    return [row["train_loss"] for row in log["history"]]


# ---- a smoke run ----------------------------------------------------------------------------

def test_loss_falls(full_run):
    cfg, metrics = full_run
    losses = train_losses(cfg)
    assert len(losses) == STEPS
    last = sum(losses[-5:]) / 5
    print(f"\ntrain loss {losses[0]:.3f} -> {last:.3f} (mean of the last 5); val {metrics['val_loss_per_token']:.3f}")
    assert last < 0.5 * losses[0]
    assert metrics["val_loss_per_token"] < losses[0]
    assert metrics["steps"] == STEPS


def test_history_and_metrics(full_run):
    cfg, metrics = full_run
    log = json.loads((Path(cfg.out_dir) / "tang-char.log.json").read_text(encoding="utf-8"))
    history = log["history"]
    assert [row["step"] for row in history] == list(range(1, STEPS + 1))
    assert [row["step"] for row in history if "val_loss" in row] == [20, 40]
    assert [row["lr"] for row in history] == [lr_at(s, cfg) for s in range(STEPS)]
    assert log["metrics"] == metrics
    # A character tokenizer: one token per character, so nats per token = nats per character.
    assert metrics["val_nats_per_char"] == pytest.approx(metrics["val_loss_per_token"])


def test_files_are_written_only_where_asked(full_run):
    cfg, _ = full_run
    out, work = Path(cfg.out_dir), Path(cfg.work_dir)
    assert {"tang-char.pt", "tang-char.tokenizer.json", "tang-char.log.json", "tang-char.loss.png"} <= {
        p.name for p in out.iterdir()}
    assert (out / "tang-char.loss.png").read_bytes().startswith(b"\x89PNG")
    assert {"state.pt", "log.json", "tokenizer.json"} <= {p.name for p in work.iterdir()}
    assert not any(p.name.endswith(".tmp") for p in [*out.iterdir(), *work.iterdir()])
    assert not (out / integrity.MANIFEST_NAME).exists()


def test_exported_checkpoint_loads_with_weights_only(full_run):
    cfg, metrics = full_run
    out = Path(cfg.out_dir)
    ckpt = torch.load(out / "tang-char.pt", weights_only=True)
    assert ckpt["tokenizer"] == "tang-char.tokenizer.json"
    assert ckpt["metrics"] == metrics
    assert "out_dir" not in ckpt["train_config"] and "work_dir" not in ckpt["train_config"]
    assert ckpt["train_config"]["steps"] == STEPS

    tok = load_tokenizer(out / ckpt["tokenizer"])
    assert isinstance(tok, CharTokenizer)
    model = GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    assert model.config == GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=32)
    assert model.num_params() == metrics["params"]
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied after loading

    # The loaded model predicts the poem structure better than chance.
    ids = torch.tensor([tok.encode_corpus(POEMS[:4])])[:, :17]
    with torch.no_grad():
        _, loss = model.eval()(ids[:, :-1], targets=ids[:, 1:])
    assert loss.item() < torch.log(torch.tensor(float(tok.vocab_size))).item()


# ---- resuming -------------------------------------------------------------------------------

def test_resume_after_an_interruption_matches_an_uninterrupted_run(full_run, tmp_path, interrupt_training):
    full_cfg, full_metrics = full_run
    cfg = tiny_config(tmp_path, "resumed")
    interrupt_training(cfg, 20, POEMS)

    state = torch.load(Path(cfg.work_dir) / "state.pt", weights_only=False)
    assert state["step"] == 20 and len(state["history"]) == 20
    assert not (Path(cfg.out_dir) / "tang-char.pt").exists()

    metrics = train(cfg, resume=True, poems=POEMS, progress=False)
    assert metrics["steps"] == STEPS
    resumed, uninterrupted = train_losses(cfg), train_losses(full_cfg)
    assert len(resumed) == len(uninterrupted) == STEPS
    for a, b in zip(resumed, uninterrupted):
        assert a == pytest.approx(b, abs=1e-5)
    assert metrics["val_loss_per_token"] == pytest.approx(full_metrics["val_loss_per_token"], abs=1e-5)


def test_resume_needs_a_state_with_the_same_configuration(full_run, tmp_path):
    with pytest.raises(FileNotFoundError, match="state.pt"):
        train(tiny_config(tmp_path, "nothing"), resume=True, poems=POEMS, progress=False)
    full_cfg, _ = full_run
    other = tiny_config(tmp_path, "other", seed=8, work_dir=full_cfg.work_dir)
    with pytest.raises(ValueError, match="another configuration"):
        train(other, resume=True, poems=POEMS, progress=False)


# ---- pieces ---------------------------------------------------------------------------------

def test_lr_warms_up_linearly_then_follows_a_cosine_down_to_min_lr():
    cfg = TrainConfig(steps=110, warmup=10, lr=1.0, min_lr=0.1, out_dir="unused", work_dir="unused")
    warm = [lr_at(s, cfg) for s in range(10)]
    assert warm == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # halfway through the decay
    assert lr_at(110, cfg) == pytest.approx(0.1)
    assert lr_at(500, cfg) == pytest.approx(0.1)  # held at min_lr after the last step
    decay = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))
    assert max(lr_at(s, cfg) for s in range(200)) == pytest.approx(1.0)


def test_windows_are_non_overlapping_and_shifted_by_one():
    ids = torch.arange(50)
    x, y = windows(ids, 16)
    assert x.shape == y.shape == (3, 16)
    assert torch.equal(x.flatten(), torch.arange(48))
    assert torch.equal(y, x + 1)
    assert windows(torch.arange(17), 16)[0].shape == (1, 16)
    assert windows(torch.arange(16), 16)[0].shape == (0, 16)


def test_train_config_rejects_an_unknown_model():
    with pytest.raises(ValueError, match="tang-char"):
        TrainConfig(model="tang-word", out_dir="unused", work_dir="unused")


@pytest.mark.parametrize("name,shape", [("tang-char-gqa2", (2, 32, 32)), ("tang-char-mqa", (1, 32, 32)),
                                        ("tang-char-mla", (1, 16, 0))])
def test_a_smaller_cache_recipe_converts_tang_char_and_trains_on(tmp_path, name, shape):
    """Notebook 9's recipes start from the shipped tang-char, converted, and log where they started."""
    from kvlib.tools.loading import load_pretrained

    from kvlib.tools.corpus import load_poems

    poems = load_poems()[:400]
    cfg = train_mod.config_for(name, steps=2, batch_size=2, eval_every=1, eval_batches=1,
                               out_dir=str(tmp_path / "out"), work_dir=str(tmp_path / "run"))
    assert cfg.init_from == "tang-char" and cfg.steps == 2
    assert train_mod.config_for(name).steps == 200  # 5 % of tang-char's 4,000
    metrics = train_mod.train(cfg, poems=poems, progress=False)
    assert metrics["converted_from"] == "tang-char"
    log = json.loads((tmp_path / "out" / f"{name}.log.json").read_text())
    assert log["history"][0]["step"] == 0 and "val_loss" in log["history"][0]  # before any training
    ckpt = torch.load(tmp_path / "out" / f"{name}.pt", weights_only=True)
    cfg_out = GPTConfig(**ckpt["config"])
    assert cfg_out.cache_shape == shape and ckpt["tokenizer"] == "tang-char.tokenizer.json"
    base, _ = load_pretrained("tang-char")
    assert cfg_out.vocab_size == base.config.vocab_size


def test_init_from_needs_a_shared_tokenizer():
    with pytest.raises(ValueError, match="needs a model that shares its tokenizer"):
        train_mod.TrainConfig(model="tang-bpe", init_from="tang-char")
    with pytest.raises(ValueError, match="init_from must be"):
        train_mod.TrainConfig(model="tang-char-mqa", init_from="tang-bpe")


def test_resuming_a_state_whose_weights_are_another_models_is_refused_before_any_step(full_run, tmp_path):
    """A state whose settings say one shape and whose weights hold another (the weights of a run with two
    key/value heads fewer, say) is refused by name before a step runs; the state file is left as it was."""
    import shutil
    from dataclasses import replace

    full_cfg, _ = full_run
    work = tmp_path / "tampered"
    shutil.copytree(full_cfg.work_dir, work)
    state_path = work / "state.pt"
    state = torch.load(state_path, weights_only=True)
    key = "transformer.h.0.attn.c_attn.weight"
    state["model"][key] = state["model"][key][: 2 * 32]       # as if keys and values were gone
    state["step"] = 1                                       # unfinished, so resuming would train on
    torch.save(state, state_path)
    before = state_path.read_bytes()
    cfg = replace(full_cfg, work_dir=str(work), out_dir=str(tmp_path / "out"))
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        train(cfg, resume=True, poems=POEMS, progress=False)
    assert state_path.read_bytes() == before and not (tmp_path / "out" / "tang-char.pt").exists()


def test_resume_under_another_model_name_is_refused_naming_both(tmp_path, monkeypatch, capsys):
    from kvlib.tools import cli, training

    saved = training.config_for("tang-char-mqa")
    monkeypatch.setattr(training, "saved_config", lambda work_dir: saved)
    monkeypatch.setattr(Path, "exists", lambda self: True if self.name == "state.pt" else Path.is_file(self))
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "--model", "tang-char-gqa2", "--resume"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "tang-char-mqa" in err and "tang-char-gqa2" in err and "n_kv_head" in err
