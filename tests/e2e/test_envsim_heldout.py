"""The envsim job's held-out split, end to end (issue 10, point 7), and what its rows hold.

A small mixture keeps each run short; the held-out rows never share a row, a task
(``by: task``) or a world (``by: env``) with the training rows, and
``factory.evaluate`` reads ``data/`` and ``heldout/`` as the job wrote them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from factory.engine.runner import run
from factory.envsim.simulator import check_sample
from factory.evaluate import main as evaluate_main
from tests.conftest import ROOT
from tests.helpers import recipe, underivable

pytestmark = pytest.mark.ray

AIRLINE_TOOLS = {t["name"] for t in json.loads((ROOT / "prompts/airline/tools.json").read_text())}
MIXTURE = """name: tiny
min_per_tool: 1
quotas:
  - {name: fail, group: Failure, count: 16}
  - {name: nc, group: No-Change, count: 24}
  - {name: simple, group: Simple, count: 16}
  - {name: complex, group: [Medium, Difficult, Beyond], count: 8}
"""


def _rows(folder: Path) -> list[dict[str, Any]]:
    return [r for f in sorted(folder.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def _run(tmp_path: Path, *overrides: str) -> tuple[Path, dict[str, Any]]:
    mix = tmp_path / "tiny.yaml"
    mix.write_text(MIXTURE)
    out = tmp_path / "out"
    cfg = recipe(
        "airline-envsim.yaml",
        out,
        f"mixture.path={mix}",
        "envsim.episodes_per_round=60",
        "envsim.max_episodes=900",
        *overrides,
    )
    run(cfg, out, progress=False)
    return out, json.loads((out / "manifest.json").read_text())


def _labels(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(row["meta"])["labels"]


def test_heldout_by_task_is_disjoint_balanced_and_evaluable(
    ray_session: Any, devserver: Any, tmp_path: Path
) -> None:
    out, manifest = _run(tmp_path, "envsim.heldout={by: task, share: 0.3, scale: 0.5}")
    data, held = _rows(out / "data"), _rows(out / "heldout")
    assert len(data) == 64 and len(held) == 32  # ceil(8, 12, 8, 4)
    assert manifest["heldout"]["rows"] == 32 and manifest["heldout"]["by"] == "task"
    assert manifest["mixture"]["shortfall"] == {} == manifest["heldout"]["mixture"]["shortfall"]
    assert {r["id"] for r in data}.isdisjoint(r["id"] for r in held)
    train_tasks = {_labels(r)["task_id"] for r in data}
    held_tasks = {_labels(r)["task_id"] for r in held}
    assert train_tasks and held_tasks and train_tasks.isdisjoint(held_tasks)
    assert any(f.startswith("heldout/") for f in manifest["files"])
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["factory_airline_envsim_heldout"]["file_name"] == "heldout"
    # tool balance: every airline tool is in the training rows
    assert {check_sample(r)["tool"] for r in data} == AIRLINE_TOOLS
    # rows stand alone: no output value the instruction and input do not give
    assert {r["id"]: underivable(r) for r in data + held if underivable(r)} == {}
    # the evaluator reads both folders as they are; the devserver is a perfect simulator
    server = devserver()
    for folder, n in (("data", 64), ("heldout", 32)):
        report = tmp_path / f"eval-{folder}"
        argv = ["--samples", str(out / folder), "--base-url", server.url, "--model", "factory-dev"]
        assert evaluate_main([*argv, "--out", str(report)]) == 0
        body = json.loads((report / "evaluation.json").read_text())
        assert body["samples"] == n and body["invalid_records"] == 0
        overall = body["overall"]
        assert overall["feedback_match"] == overall["config_match"] == n


def test_heldout_by_env_uses_its_own_world_in_envsimbench_layout(
    ray_session: Any, tmp_path: Path
) -> None:
    out, manifest = _run(
        tmp_path,
        "envsim.heldout={by: env, scale: 0.25}",
        "envsim.layout=envsimbench",
        "envsim.validate_arguments=false",
    )
    data, held = _rows(out / "data"), _rows(out / "heldout")
    assert len(data) == 64 and len(held) == 16
    assert manifest["heldout"]["world_seed"] == 1
    assert {json.loads(r["meta"])["env_id"] for r in data} == {"airline-gen-0"}
    assert {json.loads(r["meta"])["env_id"] for r in held} == {"airline-gen-1"}
    for row in data + held:
        body = json.loads(row["input"])
        assert set(body) == {"initial_config", "tool_call"}
        assert "Environment Code:" in row["instruction"]
        sample = check_sample(row)  # the evaluator reads this layout too
        assert sample["tool"] in AIRLINE_TOOLS
    # validate_arguments=false: no call was refused for an argument's type
    assert not any("invalid argument" in json.loads(r["output"])["feedback"] for r in data + held)
