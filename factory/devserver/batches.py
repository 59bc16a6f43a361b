"""The development server's OpenAI Batch API: ``/v1/files`` and ``/v1/batches``.

Why: the ``openai_batch`` backend (``factory.llm.backends.openai_batch``) must be
tested offline against the same contract OpenAI serves, including what goes
wrong in a real batch: a processing delay (a batch is ``validating``, then
``in_progress`` with growing ``request_counts``, then ``finalizing``), a share of
per-request errors (lines in the error file), expiry (the 24h window ran out:
the finished requests in the output file, the rest ``batch_expired`` in the
error file), cancellation (the same, ``batch_cancelled``) and a batch that fails
validation (no output at all).

The contract (openai-python ``resources/batches.py``, ``resources/files.py``,
``types/batch.py``): an input file is JSONL, one ``{custom_id, method, url,
body}`` per line, at most 50,000 lines and 200 MB; an output or error file line
is ``{id, custom_id, response: {status_code, request_id, body} | null, error:
{code, message} | null}``. Which batches expire or fail is chosen by creation
order (``DevServerConfig.batch_fail_first``, ``batch_expire_first``) so a test
knows which ones do; which requests error is drawn from the custom id and its
attempt, so a re-submitted request may succeed.

The request log (``--request-log``) gets one line per submitted request
(``kind: batch_submit``), per answered request (``kind: batch``) and per batch
that ends (``kind: batch_end``), so a test can check that no request sat in two
live batches and none was answered twice.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from factory.devserver.batchwork import errored

__all__ = ["MAX_FILE_BYTES", "MAX_REQUESTS", "BatchHooks", "add_routes"]

MAX_REQUESTS = 50_000  # OpenAI's limits per batch input file
MAX_FILE_BYTES = 200 * 1024 * 1024
TERMINAL = ("completed", "failed", "expired", "cancelled")


@dataclass(frozen=True)
class BatchHooks:
    """What the batch endpoints take from the server (``factory.devserver.app``), which
    imports this module: its config (``batch_*`` fields, ``seed``), how it answers one
    chat completion body, and its request log."""

    config: Any
    answer: Callable[[dict[str, Any]], dict[str, Any]]
    log: Callable[..., None]


class _Batches:
    """Files and batches of one server (in memory), and the tasks that process them."""

    def __init__(self, hooks: BatchHooks) -> None:
        self.hooks = hooks
        self.files: dict[str, dict[str, Any]] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.cancel: set[str] = set()
        self.attempts: dict[str, int] = {}
        self.created = 0

    def add_file(self, data: bytes, purpose: str, filename: str) -> dict[str, Any]:
        fid = f"file-{uuid.uuid4().hex[:24]}"
        obj = {
            "id": fid,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        self.files[fid] = {**obj, "data": data}
        return obj


_BATCHES: web.AppKey[_Batches] = web.AppKey("batches", _Batches)


def _public(f: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in f.items() if k != "data"}


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    """An error body shaped like OpenAI's (``invalid_request_error``)."""
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": None}}  # fmt: skip
    return web.json_response(body, status=status)


async def _upload(request: web.Request) -> web.Response:
    books = request.app[_BATCHES]
    form = await request.post()
    upload = form.get("file")
    purpose = str(form.get("purpose") or "")
    if not isinstance(upload, web.FileField):
        return _error(400, "'file' is a required field.", "file")
    if purpose != "batch":
        return _error(400, "purpose must be 'batch'.", "purpose")
    data = upload.file.read()
    return web.json_response(books.add_file(data, purpose, upload.filename or "input.jsonl"))


def _file(request: web.Request) -> dict[str, Any] | None:
    return request.app[_BATCHES].files.get(request.match_info["file_id"])


async def _file_info(request: web.Request) -> web.Response:
    f = _file(request)
    if f is None:
        return _error(404, "No such File object.", "id")
    return web.json_response(_public(f))


async def _file_content(request: web.Request) -> web.Response:
    f = _file(request)
    if f is None:
        return _error(404, "No such File object.", "id")
    return web.Response(body=f["data"], content_type="application/octet-stream")


async def _create(request: web.Request) -> web.Response:
    books = request.app[_BATCHES]
    try:
        payload = await request.json()
    except ValueError:
        return _error(400, "The request body is not valid JSON.")
    fid = payload.get("input_file_id") if isinstance(payload, dict) else None
    if fid not in books.files:
        return _error(400, "input_file_id does not exist.", "input_file_id")
    if payload.get("endpoint") != "/v1/chat/completions":
        return _error(400, "unsupported endpoint.", "endpoint")
    if payload.get("completion_window") != "24h":
        return _error(400, "completion_window must be '24h'.", "completion_window")
    now = int(time.time())
    bid = f"batch_{uuid.uuid4().hex[:24]}"
    batch: dict[str, Any] = {
        "id": bid,
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "errors": None,
        "input_file_id": fid,
        "completion_window": "24h",
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + 24 * 3600,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": payload.get("metadata"),
    }
    books.batches[bid] = batch
    index = books.created
    books.created += 1
    task = asyncio.get_running_loop().create_task(_process(books, batch, index))
    books.tasks[bid] = task
    return web.json_response(batch)


def _get_batch(request: web.Request) -> dict[str, Any] | None:
    return request.app[_BATCHES].batches.get(request.match_info["batch_id"])


async def _retrieve(request: web.Request) -> web.Response:
    batch = _get_batch(request)
    if batch is None:
        return _error(404, "No such batch.", "batch_id")
    return web.json_response(batch)


async def _list(request: web.Request) -> web.Response:
    books = request.app[_BATCHES]
    data = sorted(books.batches.values(), key=lambda b: b["created_at"], reverse=True)
    return web.json_response({"object": "list", "data": data, "has_more": False})


async def _cancel(request: web.Request) -> web.Response:
    batch = _get_batch(request)
    if batch is None:
        return _error(404, "No such batch.", "batch_id")
    if batch["status"] in TERMINAL:
        return _error(409, f"Cannot cancel a batch with status {batch['status']}.")
    request.app[_BATCHES].cancel.add(batch["id"])
    batch["status"], batch["cancelling_at"] = "cancelling", int(time.time())
    return web.json_response(batch)


def _parse_lines(data: bytes) -> tuple[list[dict[str, Any]], str | None]:
    """The input file's requests, or the validation error that fails the batch."""
    if len(data) > MAX_FILE_BYTES:
        return [], f"input file is larger than {MAX_FILE_BYTES} bytes"
    lines: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            return [], f"line {n} is not valid JSON"
        if not isinstance(line, dict) or not all(
            k in line for k in ("custom_id", "method", "url", "body")
        ):
            return [], f"line {n} needs custom_id, method, url and body"
        if line["custom_id"] in seen:
            return [], f"line {n}: duplicate custom_id"
        seen.add(line["custom_id"])
        lines.append(line)
    if not lines:
        return [], "input file holds no request"
    if len(lines) > MAX_REQUESTS:
        return [], f"input file holds more than {MAX_REQUESTS} requests"
    return lines, None


async def _process(books: _Batches, batch: dict[str, Any], index: int) -> None:
    """Run one batch: validate, answer its lines one by one, write its files."""
    cfg = books.hooks.config
    _log = books.hooks.log
    bid = batch["id"]
    lines, problem = _parse_lines(books.files[batch["input_file_id"]]["data"])
    for line in lines:
        _log(kind="batch_submit", batch_id=bid, request_id=line["custom_id"])
    await asyncio.sleep(cfg.batch_delay_s * 0.1)
    if problem is None and index < cfg.batch_fail_first:
        problem = "simulated validation failure (devserver batch_fail_first)"
    if problem is not None:
        batch.update(status="failed", failed_at=int(time.time()))
        batch["errors"] = {"object": "list", "data": [{"code": "invalid_file", "message": problem}]}
        _log(kind="batch_end", batch_id=bid, status="failed")
        return
    expire_at: int | None = None
    if cfg.batch_fail_first <= index < cfg.batch_fail_first + cfg.batch_expire_first:
        expire_at = int(len(lines) * cfg.batch_expire_keep)
    counts = batch["request_counts"]
    counts["total"] = len(lines)
    batch.update(status="in_progress", in_progress_at=int(time.time()))
    out: list[str] = []
    err: list[str] = []
    per_line = cfg.batch_delay_s * 0.8 / len(lines)
    end_status, end_code = "completed", ""
    for n, line in enumerate(lines):
        if bid in books.cancel:
            end_status, end_code = "cancelled", "batch_cancelled"
        elif expire_at is not None and n >= expire_at:
            end_status, end_code = "expired", "batch_expired"
        if end_status != "completed":
            break
        await asyncio.sleep(per_line)
        cid = line["custom_id"]
        rid = f"req_{uuid.uuid4().hex[:24]}"
        if errored(books.hooks.config, books.attempts, cid):
            body = {"error": {"message": "The server had an error (simulated).",
                              "type": "server_error", "param": None, "code": None}}  # fmt: skip
            entry = {"id": f"batch_req_{uuid.uuid4().hex[:20]}", "custom_id": cid,
                     "response": {"status_code": 500, "request_id": rid, "body": body},
                     "error": None}  # fmt: skip
            err.append(json.dumps(entry))
            counts["failed"] += 1
            _log(kind="batch", batch_id=bid, request_id=cid, status=500, completed=False)
            continue
        answer = books.hooks.answer(line["body"])
        entry = {"id": f"batch_req_{uuid.uuid4().hex[:20]}", "custom_id": cid,
                 "response": {"status_code": 200, "request_id": rid, "body": answer},
                 "error": None}  # fmt: skip
        out.append(json.dumps(entry, ensure_ascii=False))
        counts["completed"] += 1
        _log(kind="batch", batch_id=bid, request_id=cid, status=200, completed=True)
    if end_status != "completed":
        message = {
            "batch_expired": "This request could not be executed before the completion "
            "window expired.",
            "batch_cancelled": "This request was not executed because the batch was cancelled.",
        }[end_code]
        for line in lines[len(out) + len(err) :]:
            entry = {"id": f"batch_req_{uuid.uuid4().hex[:20]}", "custom_id": line["custom_id"],
                     "response": None, "error": {"code": end_code, "message": message}}  # fmt: skip
            err.append(json.dumps(entry))
            counts["failed"] += 1
    else:
        batch.update(status="finalizing", finalizing_at=int(time.time()))
        await asyncio.sleep(cfg.batch_delay_s * 0.1)
    if out:
        batch["output_file_id"] = books.add_file(
            ("\n".join(out) + "\n").encode(), "batch_output", f"{bid}_output.jsonl"
        )["id"]
    if err:
        batch["error_file_id"] = books.add_file(
            ("\n".join(err) + "\n").encode(), "batch_output", f"{bid}_error.jsonl"
        )["id"]
    now = int(time.time())
    batch["status"] = end_status
    batch[
        {"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}[
            end_status
        ]
    ] = now
    _log(kind="batch_end", batch_id=bid, status=end_status)


def add_routes(app: web.Application, hooks: BatchHooks) -> None:
    """Serve the Files and Batch endpoints on ``app`` (built by ``app.build_app``)."""
    app[_BATCHES] = _Batches(hooks)
    app.router.add_post("/v1/files", _upload)
    app.router.add_get("/v1/files/{file_id}", _file_info)
    app.router.add_get("/v1/files/{file_id}/content", _file_content)
    app.router.add_post("/v1/batches", _create)
    app.router.add_get("/v1/batches", _list)
    app.router.add_get("/v1/batches/{batch_id}", _retrieve)
    app.router.add_post("/v1/batches/{batch_id}/cancel", _cancel)
