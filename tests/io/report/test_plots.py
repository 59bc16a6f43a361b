"""The report's plots as matplotlib draws them (``factory/io/report/plots.py``): what a
reader tripped over in issue 39, checked on the figures themselves. The browser's view
of the same plots is ``tests/helpers/browser.assert_readable``."""

from __future__ import annotations

import pytest

from factory.io.report import plots


def _tick_labels(axis) -> list[str]:  # type: ignore[no-untyped-def]
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


@pytest.mark.parametrize(
    ("value", "label"),
    [(0, "0"), (0.25, "0.25"), (999.5, "999.5"), (1500, "1.5k"), (350_000, "350k"),
     (1_200_000, "1.2M"), (3.5e9, "3.5B"), (-2000, "-2k")],
)  # fmt: skip
def test_tick_labels_carry_their_scale(value: float, label: str) -> None:
    assert plots.compact(value) == label


def test_a_large_axis_has_readable_ticks_not_a_corner_exponent() -> None:
    fig, ax = plots._bars_axes({"amplify": 3_725_012, "prefilter": 257_032}, xlabel="tokens")
    fig.draw_without_rendering()
    assert ax.yaxis.get_offset_text().get_text() == ""  # no "1e6" in the corner
    labels = _tick_labels(ax.yaxis)
    assert "1M" in labels and "3.5M" in labels and "500k" in labels


def test_identical_series_are_one_line_named_together() -> None:
    same = [0.0, 1.0, 4.0]
    fig, ax = plots._lines_axes(
        [0, 1, 2], {"total": same, "accepted": list(same)}, xlim=None, step=False, shade=None
    )
    assert [line.get_label() for line in ax.get_lines()] == ["total = accepted"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["total = accepted"]
    assert plots.merge_identical({"a": [1], "b": [2], "c": [1]}) == {"a = c": [1], "b": [2]}


def test_differing_series_are_drawn_distinguishably() -> None:
    _fig, ax = plots._lines_axes(
        [0, 1, 2], {"total": [0, 2, 5], "accepted": [0, 2, 4]}, xlim=None, step=False,
        shade=None,
    )  # fmt: skip
    drawn = ax.get_lines()
    assert [line.get_label() for line in drawn] == ["total", "accepted"]
    # where they agree (0..1) one is on the other: colour and dash still tell them apart
    assert drawn[0].get_linestyle() != drawn[1].get_linestyle()
    assert drawn[0].get_color() != drawn[1].get_color()


def _overlaps(a, b) -> bool:  # type: ignore[no-untyped-def]
    return min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1


def test_legends_sit_outside_the_plotted_area() -> None:
    # the tallest bars right at the cutoff line, where an inside legend lands on them
    counts = {7000 + 50 * i: 10 + i for i in range(24)}
    fig, ax = plots._histogram_axes(counts, bin_width=50, marker=("cutoff_len 8,192", 8192))
    fig2, ax2 = plots._lines_axes(
        [0, 5, 10], {"total": [0, 0, 9], "accepted": [0, 0, 7]}, xlim=(0, 10), step=False,
        shade=(0, 5, "start-up"),
    )  # fmt: skip
    for f, a in ((fig, ax), (fig2, ax2)):
        f.draw_without_rendering()
        (legend,) = f.legends
        assert not _overlaps(legend.get_window_extent(), a.get_window_extent())
