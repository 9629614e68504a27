"""Training survives being killed: SIGKILL a tiny run mid-way (twice), resume it, and compare.

The run happens in a child process (``python -c``) on a dozen-line corpus in ``tmp_path``. The child
sleeps a little in every step (wrapping ``lr_at``; the numbers are untouched) so the kills land
mid-run whatever the machine's speed. After every kill the saved state must load with
``weights_only=True`` and be consistent; the resumed run's losses must equal those of an
uninterrupted run with the same seed to 1e-5.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from kvlib.tools.training import TrainConfig, train

LINES = ["床前看月光", "疑是地上霜", "举头望山月", "低头思故乡", "白日依山尽", "黄河入海流",
         "欲穷千里目", "更上一层楼", "春眠不觉晓", "处处闻啼鸟", "夜来风雨声", "花落知多少"]
POEMS = ["{}，{}。{}，{}。".format(*(LINES[(i * 5 + j * 7) % 12] for j in range(4))) for i in range(120)]
STEPS, SAVE_EVERY = 40, 4
CHILD = """
import json, sys, time
from kvlib.tools import training as T
cfg = T.TrainConfig(**json.load(open(sys.argv[1], encoding="utf-8")))
poems = json.load(open(sys.argv[2], encoding="utf-8"))
real = T.lr_at
def slow(step, c):
    time.sleep(0.05)  # slow the run down so that a kill lands mid-way; the numbers are unchanged
    return real(step, c)
T.lr_at = slow
T.train(cfg, resume=sys.argv[3] == "resume", poems=poems, progress=False)
print("finished")
"""


def config(root: Path, name: str) -> TrainConfig:
    return TrainConfig(model="tang-char", steps=STEPS, batch_size=4, block_size=16, n_layer=1, n_head=2,
                       n_embd=32, lr=1e-2, min_lr=1e-3, warmup=4, eval_every=10, eval_batches=2,
                       save_every=SAVE_EVERY, seed=11, threads=1,
                       out_dir=str(root / name / "out"), work_dir=str(root / name / "work"))


def saved_step(work: Path) -> int:
    """The step of the last checkpoint, read from the log written beside it (0 if none yet)."""
    try:
        history = json.loads((work / "log.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    return history[-1]["step"] if history else 0


def start(cfg_path: Path, poems_path: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(cfg_path), str(poems_path), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_after(proc: subprocess.Popen, work: Path, step: int, timeout: float = 120) -> int:
    """SIGKILL ``proc`` once a checkpoint at ``step`` or later is on disk; return the step seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = saved_step(work)
        if seen >= step:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            assert proc.returncode == -signal.SIGKILL
            return seen
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (status {proc.returncode}) before step {step}: {out}{err[-2000:]}")
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    pytest.fail(f"no checkpoint at step {step} within {timeout} s")


def check_state(work: Path) -> int:
    """The saved state loads with weights_only=True and agrees with itself; return its step."""
    state = torch.load(work / "state.pt", weights_only=True)
    step = state["step"]
    assert step % SAVE_EVERY == 0 and 0 < step < STEPS
    assert [row["step"] for row in state["history"]] == list(range(1, step + 1))
    assert set(state["model"]) and set(state["optimizer"]) == {"state", "param_groups"}
    assert isinstance(state["batch_rng"], torch.Tensor) and isinstance(state["torch_rng"], torch.Tensor)
    return step


def history(cfg: TrainConfig) -> list[dict]:
    return json.loads((Path(cfg.out_dir) / "tang-char.log.json").read_text(encoding="utf-8"))["history"]


@pytest.mark.slow
def test_sigkill_mid_training_then_resume_matches_an_uninterrupted_run(tmp_path):
    cfg = config(tmp_path, "killed")
    work = Path(cfg.work_dir)
    cfg_path, poems_path = tmp_path / "config.json", tmp_path / "poems.json"
    cfg_path.write_text(json.dumps(asdict(cfg)), encoding="utf-8")
    poems_path.write_text(json.dumps(POEMS, ensure_ascii=False), encoding="utf-8")

    # First run: killed after its second checkpoint.
    seen = kill_after(start(cfg_path, poems_path, "fresh"), work, 2 * SAVE_EVERY)
    first = check_state(work)
    assert first >= seen
    assert not (Path(cfg.out_dir) / "tang-char.pt").exists()  # nothing exported by a killed run

    # Resumed, and killed again further on.
    kill_after(start(cfg_path, poems_path, "resume"), work, first + 3 * SAVE_EVERY)
    second = check_state(work)
    assert second > first

    # Resumed to the end, in this process.
    assert train(cfg, resume=True, poems=POEMS, progress=False)["steps"] == STEPS
    assert not list(work.glob(".*.tmp")) and not list(Path(cfg.out_dir).glob(".*.tmp"))
    ckpt = torch.load(Path(cfg.out_dir) / "tang-char.pt", weights_only=True)
    assert ckpt["metrics"]["steps"] == STEPS

    # The same seed without interruption, in this process.
    reference = config(tmp_path, "uninterrupted")
    metrics = train(reference, poems=POEMS, progress=False)
    resumed, uninterrupted = history(cfg), history(reference)
    assert [r["step"] for r in resumed] == [r["step"] for r in uninterrupted] == list(range(1, STEPS + 1))
    for a, b in zip(resumed, uninterrupted):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5), a["step"]
        assert a["lr"] == b["lr"]
        assert ("val_loss" in a) == ("val_loss" in b)
        if "val_loss" in a:
            assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-5), a["step"]
    assert ckpt["metrics"]["val_loss_per_token"] == pytest.approx(metrics["val_loss_per_token"], abs=1e-5)
    reference_weights = torch.load(Path(reference.out_dir) / "tang-char.pt", weights_only=True)["model"]
    for name, tensor in ckpt["model"].items():
        torch.testing.assert_close(tensor, reference_weights[name], atol=1e-5, rtol=0)


def test_a_killed_write_leaves_the_previous_state_and_resume_clears_its_debris(tmp_path):
    """A crash inside the atomic write (simulated: the temporary file is left, the rename never
    happens) keeps the old state intact; resuming removes the half-written file."""
    cfg = config(tmp_path, "debris")
    cfg = TrainConfig(**{**asdict(cfg), "steps": 8})
    train(cfg, poems=POEMS, progress=False)
    work = Path(cfg.work_dir)
    before = (work / "state.pt").read_bytes()
    debris = work / ".state.pt.abc123.tmp"
    debris.write_bytes(before[: len(before) // 3])  # what SIGKILL mid-write leaves behind
    assert torch.load(work / "state.pt", weights_only=True)["step"] == 8
    train(TrainConfig(**{**asdict(cfg), "steps": 8}), resume=True, poems=POEMS, progress=False)
    assert not debris.exists()


# ---- never destroying state: fresh over unfinished, resume with other settings, divergence --------

def test_a_fresh_run_refuses_to_replace_an_unfinished_one_until_told(tmp_path, interrupt_training):
    from kvlib.tools.training import UnfinishedRunError

    cfg = TrainConfig(**{**asdict(config(tmp_path, "kept")), "steps": 12})
    interrupt_training(cfg, 9, POEMS)  # saved at step 8 (save_every 4)
    before = (Path(cfg.work_dir) / "state.pt").read_bytes()
    with pytest.raises(UnfinishedRunError, match=r"unfinished run \(step 8 of 12\).*--resume.*--restart"):
        train(cfg, poems=POEMS, progress=False)
    assert (Path(cfg.work_dir) / "state.pt").read_bytes() == before  # nothing was touched
    assert train(cfg, restart=True, poems=POEMS, progress=False)["steps"] == 12  # explicit: start over
    train(cfg, poems=POEMS, progress=False)  # a finished run may be replaced without a word


def test_resume_with_other_settings_lists_every_difference(tmp_path):
    cfg = TrainConfig(**{**asdict(config(tmp_path, "finished")), "steps": 6})
    train(cfg, poems=POEMS, progress=False)
    longer = TrainConfig(**{**asdict(cfg), "steps": 12, "n_embd": 16, "threads": 2})
    with pytest.raises(ValueError) as info:
        train(longer, resume=True, poems=POEMS, progress=False)
    message = str(info.value)
    assert "steps: 6 -> 12" in message and "n_embd: 32 -> 16" in message and "--restart" in message
    assert "threads" not in message  # the thread count may change between a run and its resumption
    same = TrainConfig(**{**asdict(cfg), "threads": 2})
    assert train(same, resume=True, poems=POEMS, progress=False)["steps"] == 6


def test_a_diverging_run_stops_and_exports_nothing(tmp_path, monkeypatch):
    from kvlib.tools import training

    cfg = TrainConfig(**{**asdict(config(tmp_path, "diverged")), "warmup": 0, "grad_clip": 1e30, "steps": 20})
    monkeypatch.setattr(training, "lr_at", lambda step, c: 1e9)  # past any learning rate a config accepts
    with pytest.raises(FloatingPointError, match=r"training stopped: the .* is (nan|inf|not finite) at step \d+"):
        train(cfg, poems=POEMS, progress=False)
    assert not (Path(cfg.out_dir) / "tang-char.pt").exists()
    state = Path(cfg.work_dir) / "state.pt"
    if state.exists():  # whatever was saved before the divergence holds finite weights only
        saved = torch.load(state, weights_only=True)
        assert all(bool(torch.isfinite(t).all()) for t in saved["model"].values())


def test_a_fresh_start_clears_what_a_killed_export_left(tmp_path):
    """SIGKILL inside the export's atomic write leaves ``.tang-char.pt.<random>.tmp`` in the output
    folder (simulated here); the next start, fresh or resumed, removes it and leaves other files alone."""
    cfg = TrainConfig(**{**asdict(config(tmp_path, "export")), "steps": 4})
    out, work = Path(cfg.out_dir), Path(cfg.work_dir)
    out.mkdir(parents=True)
    work.mkdir(parents=True)
    debris = [out / ".tang-char.pt.k1ll3d.tmp", out / ".tang-char.tokenizer.json.x_9.tmp", work / ".state.pt.ab.tmp"]
    for p in debris:
        p.write_bytes(b"\0" * 1000)
    other = out / ".tang-bpe.pt.abc.tmp"  # another model's write in the same folder: not ours to remove
    other.write_bytes(b"\0")
    train(cfg, poems=POEMS, progress=False)
    assert not any(p.exists() for p in debris) and other.exists()
