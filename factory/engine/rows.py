"""The pipeline row, typed: its columns, its status, and the fates the driver files it under.

Why a ``TypedDict`` and not a dataclass: a row crosses Ray from a worker to the driver
about once per item, and becomes Arrow (``rows_to_table``) or a JSON line as a plain
dict; a ``TypedDict`` is a plain dict at run time (nothing to convert, nothing extra to
pickle) and lets mypy check every column a reader names. Every row has every column
(``make_row``: ``None`` where unset), so the keys are required and the values optional.

Why ``StrEnum``: a status or a fate is compared with, and written as, its string
(Parquet shards, reject files, manifest keys); a ``StrEnum`` member *is* that string
(equal, same hash, ``json.dumps`` and Arrow write its value), so the files stay byte
for byte what they were while the code names each value once.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NotRequired, TypedDict

__all__ = ["Fate", "Row", "Status", "StepRow"]


class Status(StrEnum):
    """A row's ``status`` column: where it stands in its chain."""

    OK = "ok"  # passed every stage so far
    REJECTED = "rejected"  # bad content: a rule or a judge said no (reason code beside it)
    FAILED = "failed"  # the factory could not process it (e.g. the LLM was down)
    UNISSUED = "unissued"  # never sent: a budget cap (or a broken cache) stopped it first


class Fate(StrEnum):
    """Where the driver filed a row (``factory.engine.filing``): the run's totals' keys."""

    ACCEPTED = "accepted"  # a training row (data/, or candidates/ under a mixture)
    SURPLUS = "surplus"  # valid, past the target or a seed's cap: kept in surplus/
    REJECTED = "rejected"  # rejects/ with its stage and reason code
    FAILED = "failed"  # failed/ with its stage and reason code
    UNISSUED = "unissued"  # never sent: counted apart from the totals


class Row(TypedDict):
    """One pipeline row: the columns of ``factory.engine.stages.base.ROW_SCHEMA``, in its
    order (a test checks both agree). What a worker hands the driver (``ItemResult``)."""

    id: str | None  # trajectory content id, or a work-item id before there is one
    status: Status
    stage: str | None  # last stage that touched the row (the deciding one if not ok)
    reason: str | None  # reason code (factory.core.reasons) when not ok
    message: str | None  # human detail, truncated
    source: str | None  # provenance: "file:index" or "seed-id#variation"
    raw: str | None  # raw input / completion kept for rejects (truncated)
    record: str | None  # canonical Trajectory JSON
    seed_id: str | None  # the seed a generated row comes from
    call_index: int | None  # global amplification call number
    request_id: str | None  # content-derived LLM request id
    verdict: str | None  # pre-filter verdict JSON
    completion: str | None  # raw model output
    usage: str | None  # token usage JSON
    cost_usd: float | None
    attempts: int | None  # attempts that reached the wire
    calls: int | None  # requests this row sent (cache replays are not calls)
    llm_stage: str | None  # the LLM stage whose call the usage and cost are
    retries: str | None  # retried attempts / requests by reason (JSON)
    latency_s: float | None
    endpoint: str | None
    fingerprint: str | None  # system_fingerprint of the serving model
    output: str | None  # exported training row (JSON), less its shared columns:
    system: str | None  # its system prompt and tools (``stages.export.output_fields``)
    tools: str | None
    labels: str | None  # stratification labels JSON
    grounding: str | None  # replay result on the executable world (JSON)
    cached: bool | None  # the LLM response came from the cache
    cached_responses: int | None  # responses replayed from the cache (all requests)
    paid_usd: float | None  # what this run paid for the row (all requests)
    unstored: str | None  # a paid response the cache could not store (JSON)
    minhash: bytes | None  # the accepted row's MinHash signature (factory.core.neardup)
    #: Not a ``ROW_SCHEMA`` column: the simulator-data job's step sample, on the rows its
    #: episode stage makes (filed as a ``StepRow``).
    sample: NotRequired[str | None]


class StepRow(TypedDict):
    """One step sample of the simulator-data job (``jobs.envsim.CANDIDATE_SCHEMA``'s
    columns); ``stage`` and ``raw`` only while it travels (a stage or a reject sets them),
    never written."""

    id: str | None  # None only on a row that failed before it had a step
    status: Status
    reason: str | None
    message: str | None
    labels: str | None  # selection labels JSON (the tool among them)
    sample: str | None  # the StepSample JSON
    stage: NotRequired[str | None]
    raw: NotRequired[str | None]
