"""Every figure the notebooks show, drawn with the notebooks' own inputs, fits a 1280x720 projector.

``figure_checks.figure_problems`` fails a figure whose text boxes collide or leave the figure, whose
legend is small or covers data, or which is too big. Every public function of ``kvlib.notebook.plots``
(and every other figure builder of ``kvlib.notebook``) must have a case here: a new one without
a case fails ``test_every_figure_builder_is_drawn``.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch

import kvlib.notebook
from kvlib import constraints, encode_prompt, pad_prompts, probabilities, top_k_filter, top_p_filter, verify_cache
from kvlib.model import attention_mask, causal_mask
from kvlib.notebook import diagrams, plots
from kvlib.poems import top_next

from .figure_checks import MAX_HEIGHT, figure_problems

# Functions of plots.py that draw no figure of their own.
NOT_FIGURES = {
    "figure_png": "turns a figure into PNG bytes",
    "plot_loss_curve": "saves loss_curve_figure's figure as a PNG (test_loss_curve_png)",
}


# ---- the notebooks' inputs -------------------------------------------------------------------------

def _logits(model, tok, text):
    with torch.inference_mode():
        return model(torch.tensor([encode_prompt(tok, text)]))[0][:, -1]


def _bar_cases(model, tok):
    """notebooks 1, 2, 3: ``bar_panels`` as they call it (and one ``bar_top_k`` chart)."""
    tops = {text: top_next(model, tok, text, 8) for text in ["白日依山尽，黄河入海", "床前明月光，疑是地上", "春风"]}
    three = [(*zip(*pairs), f"「{text}」→ ?") for text, pairs in tops.items()]
    chars, ps = zip(*tops["春风"])
    corpus = (list("里。来雨起吹花动"), [0.21, 0.14, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03])

    logits = _logits(model, tok, "春风")
    top = probabilities(logits)[0].topk(10).indices
    chars10 = [tok.decode([i]) for i in top.tolist()]
    temperatures = [(chars10, probabilities(logits, t)[0, top], f"temperature {t}") for t in [0.3, 0.7, 1.0, 1.5]]

    top15 = probabilities(logits)[0].topk(15).indices
    chars15 = [tok.decode([i]) for i in top15.tolist()]
    filters = []
    for name, kept in [("top-k 5", top_k_filter(logits, 5)), ("top-p 0.1", top_p_filter(logits, 0.1)),
                       ("top-p 0.9", top_p_filter(logits, 0.9))]:
        kept = torch.isfinite(kept)[0]
        kept_chars = [c for c, k in zip(chars15, kept[top15]) if k]
        filters.append((chars15, probabilities(logits)[0, top15], f"{name}: keeps {int(kept.sum()):,}", kept_chars))

    bed = _logits(model, tok, "床前明月光")
    before = probabilities(bed)[0]
    banned = constraints.punctuation_mask(tok)
    after = probabilities(constraints.ban(bed, banned))[0]
    tb, ta = before.topk(10).indices, after.topk(10).indices
    labels = lambda ids: [tok.decode([i]) for i in ids.tolist()]  # noqa: E731
    banned_chars = [tok.decode([i]) for i in banned.nonzero()[:, 0].tolist()]
    long_titles = [(chars15, probabilities(logits, t)[0, top15], f"「床前明月光，疑是地上霜」at temperature {t}", "吹")
                   for t in (0.2, 0.5, 1.0, 2.0)]
    return {
        "bar_top_k": [lambda: plots.bar_top_k(chars, ps, title="「春风」→ ?", highlight="花")],
        "bar_panels": [
            lambda: plots.bar_panels(three),                                                   # notebook 1
            lambda: plots.bar_panels([(*corpus, "corpus: after 春风", "。"),
                                      (chars, ps, "model: 「春风」, no context", "。")]),      # notebook 1
            lambda: plots.bar_panels(temperatures, panel_width=3.6),                         # notebook 2
            lambda: plots.bar_panels(filters, panel_width=4.0),                              # notebook 2
            lambda: plots.bar_panels([(labels(tb), before[tb], "「床前明月光」→ ?", banned_chars),
                                      (labels(ta), after[ta], "punctuation banned")]),        # notebook 3
            lambda: plots.bar_panels(long_titles, title="four long titles, fifteen bars, a favourite near 100 %: "
                                                        "what the wrapping and the bar labels must absorb"),
        ],
    }


def _cache_cases(model, tok):
    """notebooks 4 and 6: token-forwards, masks, the cache check, the padded batch."""
    P = 16
    ns = list(range(1, model.config.block_size - P + 2))
    measured = {n: (n * P + n * (n - 1) // 2, P + n - 1) for n in (25, 50, 100)}
    prompt = torch.tensor([encode_prompt(tok, "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。")[:P]])
    report = verify_cache(model, prompt, 64, decoder="model")
    idx, key_mask = pad_prompts([encode_prompt(tok, t) for t in ["春风", "白日依山尽，", "床前看月光，疑是地上霜。"]],
                                pad_id=tok.eos_id)
    grid_labels = [[tok.decode([i]) for i in row] for row in idx.tolist()]
    T = idx.shape[1]
    full = attention_mask(T, T, key_mask)
    masks4 = {"prefill: 6 tokens, empty cache": causal_mask(6, 6), "decode: 1 new token after 6": causal_mask(1, 7),
              "chunk: 3 new tokens after 4": causal_mask(3, 7)}
    return {
        "plot_token_forwards": [lambda: plots.plot_token_forwards(
            ns, [n * P + n * (n - 1) // 2 for n in ns], [P + n - 1 for n in ns], P, measured)],
        "plot_masks": [
            lambda: plots.plot_masks(masks4, row_labels={"decode: 1 new token after 6": ["6"],
                                                         "chunk: 3 new tokens after 4": ["4", "5", "6"]}),
            lambda: plots.plot_masks({"row 0: 春风 after 10 pads": full[0, 0], "row 2: no padding": full[2, 0]},
                                     xlabel="key column", ylabel="query column"),
        ],
        "plot_cache_check": [lambda: plots.plot_cache_check(report)],
        "plot_token_grid": [lambda: plots.plot_token_grid(
            grid_labels, key_mask, title="left padding: every row's last real token in the last column")],
    }


# notebook 5's sweep and notebook 8's benchmark, as one run printed them
TIMES_MS = {"recompute": [28.9, 70.3, 195.4, 486.0], "cached (model + KVCache)": [27.9, 50.4, 99.1, 281.5],
            "cached (fast)": [8.0, 15.4, 30.3, 55.9]}
TIMING_SPEEDUPS = {"cached (model + KVCache)": [(1.0, 0.9, 1.2), (1.3, 1.2, 1.6), (2.0, 1.7, 2.3), (1.8, 1.5, 1.9)],
                   "cached (fast)": [(3.5, 2.8, 4.1), (4.4, 3.9, 5.2), (6.1, 5.6, 7.4), (8.8, 7.1, 10.4)]}
SPEC_ROWS = {
    "n-gram": [(1.23, 1.24, 1562), (1.25, 1.27, 2108), (1.33, 1.36, 3125), (1.33, 1.35, 2702),
               (1.33, 1.35, 2074), (1.33, 1.35, 2495), (1.33, 1.35, 2946), (1.33, 1.35, 3771)],
    "n-gram + lookup": [(1.28, 1.29, 1614), (1.33, 1.35, 1770), (1.39, 1.44, 2713), (1.42, 1.46, 2381),
                        (1.45, 1.47, 2786), (1.45, 1.48, 2554), (1.45, 1.48, 2077), (1.45, 1.48, 2232)],
    "neural": [(1.28, 1.29, 1920), (1.31, 1.33, 2150), (1.39, 1.43, 3476), (1.39, 1.41, 3315),
               (1.39, 1.41, 3927), (1.39, 1.41, 4109), (1.39, 1.41, 4778), (1.39, 1.41, 5430)],
}
SPEC_RESULTS = {name: [{"gamma": g, "tokens_per_full_round": t, "formula": f, "us_per_token": us}
                       for g, (t, f, us) in enumerate(rows, 1)] for name, rows in SPEC_ROWS.items()}
PLAIN_US = 1555.0
# notebook 9's table, as shrink_table returns it (the numbers of one run)
SHRINK_ROWS = [("full cache", 0.0, 0.0, ""), ("quantised", 0.688, 0.00001, "8-bit"), ("quantised", 0.812, 0.0011, "4-bit"),
               ("quantised", 0.875, 0.0288, "2-bit"), ("quantised", 0.583, 0.0007, "2-bit + float32 window"),
               ("evicted", 0.5, 0.023, "window"), ("evicted", 0.5, 0.0154, "sinks + window"),
               ("evicted", 0.492, 0.011, "H2O"), ("fewer heads", 0.5, 1.21, "GQA, pooled"),
               ("fewer heads", 0.5, 0.2, "GQA, trained"), ("fewer heads", 0.75, 1.7, "MQA, pooled"),
               ("fewer heads", 0.75, 0.4, "MQA, trained"), ("latent", 0.938, 0.64, "MLA, SVD"),
               ("latent", 0.938, 0.15, "MLA, trained")]
SHRINK_TABLE = {"texts": 50, "length": 48,
                "rows": [{"family": f, "memory_cut": c, "kl": k, "short": n} for f, c, k, n in SHRINK_ROWS]}
HISTORY = [{"step": s, "train_loss": 8.0 * 0.995**s + 3.2, "val_loss": 8.0 * 0.995**s + 3.3 if s % 250 == 0 else None}
           for s in range(1, 3001)]


@pytest.fixture(scope="module")
def cases(char):
    """Each figure function's name -> functions drawing the notebooks' figures with it."""
    model, tok = char
    return {
        **_bar_cases(model, tok),
        **_cache_cases(model, tok),
        "loss_curve_figure": [lambda: plots.loss_curve_figure(HISTORY, title="tang-char")],
        "plot_model": [lambda: diagrams.plot_model(model.config)],                                        # notebook 4
        "plot_timing": [lambda: plots.plot_timing([16, 32, 64, 120], TIMES_MS, baseline="recompute"),
                        lambda: plots.plot_timing([16, 32, 64, 120], TIMES_MS, baseline="recompute",
                                                  speedups=TIMING_SPEEDUPS)],                       # notebook 5
        "plot_cache_memory": [plots.plot_cache_memory,                                                 # notebook 5
                              lambda: plots.plot_cache_memory(dtype="float32", max_batch=64, highlight="Llama 3 8B")],
        "plot_speculation_sweep": [lambda: plots.plot_speculation_sweep(SPEC_RESULTS, PLAIN_US)],       # notebook 8
        "plot_cache_tradeoff": [lambda: plots.plot_cache_tradeoff(SHRINK_TABLE)],                      # notebook 9
    }


@pytest.fixture(scope="module")
def figures(cases):
    """Every case drawn once: ``"name[i]"`` -> Figure."""
    return {f"{name}[{i}]": build() for name, builders in cases.items() for i, build in enumerate(builders)}


# ---- the checks ----------------------------------------------------------------------------------

def _figure_builders() -> set[str]:
    """Public functions of plots.py, and public functions elsewhere in kvlib.notebook that build a Figure."""
    names = {name for name, f in vars(plots).items()
             if inspect.isfunction(f) and f.__module__ == plots.__name__ and not name.startswith("_")}
    for info in pkgutil.iter_modules(kvlib.notebook.__path__):
        module = importlib.import_module(f"kvlib.notebook.{info.name}")
        if module is plots:
            continue
        for name, f in vars(module).items():
            if (inspect.isfunction(f) and f.__module__ == module.__name__ and not name.startswith("_")
                    and "Figure(" in inspect.getsource(f)):
                names.add(name)
    return names - set(NOT_FIGURES)


def test_every_figure_builder_is_drawn(cases):
    missing = _figure_builders() - set(cases)
    assert not missing, f"figure functions without a case in {__name__}: {sorted(missing)}"
    assert not set(cases) - _figure_builders(), "a case for a function that is gone"


@pytest.mark.slow
def test_no_figure_has_colliding_or_escaping_text(figures, capsys):
    report = {name: figure_problems(fig) for name, fig in figures.items()}
    found = sum(len(p) for p in report.values())
    with capsys.disabled():
        print(f"\nfigure check: {found} problem(s) in {len(report)} figures")
    assert not found, "\n".join(f"{name}: {p}" for name, problems in report.items() for p in problems)


# Panels that compare one quantity against the same x: bar charts of probabilities, the cache check's
# steps, the timing's lengths, the speculation sweep's γ.
SHARED_X = ("bar_panels", "plot_cache_check", "plot_timing", "plot_speculation_sweep")


def test_compared_panels_share_their_x_axis(figures):
    checked = 0
    for name, fig in figures.items():
        if name.split("[")[0] in SHARED_X and len(fig.axes) > 1:
            first, *rest = fig.axes
            assert all(first.get_shared_x_axes().joined(first, ax) for ax in rest), name
            assert len({ax.get_xlim() for ax in fig.axes}) == 1, name
            checked += 1
    assert checked >= 8


def test_every_point_of_the_tradeoff_is_named_without_collisions():
    """Each setting's name beside its marker, even where markers crowd (one spot, several names)."""
    fig = plots.plot_cache_tradeoff(SHRINK_TABLE)
    names = [t.get_text() for t in fig.axes[0].texts]
    assert sorted(names) == sorted(n for *_, n in SHRINK_ROWS if n)
    crowded = {"texts": 3, "length": 8, "rows": [{"family": "evicted", "memory_cut": 0.5, "kl": 0.02, "short": f"name {i}"}
                                                 for i in range(5)]}
    fig = plots.plot_cache_tradeoff(crowded)
    assert len(fig.axes[0].texts) == 5 and figure_problems(fig) == []


def test_the_checker_finds_what_it_is_for():
    fig = plots.Figure(figsize=(6, MAX_HEIGHT + 1))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.set_title("a long title that runs into the next panel's title")
    ax2.set_title("the next panel's title")
    ax1.plot([0, 1], [0, 1], label="a line")
    ax1.legend(loc="center", fontsize=8)
    ax2.annotate("far away", (0.5, 0.5), xytext=(400, 0), textcoords="offset points")
    fig.text(0.7, 0.5, "on a panel")
    problems = "\n".join(figure_problems(fig))
    for fragment in ("tall", "overlaps axes 1 title", "at 8 pt", "legend covers", "leaves the figure",
                     "leaves its axes", "reaches into axes"):
        assert fragment in problems, (fragment, problems)
    assert figure_problems(plots.bar_top_k(list("春风"), [0.6, 0.4], title="ok")) == []


def test_loss_curve_png(tmp_path):
    path = plots.plot_loss_curve(HISTORY, tmp_path / "loss.png", title="tang-char")
    assert path.read_bytes().startswith(b"\x89PNG")
