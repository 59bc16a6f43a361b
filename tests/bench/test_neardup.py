"""The near-duplicate benchmark's measuring function, on a few hundred rows (no timing asserted)."""

from __future__ import annotations

import pytest

from factory.bench.neardup import _one, make_rows


def test_make_rows_plants_copies() -> None:
    rows, copies = make_rows(200, 0.2)
    assert len(rows) == 200 and 20 <= len(copies) <= 60 and all(rows)


@pytest.mark.parametrize("library", ["rensa", "datasketch"])
def test_one_library_reports_recall_and_rates(library: str) -> None:
    report = _one(library, 300, 0.2)
    assert report["library"] == library and report["rows"] == 300
    assert report["recall"] >= 0.95 and report["false_removals"] == 0
    assert report["sign_rows_per_s"] > 0 and report["index_rows_per_s"] > 0
