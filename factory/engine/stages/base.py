"""Stage plumbing: the row shape every stage reads and writes, and the per-row guard.

A stage is a pure function over one row (``process``), or for LLM stages an
async one (``aprocess``). ``Stage.run_one`` does the plumbing once for all of
them (the idea of Ray's ``StatefulStageUDF``): it checks the stage's required
columns (a missing one is an error naming the stage and key), passes rows that
earlier stages rejected or failed through untouched, and turns an unexpected
exception on one row into a failed row (``Type: message``). A stage returns
its row, or a list of rows (one input may make several: an episode's steps).
Failures are data: nothing is dropped here. The worker
(``factory.engine.worker``) runs chains of stages over work items.
"""

from __future__ import annotations

import asyncio
import contextvars
from abc import ABC
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import pyarrow as pa

from factory.engine.rows import Row, Status, StepRow
from factory.errors import FactoryError, short

__all__ = [
    "FAILED",
    "HURRY",
    "OK",
    "REJECTED",
    "ROW_SCHEMA",
    "UNISSUED",
    "AnyRow",
    "Stage",
    "StageSpec",
    "fail",
    "make_row",
    "reject",
    "rows_to_table",
]

# The statuses under the names the stages use (``factory.engine.rows.Status``).
OK, REJECTED, FAILED, UNISSUED = Status.OK, Status.REJECTED, Status.FAILED, Status.UNISSUED
# The stop reason of a run that has what it needs: unstarted work vanishes (not counted).
NOT_NEEDED = "not_needed"
RAW_LIMIT = 4000  # characters of raw input kept on reject rows

#: Set by the worker for the task of each item: the driver sets the event when the item
#: holds back results that came after it (rows are used in item order, so one row deep in
#: a retry chain keeps every later row waiting). A waiting retry then ends early
#: (``factory.engine.stages.llm_stage``); what the server asked for is still waited.
HURRY: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar("hurry", default=None)

ROW_SCHEMA = pa.schema(
    [
        ("id", pa.string()),  # trajectory content id, or a work-item id before there is one
        ("status", pa.string()),  # ok | rejected | failed
        ("stage", pa.string()),  # last stage that touched the row (the deciding one if not ok)
        ("reason", pa.string()),  # reason code (factory.core.reasons) when not ok
        ("message", pa.string()),  # human detail, truncated
        ("source", pa.string()),  # provenance: "file:index" or "seed-id#variation"
        ("raw", pa.string()),  # raw input / completion kept for rejects (truncated)
        ("record", pa.string()),  # canonical Trajectory JSON
        ("seed_id", pa.string()),  # the seed a generated row comes from
        ("call_index", pa.int64()),  # global amplification call number
        ("request_id", pa.string()),  # content-derived LLM request id
        ("verdict", pa.string()),  # pre-filter verdict JSON
        ("completion", pa.string()),  # raw model output
        ("usage", pa.string()),  # token usage JSON
        ("cost_usd", pa.float64()),
        ("attempts", pa.int64()),  # attempts that reached the wire
        ("calls", pa.int64()),  # requests this row sent (cache replays are not calls)
        ("llm_stage", pa.string()),  # the LLM stage whose call the usage and cost are
        ("retries", pa.string()),  # retried attempts / requests by reason (JSON)
        ("latency_s", pa.float64()),
        ("endpoint", pa.string()),
        ("fingerprint", pa.string()),  # system_fingerprint of the serving model
        ("output", pa.string()),  # exported training row (JSON) when accepted, less:
        ("system", pa.string()),  # its system prompt and tools, shared by most rows and
        ("tools", pa.string()),  # sent apart (``stages.export.output_fields``)
        ("labels", pa.string()),  # stratification labels JSON
        ("grounding", pa.string()),  # replay result on the executable world (JSON)
        ("cached", pa.bool_()),  # the LLM response came from the cache (paid by an earlier run)
        # Per row, over all its requests (a judge may ask again): responses replayed from
        # the cache, and what this run paid; the manifest's figures are their sums.
        ("cached_responses", pa.int64()),
        ("paid_usd", pa.float64()),
        # {"request_id", "record", "error"} JSON of a paid response the cache could not store:
        # the driver keeps it (OUT/unstored/) and stops the run (factory.io.runstate).
        ("unstored", pa.string()),
        # The accepted row's MinHash signature (factory.core.neardup), checked on the driver.
        ("minhash", pa.binary()),
    ]
)
COLUMNS: tuple[str, ...] = tuple(ROW_SCHEMA.names)
#: A row as stages pass it (a plain dict) or as the driver files it (typed).
AnyRow = TypeVar("AnyRow", Row, StepRow, dict[str, Any])


def make_row(**values: Any) -> dict[str, Any]:
    """A row with every column present (None where unset), status ok by default."""
    row = dict.fromkeys(COLUMNS)
    row["status"] = OK
    unknown = set(values) - set(COLUMNS)
    if unknown:
        raise KeyError(f"unknown row columns: {sorted(unknown)}")
    row.update(values)
    return row


def reject(row: AnyRow, stage: str, reason: str, message: str, *, raw: Any = None) -> AnyRow:
    """Mark ``row`` rejected by ``stage`` (bad content: a rule or a judge said no)."""
    row["status"] = Status.REJECTED
    row["stage"], row["reason"], row["message"] = stage, reason, short(message, 500)
    if raw is not None:
        row["raw"] = short(raw, RAW_LIMIT)
    return row


def fail(row: AnyRow, stage: str, reason: str, message: str) -> AnyRow:
    """Mark ``row`` failed by ``stage`` (the factory could not process it, e.g. LLM down)."""
    row["status"] = Status.FAILED
    row["stage"], row["reason"], row["message"] = stage, reason, short(message, 500)
    return row


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ROW_SCHEMA)


class Stage(ABC):  # noqa: B024 - subclasses implement one of process / aprocess
    """One step of a pipeline over rows. Subclasses set ``name``, ``requires`` and
    implement ``process(row)`` (sync) or ``aprocess(row)`` (async, for I/O)."""

    name: ClassVar[str] = "stage"
    requires: ClassVar[tuple[str, ...]] = ("record",)
    #: Set by the worker: why no new LLM request may start now (a stop), or None.
    admission: Callable[[], str | None] | None = None

    def process(self, row: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        return self.process(row)

    def close(self) -> None:  # noqa: B027 - optional hook, most stages hold nothing
        """Release what the stage holds (HTTP sessions); called when its actor ends."""

    async def aclose(self) -> None:
        """``close`` from the worker's event loop (LLM stages close their sessions there)."""
        self.close()

    @property
    def is_async(self) -> bool:
        return type(self).aprocess is not Stage.aprocess

    def check_columns(self, row: dict[str, Any]) -> None:
        missing = [k for k in self.requires if row.get(k) is None]
        if missing:
            raise FactoryError(
                f"stage {self.name!r} needs column {missing[0]!r}, which the row lacks",
                stage=self.name,
                row_id=row.get("id"),
            )

    def _guard(self, row: dict[str, Any], exc: Exception) -> dict[str, Any]:
        if isinstance(exc, FactoryError) and exc.stage == self.name and "needs column" in str(exc):
            raise exc  # a wiring bug, not a data problem: stop loudly
        reason = (exc.reason if isinstance(exc, FactoryError) else None) or "internal_error"
        desc = exc.describe() if isinstance(exc, FactoryError) else f"{type(exc).__name__}: {exc}"
        return fail(row, self.name, reason, desc)

    def run_one(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get("status") != OK:
            return row
        self.check_columns(row)
        try:
            out = self.process(row)
        except Exception as exc:
            return self._guard(row, exc)
        for one in out if isinstance(out, list) else [out]:
            one.setdefault("stage", self.name)
            if one.get("status") == OK:
                one["stage"] = self.name
        return out

    async def arun_one(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get("status") != OK:
            return row
        self.check_columns(row)
        try:
            out = await self.aprocess(row)
        except Exception as exc:
            return self._guard(row, exc)
        if out.get("status") == OK:
            out["stage"] = self.name
        return out

    def run_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Sync entry point over a list of rows (tests, batched chains, the dry run)."""
        if self.is_async:
            return asyncio.run(self.arun_rows(rows))
        out: list[dict[str, Any]] = []
        for row in rows:
            result = self.run_one(row)
            out.extend(result if isinstance(result, list) else [result])
        return out

    async def arun_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """All rows of a batch concurrently; the stage's own client bounds concurrency."""
        return list(await asyncio.gather(*(self.arun_one(r) for r in rows)))


StageSpec = tuple[Callable[..., Stage], tuple[Any, ...]]
