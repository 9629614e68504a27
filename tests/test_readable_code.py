"""The library reads as the ideas it teaches: each idea under its public name, guards as one decorator pattern,
objects that talk through public interfaces, small modules, no import cycle, no checked and unchecked twins."""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvlib"
CORE = sorted(PACKAGE.glob("*.py"))
EVERY = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
CACHE_CLASSES = {"KVCache", "GrowingKVCache", "QuantizedKVCache", "EvictingCache", "SlidingWindowCache", "SinkCache",
                 "HeavyHitterCache", "PagedBatch", "PagedKVCache"}
# Underscore names that belong to another library's protocol, not to a kvlib object.
FOREIGN = {"_repr_mimebundle_",  # IPython's display protocol
           "_version",           # a tensor's in-place write counter (kvlib.weights)
           "_reorder_linear_weight", "_linear_pointwise",  # PyTorch's mkldnn operators (kvlib.fast)
           "_get_help_string"}   # argparse's formatter hook, through super()


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def test_no_module_reaches_into_another_objects_underscore_names():
    found = []
    for path in EVERY:
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                mine = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
                parent = isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super"
                if not (mine or parent or node.attr in FOREIGN):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "underscore names used across objects (make them public, or ask the object):\n" + "\n".join(found)


def test_no_core_module_decides_by_a_caches_class():
    """``isinstance`` on a concrete cache class only to refuse a wrong argument (``if not isinstance(...): raise``)."""
    found = []
    for path in CORE:
        module = tree(path)
        validating = {id(n) for f in ast.walk(module) if isinstance(f, ast.FunctionDef) and f.name.startswith("check_")
                      for n in ast.walk(f)}  # a check_* function may look at a cache to refuse it
        refusals = {id(n.test.operand) for n in ast.walk(module) if isinstance(n, ast.If)
                    and isinstance(n.test, ast.UnaryOp) and isinstance(n.test.op, ast.Not)
                    and len(n.body) == 1 and isinstance(n.body[0], ast.Raise)}
        for node in ast.walk(module):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and any(isinstance(c, ast.Name) and c.id in CACHE_CLASSES for c in ast.walk(node.args[1]))
                    and id(node) not in refusals):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and isinstance(node.args[0], ast.Attribute | ast.Name) and ast.unparse(node.args[0]).endswith("cache")
                    and id(node) not in validating):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "a cache is driven by its class, not by the Cache protocol:\n" + "\n".join(found)


def listed_objects() -> list[str]:
    """Every ``module:qualname`` that a notebook's saved output lists with ``show_source``."""
    import json

    names = set()
    for nb in sorted((ROOT / "notebooks").glob("0*.ipynb")):
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            for out in cell.get("outputs", []):
                names.update(re.findall(r'data-source="([^"]+)"', "".join(out.get("data", {}).get("text/html", ""))))
    return sorted(names)


def body_without_docstring(source: str) -> list[ast.stmt]:
    node = ast.parse(textwrap.dedent(source)).body[0]
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body


@pytest.mark.parametrize("name", listed_objects())
def test_every_listed_function_does_its_own_work(name):
    """A listing shows the idea: not a body that only takes a lock, snapshots state or hands over to a twin."""
    from kvlib.notebook.source import resolve

    obj = resolve(name)
    if inspect.isclass(obj):
        return
    body = body_without_docstring(inspect.getsource(obj))
    assert body, f"{name} has no body"
    only = body[0] if len(body) == 1 else None
    assert not isinstance(only, ast.With), f"{name}'s body is only a `with` block (a guard belongs in a decorator)"
    assert not isinstance(only, ast.Try), f"{name}'s body is only a try block (all-or-nothing belongs in a decorator)"
    if isinstance(only, ast.Return) and isinstance(only.value, ast.Call):
        callee = ast.unparse(only.value.func)
        assert not re.search(r"(^|\.)_\w+$", callee), f"{name} only hands over to {callee}"


def test_no_checked_and_unchecked_twins():
    names = [n.name for path in EVERY for n in ast.walk(tree(path)) if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    twins = [n for n in names if n.endswith("_unchecked") or n in ("_forward_own", "_reserved_batch", "_reserved")]
    assert not twins, f"checked/unchecked twins: {twins} (validate once, into an object, at the edge)"


def test_checks_is_small_and_generic():
    checks = (PACKAGE / "checks.py").read_text(encoding="utf-8")
    assert len(checks.splitlines()) <= 250, "kvlib/checks.py holds generic checks only; put contracts beside their owner"
    assert not re.search(r"^from \.(?!\s)", checks, re.M), "kvlib/checks.py imports nothing of kvlib"


CORE_LINES_BUDGET = 6_264  # the core's size when it was last reviewed: it may only shrink


def test_the_core_stays_within_its_budget():
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.glob("*.py"))
    assert lines < CORE_LINES_BUDGET, f"kvlib/*.py holds {lines:,} lines; a tool or a view belongs in tools/ or notebook/"


def test_banning_a_token_has_one_home():
    """Only ``sampling.ban`` (and ``only``) turn chosen tokens' scores to -inf; everything else calls them."""
    by_index = [f"{p.relative_to(ROOT)}:{i}" for p in EVERY
                for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                if re.search(r"\]\s*=\s*float\(\"-inf\"\)", line)]
    assert not by_index, f"ban tokens with kvlib.sampling.ban and a token mask: {by_index}"


def test_no_file_is_over_500_lines():
    long = {p.relative_to(ROOT).as_posix(): n for p in EVERY if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, f"split these by idea: {long}"


def imports_of(path: Path) -> set[str]:
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    module = tree(path)
    typing_only = {id(n) for i in ast.walk(module) if isinstance(i, ast.If) and ast.unparse(i.test) == "TYPE_CHECKING"
                   for n in ast.walk(i)}
    found = set()
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and node.level and id(node) not in typing_only:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            names = [f"{target}.{a.name}" for a in node.names] if not node.module else []
            found.update([target, *names])
    return found


def test_no_import_cycle_in_kvlib():
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in EVERY}
    graph = {m: {t for t in imports_of(p) if t in modules and t != m} for m, p in modules.items()}
    top = {m for m in graph if m.count(".") <= 1}  # a package __init__ importing its own modules is not a cycle
    for start in top:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start and not (start in ("kvlib", "kvlib.notebook", "kvlib.tools")):
                    pytest.fail(f"import cycle: {' -> '.join(path + [nxt])}")
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))


def test_model_py_installs_nothing_at_import():
    """The file a learner opens first defines the model; nothing in it runs at import but definitions."""
    module = tree(PACKAGE / "model.py")
    statements = [n for n in module.body if not isinstance(n, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef)
                  and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
                  and not isinstance(n, ast.Assign | ast.AnnAssign)]
    assert not statements, [ast.unparse(s)[:60] for s in statements]
