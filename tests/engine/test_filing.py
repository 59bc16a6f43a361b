"""One way to file a row (``factory.engine.filing``) over the typed row (``engine.rows``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from factory.core.dedup import Deduper
from factory.engine.filing import Filing, exact_duplicates
from factory.engine.jobs.amplify import SeedSide, _Sink
from factory.engine.rows import Fate, Row, Status
from factory.engine.stages.base import ROW_SCHEMA, make_row
from factory.io.writer import RejectWriter
from tests.helpers import read_jsonl


def test_the_typed_row_has_the_schema_columns_in_order() -> None:
    columns = list(Row.__annotations__)
    # every schema column, in order; then the envsim job's step sample (not a column)
    assert columns == [*ROW_SCHEMA.names, "sample"]


def test_statuses_and_fates_are_written_as_their_strings() -> None:
    assert [str(s) for s in Status] == ["ok", "rejected", "failed", "unissued"]
    assert json.dumps({Fate.ACCEPTED: Status.OK}) == '{"accepted": "ok"}'
    assert {"rejected": 1}[Fate.REJECTED] == 1 and Fate.FAILED == Status.FAILED
    table = pa.Table.from_pylist([make_row(id="x")], schema=ROW_SCHEMA)
    assert table.column("status").to_pylist() == ["ok"]
    assert type(table.column("status").to_pylist()[0]) is str


def _filing(tmp_path: Path, failed: bool = True) -> Filing[Row]:
    return Filing(
        RejectWriter(tmp_path, subdir="rejects"),
        RejectWriter(tmp_path, subdir="failed") if failed else None,
        checks=[exact_duplicates(Deduper("same as {first}"))],
        drop=("output",),
    )


def _row(rid: str, status: Status = Status.OK, **kw: Any) -> Row:
    row: Row = make_row(id=rid, record=f'{{"id": "{rid}"}}', output="{}", **kw)
    row["status"] = status
    return row


def test_a_filing_checks_rejects_counts_and_writes(tmp_path: Path) -> None:
    filing = _filing(tmp_path)
    kept: list[str] = []

    def keep(row: Row) -> Fate:
        kept.append(row["id"] or "")
        return Fate.ACCEPTED

    rows = [
        _row("a"),
        _row("a"),  # the same content again: refused by the duplicate check
        _row("b", Status.FAILED, stage="amplify", reason="llm_timeout"),
        _row("c", Status.REJECTED, stage="postprocess", reason="wrong_type"),
        _row("d", Status.UNISSUED, stage="amplify", reason="max_calls"),
    ]
    fates = [filing.file(r, keep) for r in rows]
    assert fates == ["accepted", "rejected", "failed", "rejected", "unissued"]
    assert kept == ["a"]
    assert rows[1]["stage"] == "dedup" and rows[1]["reason"] == "duplicate"
    assert filing.counts == {"accepted": 1, "rejected": 2, "failed": 1, "unissued": 1}
    filing.close()
    rejects = read_jsonl(tmp_path / "rejects")
    assert [r["id"] for r in rejects] == ["a", "c"]
    assert all("output" not in r and None not in r.values() for r in rejects)
    assert [r["reason"] for r in read_jsonl(tmp_path / "failed")] == ["llm_timeout"]


def test_without_a_failed_folder_a_failed_row_is_a_reject(tmp_path: Path) -> None:
    filing = _filing(tmp_path, failed=False)
    row = _row("b", Status.FAILED, stage="envsim", reason="internal_error")
    assert filing.file(row, lambda r: Fate.ACCEPTED) == Fate.REJECTED
    filing.close()
    assert [r["id"] for r in read_jsonl(tmp_path / "rejects")] == ["b"]
    assert not (tmp_path / "failed").exists()


def test_amplify_tells_seeds_from_calls_by_their_stream(tmp_path: Path) -> None:
    filed: list[Row] = []

    class Collector:
        stop_reason = None

        def add(self, row: Row) -> Fate:
            filed.append(row)
            return Fate.ACCEPTED

    sink = _Sink(Collector(), SeedSide(tmp_path))  # type: ignore[arg-type]
    seed = _row("s", call_index=3)  # a column set or not says nothing about the stream
    call = _row("c")
    assert sink.add(seed, "seeds") is None
    assert sink.add(call, "calls") == Fate.ACCEPTED and filed == [call]


def test_the_seed_side_counts_in_the_manifest_order(tmp_path: Path) -> None:
    side = SeedSide(tmp_path)
    for row in (
        _row("a"),
        _row("a"),
        _row("b", Status.UNISSUED),
        _row("c", Status.FAILED, stage="prefilter", reason="llm_timeout"),
    ):
        side.add(row)
    side.unread = 2
    assert list(side.counts.items()) == [
        ("total", 6),
        ("kept", 1),
        ("rejected", 1),
        ("failed", 1),
        ("unissued", 3),
    ]
    assert side.reasons == {"dedup:duplicate": 1, "prefilter:llm_timeout": 1}
