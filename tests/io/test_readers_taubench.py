"""All 200 tau-bench GPT-4o airline trajectories ingest losslessly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from factory.core.formats import parse_record
from factory.core.trajectory import Trajectory
from factory.io.readers import SeedReject, read_seeds

pytestmark = pytest.mark.shared


@pytest.fixture(scope="module")
def taubench(taubench_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Path]:
    path = taubench_dir / "gpt-4o-airline.json"
    records = json.loads(path.read_text(encoding="utf-8"))
    tools = json.loads((taubench_dir / "tools.json").read_text(encoding="utf-8"))
    return records, tools, path


def test_all_200_parse_with_metadata_kept(taubench: Any) -> None:
    records, tools, path = taubench
    got = list(read_seeds(path, default_tools=tools))
    rejects = [g for g in got if isinstance(g, SeedReject)]
    assert rejects == []
    assert len(got) == len(records) == 200
    for i, (traj, record) in enumerate(zip(got, records, strict=True)):
        assert isinstance(traj, Trajectory)
        meta = traj.metadata
        assert meta["format"] == "openai"
        assert meta["source"] == f"{path}:{i}"
        assert meta["reward"] == record["reward"]
        assert meta["task_id"] == record["task_id"]
        assert meta["trial"] == record["trial"]
        assert meta["user_id"] == record["info"]["task"]["user_id"]
        assert meta["repairs"] == []
        assert meta["id"] == traj.content_id()
        assert traj.system == record["traj"][0]["content"]
        assert len(traj.tools) == 14
    assert {t.metadata["reward"] for t in got if isinstance(t, Trajectory)} == {0.0, 1.0}
    assert len({t.id for t in got if isinstance(t, Trajectory)}) == 200


def test_calls_and_observations_are_exact(taubench: Any) -> None:
    records, tools, _ = taubench
    n_calls = n_observations = 0
    for i, record in enumerate(records):
        traj = parse_record(record, source=f"tau:{i}", default_tools=tools)
        source = [m for m in record["traj"] if m["role"] != "system"]
        assert len(traj.turns) == len(source)
        for turn, msg in zip(traj.turns, source, strict=True):
            assert turn.role == msg["role"]
            if msg["role"] == "assistant":
                assert turn.content == (msg["content"] or "")
                expected = [
                    (c["function"]["name"], json.loads(c["function"]["arguments"]), c["id"])
                    for c in msg.get("tool_calls") or []
                ]
                assert [(c.name, c.arguments, c.id) for c in turn.tool_calls] == expected
                n_calls += len(expected)
            elif msg["role"] == "tool":
                # observations stay byte for byte (fidelity against the executed world)
                assert turn.content == msg["content"]
                assert (turn.name, turn.tool_call_id) == (msg["name"], msg["tool_call_id"])
                assert turn.name in traj.tool_names()
                n_observations += 1
            else:
                assert turn.content == msg["content"]
    assert n_calls == n_observations == 1164
