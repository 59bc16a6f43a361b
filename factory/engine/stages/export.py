"""Final stage of every trajectory pipeline: the LLaMA-Factory training row.

Runs distributed (not on the driver) because rendering is the per-row CPU work
of the output; the driver only appends the ready JSON to a shard.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from factory.core.decontam import DECONTAM_STAGE, Decontaminator
from factory.core.export import Rendered, export_tools, render
from factory.core.neardup import NearDupParams, signature_bytes
from factory.core.trajectory import Trajectory
from factory.engine.stages.base import Stage, reject

__all__ = [
    "META_KEYS",
    "SHARED_COLUMNS",
    "ExportStage",
    "output_fields",
    "sharegpt_row",
    "training_row",
]

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


def sharegpt_row(
    traj: Trajectory,
    reasoning: str,
    rendered: Rendered | None = None,
    *,
    text_actions: bool = False,
) -> dict[str, Any]:
    """The Parquet row of one accepted trajectory: LLaMA-Factory columns + id + meta.

    Args:
        traj: the accepted trajectory, its metadata final (labels, id).
        reasoning: the export mode.
        rendered: ``validate_rendered``'s rendering of ``traj`` in the same mode, if
            the caller has it: reused, so the row is exactly what was validated and
            the trajectory is not normalised and rendered a second time.
        text_actions: the domain's actions are text (an action grammar): the row keeps
            the agent's turns as they are and has no tools column (``""``).
    """
    if rendered is None or rendered.reasoning != reasoning:
        rendered = render(traj, reasoning=reasoning, text_actions=text_actions)  # type: ignore[arg-type]
    # What ``to_sharegpt(normalize(traj))`` writes: normalising rewrites turns and
    # appends to the repairs; system, tools and other metadata are the trajectory's.
    metadata = {
        **traj.metadata,
        "repairs": [*(traj.metadata.get("repairs") or ()), *rendered.repairs],
    }
    meta = {k: metadata[k] for k in META_KEYS if k in metadata}
    return {
        "conversations": rendered.conversations,
        "system": traj.system,
        "tools": export_tools(traj.tools) if rendered.tools_column else "",
        "id": traj.id,
        "meta": json.dumps(meta, ensure_ascii=False, default=str),
    }


# The training columns the rows of a run share: the deployment system prompt and the
# domain's tools, ~19 of an airline row's ~23 kB. They travel to the driver beside
# ``output`` as row fields of their own, one str object per distinct text in a worker
# process, so a reply that carries several rows pickles each text once (pickle writes an
# object it has seen as a reference) and the driver parses only the row's own JSON.
SHARED_COLUMNS = ("system", "tools")
_INTERNED: dict[str, str] = {}
_INTERNED_MAX = 4096  # distinct shared texts kept (a pack without a policy: one per seed)


def output_fields(out: dict[str, Any]) -> dict[str, Any]:
    """The row fields of the training row ``out`` (``sharegpt_row``): ``output``, its JSON
    with the shared columns null (in their places, so the row comes back in its column
    order), and each shared column as a field of its own."""
    own = {k: None if k in SHARED_COLUMNS else v for k, v in out.items()}
    fields: dict[str, Any] = {"output": json.dumps(own, ensure_ascii=False)}
    if len(_INTERNED) > _INTERNED_MAX:
        _INTERNED.clear()
    for key in SHARED_COLUMNS:
        text = out[key]
        fields[key] = _INTERNED.setdefault(text, text)
    return fields


def training_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The training row a pipeline row carries (``output_fields`` undone)."""
    out: dict[str, Any] = json.loads(row["output"])
    for key in SHARED_COLUMNS:
        if key in out and row.get(key) is not None:
            out[key] = row[key]
    return out


class ExportStage(Stage):
    name = "export"
    requires = ("record",)

    def __init__(
        self,
        reasoning: str = "keep",
        *,
        decontam: Decontaminator | None = None,
        neardup: NearDupParams | None = None,
        text_actions: bool = False,
    ):
        self.reasoning = reasoning
        self.decontam = decontam
        self.neardup = neardup
        self.text_actions = text_actions

    def process(self, row: dict[str, Any]) -> dict[str, Any]:
        traj = Trajectory.from_json(row["record"])
        if self.decontam is not None:
            issue = self.decontam.check(traj)
            if issue is not None:
                return reject(row, DECONTAM_STAGE, issue.code, issue.message)
        if self.neardup is not None:  # the driver's index compares signatures, never rows
            row["minhash"] = signature_bytes(traj, self.neardup)
        row.update(
            output_fields(sharegpt_row(traj, self.reasoning, text_actions=self.text_actions))
        )
        row["id"] = traj.id
        row["record"] = None  # the driver needs the training row only
        return row
