"""The amplify job's planner: seeds first, then calls as the observed yield requires."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from factory.engine.jobs.amplify import AmplifyPlanner, SeedSide, calls_wanted, no_progress_calls
from factory.engine.work import ItemResult


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"remaining": 100, "pending": 0, "released": 0, "accepted": 0}, 100),
        ({"remaining": 100, "pending": 60, "released": 0, "accepted": 0}, 40),
        ({"remaining": 40, "pending": 0, "released": 60, "accepted": 60}, 40),  # no loss yet
        (
            {"remaining": 55, "pending": 10, "released": 50, "accepted": 45},
            math.ceil(55 / 0.9 * 1.05) - 10,  # observed 0.9 = the prior
        ),
        # one reject among the first two calls: the estimate stays near the prior
        (
            {"remaining": 19, "pending": 18, "released": 2, "accepted": 1},
            math.ceil(19 / ((1 + 0.9 * 20) / 22) * 1.05) - 18,
        ),
        ({"remaining": 10, "pending": 0, "released": 2000, "accepted": 0}, 210),  # floor 5%
        ({"remaining": 0, "pending": 0, "released": 10, "accepted": 10}, 0),
        ({"remaining": 5, "pending": 50, "released": 10, "accepted": 5}, 0),  # enough out
    ],
)
def test_calls_wanted(kw: dict[str, int], expected: int) -> None:
    assert calls_wanted(**kw) == expected


def test_a_run_gives_up_after_a_bounded_streak() -> None:
    assert no_progress_calls(5, 64) == 20 and no_progress_calls(1000, 64) == 128
    assert no_progress_calls(50, 8) == 20


class _Collector:
    def __init__(self, target: int) -> None:
        self.target = target
        self.accepted = 0

    @property
    def done(self) -> bool:
        return self.accepted >= self.target


def _seed(i: int) -> dict[str, Any]:
    return {"source": f"s:{i}", "record": "{}", "status": "ok"}


def test_seeds_then_calls_in_order_until_the_target(tmp_path: Path) -> None:
    started: list[dict[str, str]] = []
    collector = _Collector(target=5)
    planner = AmplifyPlanner(
        iter([_seed(i) for i in range(3)]),
        judged=True,
        start_calls=started.append,
        collector=collector,  # type: ignore[arg-type]
        seeds=SeedSide(tmp_path),
        target=5,
        give_up=20,
    )
    seeds = planner.issue(room=10, llm_room=2)  # the judge's calls count against the budget
    assert [i.key for i in seeds] == [("seeds", 0), ("seeds", 1)] and all(i.llm for i in seeds)
    seeds += planner.issue(room=10, llm_room=10)
    assert len(seeds) == 3 and planner.seeds_read_all
    for item in seeds:
        row = {"status": "ok", "id": f"t{item.index}", "record": "{}", "stage": "prefilter"}
        planner.observe(ItemResult("seeds", item.index, [row]))
    assert planner.phase == "calls" and list(started[0]) == ["t0", "t1", "t2"]
    calls = planner.issue(room=64, llm_room=64)
    assert [i.row["call_index"] for i in calls] == [0, 1, 2, 3, 4]  # one per missing row
    assert planner.issue(room=64, llm_room=64) == []  # enough in flight
    for item in calls[:4]:
        collector.accepted += 1
        planner.observe(ItemResult("calls", item.index, []))
    planner.observe(ItemResult("calls", 4, []))  # rejected: one more is needed
    assert not planner.finished
    more = planner.issue(room=64, llm_room=64)
    # 1 missing at an estimated (4 + 0.9 x 20) / 25 = 88% yield + 5%: two calls
    assert [i.row["call_index"] for i in more] == [5, 6]
    collector.accepted += 1
    planner.observe(ItemResult("calls", 5, []))
    assert planner.finished and planner.stopped_by is None


def test_no_progress_ends_the_run(tmp_path: Path) -> None:
    collector = _Collector(target=50)
    planner = AmplifyPlanner(
        iter([_seed(0)]),
        judged=False,
        start_calls=lambda kept: None,
        collector=collector,  # type: ignore[arg-type]
        seeds=SeedSide(tmp_path),
        target=50,
        give_up=20,
    )
    (item,) = planner.issue(room=8, llm_room=0)  # no judge: seed checks need no LLM room
    assert not item.llm
    planner.observe(ItemResult("seeds", 0, [{"status": "ok", "id": "t", "record": "{}"}]))
    planner.issue(room=8, llm_room=8)  # nothing issued: the reader is read out now
    calls = planner.issue(room=64, llm_room=64)
    for item in calls[:19]:
        planner.observe(ItemResult("calls", item.index, []))
    assert not planner.finished
    planner.observe(ItemResult("calls", 19, []))
    assert planner.finished and planner.stopped_by == "no_progress"


def test_a_run_without_kept_seeds_ends_and_says_why(tmp_path: Path) -> None:
    side = SeedSide(tmp_path)
    planner = AmplifyPlanner(
        iter([_seed(0)]),
        judged=True,
        start_calls=lambda kept: None,
        collector=_Collector(5),  # type: ignore[arg-type]
        seeds=side,
        target=5,
        give_up=20,
    )
    planner.issue(room=4, llm_room=4)
    row = {"status": "rejected", "stage": "validate", "reason": "bad_role", "source": "s:0"}
    planner.observe(ItemResult("seeds", 0, [row]))
    planner.issue(room=4, llm_room=4)
    assert planner.finished
    error = side.error()
    assert "no seed survived" in str(error) and "validate:bad_role x1" in error.details[0]
