"""Rollouts are data: a finished episode becomes a LLaMA-Factory sharegpt row.

Why the SFT pipeline's writer: a run of the environment with any policy is then also
a trajectory dataset, in the exact layout (columns, ``meta``, ``dataset_info.json``)
the curate and amplify jobs write, so the same training and filtering tools read it.
The row is ``factory.engine.stages.export.sharegpt_row`` of the episode; ``meta``
carries the reward, the task id and ``labels`` (mode, steps, invalid calls, tool
errors, simulated and inconsistent calls, every reward source).

A training row must end on an assistant message, so the turns after the agent's last
plain message (the user's goodbye, a call left unanswered by ``max_steps``) are cut;
what was cut is counted in ``labels.trimmed_turns``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from factory.core.trajectory import Trajectory
from factory.engine.stages.export import sharegpt_row
from factory.io.writer import ShardWriter, write_dataset_info
from factory.simenv.env import SimEnv

__all__ = ["RolloutWriter", "rollout_row", "rollout_trajectory"]


def rollout_trajectory(env: SimEnv) -> Trajectory:
    """The finished episode of ``env`` as a trainable trajectory (see the module doc)."""
    traj = env.trajectory()
    last = max(
        (i for i, t in enumerate(traj.turns) if t.role == "assistant" and not t.tool_calls),
        default=-1,
    )
    trimmed = len(traj.turns) - (last + 1)
    traj.turns = traj.turns[: last + 1]
    traj.metadata["labels"]["trimmed_turns"] = trimmed
    return traj


def rollout_row(env: SimEnv, *, reasoning: str = "keep") -> dict[str, Any]:
    """The Parquet row of the finished episode (LLaMA-Factory columns + id + meta)."""
    return sharegpt_row(rollout_trajectory(env), reasoning)


class RolloutWriter:
    """Shards of rollout rows in ``out_dir/data`` plus ``dataset_info.json``.

    Args:
        out_dir: the dataset folder (LLaMA-Factory's ``dataset_dir``).
        name: the dataset's name in ``dataset_info.json``.
        shard_rows: rows per Parquet shard.
    """

    def __init__(
        self, out_dir: str | Path, *, name: str = "simenv_rollouts", shard_rows: int = 500
    ):
        self.out_dir = Path(out_dir)
        self.name = name
        self._shards = ShardWriter(self.out_dir, shard_rows=shard_rows)
        self.rows = 0
        self.skipped = 0

    def add(self, env: SimEnv) -> bool:
        """Write the finished episode; False when it has no agent message to train on."""
        traj = rollout_trajectory(env)
        if not traj.turns:
            self.skipped += 1
            return False
        self._shards.add(sharegpt_row(traj, "keep"))
        self.rows += 1
        return True

    def close(self) -> None:
        self._shards.close()
        if self._shards.rows_written:
            write_dataset_info(self.out_dir, self.name)
