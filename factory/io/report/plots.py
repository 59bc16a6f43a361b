"""The report's plots: matplotlib figures rendered to SVG, inlined as data URIs.

Why matplotlib and SVG: the report must open with no network and no script, so
a plot is a finished picture, not a JavaScript widget; SVG keeps text sharp and
a plot is a few kB to tens of kB (a plotly page carries ~3.5 MB of its library).
Figures are built with the object API (``Figure``), never ``pyplot``: no global
state, no GUI backend, safe inside a run. Output is deterministic (fixed hash
salt, no date), so two reports of one folder are the same bytes.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["Plot", "bars", "binned", "compact", "histogram", "lines", "merge_identical",
           "nice_width"]  # fmt: skip

_RC: Any = {"svg.fonttype": "none", "svg.hashsalt": "factory-report", "font.size": 9}
_COLOR = "#4c72b0"
_MAX_BARS = 40
# Series on one plot: each its own colour and dash, so a line drawn over another
# where they agree still shows where they part (total vs accepted, cost vs paid).
_STYLES: tuple[dict[str, Any], ...] = (
    {"color": _COLOR, "linestyle": "-", "linewidth": 2.0},
    {"color": "#dd8452", "linestyle": "--", "linewidth": 1.6},
    {"color": "#55a868", "linestyle": ":", "linewidth": 1.6},
    {"color": "#8172b3", "linestyle": "-.", "linewidth": 1.4},
)


@dataclass(frozen=True)
class Plot:
    """A rendered plot: its title and its SVG document."""

    title: str
    svg: str

    def data_uri(self) -> str:
        return "data:image/svg+xml;base64," + base64.b64encode(self.svg.encode()).decode()


def _render(fig: Figure, title: str) -> Plot:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None})  # layout: constrained
    return Plot(title, buf.getvalue())


def _figure(width: float = 6.4, height: float = 3.0) -> tuple[Figure, Axes]:
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width, height), layout="constrained")
        ax = fig.subplots()
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def compact(value: float, _pos: object = None) -> str:
    """A tick label read at a glance: ``350k``, ``1.2M``, ``0.25``. Why: matplotlib's
    default puts a large axis's scale in a corner label (``1e6``) a reader misses."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.4g}"


def _readable(*axes: Any) -> None:
    """Tick labels of these axes (``ax.xaxis``, ``ax.yaxis``) in ``compact`` form."""
    from matplotlib.ticker import FuncFormatter

    for axis in axes:
        axis.set_major_formatter(FuncFormatter(compact))


def _legend(fig: Figure) -> None:
    """The legend above the plot, outside its axes: never on the bars or lines."""
    fig.legend(loc="outside upper right", frameon=False, ncols=3)


def _bars_axes(
    counts: Mapping[str, float], *, xlabel: str, horizontal: bool = False, color: str = _COLOR
) -> tuple[Figure, Axes]:
    items = list(counts.items())
    if len(items) > _MAX_BARS:
        rest = sum(v for _, v in items[_MAX_BARS - 1 :])
        items = [*items[: _MAX_BARS - 1], (f"{len(items) - _MAX_BARS + 1} more", rest)]
    labels = [str(k) for k, _ in items]
    values = [v for _, v in items]
    if horizontal:
        fig, ax = _figure(6.4, max(1.6, 0.22 * len(items) + 0.8))
        ax.barh(range(len(values)), values, color=color)
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        _readable(ax.xaxis)
    else:
        fig, ax = _figure()
        ax.bar(range(len(values)), values, color=color)
        rotate = 30 if max((len(x) for x in labels), default=0) > 6 else 0
        align = "right" if rotate else "center"
        ax.set_xticks(range(len(labels)), labels, rotation=rotate, ha=align)
        ax.set_ylabel(xlabel)
        _readable(ax.yaxis)
    return fig, ax


def bars(
    counts: Mapping[str, float],
    title: str,
    *,
    xlabel: str = "",
    horizontal: bool = False,
    color: str = _COLOR,
) -> Plot:
    """Bars of ``counts`` in their order (the first ``_MAX_BARS``; the rest summed), the
    value axis in ``compact`` ticks (350k, 1.2M)."""
    fig, ax = _bars_axes(counts, xlabel=xlabel, horizontal=horizontal, color=color)
    ax.set_title(title)
    return _render(fig, title)


def nice_width(span: float, bins: int = 40) -> int:
    """A round bin width (1, 2 or 5 times a power of ten) giving at most ``bins`` bins
    over ``span``."""
    raw = max(1.0, span / bins)
    power = 10 ** math.floor(math.log10(raw))
    return int(next(m * power for m in (1, 2, 5, 10) if m * power >= raw))


def binned(values: Sequence[int], bins: int = 40) -> tuple[dict[int, int], int]:
    """``values`` counted in bins of a round width: ``({bin start: count}, width)``."""
    if not values:
        return {}, 1
    width = nice_width(max(values) - min(values) + 1, bins)
    counts: dict[int, int] = {}
    for v in values:
        start = (v // width) * width
        counts[start] = counts.get(start, 0) + 1
    return dict(sorted(counts.items())), width


def _histogram_axes(
    counts: Mapping[int, int], *, bin_width: int, marker: tuple[str, float] | None
) -> tuple[Figure, Axes]:
    fig, ax = _figure()
    xs = sorted(counts)
    heights = [counts[x] for x in xs]
    if bin_width == 1:  # exact integer values: a bar per value, gaps where none is
        ax.bar(xs, heights, width=0.8, color=_COLOR)
        if xs and xs[-1] - xs[0] <= 30:
            ax.set_xticks(range(xs[0], xs[-1] + 1))
    else:  # a bin [start, start + width) drawn as wide as it is
        ax.bar(xs, heights, width=bin_width, align="edge", color=_COLOR, edgecolor="white",
               linewidth=0.4)  # fmt: skip
    _readable(ax.xaxis, ax.yaxis)
    if marker is not None:
        label, x = marker
        ax.axvline(x, color="#c44e52", linestyle="--", linewidth=1.2, label=label)
        _legend(fig)
    return fig, ax


def histogram(
    counts: Mapping[int, int],
    title: str,
    *,
    xlabel: str,
    ylabel: str = "rows",
    bin_width: int = 1,
    marker: tuple[str, float] | None = None,
) -> Plot:
    """A histogram of integer values: ``counts`` maps a value (``bin_width`` 1: |Δ|,
    argument cardinality, turns) or a bin's start (``binned``) to its rows; each bar is
    as wide as its bin. ``marker``: a labelled vertical line (a cutoff)."""
    fig, ax = _histogram_axes(counts, bin_width=bin_width, marker=marker)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _render(fig, title)


def merge_identical(series: Mapping[str, Sequence[float]]) -> dict[str, Sequence[float]]:
    """``series`` with those of equal values drawn once, named together (``total =
    accepted``): two identical lines would hide one under the other while the legend
    names both."""
    groups: list[tuple[list[str], Sequence[float]]] = []
    for name, ys in series.items():
        same = next((names for names, seen in groups if list(seen) == list(ys)), None)
        if same is None:
            groups.append(([name], ys))
        else:
            same.append(name)
    return {" = ".join(names): ys for names, ys in groups}


def _lines_axes(
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    xlim: tuple[float, float] | None,
    step: bool,
    shade: tuple[float, float, str] | None,
) -> tuple[Figure, Axes]:
    fig, ax = _figure()
    drawn = merge_identical(series)
    for i, (name, ys) in enumerate(drawn.items()):
        style = _STYLES[i % len(_STYLES)]
        if step:
            ax.step(x, ys, where="post", label=name, **style)
        else:
            ax.plot(x, ys, label=name, marker="." if len(x) < 30 else None, **style)
    if shade is not None and shade[1] > shade[0]:
        ax.axvspan(shade[0], shade[1], color="#000000", alpha=0.06, linewidth=0, label=shade[2])
    if xlim is not None and xlim[1] > xlim[0]:
        ax.set_xlim(*xlim)
    ax.set_ylim(bottom=0)
    _readable(ax.yaxis)
    if len(series) > 1 or shade is not None:  # a merged pair says so in its one label
        _legend(fig)
    return fig, ax


def lines(
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    title: str,
    *,
    xlabel: str,
    ylabel: str,
    xlim: tuple[float, float] | None = None,
    step: bool = False,
    shade: tuple[float, float, str] | None = None,
) -> Plot:
    """One line per series over ``x`` (rows, throughput and cost over time), each in its
    own colour and dash; series with equal values are one line (``merge_identical``).
    ``xlim``: the x axis's span (the run's wall time, or the phase rows arrive in);
    ``step``: values hold until the next x; ``shade``: ``(start, end, label)``, a span
    drawn grey and named in the legend (the start-up before the first row)."""
    fig, ax = _lines_axes(x, series, xlim=xlim, step=step, shade=shade)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _render(fig, title)
