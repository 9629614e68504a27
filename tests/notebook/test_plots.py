import io
import warnings
from pathlib import Path

import pytest
from matplotlib import font_manager, rcParams
from matplotlib.ft2font import FT2Font

from kvlib.notebook import plots
from kvlib.tools.fonts import ASCII, EXTRA, FONT_FILE
from kvlib.tools.integrity import DATA_DIR, read_manifest, sha256_file, verified_path

PNG = b"\x89PNG"
LINE = "白日依山尽，黄河入海"
CHARS = list("无间多深流霜")
PROBS = [0.31, 0.22, 0.17, 0.12, 0.1, 0.08]


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def test_font_matches_manifest():
    path = verified_path(FONT_FILE)
    assert read_manifest()[FONT_FILE]["sha256"] == sha256_file(path)
    assert (DATA_DIR / "fonts" / "LICENSE-OFL.txt").read_text(encoding="utf-8").count("SIL OPEN FONT LICENSE") == 1


def test_font_is_registered_and_first():
    family = plots.use_cjk_font()
    assert plots.use_cjk_font() == family == "Noto Sans CJK SC"  # idempotent
    assert rcParams["font.sans-serif"][0] == family
    assert rcParams["font.size"] >= 12
    found = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
    # Ours, or the same family installed on this machine (fonts-noto-cjk): both draw every character ours has.
    assert Path(found) == verified_path(FONT_FILE) or "NotoSansCJK" in Path(found).name
    registered = [f for f in font_manager.fontManager.ttflist if Path(f.fname) == verified_path(FONT_FILE)]
    assert len(registered) == 1


def test_font_covers_test_text_ascii_and_symbols():
    cmap = FT2Font(str(verified_path(FONT_FILE))).get_charmap()
    missing = [c for c in LINE + "".join(CHARS) + ASCII + EXTRA if ord(c) not in cmap]
    assert missing in ([], ["✗"])  # ✗ is drawn from DejaVu Sans


def test_chinese_plots_render_without_warnings(tmp_path):
    history = [{"step": s, "train_loss": 8.0 - s / 100} for s in range(1, 301)]
    for row in history[49::50]:
        row["val_loss"] = row["train_loss"] + 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Glyph ... missing from font(s)" would fail here
        fig = plots.bar_top_k(CHARS, PROBS, title=f"{LINE} → ?", highlight={"流", "霜"})
        data = png_bytes(fig)
        path = plots.plot_loss_curve(history, tmp_path / "loss.png", title=f"{LINE}（训练 −1 ≤ 2 × 3°）")
    assert data.startswith(b"\x89PNG") and path.read_bytes().startswith(b"\x89PNG")


def test_bar_top_k_order_labels_and_colours():
    import torch

    probs = torch.tensor([0.05, 0.5, 0.2, 0.25])
    fig = plots.bar_top_k(["a", "\n", "\ue817", "流"], probs, highlight="流")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["⏎", "流", "U+E817", "a"]  # a private-use character of the corpus: no font draws it
    widths = [p.get_width() for p in ax.patches]
    assert widths == pytest.approx([50, 25, 20, 5])
    assert ax.yaxis_inverted()
    colours = [p.get_facecolor() for p in ax.patches]
    assert colours[1] != colours[0] == colours[2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        png_bytes(fig)


def test_bar_top_k_on_given_axes():
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    assert plots.bar_top_k(CHARS, PROBS, ax=ax) is fig
    with pytest.raises(ValueError):
        plots.bar_top_k(CHARS, PROBS[:3])


def test_panels_render_chinese_without_warnings_and_fit_a_720p_notebook():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.bar_panels([(list("春风"), [0.6, 0.4], "a"), (list("明月"), [0.5, 0.5], "b", "月"),
                                (list("白日"), [0.7, 0.3], "c")])
        assert len(fig.axes) == 3 and fig.get_figwidth() <= plots.MAX_WIDTH
        png_bytes(fig)


@pytest.mark.slow
def test_every_vocabulary_entry_is_drawn_or_shown_as_its_code_point(shipped_char):
    """The Noto subset and the two fallback subsets draw all but the few characters no free font has."""
    from kvlib.notebook.fonts import char_label, glyph_coverage

    _, tok = shipped_char
    drawn, missing = glyph_coverage(tok.itos[2:])
    assert drawn >= len(tok.itos) - 2 - 4 and len(missing) <= 4, missing  # 3 private-use points, 1 Extension G
    labels = [char_label(t) for t in tok.itos]
    assert all(char_label(c).startswith("U+") for c in missing)
    fig = plots.Figure(figsize=(8, 8))
    for i in range(0, len(labels), 100):  # every label, 100 to a line of text
        fig.text(0, i / len(labels), " ".join(labels[i:i + 100]), fontsize=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing glyph warns: that would be a box in the picture
        png_bytes(fig)
