"""Charts drawn on the server as SVG text: curves, the divergence map, the lineage tree.

Every piece of text that goes into the SVG is escaped here; the templates include the
result as markup. No script runs to draw them, so the certificate can embed them; the
pages draw their line charts again with uPlot (static/charts.js) from a chart's `data`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

# Ten colours told apart in print and by most colour-blind readers, and dash patterns cycled
# at another period, so no two of the first 30 series look alike and a line drawn exactly over
# another still shows it through its gaps.
PALETTE = (
    "#1f4e96", "#c2410c", "#15803d", "#7e22ce", "#0e7490",
    "#a16207", "#be123c", "#4d7c0f", "#475569", "#9333ea",
)  # fmt: skip
DASHES = ("", "7 4", "2 3", "10 3 2 3", "4 2", "1 4")
# Points per series that carry a hover value; longer series show every k-th and the last.
MAX_HOVER_POINTS = 200


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False
    # Other x values of the same points (e.g. "step" beside "epoch"), one per point.
    other_x: Mapping[str, Sequence[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Chart:
    """A line chart as a page shows it: the SVG drawn here (what the certificate embeds,
    and what shows until the page's script draws the interactive chart), and `data`, what
    that script draws from (JSON: finite numbers only)."""

    svg: str
    data: dict[str, Any]


def chart(series: Sequence[Series], *, title: str, x_label: str = "epoch") -> Chart | None:
    """The chart of these series, None when nothing is to be drawn."""
    drawn = line_chart(series, title=title, x_label=x_label)
    if not drawn:
        return None
    extra = sorted({k for s in series for k in s.other_x})
    data_series = []
    for s in series:
        kept = [i for i, (x, y) in enumerate(s.points) if math.isfinite(x) and math.isfinite(y)]
        xs = {x_label: [s.points[i][0] for i in kept]}
        xs.update({k: [s.other_x[k][i] for i in kept] for k in extra if k in s.other_x})
        ys = [s.points[i][1] for i in kept]
        data_series.append({"label": s.name, "dashed": s.dashed, "x": xs, "y": ys})
    return Chart(drawn, {"title": title, "xs": [x_label, *extra], "series": data_series})


def _style(i: int, series: Series) -> tuple[str, str]:
    """(colour, ' stroke-dasharray=...' or '') of the i-th series drawn."""
    dash = DASHES[i % len(DASHES)] or ("5 3" if series.dashed else "")
    return PALETTE[i % len(PALETTE)], f' stroke-dasharray="{dash}"' if dash else ""


def _hover_points(
    s: Series, colour: str, at: Callable[[float, float], str], what: str, x_label: str
) -> list[str]:
    """Invisible targets over the points; hovering one shows run, x and value."""
    points = [(x, y) for x, y in s.points if math.isfinite(y)]
    step = max(1, math.ceil(len(points) / MAX_HOVER_POINTS))
    shown = points[::step] + ([points[-1]] if (len(points) - 1) % step else [])
    name = "" if s.name == what else f"{_e(s.name)} · "
    return [
        f'<circle class="point" {at(x, y)} r="4" fill="{colour}" fill-opacity="0">'
        f"<title>{name}{_e(x_label)} {_fmt(x)} · {_e(what)} {y:.6g}</title></circle>"
        for x, y in shown
    ]


def _legend(
    drawn: Sequence[Series], *, x: int, y: int, width: int, below: bool
) -> tuple[list[str], int]:
    """The legend's parts and the height it adds below the chart (0 when it sits inside)."""
    columns = max(1, (width - x) // 150) if below else 1
    parts = []
    for i, s in enumerate(drawn):
        colour, dash = _style(i, s)
        lx = x + (i % columns) * 150 if below else width - 162
        ly = y + 14 * (i // columns)
        parts.append(
            f'<g class="legend-entry"><line x1="{lx}" y1="{ly - 4}" x2="{lx + 22}" y2="{ly - 4}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
            f'<text x="{lx + 26}" y="{ly}">{_e(s.name)}</text></g>'
        )
    rows = math.ceil(len(drawn) / columns)
    return parts, (14 * rows + 6 if below else 0)


def line_chart(
    series: Sequence[Series], *, title: str, x_label: str = "epoch", width: int = 520,
    height: int = 220,
) -> str:  # fmt: skip
    """Lines over a shared x axis, with min/max ticks, a legend (below the plot past three
    series) and the value of each point on hover; '' when nothing to draw."""
    drawn = [s for s in series if s.points]
    values = [(x, y) for s in drawn for x, y in s.points if math.isfinite(y)]
    if not values:
        return ""
    left, right, top, bottom = 56, 12, 24, 34
    xs, ys = [x for x, _ in values], [y for _, y in values]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - abs(y0 or 1) * 0.05, y1 + abs(y1 or 1) * 0.05
    plot_w, plot_h = width - left - right, height - top - bottom
    below = len(drawn) > 3
    legend, extra = _legend(drawn, x=left, y=height + 8 if below else top + 12, width=width - right,
                            below=below)  # fmt: skip
    total = height + extra

    def xy(x: float, y: float) -> tuple[float, float]:
        return left + (x - x0) / (x1 - x0) * plot_w, top + (1 - (y - y0) / (y1 - y0)) * plot_h

    def at(x: float, y: float) -> str:
        px, py = xy(x, y)
        return f'cx="{px:.1f}" cy="{py:.1f}"'

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{total}" viewBox="0 0 {width} {total}" role="img" '
        f'aria-label="{_e(title)}">',
        f"<title>{_e(title)}</title>",
        f'<text x="{left}" y="15" font-weight="600">{_e(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="#9aa3b2"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#9aa3b2"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_fmt(y1)}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">{_fmt(y0)}</text>',
        f'<text x="{left}" y="{height - 8}">{_fmt(x0)}</text>',
        f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end">{_fmt(x1)}</text>',
        f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">{_e(x_label)}</text>',
    ]
    for i, s in enumerate(drawn):
        colour, dash = _style(i, s)
        finite = [(x, y) for x, y in s.points if math.isfinite(y)]
        points = " ".join("{:.1f},{:.1f}".format(*xy(x, y)) for x, y in finite)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{points}">'
            f"<title>{_e(s.name)}</title></polyline>"
        )
        for x, y in finite[-1:]:
            parts.append(f'<circle {at(x, y)} r="3" fill="{colour}"/>')
    for i, s in enumerate(drawn):  # on top of every line, so each point can be hovered
        parts += _hover_points(s, _style(i, s)[0], at, title, x_label)
    parts += legend
    parts.append("</svg>")
    return "".join(parts)


def progress_bar(done: float, total: float, width: int = 320) -> str:
    """A bar filled in proportion done/total."""
    share = 0.0 if total <= 0 else max(0.0, min(1.0, done / total))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="10" role="img" '
        f'aria-label="{share:.0%} done"><rect width="{width}" height="10" fill="#eceff3"/>'
        f'<rect width="{width * share:.1f}" height="10" fill="#1f4e96"/></svg>'
    )


def ulp_colour(max_ulp: int | None) -> str:
    """Cell colour of a differing variable: darker for larger log2(max ULP)."""
    if max_ulp is None or max_ulp <= 0:
        return "#f59e0b"  # differs, size unknown
    level = min(math.log2(max_ulp) / 24, 1.0)  # 2**24 ULP: as far apart as float32 gets
    red = 252 - int(level * 125)
    green = 165 - int(level * 140)
    blue = 165 - int(level * 140)
    return f"#{red:02x}{green:02x}{blue:02x}"


@dataclass(frozen=True)
class MapCell:
    state: str  # "equal", "differs", "missing"
    max_ulp: int | None = None
    first: bool = False


def divergence_map(
    variables: Sequence[str], columns: Sequence[str], cells: Sequence[Sequence[MapCell]]
) -> str:
    """Variables (rows) by trace points (columns); differing cells coloured, the first
    divergent cells outlined.

    Equal cells are the background pattern of their row, so a map of 200 variables by 50
    points stays a few hundred elements: only cells that differ are drawn one by one.
    """
    cell, gap = (18, 2) if len(columns) <= 24 else (14, 2) if len(columns) <= 60 else (8, 1)
    pitch = cell + gap
    label_w = min(12 + 7 * max((len(v) for v in variables), default=4), 420)
    head = 70
    width = label_w + len(columns) * pitch + 20
    height = head + len(variables) * pitch + 10
    parts = [
        f'<svg class="divergence-map" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="divergence map: variables by trace points">',
        f'<defs><pattern id="equal-cells" x="{label_w}" y="{head}" width="{pitch}" '
        f'height="{pitch}" patternUnits="userSpaceOnUse"><rect width="{cell}" '
        f'height="{cell}" fill="#dafbe1" stroke="#c3e6cb"/></pattern></defs>',
    ]
    step = max(1, len(columns) // 40)
    for j, name in enumerate(columns):
        if j % step == 0 or j == len(columns) - 1:
            x = label_w + j * pitch + cell / 2
            parts.append(
                f'<text transform="translate({x:.1f},{head - 6}) rotate(-60)">{_e(name)}</text>'
            )
    for i, variable in enumerate(variables):
        y = head + i * pitch
        name = _e(variable)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + cell - 3}" text-anchor="end">{name}</text>'
            f'<rect class="row" x="{label_w}" y="{y}" width="{len(columns) * pitch}" '
            f'height="{cell}" fill="url(#equal-cells)"><title>{name}: equal unless marked'
            "</title></rect>"
        )
        for j, c in enumerate(cells[i]):
            if c.state == "equal":
                continue
            x = label_w + j * pitch
            if c.state == "missing":
                fill, label = "#ffffff", "not recorded in both runs"
            else:
                fill = ulp_colour(c.max_ulp)
                label = "differs" + (f", max {c.max_ulp} ULP" if c.max_ulp else "")
            classes = f"cell {c.state}" + (" first-divergence" if c.first else "")
            outline = ' stroke="#111827" stroke-width="2.5"' if c.first else ' stroke="#d0d5dd"'
            parts.append(
                f'<rect class="{classes}" data-variable="{name}" '
                f'data-point="{_e(columns[j])}" x="{x}" y="{y}" width="{cell}" height="{cell}" '
                f'fill="{fill}"{outline}><title>{name} at {_e(columns[j])}: {label}'
                "</title></rect>"
            )
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True)
class TreeNode:
    id: int
    parent: int | None
    label: str
    verdict: str | None  # of the edge into this node
    status: str


_EDGE = {"identical": "#1a7f37", "diverged": "#b42318", "incomparable": "#5c6577"}


def lineage_tree(nodes: Sequence[TreeNode], *, link: str = "/runs/{id}") -> str:
    """The rerun family as a tree, parents left of their reruns, verdicts on the edges."""
    if not nodes:
        return ""
    known = {n.id for n in nodes}
    children: dict[int | None, list[TreeNode]] = {}
    for n in nodes:
        parent = n.parent if n.parent in known else None
        children.setdefault(parent, []).append(n)
    placed: dict[int, tuple[int, int]] = {}
    row = 0

    def place(node: TreeNode, depth: int) -> None:
        nonlocal row
        placed[node.id] = (depth, row)
        kids = children.get(node.id, [])
        if not kids:
            row += 1
        for kid in kids:
            place(kid, depth + 1)

    for root in children.get(None, []):
        place(root, 0)
    box_w, box_h, col_w, row_h = 150, 34, 250, 48
    depth = max(d for d, _ in placed.values())
    width = (depth + 1) * col_w + 20
    height = row * row_h + 20
    parts = [
        f'<svg class="lineage" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="rerun family lineage">',
    ]
    by_id = {n.id: n for n in nodes}
    for n in nodes:
        if n.parent not in placed or n.id not in placed:
            continue
        (pd, pr), (cd, cr) = placed[n.parent], placed[n.id]
        x1, y1 = 10 + pd * col_w + box_w, 10 + pr * row_h + box_h / 2
        x2, y2 = 10 + cd * col_w, 10 + cr * row_h + box_h / 2
        colour = _EDGE.get(n.verdict or "", "#9aa3b2")
        verdict = n.verdict or ("pending" if n.status in ("queued", "running") else n.status)
        parts.append(
            f'<path d="M{x1},{y1} C{x1 + 40},{y1} {x2 - 40},{y2} {x2},{y2}" fill="none" '
            f'stroke="{colour}" stroke-width="2"/>'
            f'<text class="edge {_e(verdict)}" x="{x2 - 6}" y="{y2 - 5}" '
            f'text-anchor="end" fill="{colour}">{_e(verdict)}</text>'
        )
    for node_id, (d, r) in placed.items():
        n = by_id[node_id]
        x, y = 10 + d * col_w, 10 + r * row_h
        href = _e(link.format(id=n.id))
        parts.append(
            f'<a href="{href}"><rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="6" '
            f'fill="#f4f6f9" stroke="#9aa3b2"/><text x="{x + 8}" y="{y + 14}" '
            f'font-weight="600">run {n.id}</text><text x="{x + 8}" y="{y + 28}">'
            f"{_e(n.label)}</text></a>"
        )
    parts.append("</svg>")
    return "".join(parts)
