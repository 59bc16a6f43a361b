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

__all__ = ["Plot", "bars", "binned", "histogram", "lines", "nice_width"]

_RC: Any = {"svg.fonttype": "none", "svg.hashsalt": "factory-report", "font.size": 9}
_COLOR = "#4c72b0"
_MAX_BARS = 40


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


def bars(
    counts: Mapping[str, float],
    title: str,
    *,
    xlabel: str = "",
    horizontal: bool = False,
    color: str = _COLOR,
) -> Plot:
    """Bars of ``counts`` in their order (the first ``_MAX_BARS``; the rest summed)."""
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
    else:
        fig, ax = _figure()
        ax.bar(range(len(values)), values, color=color)
        rotate = 30 if max((len(x) for x in labels), default=0) > 6 else 0
        align = "right" if rotate else "center"
        ax.set_xticks(range(len(labels)), labels, rotation=rotate, ha=align)
        ax.set_ylabel(xlabel)
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
    if marker is not None:
        label, x = marker
        ax.axvline(x, color="#c44e52", linestyle="--", linewidth=1.2, label=label)
        ax.legend(frameon=False, loc="upper right")
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


def lines(
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    title: str,
    *,
    xlabel: str,
    ylabel: str,
    xmax: float | None = None,
    step: bool = False,
) -> Plot:
    """One line per series over ``x`` (throughput and cost over time), the x axis from
    0 to ``xmax`` (the run's wall time) when given; ``step``: values hold until the next x."""
    fig, ax = _figure()
    for name, ys in series.items():
        if step:
            ax.step(x, ys, where="post", label=name)
        else:
            ax.plot(x, ys, label=name, marker="." if len(x) < 30 else None)
    if xmax is not None and xmax > 0:
        ax.set_xlim(0, xmax)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(frameon=False)
    return _render(fig, title)
