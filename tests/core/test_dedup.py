"""Exact-duplicate detection by content hash."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from factory.core.dedup import DEDUP_STAGE, Deduper, dedup_key, row_key
from factory.core.reasons import REASONS
from factory.core.trajectory import ToolCall, Trajectory, Turn


def make(**metadata: object) -> Trajectory:
    return Trajectory(
        system="Policy.",
        tools=[{"name": "lookup", "description": "", "parameters": {"type": "object"}}],
        turns=[
            Turn("user", "find ZFA04Y"),
            Turn("assistant", "", [ToolCall("lookup", {"id": "ZFA04Y", "n": 1})]),
            Turn("tool", "{}"),
            Turn("assistant", "Found it."),
        ],
        metadata=dict(metadata),
    )


def test_key_ignores_metadata_and_call_argument_order() -> None:
    a = make(id="a", source="one.jsonl")
    b = make(id="b", source="two.jsonl", reward=1.0)
    b.turns[1].tool_calls[0].arguments = {"n": 1, "id": "ZFA04Y"}
    assert dedup_key(a) == dedup_key(b) == a.content_id()
    assert len(dedup_key(a)) == 24


@pytest.mark.parametrize(
    "change",
    [
        lambda t: setattr(t, "system", "Other policy."),
        lambda t: t.tools.append({"name": "other", "description": "", "parameters": {}}),
        lambda t: setattr(t.turns[0], "content", "find ZFA04Z"),
        lambda t: setattr(t.turns[3], "reasoning", "because"),
        lambda t: t.turns[1].tool_calls[0].arguments.update(n=2),
        lambda t: t.turns.pop(),
    ],
    ids=["system", "tools", "text", "reasoning", "arguments", "turns"],
)
def test_key_changes_with_content(change: Callable[[Trajectory], object]) -> None:
    original = make()
    changed = copy.deepcopy(original)
    change(changed)
    assert dedup_key(changed) != dedup_key(original)


def test_deduper_names_the_first_occurrence() -> None:
    deduper = Deduper()
    assert deduper.check(make(id="first")) is None
    assert deduper.check(Trajectory(system="different content")) is None
    issue = deduper.check(make(id="second"))
    assert issue is not None
    assert issue.code == "duplicate" and "duplicate" in REASONS
    assert "first" in issue.message
    assert issue.path == dedup_key(make())
    assert len(deduper) == 2
    assert dedup_key(make()) in deduper


def test_rows_without_ids_fall_back_to_the_content_id() -> None:
    deduper = Deduper()
    assert deduper.check(make()) is None
    issue = deduper.check(make())
    assert issue is not None
    assert make().content_id() in issue.message


def test_check_key_keeps_the_first_id_for_every_later_duplicate() -> None:
    deduper = Deduper()
    assert deduper.check_key("k", "r1") is None
    for row_id in ("r2", "r3", "r1"):
        issue = deduper.check_key("k", row_id)
        assert issue is not None and issue.message == "same content as r1"
    assert deduper.check_key("other", "r4") is None


# --- one filter, two owners (issue 9: Collector.seen and _collect_seeds' dict merged here) --
def test_message_is_worded_by_the_owner_and_keys_rows_by_their_id() -> None:
    deduper = Deduper("same content as seed {first}")
    assert deduper.check_row({"id": "abc"}) is None
    issue = deduper.check_row({"id": "abc", "source": "other.jsonl:3"})
    assert issue is not None and issue.message == "same content as seed abc"
    assert (issue.code, issue.path) == ("duplicate", "abc")
    assert row_key({"id": None}) == row_key({}) == ""


def test_collector_rejects_a_repeated_id_through_its_deduper(tmp_path: Path) -> None:
    from factory.engine.collect import Collector
    from factory.engine.stages.base import make_row
    from factory.io.writer import Manifest
    from tests.helpers import collect_rows

    collector = Collector(tmp_path, Manifest("r", "h"), dataset_name="d")
    output = json.dumps({"conversations": [], "system": "", "tools": "", "id": "k1", "meta": "{}"})
    rows = [make_row(id=i, stage="postprocess", output=output) for i in ("k1", "k2", "k1", "k1")]
    rows.append(make_row(id="k2", status="rejected", stage="postprocess", reason="wrong_type"))
    assert collect_rows(tmp_path, collector, rows) == [
        "accepted",
        "accepted",
        "rejected",
        "rejected",
        "rejected",
    ]
    assert len(collector.dedup) == 2 and "k1" in collector.dedup
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["reasons"]["dedup"] == {"duplicate": 2}
    assert manifest["stages"]["dedup"] == {"rejected": 2}
    lines = "".join(p.read_text() for p in (tmp_path / "rejects").glob("*.jsonl"))
    rejects = [json.loads(line) for line in lines.splitlines()]
    dups = [r for r in rejects if r["stage"] == DEDUP_STAGE]
    assert [r["message"] for r in dups] == ["same content as an earlier row (k1)"] * 2
    assert all(r["reason"] == "duplicate" and "output" not in r for r in dups)
