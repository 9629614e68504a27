"""Everything the notebooks put on screen: plots, fonts, and one widget module per notebook.

This is the only part of kvlib that imports matplotlib or ipywidgets; the ideas it shows live in the
core (``kvlib.*``), where tests reach them without a browser. Each notebook starts with :func:`setup`
and ends by printing :func:`rng_untouched`.
"""
from __future__ import annotations

import torch

_rng_at_setup: torch.Tensor | None = None


def setup(model: str = "tang-char", threads: int = 1):
    """A notebook's first cell: one thread, the CJK font, the global RNG noted, a shipped model loaded.

    Returns ``(model, tokenizer)`` (both sha256-checked). One thread is fastest for this model size;
    the RNG state is saved before anything else runs, so :func:`rng_untouched` can prove at the end
    that the notebook drew every random number from its own seeded generators.
    """
    global _rng_at_setup
    _rng_at_setup = torch.get_rng_state()
    torch.set_num_threads(threads)
    try:
        from ..tools.loading import load_pretrained
        from . import plots  # noqa: F401  registers the font

        return load_pretrained(model)
    except Exception as e:
        raise SetupFailed(e) from None


class SetupFailed(RuntimeError):
    """A notebook's set-up failed: Jupyter shows the error and the doctor's findings, not a traceback."""

    def __init__(self, error: Exception):
        super().__init__(f"{type(error).__name__}: {error}")

    def _render_traceback_(self) -> list[str]:  # IPython prints these lines instead of the traceback
        from ..tools import doctor

        return [f"The notebook's set-up failed: {self}", "",
                doctor.report(doctor.diagnose()), "", "(python -m kvlib doctor prints the same in a terminal)"]


def rng_untouched() -> bool:
    """Whether torch's global RNG is as :func:`setup` found it."""
    if _rng_at_setup is None:
        raise RuntimeError("call kvlib.notebook.setup() first: it records the RNG state to compare with")
    return torch.equal(torch.get_rng_state(), _rng_at_setup)


from .source import show_source  # noqa: E402  (re-exported: every notebook shows library code with it)
