"""Fixtures of the tools' tests."""
import pytest


class TrainingInterrupted(Exception):
    """Raised inside a training step, as Ctrl-C would interrupt it."""


@pytest.fixture
def interrupt_training(monkeypatch):
    """``run(cfg, at, poems)``: train ``cfg`` until an exception at step ``at``, leaving its saved state."""
    from kvlib.tools import training

    def run(cfg, at: int, poems) -> None:
        real = training.lr_at

        def stop(step, c):
            if step == at:
                raise TrainingInterrupted
            return real(step, c)

        monkeypatch.setattr(training, "lr_at", stop)
        with pytest.raises(TrainingInterrupted):
            training.train(cfg, poems=poems, progress=False)
        monkeypatch.setattr(training, "lr_at", real)

    return run
