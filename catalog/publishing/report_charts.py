"""Charts of released tables for the audit report: small inline SVG, drawn without matplotlib.

A chart is chosen from the table model alone (:func:`table_model`), so any table with label
columns before ``estimate`` gets one: bars with 95% error bars for a 1-D table, a step curve with
a band for a cumulative (``<attr>_upper``) or range (``<attr>_low``/``<attr>_high``) table, a heat
map for a grid of two or more attributes.  Heat maps are one pixel per cell in an embedded PNG
(numpy + zlib), scaled by the browser, so a 100 × 100 grid costs one element, not 10,000.

Every number drawn is a released (noisy) value or public metadata: the estimate and its interval.
"""

from __future__ import annotations

import base64
import html
import itertools
import math
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

WIDTH = 640
# label columns come before it, value columns from it on (catalog.publishing.tables)
VALUE_START = "estimate"
MAX_HEATMAP_SIDE = 400  # a larger grid gets no chart (the table and CSV still hold every row)
MAX_BARS = 400
TICKS_WANTED = 12  # at most this many labelled ticks on a categorical axis
VIRIDIS = np.array(
    [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64
)
NAN_RGB = (226, 232, 240)


@dataclass(frozen=True, kw_only=True)
class Axis:
    """One dimension of a table: an attribute and how its rows are labelled."""

    name: str
    kind: str  # "category" | "cumulative" | "range"
    columns: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Chart:
    note: str
    kind: str = "none"  # "bars" | "step" | "heatmap" | "none"
    svg: str = ""


def table_model(table: pa.Table) -> list[Axis]:
    """The table's axes: the label columns before ``estimate``, ``_low``/``_high`` paired."""
    names = table.column_names
    labels = names[: names.index(VALUE_START)] if VALUE_START in names else list(names)
    axes: list[Axis] = []
    for column in labels:
        if column.endswith("_high") and f"{column[:-5]}_low" in labels:
            continue
        if column.endswith("_low") and f"{column[:-4]}_high" in labels:
            axes.append(
                Axis(name=column[:-4], kind="range", columns=(column, f"{column[:-4]}_high"))
            )
        elif column.endswith("_upper"):
            axes.append(Axis(name=column[:-6], kind="cumulative", columns=(column,)))
        else:
            axes.append(Axis(name=column, kind="category", columns=(column,)))
    return axes


def axis_labels(table: pa.Table, axis: Axis) -> list[str]:
    """One display label per row for ``axis`` (a range reads ``low–high``). O(rows)."""
    columns = [_column_labels(table[c]) for c in axis.columns]
    if axis.kind == "range":
        return [lo if lo == hi else f"{lo}–{hi}" for lo, hi in zip(*columns, strict=True)]
    return columns[0]


def _column_labels(column: pa.ChunkedArray) -> list[str]:
    """:func:`_label` of every value, formatted once per distinct value (a grid axis repeats a
    few levels). O(rows)."""
    values = column.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    encoded = pc.dictionary_encode(values, null_encoding="encode")
    names = np.array([_label(v) for v in encoded.dictionary.to_pylist()] or [""], dtype=object)
    return names[encoded.indices.to_numpy(zero_copy_only=False)].tolist()


def _label(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return f"{value:.0f}"
    return "" if value is None else str(value)


def _values(table: pa.Table, column: str) -> np.ndarray:
    if column not in table.column_names:
        return np.full(table.num_rows, np.nan)
    return np.asarray(table[column].to_numpy(zero_copy_only=False), dtype=np.float64)


def chart_for(table: pa.Table, *, title: str) -> Chart:
    """The chart that fits the table's model (see the module docstring)."""
    if VALUE_START not in table.column_names or table.num_rows == 0:
        return Chart(note="no estimate column to chart")
    estimate = _values(table, "estimate")
    low, high = _values(table, "ci_low"), _values(table, "ci_high")
    axes = table_model(table)
    if not axes:
        svg = value_chart("bars", [title], estimate, low, high, x_title="")
        return Chart(kind="bars", svg=svg, note="")
    if len(axes) == 1:
        axis = axes[0]
        labels = axis_labels(table, axis)
        if axis.kind == "cumulative":
            svg = value_chart("step", labels, estimate, low, high, x_title=f"{axis.name} ≤")
            return Chart(kind="step", svg=svg, note="cumulative estimates with 95% band")
        if axis.kind == "range":
            return _range_chart(table, axis, estimate, low, high)
        if table.num_rows > MAX_BARS:
            return Chart(note=f"{table.num_rows:,} rows: too many to chart")
        svg = value_chart("bars", labels, estimate, low, high, x_title=axis.name)
        return Chart(kind="bars", svg=svg, note="estimates with 95% intervals")
    grid = _grid(table, axes)
    if grid is None:
        return Chart(note="rows do not form a grid of the attributes")
    row_labels, column_labels, shape = grid
    if max(shape) > MAX_HEATMAP_SIDE:
        return Chart(note=f"a {shape[0]} × {shape[1]} grid is too large to chart")
    svg = heatmap(
        row_labels,
        column_labels,
        estimate.reshape(shape),
        y_title=axes[0].name,
        x_title=" · ".join(axis.name for axis in axes[1:]),
    )
    return Chart(kind="heatmap", svg=svg, note="estimates by cell (colour scale at right)")


def _range_chart(
    table: pa.Table, axis: Axis, estimate: np.ndarray, low: np.ndarray, high: np.ndarray
) -> Chart:
    """Ranges from the smallest lower bound, by upper bound (a CDF); few ranges get bars."""
    lows = [_label(v) for v in table[axis.columns[0]].to_pylist()]
    first = np.flatnonzero(np.asarray(lows, dtype=object) == lows[0])
    if first.size >= 3:
        uppers = [_label(v) for v in table[axis.columns[1]].take(pa.array(first)).to_pylist()]
        title = f"{axis.name} ≤ (from {lows[0]})"
        svg = value_chart("step", uppers, estimate[first], low[first], high[first], x_title=title)
        return Chart(
            kind="step",
            svg=svg,
            note=f"the {first.size} ranges that start at {lows[0]}, with 95% band; the table "
            "holds every range",
        )
    if table.num_rows > MAX_BARS:
        return Chart(note=f"{table.num_rows:,} ranges: too many to chart")
    labels = axis_labels(table, axis)
    svg = value_chart("bars", labels, estimate, low, high, x_title=f"{axis.name} range")
    return Chart(kind="bars", svg=svg, note="estimates with 95% intervals")


def _grid(table: pa.Table, axes: list[Axis]) -> tuple[list[str], list[str], tuple[int, int]] | None:
    """Row labels (first axis) and column labels (the others joined), if rows are a row-major
    grid of the axes' levels. O(rows · axes)."""
    codes, levels = [], []
    for axis in axes:
        labels = np.asarray(axis_labels(table, axis), dtype=str)
        # levels in order of first appearance; O(rows log rows) in numpy, not per row in Python
        unique, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        codes.append(rank[inverse.reshape(-1)].astype(np.int64))
        levels.append(unique[order].tolist())
    sizes = tuple(len(level) for level in levels)
    if math.prod(sizes) != table.num_rows:
        return None
    if not np.array_equal(np.ravel_multi_index(tuple(codes), sizes), np.arange(table.num_rows)):
        return None
    rest = [" · ".join(combo) for combo in itertools.product(*levels[1:])]
    return levels[0], rest, (sizes[0], math.prod(sizes[1:]))


def _nice_ticks(lo: float, hi: float, wanted: int = 5) -> np.ndarray:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / wanted
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(s * magnitude for s in (1, 2, 2.5, 5, 10) if s * magnitude >= raw)
    start = math.floor(lo / step) * step
    stop = math.ceil(hi / step) * step
    return np.arange(start, stop + step / 2, step)


def _short(text: str, limit: int = 14) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _y_range(estimate: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[float, float]:
    """The value axis: the data (estimates and intervals) and zero, padded by 3%."""
    values = np.concatenate([estimate, low, high, [0.0]])
    values = values[np.isfinite(values)]
    lo, hi = float(values.min()), float(values.max())
    pad = 0.03 * (hi - lo if hi > lo else 1.0)
    return lo - pad if lo < 0 else 0.0, hi + pad


def _frame(height: int, left: int, bottom: int, right: int = 12, top: int = 10) -> dict[str, float]:
    return {"x0": left, "x1": WIDTH - right, "y0": top, "y1": height - bottom, "h": height}


def _y_axis(
    frame: dict[str, float], domain: tuple[float, float], title: str
) -> tuple[list[str], Any]:
    lo, hi = domain
    ticks = _nice_ticks(lo, hi)
    ticks = ticks[(ticks >= lo) & (ticks <= hi)]
    step = float(ticks[1] - ticks[0]) if ticks.size > 1 else 1.0

    def y(value: np.ndarray | float) -> Any:
        return frame["y1"] - (np.asarray(value) - lo) / (hi - lo) * (frame["y1"] - frame["y0"])

    parts = []
    for tick in ticks.tolist():
        yy = float(y(tick))
        text = f"{tick:,.0f}" if step >= 1 or tick == 0 else f"{tick:.3g}"
        parts.append(
            f"<line class='grid' x1='{frame['x0']}' x2='{frame['x1']}' y1='{yy:.1f}' y2='{yy:.1f}'/>"
            f"<text x='{frame['x0'] - 6}' y='{yy + 4:.1f}' text-anchor='end'>{text}</text>"
        )
    parts.append(_y_title((frame["y0"] + frame["y1"]) / 2, title))
    return parts, y


def _y_title(middle: float, title: str) -> str:
    return (
        f"<text class='title' transform='translate(12,{middle:.0f}) rotate(-90)' "
        f"text-anchor='middle'>{html.escape(title)}</text>"
    )


def _label_layout(labels: list[str], width: float) -> tuple[int, bool, int]:
    """Every how many categories a label is drawn, whether labels are slanted, and the bottom
    margin that leaves room for them (and the axis title)."""
    count = len(labels)
    every = max(1, math.ceil(count / TICKS_WANTED))
    shown = [_short(labels[k]) for k in range(0, count, every)] or [""]
    longest = max(len(text) for text in shown) * 6.5
    rotate = longest > width / max(count, 1) * every
    return every, rotate, int(40 + (longest * 0.6 if rotate else 0))


def _x_labels(frame: dict[str, float], labels: list[str], centre: Any, title: str) -> list[str]:
    every, rotate, _ = _label_layout(labels, frame["x1"] - frame["x0"])
    parts = []
    for k in range(0, len(labels), every):
        x, yy = float(centre(k)), frame["y1"] + 14
        text = html.escape(_short(labels[k]))
        if rotate:
            parts.append(
                f"<text x='{x:.1f}' y='{yy:.0f}' text-anchor='end' "
                f"transform='rotate(-35 {x:.1f} {yy:.0f})'>{text}</text>"
            )
        else:
            parts.append(f"<text x='{x:.1f}' y='{yy:.0f}' text-anchor='middle'>{text}</text>")
    parts.append(
        f"<text class='title' x='{(frame['x0'] + frame['x1']) / 2:.0f}' y='{frame['h'] - 4}' "
        f"text-anchor='middle'>{html.escape(title)}</text>"
    )
    return parts


def _svg(height: int, body: list[str], label: str) -> str:
    return (
        f"<svg class='chart' viewBox='0 0 {WIDTH} {height}' width='{WIDTH}' height='{height}' "
        f"role='img' aria-label='{html.escape(label, quote=True)}'>" + "".join(body) + "</svg>"
    )


def value_chart(
    style: str,
    labels: list[str],
    estimate: np.ndarray,
    low: np.ndarray | None = None,
    high: np.ndarray | None = None,
    *,
    x_title: str,
    y_title: str = "estimate",
    reference: tuple[float, str] | None = None,
) -> str:
    """Bars from zero with a 95% interval whisker each (none where the row claims no interval),
    or (style "step") a step curve of the estimates with the 95% interval as a shaded band; no
    ``low``/``high``: no intervals.  ``reference``: a dashed horizontal line at a value, with its
    label (a bound, a cap). O(rows)."""
    if low is None or high is None:
        low = high = np.full(estimate.shape, np.nan)
    bottom = _label_layout(labels, WIDTH - 70 - 12)[2]
    height = 190 + bottom
    frame = _frame(height, left=70, bottom=bottom)
    extra = np.array([reference[0] if reference is not None else np.nan])
    parts, y = _y_axis(frame, _y_range(estimate, low, np.concatenate([high, extra])), y_title)
    if reference is not None:
        value, label = reference
        yy = float(y(value))
        parts.append(
            f"<line class='ref' x1='{frame['x0']}' x2='{frame['x1']}' y1='{yy:.1f}' "
            f"y2='{yy:.1f}'/><text class='ref' x='{frame['x1'] - 4}' y='{yy - 4:.1f}' "
            f"text-anchor='end'>{html.escape(label)}</text>"
        )
    count = len(labels)
    slot = (frame["x1"] - frame["x0"]) / count
    if style == "step":
        edges = frame["x0"] + slot * np.arange(count + 1)
        ok = np.isfinite(estimate)
        lo = np.where(np.isfinite(low) & ok, low, estimate)
        hi = np.where(np.isfinite(high) & ok, high, estimate)

        def steps(values: np.ndarray) -> list[tuple[float, float]]:
            points = []
            for k in range(count):
                yy = float(y(values[k])) if math.isfinite(values[k]) else float(y(0.0))
                points += [(edges[k], yy), (edges[k + 1], yy)]
            return points

        def path(points: list[tuple[float, float]]) -> str:
            return "M" + "L".join(f"{x:.1f} {yy:.1f}" for x, yy in points)

        band = path(steps(hi) + steps(lo)[::-1])
        parts.append(f"<path class='band' d='{band}Z'><title>95% interval</title></path>")
        parts.append(f"<path class='line' d='{path(steps(estimate))}'/>")
        parts += _x_labels(frame, labels, lambda k: edges[k] + slot / 2, x_title)
        return _svg(height, parts, f"step curve of estimates by {x_title}")

    def centre(k: int) -> float:
        return frame["x0"] + (k + 0.5) * slot

    zero = float(y(0.0))
    width = max(slot * 0.75, 0.8)
    for k in range(count):
        value = estimate[k]
        if not math.isfinite(value):
            continue
        top = float(y(value))
        tip = f"{labels[k]}: {value:,.4g}"
        if math.isfinite(low[k]) and math.isfinite(high[k]):
            tip += f" (95% interval {low[k]:,.4g} to {high[k]:,.4g})"
        parts.append(
            f"<rect class='bar' x='{centre(k) - width / 2:.1f}' y='{min(top, zero):.1f}' "
            f"width='{width:.1f}' height='{abs(zero - top):.1f}'><title>{html.escape(tip)}</title></rect>"
        )
        if math.isfinite(low[k]) and math.isfinite(high[k]):
            x = centre(k)
            cap = min(width / 2, 4)
            y_lo, y_hi = float(y(low[k])), float(y(high[k]))
            parts.append(
                f"<path class='err' d='M{x:.1f} {y_lo:.1f}V{y_hi:.1f}M{x - cap:.1f} {y_lo:.1f}"
                f"h{2 * cap:.1f}M{x - cap:.1f} {y_hi:.1f}h{2 * cap:.1f}'/>"
            )
    parts.append(
        f"<line class='axis' x1='{frame['x0']}' x2='{frame['x1']}' y1='{zero:.1f}' y2='{zero:.1f}'/>"
    )
    parts += _x_labels(frame, labels, centre, x_title)
    return _svg(height, parts, f"bar chart of estimates by {x_title}")


def _colours(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Viridis colours (uint8 RGB) for ``values`` scaled to [lo, hi]; NaN is light grey."""
    scaled = np.clip((values - lo) / (hi - lo if hi > lo else 1.0), 0.0, 1.0)
    position = np.nan_to_num(scaled) * (len(VIRIDIS) - 1)
    index = np.minimum(position.astype(np.int64), len(VIRIDIS) - 2)
    fraction = (position - index)[..., None]
    rgb = VIRIDIS[index] * (1 - fraction) + VIRIDIS[index + 1] * fraction
    rgb[~np.isfinite(values)] = NAN_RGB
    return np.round(rgb).astype(np.uint8)


def png_rgb(pixels: np.ndarray) -> bytes:
    """A PNG file of an (h, w, 3) uint8 image. O(h·w)."""
    height, width, _ = pixels.shape
    raw = b"".join(b"\x00" + row.tobytes() for row in np.ascontiguousarray(pixels))

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def _png_uri(pixels: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(png_rgb(pixels)).decode()


def heatmap(
    row_labels: list[str],
    column_labels: list[str],
    matrix: np.ndarray,
    *,
    y_title: str,
    x_title: str,
) -> str:
    """A heat map of the estimates: one pixel per cell, rows top to bottom, with a colour bar."""
    rows, columns = matrix.shape
    left = int(min(150, 24 + 6.5 * max(len(_short(v)) for v in row_labels)))
    bottom = _label_layout(column_labels, WIDTH - left - 90)[2]
    height = int(min(380, max(150, 40 + 16 * rows))) + bottom
    frame = _frame(height, left=left, bottom=bottom, right=90)
    finite = matrix[np.isfinite(matrix)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    x0, x1, y0, y1 = frame["x0"], frame["x1"], frame["y0"], frame["y1"]
    parts = [
        f"<image x='{x0}' y='{y0}' width='{x1 - x0}' height='{y1 - y0}' preserveAspectRatio='none' "
        f"style='image-rendering:pixelated' href='{_png_uri(_colours(matrix, lo, hi))}'/>",
        f"<rect class='frame' x='{x0}' y='{y0}' width='{x1 - x0}' height='{y1 - y0}'/>",
    ]
    cell_h = (y1 - y0) / rows
    every = max(1, math.ceil(rows / TICKS_WANTED))
    for k in range(0, rows, every):
        yy = y0 + (k + 0.5) * cell_h
        parts.append(
            f"<text x='{x0 - 5}' y='{yy + 4:.1f}' text-anchor='end'>"
            f"{html.escape(_short(row_labels[k]))}</text>"
        )
    parts.append(_y_title((y0 + y1) / 2, y_title))
    cell_w = (x1 - x0) / columns
    parts += _x_labels(frame, column_labels, lambda k: x0 + (k + 0.5) * cell_w, x_title)
    bx = x1 + 18
    parts.append(
        f"<image x='{bx}' y='{y0}' width='14' height='{y1 - y0}' preserveAspectRatio='none' "
        f"href='{_png_uri(_colours(np.linspace(hi, lo, 64)[:, None], lo, hi))}'/>"
        f"<rect class='frame' x='{bx}' y='{y0}' width='14' height='{y1 - y0}'/>"
        f"<text x='{bx + 18}' y='{y0 + 9}'>{_fmt_value(hi)}</text>"
        f"<text x='{bx + 18}' y='{y1}'>{_fmt_value(lo)}</text>"
    )
    return _svg(height, parts, f"heat map of estimates by {y_title} and {x_title}")


def _fmt_value(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
