"""The library's own source on screen, folded: what a learner reads is what runs.

``show_source(generate)`` displays the installed source of each object, read with
``inspect.getsource`` when the cell runs, inside a folded ``<details>`` block that names the object
and its length: one click opens it, and a teacher presenting scrolls past a one-line summary
instead of a page of code. The plain-text copy of the output is the source itself. Each block
carries the object's full name in ``data-source``, so a test can compare the saved output with the
installed code.
"""
from __future__ import annotations

import html
import inspect

SUMMARY_STYLE = "cursor:pointer;font-size:16px;color:#1a5fa8"
CODE_STYLE = "font-size:var(--jp-code-font-size, 14px);line-height:1.4;margin:4px 0 8px 0;padding:6px 8px;background:#f6f8fa;overflow-x:auto"


def full_name(obj) -> str:
    """``module:qualname`` of a function, class or method: where the source comes from."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname:
        raise TypeError(f"show_source takes functions, classes and methods, got {obj!r:.80}")
    return f"{module}:{qualname}"


def resolve(name: str):
    """The object a ``module:qualname`` names (the inverse of :func:`full_name`)."""
    import importlib

    module, _, qualname = name.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class SourceListing:
    """The sources of some objects, shown folded in JupyterLab and as plain text elsewhere."""

    def __init__(self, objs, folded: bool = True):
        if not objs:
            raise TypeError("show_source needs at least one function, class or method")
        self.items = [(full_name(obj), inspect.getsource(obj)) for obj in objs]
        self.folded = folded

    def _repr_mimebundle_(self, include=None, exclude=None):
        blocks = []
        for name, source in self.items:
            lines = source.count("\n")
            shown = name.replace(":", ".")
            blocks.append(
                f'<details data-source="{html.escape(name)}"{"" if self.folded else " open"}>'
                f'<summary style="{SUMMARY_STYLE}">source of <code>{html.escape(shown)}</code> '
                f"({lines} lines)</summary>"
                f'<pre style="{CODE_STYLE}">{html.escape(source)}</pre></details>')
        return {"text/plain": "\n".join(source for _, source in self.items), "text/html": "".join(blocks)}


def show_source(*objs, folded: bool = True) -> None:
    """Display the installed source of each object, folded (``folded=False`` shows it open)."""
    from IPython.display import display

    display(SourceListing(objs, folded))
