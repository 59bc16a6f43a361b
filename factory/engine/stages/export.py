"""Final stage of every trajectory pipeline: the LLaMA-Factory training row.

Runs distributed (not on the driver) because rendering is the per-row CPU work
of the output; the driver only appends the ready JSON to a shard.
"""

from __future__ import annotations

import json
from typing import Any

from factory.core.export import normalize, to_sharegpt
from factory.core.trajectory import Trajectory
from factory.engine.stages.base import Stage

__all__ = ["META_KEYS", "ExportStage", "sharegpt_row"]

# Metadata worth keeping next to the training columns (provenance and labels).
META_KEYS = (
    "source",
    "format",
    "task_id",
    "reward",
    "trial",
    "user_id",
    "repairs",
    "seed_id",
    "variation",
    "labels",
    "grounding",
)


def sharegpt_row(traj: Trajectory, reasoning: str) -> dict[str, Any]:
    """The Parquet row of one accepted trajectory: LLaMA-Factory columns + id + meta."""
    normalized = normalize(traj)
    row = to_sharegpt(normalized, reasoning=reasoning)  # type: ignore[arg-type]
    meta = {k: normalized.metadata[k] for k in META_KEYS if k in normalized.metadata}
    row["id"] = traj.id
    row["meta"] = json.dumps(meta, ensure_ascii=False, default=str)
    return row


class ExportStage(Stage):
    name = "export"
    requires = ("record",)

    def __init__(self, reasoning: str = "keep"):
        self.reasoning = reasoning

    def process(self, row: dict[str, Any]) -> dict[str, Any]:
        traj = Trajectory.from_json(row["record"])
        row["output"] = json.dumps(sharegpt_row(traj, self.reasoning), ensure_ascii=False)
        row["id"] = traj.id
        row["record"] = None  # the driver needs the training row only
        return row
