"""How the development server works through one batch, whatever its provider's wire.

Why shared: Anthropic's Message Batches (``anthropic_batches``) and Gemini's Batch API
(``gemini_batches``) must misbehave the way the OpenAI Batch API of ``batches`` does, so
one test plan proves the one lifecycle (``factory.llm.backends.batching``) against
each: the same processing delay (``batch_delay_s``), the same per-request error share
drawn per custom id and attempt (``batch_error_rate``, ``seed``: a resubmitted request
may succeed), and the same batches failing or expiring by creation order
(``batch_fail_first``, then ``batch_expire_first`` after answering
``batch_expire_keep`` of their requests). Cancellation comes from the provider's cancel
endpoint (:attr:`Work.cancel`). Each module keeps its own wire: this one only says, per
request, what happened.

The request log gets the same lines as the OpenAI Batch API's: ``batch_submit`` per
submitted request, ``batch`` per answered one (``completed`` true or false), and
``batch_end`` per batch, so a test can prove that no request was answered twice.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Answered", "Errored", "LineError", "NotRun", "Work", "errored", "process"]


class LineError(Exception):
    """One request the provider refuses inside a batch (bad params): an errored result."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Answered:
    """The request was answered: ``body`` is the provider's answer."""

    body: dict[str, Any]


@dataclass(frozen=True)
class Errored:
    """The request failed inside the batch with an HTTP-like ``status``."""

    status: int
    message: str


@dataclass(frozen=True)
class NotRun:
    """The batch ended before the request ran."""

    why: Literal["expired", "cancelled", "failed"]


Outcome = Answered | Errored | NotRun


@dataclass
class Work:
    """One batch as it is worked through (the provider module renders it).

    Attributes:
        batch_id: the provider's id.
        keys: the requests' custom ids (keys), in order.
        index: the batch's creation order on this server (which fail or expire).
        status: ``pending``, ``running``, then ``completed``, ``failed``, ``expired`` or
            ``cancelled``.
        outcomes: what happened to each request so far, by key.
        cancel: set by the cancel endpoint; the batch stops before its next request.
    """

    batch_id: str
    keys: list[str]
    index: int
    status: str = "pending"
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    cancel: bool = False

    @property
    def ended(self) -> bool:
        return self.status in ("completed", "failed", "expired", "cancelled")

    def count(self, kind: type) -> int:
        return sum(1 for o in self.outcomes.values() if isinstance(o, kind))


def errored(config: Any, attempts: dict[str, int], key: str) -> bool:
    """Does this request get a per-request error (drawn per key and attempt: the same
    draw on every wire, the OpenAI Batch API's included)?"""
    attempt = attempts.get(key, 0)
    attempts[key] = attempt + 1
    rate = config.batch_error_rate
    if not rate:
        return False
    return random.Random(f"{config.seed}:{key}:{attempt}").random() < rate


async def process(
    work: Work,
    config: Any,
    log: Callable[..., None],
    attempts: dict[str, int],
    answer: Callable[[int], dict[str, Any]],
) -> None:
    """Work through ``work``: ``answer(i)`` answers its i-th request (raising
    :class:`LineError` for a request the provider refuses); ``attempts`` counts each
    key's submissions on this server (the error draws)."""
    for key in work.keys:
        log(kind="batch_submit", batch_id=work.batch_id, request_id=key)
    await asyncio.sleep(config.batch_delay_s * 0.1)
    if work.index < config.batch_fail_first:
        for key in work.keys:
            work.outcomes[key] = NotRun("failed")
        work.status = "failed"
        log(kind="batch_end", batch_id=work.batch_id, status="failed")
        return
    expire_at: int | None = None
    first = config.batch_fail_first
    if first <= work.index < first + config.batch_expire_first:
        expire_at = int(len(work.keys) * config.batch_expire_keep)
    work.status = "running"
    per_line = config.batch_delay_s * 0.8 / max(len(work.keys), 1)
    end = "completed"
    for n, key in enumerate(work.keys):
        if work.cancel:
            end = "cancelled"
        elif expire_at is not None and n >= expire_at:
            end = "expired"
        if end != "completed":
            break
        await asyncio.sleep(per_line)
        if errored(config, attempts, key):
            work.outcomes[key] = Errored(500, "The server had an error (simulated).")
            log(kind="batch", batch_id=work.batch_id, request_id=key, status=500, completed=False)
            continue
        try:
            work.outcomes[key] = Answered(answer(n))
        except LineError as exc:
            work.outcomes[key] = Errored(exc.status, exc.message)
            log(kind="batch", batch_id=work.batch_id, request_id=key, status=exc.status,
                completed=False)  # fmt: skip
            continue
        log(kind="batch", batch_id=work.batch_id, request_id=key, status=200, completed=True)
    if end != "completed":
        for key in work.keys:
            work.outcomes.setdefault(key, NotRun("expired" if end == "expired" else "cancelled"))
    else:
        await asyncio.sleep(config.batch_delay_s * 0.1)
    work.status = end
    log(kind="batch_end", batch_id=work.batch_id, status=end)
