"""The package's layout is its architecture: the ideas in the root, the notebook UI and the tools beside.

Imports flow one way. Core modules (``kvlib/*.py``) import neither matplotlib, ipywidgets nor IPython,
nor either subpackage, so a learner can read and run the ideas without a notebook. Tools import the
core (and draw the training loss curve through ``kvlib.notebook.plots``, inside the one function that
writes it); the notebook UI imports the core and the tools it needs (loading, integrity).
"""
from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvlib"
ENTRY_POINTS = {"__init__.py", "__main__.py"}  # the public face may gather from every role
CORE = sorted(p for p in PACKAGE.glob("*.py") if p.name not in ENTRY_POINTS)
TOOLS = sorted((PACKAGE / "tools").glob("*.py"))
UI_LIBRARIES = {"matplotlib", "ipywidgets", "IPython"}


def imports(path: Path, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``; relative imports resolved within kvlib."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            if node.module is None:  # "from . import plots": the names are modules
                found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return found


def test_the_three_roles_have_their_folders():
    assert CORE and TOOLS and list((PACKAGE / "notebook").glob("*.py"))
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")} == {"notebook", "tools"}


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_core_modules_import_no_ui_and_no_subpackage(path):
    bad = [f"line {n}: {m}" for n, m in imports(path)
           if m.split(".")[0] in UI_LIBRARIES or m.startswith(("kvlib.notebook", "kvlib.tools"))]
    assert not bad, f"kvlib/{path.name} is core: it may not import " + ", ".join(bad)


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: p.name)
def test_tools_load_no_ui_when_imported(path):
    """At import time a tool touches neither matplotlib nor ipywidgets nor the notebook package."""
    bad = [f"line {n}: {m}" for n, m in imports(path, top_level_only=True)
           if m.split(".")[0] in UI_LIBRARIES or m.startswith("kvlib.notebook")]
    assert not bad, f"kvlib/tools/{path.name} imports UI at module level: " + ", ".join(bad)


@pytest.mark.slow
def test_importing_the_core_loads_no_ui_library():
    """The same rule, observed: a fresh interpreter imports every core module and the public API."""
    names = ", ".join(f"kvlib.{p.stem}" for p in CORE)
    code = (f"import sys, kvlib, {names}\n"
            f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(UI_LIBRARIES)!r} "
            "or m.startswith('kvlib.notebook'))\n"
            "print(loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_public_api_is_functions_and_classes_not_modules():
    import kvlib

    for name in kvlib.__all__:
        obj = getattr(kvlib, name)
        assert inspect.isfunction(obj) or inspect.isclass(obj), f"kvlib.{name} is {type(obj).__name__}"
    assert inspect.isfunction(kvlib.generate)
    modules = {p.stem for p in PACKAGE.rglob("*.py")}
    assert not modules & set(kvlib.__all__), f"modules named like exports: {modules & set(kvlib.__all__)}"


def test_no_module_imports_a_private_name_from_another():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_one_exception_for_past_the_block_size():
    import kvlib
    from kvlib import cache

    errors = [name for name, obj in vars(cache).items()
              if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == cache.__name__]
    assert errors == ["ContextLimitError"] and issubclass(kvlib.ContextLimitError, ValueError)
    for path in sorted(PACKAGE.rglob("*.py")):
        assert "CacheOverflowError" not in path.read_text(encoding="utf-8"), path


def test_validation_helpers_follow_one_naming_scheme():
    from kvlib import checks

    helpers = [name for name, obj in vars(checks).items() if inspect.isfunction(obj) and obj.__module__ == checks.__name__
               and not name.startswith("_")]
    assert helpers and all(name.startswith("check_") or name == "describe" for name in helpers), helpers
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "def validate_" not in text and "def _validate" not in text, path


def test_the_readme_library_map_names_every_module():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py")
               if p.name != "__init__.py" and p.relative_to(PACKAGE).as_posix() not in readme]
    assert not missing, f"README's library map lacks: {missing}"


def test_the_notebook_catalog_lists_exactly_the_notebooks_and_the_docs_name_each():
    from kvlib.notebook import catalog

    on_disk = sorted(p.name for p in catalog.FOLDER.glob("[0-9][0-9]_*.ipynb"))
    assert sorted(nb.file for nb in catalog.NOTEBOOKS) == on_disk
    assert [nb.number for nb in catalog.NOTEBOOKS] == list(range(1, len(catalog.NOTEBOOKS) + 1))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    guide = (ROOT / "notebooks" / "TEACHING.md").read_text(encoding="utf-8")
    for nb in catalog.NOTEBOOKS:
        cells = json.loads(nb.path.read_text(encoding="utf-8"))["cells"]
        heading = "".join(cells[0]["source"]).splitlines()[0]
        assert heading == f"# {nb.number}. {nb.title}", f"{nb.file} starts with {heading!r}"
        assert f"`{nb.file}`" in readme, f"README's notebook table lacks {nb.file}"
        assert f"`{nb.file[:2]}`" in guide or nb.file in guide, f"TEACHING.md does not place {nb.file}"


def test_every_notebook_links_the_glossary_from_its_first_cell():
    from kvlib.notebook import catalog

    assert (catalog.FOLDER / "GLOSSARY.md").is_file()
    for nb in catalog.NOTEBOOKS:
        first = "".join(json.loads(nb.path.read_text(encoding="utf-8"))["cells"][0]["source"])
        assert "(GLOSSARY.md)" in first, f"{nb.file}: its first cell does not link the glossary"
