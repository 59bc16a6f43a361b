"""The development server's Anthropic Message Batches: ``/v1/messages/batches``.

Why: the ``anthropic_batch`` backend (``factory.llm.backends.anthropic_batch``) must be
tested offline against the contract Anthropic serves (API reference: creating, retrieving,
listing, cancelling message batches and retrieving their results,
https://docs.claude.com/en/api/creating-message-batches; anthropic-sdk-python
``types/messages/message_batch.py``, ``message_batch_individual_response.py``), with what
goes wrong in a real batch: a processing delay, per-request errors, expiry, cancellation,
all scheduled as the OpenAI Batch API's are (``factory.devserver.batchwork``).

- ``POST /v1/messages/batches`` takes ``{requests: [{custom_id, params}]}`` (at most
  100,000 requests and 256 MB; each ``custom_id`` ``^[a-zA-Z0-9_-]{1,64}$`` and unique)
  and answers a ``MessageBatch`` (``processing_status: in_progress``). ``x-api-key`` and
  ``anthropic-version`` are required, as online.
- ``GET /v1/messages/batches/{id}``: ``request_counts`` grow as requests are answered;
  ``ended`` with ``ended_at`` and ``results_url`` at the end.
- ``GET /v1/messages/batches`` lists them newest first (``data``, ``has_more``,
  ``first_id``, ``last_id``); ``POST .../{id}/cancel`` cancels (``canceling``, then
  ``ended`` with the rest ``canceled``).
- ``GET .../{id}/results``: JSONL, one ``{custom_id, result}`` per request: ``succeeded``
  (a ``Message``, ``devserver.anthropic.message_from_chat`` of the chat core's answer),
  ``errored`` (an error response: ``api_error`` for the simulated errors, every request of
  a ``batch_fail_first`` batch too, since Anthropic has no failed batch state),
  ``canceled``, ``expired``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from factory.devserver.anthropic import chat_payload, error_body, message_from_chat
from factory.devserver.batchwork import Answered, Errored, LineError, NotRun, Work, process

__all__ = ["MAX_BATCH_BYTES", "MAX_REQUESTS", "add_routes"]

MAX_REQUESTS = 100_000
MAX_BATCH_BYTES = 256 * 1000 * 1000
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class _Books:
    """The server's message batches (in memory) and the tasks that work through them."""

    def __init__(self, hooks: Any) -> None:
        self.hooks = hooks
        self.batches: dict[str, dict[str, Any]] = {}  # id -> {work, params, created, ...}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.attempts: dict[str, int] = {}
        self.created = 0


_BOOKS: web.AppKey[_Books] = web.AppKey("anthropic_batches", _Books)


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _error(status: int, message: str) -> web.Response:
    return web.json_response(error_body(status, message), status=status)


def _refused(request: web.Request) -> web.Response | None:
    if not request.headers.get("anthropic-version"):
        return _error(400, "anthropic-version: header is required")
    if not request.headers.get("x-api-key"):
        return _error(401, "x-api-key header is required")
    return None


def _counts(work: Work) -> dict[str, int]:
    canceled = sum(1 for o in work.outcomes.values() if o == NotRun("cancelled"))
    expired = sum(1 for o in work.outcomes.values() if o == NotRun("expired"))
    errored = work.count(Errored) + sum(1 for o in work.outcomes.values() if o == NotRun("failed"))
    succeeded = work.count(Answered)
    processing = len(work.keys) - succeeded - errored - canceled - expired
    return {"processing": processing, "succeeded": succeeded, "errored": errored,
            "canceled": canceled, "expired": expired}  # fmt: skip


def _batch(request: web.Request, rec: dict[str, Any]) -> dict[str, Any]:
    """The ``MessageBatch`` object of one batch now."""
    work: Work = rec["work"]
    status = "ended" if work.ended else ("canceling" if work.cancel else "in_progress")
    results = None
    if work.ended:
        results = f"{request.scheme}://{request.host}/v1/messages/batches/{work.batch_id}/results"
    return {
        "id": work.batch_id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": _counts(work),
        "ended_at": _iso(rec["ended_at"]),
        "created_at": _iso(rec["created_at"]),
        "expires_at": _iso(rec["created_at"] + 24 * 3600),
        "archived_at": None,
        "cancel_initiated_at": _iso(rec["cancel_at"]),
        "results_url": results,
    }


def _answer(books: _Books, params: dict[str, Any]) -> dict[str, Any]:
    """One request's ``Message``: the chat core's answer, translated."""
    if not isinstance(params.get("messages"), list) or not params["messages"]:
        raise LineError(400, "messages: at least one message is required")
    if not isinstance(params.get("max_tokens"), int):
        raise LineError(400, "max_tokens: Field required")
    thinking = (params.get("thinking") or {}).get("type") == "enabled"
    return message_from_chat(books.hooks.answer(chat_payload(params)), thinking=thinking)


async def _create(request: web.Request) -> web.Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    books = request.app[_BOOKS]
    raw = await request.read()
    if len(raw) > MAX_BATCH_BYTES:
        return _error(413, f"a batch may hold at most {MAX_BATCH_BYTES} bytes")
    try:
        payload = json.loads(raw)
    except ValueError:
        return _error(400, "The request body is not valid JSON.")
    items = payload.get("requests") if isinstance(payload, dict) else None
    if not isinstance(items, list) or not items:
        return _error(400, "requests: at least one request is required")
    if len(items) > MAX_REQUESTS:
        return _error(400, f"requests: a batch may hold at most {MAX_REQUESTS} requests")
    seen: set[str] = set()
    for i, item in enumerate(items):
        cid = item.get("custom_id") if isinstance(item, dict) else None
        if not isinstance(cid, str) or not _CUSTOM_ID.match(cid):
            return _error(400, f"requests.{i}.custom_id: String should match pattern "
                          "'^[a-zA-Z0-9_-]{1,64}$'")  # fmt: skip
        if cid in seen:
            return _error(400, f"requests.{i}.custom_id: duplicate custom_id {cid!r}")
        if not isinstance(item.get("params"), dict):
            return _error(400, f"requests.{i}.params: Field required")
        seen.add(cid)
    bid = f"msgbatch_{uuid.uuid4().hex[:24]}"
    work = Work(bid, [str(item["custom_id"]) for item in items], books.created)
    books.created += 1
    params: list[dict[str, Any]] = [item["params"] for item in items]
    rec: dict[str, Any] = {"work": work, "created_at": time.time(), "ended_at": None,
                           "cancel_at": None}  # fmt: skip
    books.batches[bid] = rec

    async def run() -> None:
        await process(work, books.hooks.config, books.hooks.log, books.attempts,
                      lambda n: _answer(books, params[n]))  # fmt: skip
        rec["ended_at"] = time.time()

    books.tasks[bid] = asyncio.get_running_loop().create_task(run())
    return web.json_response(_batch(request, rec))


def _record(request: web.Request) -> dict[str, Any] | None:
    return request.app[_BOOKS].batches.get(request.match_info["batch_id"])


async def _retrieve(request: web.Request) -> web.Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    rec = _record(request)
    if rec is None:
        return _error(404, "No such message batch.")
    return web.json_response(_batch(request, rec))


async def _list(request: web.Request) -> web.Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    limit = max(1, min(int(request.query.get("limit") or 20), 1000))
    recs = sorted(request.app[_BOOKS].batches.values(), key=lambda r: r["created_at"],
                  reverse=True)  # fmt: skip
    data = [_batch(request, r) for r in recs[:limit]]
    return web.json_response({
        "data": data, "has_more": len(recs) > limit,
        "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None,
    })  # fmt: skip


async def _cancel(request: web.Request) -> web.Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    rec = _record(request)
    if rec is None:
        return _error(404, "No such message batch.")
    work: Work = rec["work"]
    if not work.ended and not work.cancel:
        work.cancel, rec["cancel_at"] = True, time.time()
    return web.json_response(_batch(request, rec))


def _result(work: Work, key: str) -> dict[str, Any]:
    outcome = work.outcomes.get(key)
    if isinstance(outcome, Answered):
        return {"type": "succeeded", "message": outcome.body}
    if isinstance(outcome, Errored):
        return {"type": "errored", "error": error_body(outcome.status, outcome.message)}
    if outcome == NotRun("failed"):
        message = "Internal server error (simulated: batch_fail_first)."
        return {"type": "errored", "error": error_body(500, message)}
    return {"type": "canceled" if outcome == NotRun("cancelled") else "expired"}


async def _results(request: web.Request) -> web.Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    rec = _record(request)
    if rec is None:
        return _error(404, "No such message batch.")
    work: Work = rec["work"]
    if not work.ended:
        return _error(400, f"Message batch {work.batch_id} has not ended: no results yet.")
    lines = [json.dumps({"custom_id": k, "result": _result(work, k)}, ensure_ascii=False)
             for k in work.keys]  # fmt: skip
    return web.Response(body=("\n".join(lines) + "\n").encode(),
                        content_type="application/binary")  # fmt: skip


def add_routes(app: web.Application, hooks: Any) -> None:
    """Serve the Message Batches endpoints on ``app`` (``hooks``: config, the chat core's
    batch answer, the request log; see ``factory.devserver.batches.BatchHooks``)."""
    app[_BOOKS] = _Books(hooks)
    app.router.add_post("/v1/messages/batches", _create)
    app.router.add_get("/v1/messages/batches", _list)
    app.router.add_get("/v1/messages/batches/{batch_id}", _retrieve)
    app.router.add_post("/v1/messages/batches/{batch_id}/cancel", _cancel)
    app.router.add_get("/v1/messages/batches/{batch_id}/results", _results)
