"""Diagrams for the notebooks: the whole model, drawn from its configuration (notebook 4)."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from .plots import MAX_WIDTH, SMALL
from .show import BAR_COLOR, HIGHLIGHT_COLOR
from .text_fit import set_title


def plot_model(config) -> Figure:
    """The whole model, drawn from its configuration: embedding, the blocks (norm, attention, norm, MLP, each
    with its residual), the final norm and the head; the attention row says what the KV cache keeps."""
    C, H, V = config.n_embd, config.n_head, config.vocab_size
    rows = [("token ids (B, T)", None),
            (f"embedding: wte[token] + wpe[position] → (B, T, {C})", None),
            ("LayerNorm (ln_1)", "block"),
            (f"attention: {H} heads of {C // H}; q, k, v from c_attn. The KV cache keeps k and v", "cache"),
            ("+ residual: x = x + attention", "block"),
            ("LayerNorm (ln_2)", "block"),
            (f"MLP: {C} → {4 * C} → {C}, exact GELU", "block"),
            ("+ residual: x = x + MLP", "block"),
            ("LayerNorm (ln_f)", None),
            (f"head (the embedding table again): {C} → {V:,} logits", None)]
    fig = Figure(figsize=(MAX_WIDTH, 5.9), layout="constrained")
    ax = fig.subplots()
    ax.set_xlim(0, 1)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.axis("off")
    for i, (label, kind) in enumerate(rows):
        face = HIGHLIGHT_COLOR if kind == "cache" else BAR_COLOR if kind == "block" else "#e8e8e8"
        ax.text(0.42, i, label, ha="center", va="center", fontsize=SMALL,
                bbox={"boxstyle": "round,pad=0.3", "facecolor": face, "edgecolor": "#555555"})
        if i:
            ax.add_patch(FancyArrowPatch((0.42, i - 0.62), (0.42, i - 0.38), arrowstyle="-|>", mutation_scale=10,
                                         color="#555555"))
    first = next(i for i, (_, kind) in enumerate(rows) if kind)
    last = max(i for i, (_, kind) in enumerate(rows) if kind)
    ax.add_patch(Rectangle((0.02, first - 0.45), 0.96, last - first + 0.9, fill=False, linestyle="--",
                           edgecolor="#555555"))
    ax.text(0.965, (first + last) / 2, f"× {config.n_layer}\nblocks", ha="right", va="center", fontsize=SMALL)
    set_title(ax, f"The whole model: {config.n_layer} blocks of {C} channels, {V:,} ids", MAX_WIDTH)
    return fig
