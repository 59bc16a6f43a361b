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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["Plot", "bars", "histogram", "lines"]

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


def histogram(counts: Mapping[int, int], title: str, *, xlabel: str, ylabel: str = "rows") -> Plot:
    """Bars of integer values (|Δ|, argument cardinality, turns): one bar per value,
    the empty values between them shown as gaps (a histogram of exact counts)."""
    fig, ax = _figure()
    xs = sorted(counts)
    ax.bar(xs, [counts[x] for x in xs], width=0.8, color=_COLOR)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if xs and xs[-1] - xs[0] <= 30:
        ax.set_xticks(range(xs[0], xs[-1] + 1))
    return _render(fig, title)


def lines(
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    title: str,
    *,
    xlabel: str,
    ylabel: str,
) -> Plot:
    """One line per series over ``x`` (throughput and cost over time)."""
    fig, ax = _figure()
    for name, ys in series.items():
        ax.plot(x, ys, label=name, marker="." if len(x) < 30 else None)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(frameon=False)
    return _render(fig, title)
