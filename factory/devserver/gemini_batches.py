"""The development server's Gemini Batch API: ``models/{model}:batchGenerateContent`` and
``batches``, under ``/v1beta`` (and ``/v1``, as the rest of the Gemini API here).

Why: the ``gemini_batch`` backend (``factory.llm.backends.gemini_batch``) must be tested
offline against the contract Google serves (https://ai.google.dev/api/batch-api;
googleapis/python-genai ``batches.py`` reads the same shapes), with what goes wrong in a
real batch: a processing delay, per-request errors, failure, expiry, cancellation, all
scheduled as the OpenAI Batch API's are (``factory.devserver.batchwork``).

- ``POST /{version}/models/{model}:batchGenerateContent`` takes ``{batch: {displayName,
  inputConfig: {requests: {requests: [{request, metadata}]}}}}`` (inline requests, at
  most 20 MB; snake_case names are read too, as Google's parser does) and answers an
  Operation ``{name: batches/ID, metadata: {@type, model, displayName, createTime,
  updateTime, state: BATCH_STATE_PENDING, batchStats}}``. ``inputConfig.fileName`` (the
  Files API) is not served: 400.
- ``GET /{version}/batches/{id}``: the Operation; ``state`` goes ``RUNNING``, then
  ``SUCCEEDED``, ``FAILED`` (the Operation's ``error``), ``EXPIRED`` or ``CANCELLED``,
  with ``done: true``, ``endTime`` and ``output.inlinedResponses.inlinedResponses[]``
  (also as the Operation's ``response``): each ``{response, metadata}`` (a
  ``GenerateContentResponse``, ``devserver.gemini.response_from_chat`` of the chat
  core's answer) or ``{error: {code, message}, metadata}`` (``code`` a google.rpc.Code:
  13 INTERNAL for the simulated errors). An expired or cancelled batch lists only the
  requests it ran.
- ``GET /{version}/batches`` (``operations``, ``nextPageToken``; ``pageSize``,
  ``pageToken``) and ``POST /{version}/batches/{id}:cancel``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from factory.devserver import gemini
from factory.devserver.batchwork import Answered, Errored, LineError, NotRun, Work, process

__all__ = ["MAX_INLINE_BYTES", "add_routes"]

MAX_INLINE_BYTES = 20 * 1000 * 1000
_BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
_OUTPUT_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput"
_STATE = {"pending": "PENDING", "running": "RUNNING", "completed": "SUCCEEDED",
          "failed": "FAILED", "expired": "EXPIRED", "cancelled": "CANCELLED"}  # fmt: skip
_HTTP_GRPC = {400: 3, 401: 16, 403: 7, 404: 5, 409: 10, 429: 8, 500: 13, 503: 14, 504: 4}
_NO_KEY = "Method doesn't allow unregistered callers: use an API key (x-goog-api-key)."


class _Books:
    """The server's batches (in memory) and the tasks that work through them."""

    def __init__(self, hooks: Any) -> None:
        self.hooks = hooks
        self.batches: dict[str, dict[str, Any]] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.attempts: dict[str, int] = {}
        self.created = 0


_BOOKS: web.AppKey[_Books] = web.AppKey("gemini_batches", _Books)


def _stamp(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _keyless(request: web.Request) -> web.Response | None:
    if request.headers.get("x-goog-api-key") or request.query.get("key"):
        return None
    return gemini.google_error(401, _NO_KEY)


def _line(work: Work, key: str, meta: dict[str, Any]) -> dict[str, Any] | None:
    outcome = work.outcomes.get(key)
    if isinstance(outcome, Answered):
        return {"response": outcome.body, "metadata": meta}
    if isinstance(outcome, Errored):
        code = _HTTP_GRPC.get(outcome.status, 13)
        return {"error": {"code": code, "message": outcome.message}, "metadata": meta}
    return None  # not run: an ended batch lists only what it ran


def _operation(rec: dict[str, Any]) -> dict[str, Any]:
    """The batch's Operation now."""
    work: Work = rec["work"]
    meta: dict[str, Any] = {
        "@type": _BATCH_TYPE,
        "model": rec["model"],
        "displayName": rec["display_name"],
        "createTime": _stamp(rec["created_at"]),
        "updateTime": _stamp(time.time()),
        "state": "BATCH_STATE_" + _STATE[work.status],
        "batchStats": {
            "requestCount": str(len(work.keys)),
            "successfulRequestCount": str(work.count(Answered)),
            "failedRequestCount": str(work.count(Errored)),
            "pendingRequestCount": str(
                len(work.keys) - work.count(Answered) - work.count(Errored) - work.count(NotRun)
            ),
        },
    }
    operation: dict[str, Any] = {"name": work.batch_id, "metadata": meta}
    if not work.ended:
        return operation
    meta["endTime"] = _stamp(rec["ended_at"])
    operation["done"] = True
    if work.status == "failed":
        operation["error"] = {"code": 13, "message": "Batch failed (simulated: batch_fail_first)."}
        return operation
    lines = [_line(work, key, m) for key, m in zip(work.keys, rec["metadata"], strict=True)]
    inlined = {"inlinedResponses": [line for line in lines if line is not None]}
    meta["output"] = {"inlinedResponses": inlined}
    operation["response"] = {"@type": _OUTPUT_TYPE, "inlinedResponses": inlined}
    return operation


def _answer(books: _Books, request: dict[str, Any], model: str) -> dict[str, Any]:
    """One request's ``GenerateContentResponse``: the chat core's answer, translated."""
    try:
        chat = gemini.chat_payload(request, model)
    except ValueError as exc:
        raise LineError(400, f"Invalid request: {exc}") from exc
    config = (request.get("generationConfig") or {}).get("thinkingConfig") or {}
    thinks = isinstance(config, dict) and bool(config) and config.get("thinkingBudget") != 0
    return gemini.response_from_chat(books.hooks.answer(chat), thoughts=thinks)


async def _create(request: web.Request, model: str) -> web.StreamResponse:
    refused = _keyless(request)
    if refused is not None:
        return refused
    books = request.app[_BOOKS]
    raw = await request.read()
    if len(raw) > MAX_INLINE_BYTES:
        return gemini.google_error(400, "Request payload size exceeds the limit: 20 MB inline.")
    try:
        body = gemini.normalize(json.loads(raw))
    except ValueError:
        return gemini.google_error(400, "Invalid JSON payload received.")
    batch = body.get("batch") if isinstance(body, dict) else None
    config = (batch or {}).get("inputConfig") or {}
    if config.get("fileName"):
        return gemini.google_error(400, "inputConfig.fileName: the factory devserver serves "
                                   "inline requests only.")  # fmt: skip
    items = (config.get("requests") or {}).get("requests")
    if not isinstance(batch, dict) or not isinstance(items, list) or not items:
        return gemini.google_error(400, "batch.inputConfig.requests.requests: required.")
    if not all(isinstance(i, dict) and isinstance(i.get("request"), dict) for i in items):
        return gemini.google_error(400, "batch.inputConfig.requests.requests[].request: required.")
    bid = f"batches/{uuid.uuid4().hex[:24]}"
    metadata = [dict(i.get("metadata") or {}) for i in items]
    keys = [str(m.get("key", f"{bid}#{n}")) for n, m in enumerate(metadata)]
    work = Work(bid, keys, books.created)
    books.created += 1
    requests = [i["request"] for i in items]
    name = model if model.startswith("models/") else f"models/{model}"
    rec: dict[str, Any] = {"work": work, "metadata": metadata, "model": name,
                           "display_name": str(batch.get("displayName") or ""),
                           "created_at": time.time(), "ended_at": None}  # fmt: skip
    books.batches[bid] = rec

    async def run() -> None:
        await process(work, books.hooks.config, books.hooks.log, books.attempts,
                      lambda n: _answer(books, requests[n], model))  # fmt: skip
        rec["ended_at"] = time.time()

    books.tasks[bid] = asyncio.get_running_loop().create_task(run())
    return web.json_response(_operation(rec))


async def _get(request: web.Request) -> web.Response:
    refused = _keyless(request)
    if refused is not None:
        return refused
    rec = request.app[_BOOKS].batches.get(f"batches/{request.match_info['batch_id']}")
    if rec is None:
        return gemini.google_error(404, "Requested entity was not found.")
    return web.json_response(_operation(rec))


async def _cancel(request: web.Request) -> web.Response:
    refused = _keyless(request)
    if refused is not None:
        return refused
    bid, _, method = request.match_info["call"].partition(":")
    rec = request.app[_BOOKS].batches.get(f"batches/{bid}")
    if method != "cancel" or rec is None:
        return gemini.google_error(404, "Requested entity was not found.")
    work: Work = rec["work"]
    if not work.ended:
        work.cancel = True
    return web.json_response({})


async def _list(request: web.Request) -> web.Response:
    refused = _keyless(request)
    if refused is not None:
        return refused
    size = max(1, min(int(request.query.get("pageSize") or 50), 1000))
    start = int(request.query.get("pageToken") or 0)
    recs = sorted(request.app[_BOOKS].batches.values(), key=lambda r: r["created_at"],
                  reverse=True)  # fmt: skip
    page: dict[str, Any] = {"operations": [_operation(r) for r in recs[start : start + size]]}
    if start + size < len(recs):
        page["nextPageToken"] = str(start + size)
    return web.json_response(page)


def add_routes(app: web.Application, hooks: Any) -> None:
    """Serve the Batch API on ``app``, after ``gemini.add_routes`` (whose
    ``models/{model}:{method}`` route this registers ``batchGenerateContent`` with)."""
    app[_BOOKS] = _Books(hooks)
    gemini.register_method(app, "batchGenerateContent", _create)
    for version in gemini.VERSIONS:
        app.router.add_get(f"/{version}/batches", _list)
        app.router.add_get(f"/{version}/batches/{{batch_id}}", _get)
        app.router.add_post(f"/{version}/batches/{{call}}", _cancel)
