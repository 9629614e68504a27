"""Safety and hygiene of the library and the notebooks.

- No ``eval``/``exec`` (nor ``compile``, ``__import__``, pickle, ``os.system``, ``shell=True``)
  anywhere in ``kvlib/`` or in the notebooks' code: text a person types is only ever tokenized.
- The library leaves torch's global RNG alone: every public call that samples takes a seed or a
  ``torch.Generator`` and draws from that; building a model inside the library forks the RNG.
- The notebooks neither seed nor draw from the global RNG outside ``torch.random.fork_rng()``
  (checked statically here), and each ends with a ``# NBVAL_CHECK_OUTPUT`` cell comparing
  ``torch.get_rng_state()`` with the state saved in its first cell, which nbval (and the browser
  test) execute.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
KVLIB_FILES = sorted((ROOT / "kvlib").rglob("*.py"))
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "os.system", "os.popen", "pickle.load", "pickle.loads",
                   "marshal.loads", "shelve.open", "builtins.eval", "builtins.exec"}
# Seeding the global RNG (restoring a saved state with set_rng_state is fine: it puts things back).
GLOBAL_SEEDING = {"torch.manual_seed", "torch.seed", "torch.random.manual_seed", "torch.random.seed",
                  "np.random.seed", "numpy.random.seed", "random.seed"}
GLOBAL_DRAWS = {"torch.randn", "torch.rand", "torch.randint", "torch.randperm", "torch.multinomial",
                "torch.normal", "torch.bernoulli", "torch.randn_like", "torch.rand_like", "torch.randint_like"}


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"{_name(func.value) or '?'}.{func.attr}"  # ?.eval for GPT(cfg).eval(): a method, not eval
    return ""


def notebook_code(path: Path) -> list[tuple[int, str]]:
    """(cell number, Python source) of each code cell, IPython magics and shell lines blanked out."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if src.lstrip().startswith("%%"):
            continue  # a cell magic: not Python
        lines = ["" if re.match(r"\s*[%!]", line) else line for line in src.splitlines()]
        cells.append((i, "\n".join(lines)))
    return cells


def sources() -> list[tuple[str, str]]:
    out = [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")) for p in KVLIB_FILES]
    for nb in NOTEBOOKS:
        out += [(f"{nb.relative_to(ROOT).as_posix()} cell {i}", src) for i, src in notebook_code(nb)]
    return out


def test_no_eval_exec_or_pickle_anywhere():
    found = []
    for where, src in sources():
        tree = ast.parse(src)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _name(node.func)
                if name in FORBIDDEN_CALLS:
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
                for kw in node.keywords:
                    if kw.arg == "shell" and isinstance(kw.value, ast.Constant) and kw.value.value:
                        found.append(f"{where}:{node.lineno}: shell=True")
    assert not found, "code that could run typed text:\n" + "\n".join(found)


def test_the_grep_agrees_no_eval_call_in_kvlib():
    """A plain-text cross-check of the AST test: no ``eval(`` or ``exec(`` call in the library."""
    pattern = re.compile(r"(?<![\w.])(eval|exec)\s*\(")
    hits = [f"{p.name}:{n}" for p in KVLIB_FILES for n, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line.split("#")[0])]
    assert not hits


# ---- the notebooks do not touch the global RNG -------------------------------------------------------

def _inside(node: ast.AST, parents: dict, *markers: str) -> bool:
    """Whether ``node`` sits in a ``with`` block whose context mentions one of ``markers``."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.With) and any(m in ast.unparse(item.context_expr) for item in node.items
                                              for m in markers):
            return True
    return False


def global_rng_uses(src: str) -> list[str]:
    """Calls that seed torch's global RNG, or draw from it without a generator, outside
    ``torch.random.fork_rng()`` (or a ``torch.device("meta")`` block, where nothing is drawn)."""
    tree = ast.parse(src)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        bad = name in GLOBAL_SEEDING or (name in GLOBAL_DRAWS and not any(k.arg == "generator" for k in node.keywords))
        if bad and not _inside(node, parents, "fork_rng", '"meta"', "'meta'"):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:70]}")
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_do_not_seed_or_draw_from_the_global_rng(notebook):
    found = [f"cell {i} {use}" for i, src in notebook_code(notebook) for use in global_rng_uses(src)]
    assert not found, (
        f"{notebook.name} seeds or draws from torch's global RNG; pass generator=torch.Generator()"
        ".manual_seed(...) or wrap it in `with torch.random.fork_rng(devices=[]):`\n" + "\n".join(found))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_start_with_setup_and_check_the_rng_at_the_end(notebook):
    """One set-up for every notebook: ``setup()`` saves ``torch.get_rng_state()`` before kvlib does anything;
    the last cell prints ``rng_untouched()`` (``# NBVAL_CHECK_OUTPUT``, so nbval fails if it prints False)."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"][1:]  # after the Colab cell (tests/test_run.py)
    first = "".join(code[0]["source"])
    calls = [line for line in first.splitlines() if re.search(r"\b(load_pretrained|GPT|generate|write|setup)\(", line)]
    assert calls and "setup(" in calls[0], f"{notebook.name}: the first code cell must call kvlib.notebook.setup() first"
    assert "RNG_AT_START" not in first and "set_num_threads" not in first, f"{notebook.name}: setup() does that"
    last = "".join(code[-1]["source"])
    assert "NBVAL_CHECK_OUTPUT" in last and "rng_untouched()" in last, \
        f"{notebook.name}: the last code cell must print rng_untouched()"
    printed = "".join("".join(o.get("text", "")) for o in code[-1].get("outputs", []))
    assert "global RNG untouched: True" in printed, f"{notebook.name}: committed output says {printed!r}"


def test_setup_is_the_one_copy_of_the_set_up():
    """No notebook repeats what setup() does (fork_rng around loading, thread counts, RNG bookkeeping)."""
    for notebook in NOTEBOOKS:
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        first = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
        assert "fork_rng" not in first, f"{notebook.name}: load_pretrained already keeps the global RNG"


def test_the_rng_check_itself_catches_and_excuses_what_it_should():
    assert global_rng_uses("torch.manual_seed(0)")
    assert global_rng_uses("x = torch.randn(3, 4)")
    assert not global_rng_uses("x = torch.randn(3, 4, generator=g)")
    assert not global_rng_uses("with torch.random.fork_rng(devices=[]):\n    torch.manual_seed(0)")
    assert not global_rng_uses('with torch.device("meta"):\n    x = torch.randn(3)')


# ---- the library leaves the global RNG alone -----------------------------------------------------------

LINES = ["床前看月光", "疑是地上霜", "举头望山月", "低头思故乡", "白日依山尽", "黄河入海流",
         "欲穷千里目", "更上一层楼", "春眠不觉晓", "处处闻啼鸟", "夜来风雨声", "花落知多少"]


@pytest.fixture(scope="module")
def tiny():
    from kvlib.model import GPT, GPTConfig
    from kvlib.tokenizer import CharTokenizer

    tok = CharTokenizer.train(["{}，{}。{}，{}。".format(*(LINES[(i + j) % 12] for j in range(4))) for i in range(24)])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=16)).eval()
    return model, tok


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _library_calls():
    from kvlib import constraints as constrain, decoding as generate, poems, verify
    from kvlib.tools import bench, loading

    calls = {
        "load_pretrained": lambda m, t: loading.load_pretrained("tang-char"),
        "peak_matmul_flops": lambda m, t: bench.peak_matmul_flops(n=64, min_run_time=0.01),
        "run_bench": lambda m, t: bench.run_bench(threads=(1,), progress=False, model=m, new_tokens=(4,), rounds=1,
                                                   max_seconds=0.1, peak_seconds=0.01, peak_n=64,
                                                   with_transformers=False, with_compiled=False),
        "generate": lambda m, t: generate.generate(m, torch.tensor([[0, 5, 6]]), 8, generator=_gen(), top_p=0.9),
        "generate_uncached": lambda m, t: generate.generate_uncached(m, torch.tensor([[0, 5]]), 8, block_size=64,
                                                                      generator=_gen(), top_k=5),
        "write (seed)": lambda m, t: poems.write(m, t, "春眠", 10, temperature=1.0, seed=3, n=2),
        "top_next": lambda m, t: poems.top_next(m, t, "春眠"),
        "acrostic (generator)": lambda m, t: constrain.acrostic(m, t, "春夜", 5, generator=_gen()),
        "quatrain (generator)": lambda m, t: constrain.quatrain(m, t, 5, generator=_gen()),
        "verify_cache": lambda m, t: verify.verify_cache(m, torch.tensor([[0, 5, 6]]), 8),
        "check_batch_consistency": lambda m, t: verify.check_batch_consistency(m, [[0, 5], [0, 6, 7, 8]], 4),
    }
    from kvlib import stepper
    from kvlib.notebook import acrostic_writer, cache_stepper, next_character, sampling_explorer

    calls.update({
        "next_view": lambda m, t: next_character.next_view(m, t, "春眠"),
        "explore": lambda m, t: sampling_explorer.explore(m, t, "春", 1.2, 5, 0.9, seed=4, n_chars=8),
        "acrostic_view": lambda m, t: acrostic_writer.acrostic_view(m, t, "春夜", 5, seed=2),
        "CacheStepper.run": lambda m, t: stepper.CacheStepper(m, t, "春", temperature=1.0).run(3),
        "StepperWidget Step": lambda m, t: cache_stepper.StepperWidget(m, t, "春").step_button.click(),
    })
    return calls


@pytest.mark.parametrize("name", list(_library_calls()))
def test_library_calls_leave_the_global_rng_alone(tiny, name):
    model, tok = tiny
    call = _library_calls()[name]
    before = torch.get_rng_state().clone()
    call(model, tok)
    assert torch.equal(torch.get_rng_state(), before), f"{name} changed torch.get_rng_state()"


def test_training_leaves_the_global_rng_and_threads_alone(tmp_path):
    from kvlib.tools.training import TrainConfig, train

    cfg = TrainConfig(steps=3, batch_size=2, block_size=8, n_layer=1, n_head=2, n_embd=16, warmup=1, eval_every=3,
                      eval_batches=1, save_every=3, seed=5, out_dir=str(tmp_path / "o"), work_dir=str(tmp_path / "w"))
    before, threads = torch.get_rng_state().clone(), torch.get_num_threads()
    train(cfg, poems=["{}，{}。".format(LINES[i % 12], LINES[(i + 1) % 12]) for i in range(40)], progress=False)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.get_num_threads() == threads


def saved_listings(notebook: Path) -> list[tuple[str, str]]:
    """(object name, listed source) of every ``show_source`` output saved in ``notebook``, unescaped."""
    import html

    listings = []
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for out in cell.get("outputs", []):
            page = "".join(out.get("data", {}).get("text/html", ""))
            listings += re.findall(r'<details data-source="([^"]+)".*?<pre[^>]*>(.*?)</pre></details>', page, re.S)
    return [(html.unescape(name), html.unescape(code)) for name, code in listings]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_source_listing_shown_is_the_installed_source(notebook):
    """What a learner reads is what runs: each saved ``show_source`` listing equals ``inspect.getsource`` now."""
    import inspect

    from kvlib.notebook.source import resolve

    listings = saved_listings(notebook)
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    shown = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert len(listings) >= shown.count("show_source("), f"{notebook.name}: run it again; a listing has no saved output"
    stale = [name for name, code in listings if code != inspect.getsource(resolve(name))]
    assert not stale, f"{notebook.name}: re-run it; these listings differ from the installed code: {stale}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_object_a_notebook_shows_is_public(notebook):
    """What a learner reads is the library's public surface: no listing of a private name."""
    from kvlib.notebook.source import resolve

    names = [name for name, _ in saved_listings(notebook)]
    private = [n for n in names if any(part.startswith("_") for part in re.split(r"[.:]", n))]
    assert not private, f"{notebook.name} shows private names: {private}; make them public or show the public caller"
    for name in names:
        resolve(name)  # exists


TIMING_CALLS = ("interleaved(", "run_spec_bench(", "run_serve_bench(", "run_bench(", "measure_update_latency(",
                "decode_steps(", "piece_costs(", "prefill_ms(")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_that_times_names_the_machine(notebook):
    """Times depend on the machine: a notebook that measures some prints which machine it measured on."""
    timing_cells = [i for i, src in notebook_code(notebook) if any(call in src for call in TIMING_CALLS)]
    if not timing_cells:
        return
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    printed = "".join("".join(out.get("text", "")) for cell in cells for out in cell.get("outputs", []))
    assert re.search(r"^machine: .+ CPU\(s\); torch ", printed, re.M), (
        f"{notebook.name} times something (cells {timing_cells}) but prints no 'machine: ' line "
        "(kvlib.tools.timing.describe_machine)")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_text_a_notebook_translates_has_its_english(notebook):
    """A saved run shows the English of every poem it prints with ``english()``: none lacks a translation."""
    from kvlib.notebook.english import NO_ENGLISH

    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    printed = "".join("".join(out.get("text", "")) for cell in cells for out in cell.get("outputs", []))
    assert NO_ENGLISH not in printed, (f"{notebook.name} printed a text without a stored translation: add it to "
                                       "kvlib.notebook.english.TRANSLATIONS (keyed to the exact text)")
