"""A figure checker for a projector: text that collides, leaves the figure, or is too small; figures too big.

``figure_problems(fig)`` lays out and draws a ``Figure`` with the Agg renderer and returns a list of readable
problems (empty when the figure is fine):

- two text boxes overlap (titles, suptitle, axis labels, tick labels, annotations and bar labels,
  legends), including two tick labels of one axis;
- a text box or legend reaches into the plotting area of another panel;
- an annotation (``ax.text``, ``ax.annotate``, ``bar_label``) leaves its own axes;
- a box leaves the figure;
- a legend covers a drawn point or line of its own axes;
- the figure is taller than ``MAX_HEIGHT`` or wider than ``MAX_WIDTH`` inches;
- a legend's text is below ``MIN_LEGEND_PT``, any text below ``MIN_TEXT_PT`` points.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from kvlib.notebook import plots
from kvlib.notebook.fonts import FONT_SIZE

MAX_HEIGHT = 6.2            # inches at 100 dpi: what a 1280x720 notebook view shows without scrolling
MAX_WIDTH = plots.MAX_WIDTH  # inches: JupyterLab's output area at 1280 px
MIN_LEGEND_PT = 12
MIN_TEXT_PT = FONT_SIZE - 2
TOLERANCE = 0.5             # pixels: boxes that only touch do not collide


@dataclass
class Box:
    what: str          # a readable name: "axes 1 title 'greedy margins'"
    group: str         # boxes of one group never collide with each other (a legend's parts)
    axes: Axes | None  # the panel the box belongs to (None: the figure)
    bbox: Bbox
    inside_axes: bool = False  # an annotation: must stay inside its axes


def _overlap(a: Bbox, b: Bbox, tol: float = TOLERANCE) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > tol) and (min(a.y1, b.y1) - max(a.y0, b.y0) > tol)


def _inside(inner: Bbox, outer: Bbox, tol: float = 1.0) -> bool:
    return (inner.x0 >= outer.x0 - tol and inner.y0 >= outer.y0 - tol
            and inner.x1 <= outer.x1 + tol and inner.y1 <= outer.y1 + tol)


def _shown(text: Text | None) -> bool:
    return text is not None and text.get_visible() and bool(text.get_text().strip())


def _label(text: Text) -> str:
    s = text.get_text().replace("\n", " ")
    return repr(s if len(s) <= 40 else s[:37] + "...")


def _drawn_tick_labels(axis) -> list[Text]:
    """The tick labels the axis actually draws (ticks inside the view, labels switched on, not empty)."""
    labels = []
    for tick in axis._update_ticks():  # the ticks within the view interval, as Axis.draw picks them
        for label in (tick.label1, tick.label2):
            if _shown(label):
                labels.append(label)
    return labels


def text_boxes(fig: Figure, renderer) -> tuple[list[Box], list[Text]]:
    """Every visible text box of ``fig`` (a legend counts as one box), and every visible Text artist."""
    boxes, texts = [], []

    def add(text, what, group, axes=None, inside_axes=False):
        if _shown(text):
            texts.append(text)
            boxes.append(Box(f"{what} {_label(text)}", group, axes, text.get_window_extent(renderer), inside_axes))

    def add_legend(legend: Legend, name: str, axes):
        if legend is None or not legend.get_visible():
            return
        texts.extend(t for t in legend.get_texts() if _shown(t))
        if _shown(legend.get_title()):
            texts.append(legend.get_title())
        boxes.append(Box(name, name, axes, legend.get_window_extent(renderer)))

    add(fig._suptitle, "suptitle", "suptitle")
    add(fig._supxlabel, "supxlabel", "supxlabel")
    add(fig._supylabel, "supylabel", "supylabel")
    for i, text in enumerate(fig.texts):
        if text not in (fig._suptitle, fig._supxlabel, fig._supylabel):  # those are in fig.texts too
            add(text, f"figure text {i}", f"figure text {i}")
    for i, legend in enumerate(fig.legends):
        add_legend(legend, f"figure legend {i}", None)
    for n, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        name = f"axes {n}"
        for where, title in (("title", ax.title), ("left title", ax._left_title), ("right title", ax._right_title)):
            add(title, f"{name} {where}", f"{name} {where}", ax)
        for axis_name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if not axis.get_visible():
                continue
            add(axis.label, f"{name} {axis_name}label", f"{name} {axis_name}label", ax)
            add(axis.get_offset_text(), f"{name} {axis_name} offset", f"{name} {axis_name} offset", ax)
            for j, label in enumerate(_drawn_tick_labels(axis)):
                add(label, f"{name} {axis_name} tick", f"{name} {axis_name} tick {j}", ax)
        for j, text in enumerate(ax.texts):
            add(text, f"{name} text", f"{name} text {j}", ax, inside_axes=True)
        add_legend(ax.get_legend(), f"{name} legend", ax)
    return boxes, texts


def _data_points(ax: Axes) -> np.ndarray:
    """Display coordinates of what an axes draws: line vertices and points along line segments, bar corners."""
    points = []
    for line in ax.lines:
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(line.get_xydata())
        xy = xy[np.isfinite(xy).all(1)]
        if len(xy) == 0:
            continue
        if line.get_linestyle() not in ("None", "", " ") and len(xy) > 1:
            steps = np.linspace(0, 1, 25)[:, None, None]
            xy = (xy[:-1][None] * (1 - steps) + xy[1:][None] * steps).reshape(-1, 2)
        points.append(xy)
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_visible():
            bb = patch.get_window_extent()
            points.append(np.array([[bb.x1, (bb.y0 + bb.y1) / 2], [bb.x0, (bb.y0 + bb.y1) / 2],
                                    [(bb.x0 + bb.x1) / 2, bb.y1], [(bb.x0 + bb.x1) / 2, bb.y0]]))
    if not points:
        return np.empty((0, 2))
    xy = np.concatenate(points)
    box = ax.bbox
    keep = (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0) & (xy[:, 1] <= box.y1)
    return xy[keep]


def figure_problems(fig: Figure) -> list[str]:
    """What is wrong with ``fig`` on a projector; an empty list when nothing is."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()  # the layout and every artist's position, without painting pixels
    problems = []
    width, height = fig.get_size_inches()
    if height > MAX_HEIGHT + 1e-9:
        problems.append(f"figure {height:.2f} in tall (at most {MAX_HEIGHT})")
    if width > MAX_WIDTH + 1e-9:
        problems.append(f"figure {width:.2f} in wide (at most {MAX_WIDTH})")

    boxes, texts = text_boxes(fig, renderer)
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    in_legends = {id(t) for legend in legends for t in [*legend.get_texts(), legend.get_title()]}
    for text in texts:
        if id(text) not in in_legends and text.get_fontsize() < MIN_TEXT_PT - 1e-9:
            problems.append(f"{_label(text)} at {text.get_fontsize():g} pt (at least {MIN_TEXT_PT})")
    for legend in legends:
        for text in [*legend.get_texts(), legend.get_title()]:
            if _shown(text) and text.get_fontsize() < MIN_LEGEND_PT - 1e-9:
                problems.append(f"legend text {_label(text)} at {text.get_fontsize():g} pt "
                                f"(at least {MIN_LEGEND_PT})")

    fig_box = fig.bbox
    for box in boxes:
        if not _inside(box.bbox, fig_box):
            problems.append(f"{box.what} leaves the figure")
        if box.inside_axes and not _inside(box.bbox, box.axes.bbox):
            problems.append(f"{box.what} leaves its axes")
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if a.group != b.group and _overlap(a.bbox, b.bbox):
                problems.append(f"{a.what} overlaps {b.what}")
    axes = [ax for ax in fig.axes if ax.get_visible()]
    for box in boxes:  # a box of one panel (or of the figure) inside another panel's plotting area
        for ax in axes:
            if ax is not box.axes and _overlap(box.bbox, ax.bbox):
                problems.append(f"{box.what} reaches into axes {fig.axes.index(ax)}")
    for n, ax in enumerate(axes):  # a legend on top of its own data
        legend = ax.get_legend()
        if legend is None or not legend.get_visible():
            continue
        bb = legend.get_window_extent(renderer)
        xy = _data_points(ax)
        covered = (xy[:, 0] > bb.x0) & (xy[:, 0] < bb.x1) & (xy[:, 1] > bb.y0) & (xy[:, 1] < bb.y1)
        if covered.any():
            problems.append(f"axes {fig.axes.index(ax)} legend covers {int(covered.sum())} drawn point(s)")
    return problems
