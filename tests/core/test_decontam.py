"""Decontamination (issue 13): benchmark n-gram overlap and excluded ids are rejects with
reason ``contaminated`` and the overlapping span, in the real postprocess stage."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from factory.core.decontam import Decontaminator, load_benchmark_texts
from factory.core.formats.completion import render_output
from factory.core.trajectory import Trajectory, Turn
from factory.devserver import simulate
from factory.engine.stages.base import make_row
from factory.errors import ConfigError
from factory.recipe import load_recipe
from tests.conftest import ROOT
from tests.helpers import AIRLINE_SEEDS as SEEDS
from tests.helpers import postprocess_stage

# Texts shaped like tau-bench airline test instructions (entity-free, so the development
# server's renaming leaves a planted copy word for word).
BENCH = [
    "you are reaching out because your last trip was a disaster and you want the whole "
    "booking refunded without any fee and you will not accept a travel certificate",
    "you want to move every flight of your upcoming trip one day later but only if the "
    "new flights leave in the morning and you insist on keeping the same cabin class",
    "you are anxious about baggage and want to know how many free checked bags your "
    "membership gives before you add two more bags to the booking",
]


def _bench_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([{"task_id": i, "instruction": t} for i, t in enumerate(BENCH)]))
    return path


def test_overlap_names_the_text_and_the_span(tmp_path: Path) -> None:
    d = Decontaminator(load_benchmark_texts(_bench_file(tmp_path)), n=8, threshold=0.5)
    row = Trajectory(turns=[Turn("user", "Hello. " + BENCH[1].upper() + " Thanks!")])
    issue = d.check(row)
    assert issue is not None and issue.code == "contaminated"
    assert issue.path == "tasks.json#1" and "you want to move every flight" in issue.message
    half = " ".join(BENCH[2].split()[:10])  # a third of the text: below the threshold
    assert d.check(Trajectory(turns=[Turn("user", half)])) is None
    for seed in SEEDS:  # the authored seeds are clean
        assert d.check(seed) is None
    excluded = Decontaminator([], exclude_ids=["t7"])
    issue = excluded.check(Trajectory(metadata={"task_id": "t7"}))
    assert issue is not None and "task_id t7 is excluded" in issue.message
    assert excluded.check(Trajectory(), seed_id="t7") is not None


def test_benchmark_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_benchmark_texts(tmp_path / "missing.json")
    (tmp_path / "empty.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="holds no benchmark text"):
        load_benchmark_texts(tmp_path / "empty.json")
    (tmp_path / "lines.txt").write_text("one text\n\nanother text\n")
    assert [t for _, t in load_benchmark_texts(tmp_path / "lines.txt")] == [
        "one text",
        "another text",
    ]


def test_planted_benchmark_copies_are_all_caught_in_postprocess(tmp_path: Path) -> None:
    """Seeds carrying a benchmark instruction, amplified by the development server's
    model: every answer is rejected ``contaminated``; answers of clean seeds pass."""
    bench = _bench_file(tmp_path)
    cfg = load_recipe(
        ROOT / "pipelines" / "airline.yaml",
        [f"decontamination={{benchmark: [{json.dumps(str(bench))}]}}"],
    )
    stage = postprocess_stage(cfg)
    rng = random.Random(0)
    caught = clean = 0
    for i, seed in enumerate(SEEDS[:12]):
        reference = render_output(seed)
        planted = i % 2 == 0
        if planted:  # the instruction pasted into the first user turn
            first = next(m for m in reference["messages"] if m["role"] == "user")
            first["content"] += " " + BENCH[i % 3]
        ref = simulate.reference_from_block(json.dumps(reference))
        assert ref is not None
        completion = json.dumps(simulate.amplify(ref, rng))
        out = stage.run_one(make_row(completion=completion, seed_id=f"s{i}", source=f"s{i}#0"))
        if planted:
            assert out["status"] == "rejected" and out["reason"] == "contaminated", out["message"]
            assert out["stage"] == "decontam" and "tasks.json#" in out["message"]
            caught += 1
        else:
            assert out["status"] == "ok", out.get("message")
            clean += 1
    assert caught == 6 and clean == 6


def test_curate_export_stage_decontaminates_and_signs(tmp_path: Path) -> None:
    from factory.core.neardup import NearDupParams
    from factory.engine.stages.export import ExportStage

    d = Decontaminator(load_benchmark_texts(_bench_file(tmp_path)))
    stage = ExportStage(decontam=d, neardup=NearDupParams())
    dirty = Trajectory(turns=[Turn("user", BENCH[0]), Turn("assistant", "ok")])
    out = stage.run_one(make_row(record=dirty.to_json()))
    assert out["status"] == "rejected" and out["reason"] == "contaminated"
    out = stage.run_one(make_row(record=SEEDS[0].to_json()))
    assert out["status"] == "ok" and out["minhash"] and out["output"]
