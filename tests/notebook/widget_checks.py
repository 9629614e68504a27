"""A fit checker for widgets: what a widget puts on screen must fit 800 to 1920 px and read at 16 px.

``fit_problems(obj)`` takes a widget object of ``kvlib.notebook`` (anything with a ``widget`` box and a
``show()``), walks its ipywidgets tree and every HTML string it shows (its HTML widgets' values and the
static copy its ``show()`` leaves), and returns readable problems (empty when it fits):

- a fixed width (``width``, ``min-width``, ``max-width``, a flex basis, an SVG ``width``) above
  ``MAX_FIXED_PX`` in a ``Layout``, a style or the HTML;
- a row that does not wrap: an ``HBox`` (or a ``Box`` laid out in a row) without ``flex_flow: row
  wrap``, an HTML ``display:flex`` without ``flex-wrap: wrap`` (a column is fine);
- an SVG without a ``viewBox`` that scales it;
- a font size below ``MIN_FONT_PX`` anywhere: a ``font_size`` style, a CSS ``font-size`` (in a
  ``style`` attribute or a ``<style>`` element), an SVG ``font-size`` attribute; sizes in other units
  than px (``small``, ``0.8em``) are problems too, since they cannot be checked;
- the widget's outermost box without the class that :data:`kvlib.notebook.show.WIDGET_CSS` is scoped to.
"""
from __future__ import annotations

import re

from kvlib.notebook import show

MAX_FIXED_PX = 760            # JupyterLab's output area is about 690 px wide in an 800 px notebook
MIN_FONT_PX = 16

_PX = re.compile(r"(-?\d+(?:\.\d+)?)px")
_CSS_DECL = re.compile(r"(?<![\w-])(font-size|width|min-width|max-width|flex|flex-basis)\s*:\s*([^;\"'}]+)", re.I)
_SVG_ATTR = re.compile(r"<(svg|text)\b([^>]*)>", re.I)
_ATTR = re.compile(r"([\w:-]+)\s*=\s*\"([^\"]*)\"")
_STYLE_ATTR = re.compile(r"style\s*=\s*(\"([^\"]*)\"|'([^']*)')", re.I)
_STYLE_ELEMENT = re.compile(r"<style[^>]*>(.*?)</style>", re.I | re.S)


def _font_problem(where: str, value: str) -> str | None:
    sizes = [float(x) for x in _PX.findall(value)]
    if not sizes:
        return f"{where}: font size {value!r} is not in px, so it cannot be checked against {MIN_FONT_PX} px"
    if min(sizes) < MIN_FONT_PX:
        return f"{where}: font size {value!r} is below {MIN_FONT_PX} px"
    return None


def _width_problem(where: str, prop: str, value: str) -> str | None:
    if prop.lower() == "flex":  # "1 1 320px": the basis
        value = value.split()[-1] if value.split() else value
    wide = [float(x) for x in _PX.findall(value) if float(x) > MAX_FIXED_PX]
    if wide:
        return f"{where}: {prop} {value!r} is wider than {MAX_FIXED_PX} px"
    return None


def css_problems(css: str, where: str) -> list[str]:
    """Font sizes and widths in CSS declarations (a style attribute or a style sheet)."""
    problems = []
    for prop, value in _CSS_DECL.findall(css):
        value = value.strip()
        if prop.lower() == "font-size":
            problems.append(_font_problem(where, value))
        else:
            problems.append(_width_problem(where, prop, value))
    return [p for p in problems if p]


def _flex_problems(style: str, where: str) -> list[str]:
    decls = {k.strip().lower(): v.strip().lower() for k, _, v in
             (d.partition(":") for d in style.split(";")) if k.strip()}
    if decls.get("display") not in ("flex", "inline-flex"):
        return []
    direction = decls.get("flex-direction", "") + " " + decls.get("flex-flow", "")
    wraps = "wrap" in decls.get("flex-wrap", "") + decls.get("flex-flow", "") and \
        "nowrap" not in decls.get("flex-wrap", "") + decls.get("flex-flow", "")
    if "column" in direction or wraps:
        return []
    return [f"{where}: a flex row that does not wrap: {style[:120]!r}"]


def html_problems(text: str, where: str = "html") -> list[str]:
    """Everything ``fit_problems`` checks, in one HTML string."""
    problems = []
    for css in _STYLE_ELEMENT.findall(text):
        problems += css_problems(css, f"{where} <style>")
    for match in _STYLE_ATTR.finditer(text):
        style = match.group(2) if match.group(2) is not None else match.group(3)
        problems += css_problems(style, f"{where} style")
        problems += _flex_problems(style, where)
    for tag, attrs in _SVG_ATTR.findall(text):
        values = dict(_ATTR.findall(attrs))
        if "font-size" in values:
            p = _font_problem(f"{where} <{tag}>", values["font-size"] + "px")
            problems += [p] if p else []
        if tag.lower() == "svg":
            width = values.get("width", "")
            if width and not width.endswith("%") and float(width.rstrip("px") or 0) > MAX_FIXED_PX:
                problems.append(f"{where} <svg>: width {width} is wider than {MAX_FIXED_PX} px")
            if "viewBox" not in values:
                problems.append(f"{where} <svg>: no viewBox, so it cannot scale to a narrow screen")
    return problems


def widget_tree(widget) -> list:
    """``widget`` and every widget inside it, outermost first."""
    found, todo = [], [widget]
    while todo:
        w = todo.pop(0)
        found.append(w)
        todo += list(getattr(w, "children", ()) or ())
    return found


def _layout_problems(w, where: str) -> list[str]:
    import ipywidgets as widgets

    problems = []
    layout = w.layout
    for prop in ("width", "min_width", "max_width", "flex"):
        value = getattr(layout, prop, None)
        if value:
            p = _width_problem(where, prop.replace("_", "-"), str(value))
            problems += [p] if p else []
    if isinstance(w, widgets.Box) and not isinstance(w, widgets.VBox):
        flow = (layout.flex_flow or "").lower()
        column = "column" in flow
        if not column and ("wrap" not in flow or "nowrap" in flow):
            problems.append(f"{where}: a row of {len(w.children)} widgets that does not wrap "
                            f"(flex_flow {layout.flex_flow!r})")
    style = getattr(w, "style", None)
    if style is not None:
        for key in ("font_size",):
            value = getattr(style, key, None) if key in style.keys else None
            if value:
                p = _font_problem(f"{where} style.{key}", str(value))
                problems += [p] if p else []
        for key in ("description_width", "button_width"):
            value = getattr(style, key, None) if key in style.keys else None
            if value:
                p = _width_problem(f"{where} style", key, str(value))
                problems += [p] if p else []
    return problems


def static_copy(obj) -> str:
    """The HTML a reader without a kernel sees: what ``obj.show()`` displays, as its text/html."""
    import importlib

    module = importlib.import_module(type(obj).__module__)
    shown = []
    real = getattr(module, "display", None)
    module.display = lambda *objs: shown.extend(objs)
    try:
        returned = obj.show()
    finally:
        if real is None:
            del module.display
        else:
            module.display = real
    live = returned if returned is not None else shown[-1]
    return live._repr_mimebundle_()["text/html"]


def fit_problems(obj) -> list[str]:
    """Every way ``obj`` (a widget object of kvlib.notebook, in its current state) fails to fit."""
    import ipywidgets as widgets

    root = obj.widget
    problems = []
    if show.WIDGET_CLASS not in root._dom_classes:
        problems.append(f"the outermost box lacks the class {show.WIDGET_CLASS!r}: its controls keep "
                        f"JupyterLab's 13 px text")
    styles = [w.value for w in widget_tree(root) if isinstance(w, widgets.HTML) and "<style" in w.value]
    if not styles:
        problems.append("no <style> element inside the widget: sliders and menus keep 13 px text")
    for i, w in enumerate(widget_tree(root)):
        where = f"{type(w).__name__}[{i}]" + (f" {w.description!r}" if getattr(w, "description", "") else "")
        problems += _layout_problems(w, where)
        if isinstance(w, (widgets.HTML, widgets.HTMLMath)):
            problems += html_problems(w.value, where)
    problems += html_problems(static_copy(obj), "static copy")
    return problems


def font_sizes(obj) -> list[float]:
    """Every font size in px that ``obj`` (and its static copy) sets, for reports."""
    import ipywidgets as widgets

    texts = [w.value for w in widget_tree(obj.widget) if isinstance(w, widgets.HTML)] + [static_copy(obj)]
    sizes = []
    for text in texts:
        for prop, value in _CSS_DECL.findall(text):
            if prop.lower() == "font-size":
                sizes += [float(x) for x in _PX.findall(value)]
        for tag, attrs in _SVG_ATTR.findall(text):
            values = dict(_ATTR.findall(attrs))
            if "font-size" in values:
                sizes.append(float(values["font-size"]))
    for w in widget_tree(obj.widget):
        style = getattr(w, "style", None)
        if style is not None and "font_size" in style.keys and style.font_size:
            sizes += [float(x) for x in _PX.findall(style.font_size)]
    return sizes


def assert_fits(obj) -> None:
    problems = fit_problems(obj)
    assert not problems, f"{type(obj).__name__} does not fit:\n  " + "\n  ".join(problems)
