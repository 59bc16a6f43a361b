"""Seed stages: raw records become checked canonical trajectories.

``raw_record_rows`` turns reader output into rows; ``SeedCheckStage`` parses
(formats + repair), applies the recipe's reward requirement and runs every
rule-based validation, so the LLM pre-filter only ever sees seeds that are
already valid (rules first, the judge second: cheaper and explainable).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from factory.core.formats import parse_record
from factory.core.trajectory import Trajectory
from factory.core.validate import validate
from factory.engine.stages.base import Stage, make_row, reject
from factory.envs.pack import Domain
from factory.errors import SeedError
from factory.io.readers import RawRecord

__all__ = ["SeedCheckStage", "raw_record_rows"]


def raw_record_rows(records: Iterable[RawRecord]) -> Iterator[dict[str, Any]]:
    """One row per raw record; reader errors become rejects of stage ``read``."""
    for rec in records:
        source = f"{rec.source}:{rec.index}"
        row = make_row(source=source, raw=rec.raw)
        if rec.error is not None:
            yield reject(row, "read", rec.error.reason, str(rec.error), raw=rec.raw)
            continue
        try:
            row["record"] = json.dumps(rec.record, ensure_ascii=False, default=str)
        except (TypeError, ValueError) as exc:  # e.g. circular structures from odd parquet
            yield reject(row, "read", "bad_field_type", f"record not serialisable: {exc}")
            continue
        row["stage"] = "read"
        yield row


class SeedCheckStage(Stage):
    """Parse a raw seed into a Trajectory and reject it on the first broken rule."""

    name = "seed_check"
    requires = ("record", "source")

    def __init__(
        self,
        domain: Domain,
        *,
        tools_from_domain: bool = True,
        min_reward: float | None = None,
        reasoning: Literal["keep", "strip"] = "keep",
    ):
        self.domain = domain
        self.default_tools = domain.tools if tools_from_domain else None
        self.min_reward = min_reward
        self.reasoning = reasoning

    def parse(self, row: dict[str, Any]) -> Trajectory:
        return parse_record(
            json.loads(row["record"]),
            source=row["source"],
            default_tools=self.default_tools,
            grammar=self.domain.grammar,
        )

    def process(self, row: dict[str, Any]) -> dict[str, Any]:
        try:
            traj = self.parse(row)
        except SeedError as exc:
            return reject(row, "parse", exc.reason, str(exc), raw=row.get("raw"))
        row["id"] = traj.id
        if self.min_reward is not None:
            reward = traj.metadata.get("reward")
            if not isinstance(reward, (int, float)) or reward < self.min_reward:
                return reject(
                    row,
                    self.name,
                    "reward_below_min",
                    f"reward {reward!r} < required {self.min_reward}",
                    raw=row.get("raw"),
                )
        issues = validate(
            traj, rules=self.domain.rules, reasoning=self.reasoning, grammar=self.domain.grammar
        )
        if issues:
            detail = "; ".join(str(i) for i in issues[:3])
            return reject(row, "validate", issues[0].code, detail, raw=row.get("raw"))
        row["record"] = traj.to_json()
        row["raw"] = None  # accepted rows carry the canonical record, not the raw text
        return row
