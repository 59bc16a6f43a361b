"""Diversity and yield in the manifest (issue 13), streamed with bounded memory."""

from __future__ import annotations

import json
from pathlib import Path

from factory.core.diversity import DistinctCounter, DiversityStats, StepDiversity
from factory.core.mixture import Mixture
from factory.engine.collect import Collector
from factory.engine.stages.base import make_row
from factory.io.writer import Manifest
from tests.helpers import collect_rows


def _conv(user: str, tools: list[str]) -> dict:
    conv = [{"from": "human", "value": user}]
    for t in tools:
        conv.append({"from": "function_call", "value": json.dumps({"name": t, "arguments": {}})})
        conv.append({"from": "observation", "value": "{}"})
    conv.append({"from": "gpt", "value": "done"})
    return {"conversations": conv, "system": "", "tools": "", "id": user, "meta": "{}"}


def test_distinct_counter_is_exact_when_small_and_bounded_when_large() -> None:
    small = DistinctCounter(k=64)
    for i in range(50):
        small.add(str(i % 40))
    assert small.count() == 40
    big = DistinctCounter(k=1024)
    for i in range(200_000):
        big.add(str(i))
    assert len(big._heap) == 1024 and abs(big.count() - 200_000) / 200_000 < 0.1


def test_distinct_counter_keeps_the_k_smallest_blake2b_hashes_however_items_come() -> None:
    """The sketch is the k smallest distinct 64-bit BLAKE2b hashes (so a manifest's
    estimate is the same from run to run and from build to build), whether items come
    one by one or a row's n-grams at once, repeats included."""
    import hashlib

    items = [f"word {i % 700}" for i in range(2000)]  # 700 distinct, each 2-3 times

    def h64(text: str) -> int:
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")

    hashes = sorted({h64(t) for t in items})
    one, many = DistinctCounter(k=64), DistinctCounter(k=64)
    for item in items:
        one.add(item)
    for start in range(0, len(items), 97):
        many.add_many(items[start : start + 97])
    for counter in (one, many):
        assert sorted(-h for h in counter._heap) == hashes[:64]
        assert counter.full and counter.count() == round(63 * 2**64 / hashes[63])
    small = DistinctCounter(k=1024)
    small.add_many(items)
    assert not small.full and small.count() == 700


def test_summary_counts_sequences_lengths_seeds_and_quotas() -> None:
    d = DiversityStats()
    d.add(
        _conv("book a flight to paris", ["a", "b"]), seed_id="s1", labels={"outcome": "completed"}
    )
    d.add(_conv("book a flight to rome", ["a", "b"]), seed_id="s1", labels={"outcome": "refused"})
    d.add(_conv("cancel my trip", ["c"]), seed_id="s2", labels={"outcome": "completed"})
    mixture = Mixture.from_dict(
        {"name": "m", "quotas": [{"name": "ok", "count": 5, "outcome": ["completed"]}]}
    )
    s = d.summary(["s1", "s2", "s3"], mixture)
    assert s["rows"] == 3 and s["distinct_tool_sequences"] == 2
    assert s["tool_calls"] == {"a": 2, "b": 2, "c": 1}
    assert s["tools_per_row"]["histogram"] == {"1": 1, "2": 2}
    assert s["turns"]["min"] == 4 and s["turns"]["max"] == 6
    assert s["per_seed"] == {
        "seeds": 3,
        "min": 0,
        "median": 1,
        "max": 2,
        "seeds_with_nothing": 1,
        "seeds_with_nothing_ids": ["s3"],
    }
    assert s["labels"]["outcome"] == {"completed": 2, "refused": 1}
    assert s["quotas"] == {"ok": {"wanted": 5, "matching_labels": 2}}
    uni = s["user_distinct_ngrams"]["1"]
    assert uni["total"] == 5 + 5 + 3 and uni["distinct"] == 9


def test_collector_writes_the_diversity_section(tmp_path: Path) -> None:
    c = Collector(tmp_path, Manifest("r", "h"), dataset_name="d")
    c.seeds = ["s1", "s2"]
    rows = [
        make_row(
            id=f"r{i}", status="ok", output=json.dumps(_conv(f"question {i}", tools)), seed_id="s1"
        )
        for i, tools in enumerate((["a"], ["a"], ["b", "c"]))
    ]
    collect_rows(tmp_path, c, rows)
    div = json.loads((tmp_path / "manifest.json").read_text())["diversity"]
    assert div["rows"] == 3 and div["distinct_tool_sequences"] == 2
    assert div["per_seed"]["seeds_with_nothing_ids"] == ["s2"] and div["per_seed"]["max"] == 3


def _step(tool: str, args: dict, state: dict, task: str, delta: int) -> dict:
    labels = {"kind": "step", "outcome": "change" if delta else "no_change",
              "delta_size": delta, "task_id": task, "user_id": "u", "env_id": "e"}  # fmt: skip
    return {"tool": tool, "arguments": args, "state_before": state, "labels": labels}


def test_step_diversity_counts_calls_states_labels_and_tasks() -> None:
    """Simulator data: distinct calls (tool and arguments) and states, labels without
    provenance, and rows per task with the tasks that gave nothing."""
    d = StepDiversity()
    d.add(_step("get_user", {"id": "a"}, {"users": {"a": 1}}, "t1", 0), chars=400)
    d.add(_step("get_user", {"id": "a"}, {"users": {"a": 2}}, "t1", 0), chars=400)
    d.add(_step("get_user", {"id": "b"}, {"users": {"a": 2}}, "t2", 0), chars=100)
    d.add(_step("cancel", {"id": "b"}, {"users": {"a": 2}}, "t2", 3), chars=100)
    s = d.summary(["t1", "t2", "t3"])
    assert s["unit"] == "step" and s["rows"] == 4
    assert s["distinct_calls"] == 3 and s["distinct_calls_share"] == 0.75
    assert s["distinct_states"] == 2
    assert s["tool_calls"] == {"cancel": 1, "get_user": 3}
    assert s["labels"] == {
        "delta_size": {"0": 3, "3": 1},
        "outcome": {"change": 1, "no_change": 3},
    }
    assert s["per_task"] == {"tasks": 3, "min": 0, "median": 2, "max": 2, "tasks_with_nothing": 1}
    assert s["tokens"]["histogram"] == {"0": 2, "64": 2}  # 25 and 100 tokens, bins of 64
