"""The HTTP session the Ray Data HTTP stage posts through: every outcome is an envelope.

Why not Ray's default session (``aiohttp.ClientSession``): Ray 2.60's
``HttpRequestUDF`` (``ray.llm._internal.batch.stages.http_request_stage``) creates every
request of a batch without starting it and awaits them one after another; passes a
non-retryable error status with a JSON body on as a success; and, once its own retries
are spent, raises one bare error carrying the whole payload, which fails the whole Ray
Data execution (the HTTP stage has no ``should_continue_on_error``). It takes a
``session_factory`` (the injection point Ray offers for this), so this module supplies
the session, and the stage stays a pipe:

- ``post`` starts the request at once (a task), so the requests of a batch are in flight
  together, whatever the stage awaits first;
- the stage always sees status 200 and a one-key JSON body, ``{"envelope": "<json>"}``:
  the real status, body and ``Retry-After``, or the transport failure (timeout,
  connection) as data. The factory reads the envelope on its side
  (``transport.read_envelope``) and maps it through ``factory.llm.errormap``, retries
  included; Ray's retry loop never runs;
- one ``aiohttp`` session per event loop (connections are reused across batches, where
  Ray's default opens a session per batch);
- the key is read from ``api_key_env`` in the stage's own process, never shipped in rows.

Envelope: ``{"status": int, "body": str, "retry_after": float | None,
"error": {"kind": "timeout" | "connection", "message": str} | None}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import weakref
from dataclasses import dataclass
from typing import Any

import aiohttp

from factory.llm.retry import parse_retry_after

__all__ = ["FILLER", "EnvelopeSession", "SessionFactory", "close_loop_session", "envelope"]

#: The payload of a row that only pads a batch to the processor's batch size: answered
#: here, never sent.
FILLER = json.dumps({"filler": True})

_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
    weakref.WeakKeyDictionary()
)


def envelope(
    status: int = 0,
    body: str = "",
    retry_after: float | None = None,
    error: tuple[str, str] | None = None,
) -> str:
    """One request's outcome as the JSON string the pipeline carries (pure)."""
    failure = {"kind": error[0], "message": error[1]} if error is not None else None
    return json.dumps(
        {"status": status, "body": body, "retry_after": retry_after, "error": failure},
        ensure_ascii=False,
    )


class _Delivered:
    """What the Ray stage reads of a response: status 200 and the envelope as JSON."""

    status = 200
    reason = "OK"

    def __init__(self, text: str):
        self._text = text

    async def json(self) -> dict[str, str]:
        return {"envelope": self._text}

    async def __aenter__(self) -> _Delivered:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None


class EnvelopeSession:
    """The session one batch of the HTTP stage uses (a view of the loop's shared session)."""

    def __init__(self, api_key_env: str | None, timeout_s: float):
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        self._headers = {
            "Authorization": f"Bearer {key or 'none'}",
            "Content-Type": "application/json",
        }

    async def __aenter__(self) -> EnvelopeSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None  # the loop's session outlives the batch

    def post(self, url: str, *, headers: Any = None, data: Any = None) -> asyncio.Task[_Delivered]:
        """Start the request now; the stage awaits the returned task when it gets to it.

        ``data`` is what the stage made of the row's ``payload`` (a JSON string holding
        ``{"body": <request body>, "request_id": ...}``); the stage's own headers are
        ignored (this session sets them).
        """
        del headers
        payload = json.loads(json.loads(data)) if isinstance(data, str) else {}
        return asyncio.ensure_future(self._send(url, payload))

    async def _send(self, url: str, payload: dict[str, Any]) -> _Delivered:
        if payload.get("filler"):
            return _Delivered(envelope(status=200, body="{}"))
        headers = dict(self._headers)
        if payload.get("request_id"):
            headers["X-Client-Request-Id"] = str(payload["request_id"])
        try:
            async with _session().post(
                url, data=payload["body"].encode(), headers=headers, timeout=self._timeout
            ) as resp:
                raw = await resp.read()
                text = raw.decode("utf-8", "replace")
                return _Delivered(envelope(resp.status, text, parse_retry_after(resp.headers)))
        except TimeoutError as exc:  # asyncio.TimeoutError is TimeoutError on 3.11
            return _Delivered(envelope(error=("timeout", str(exc) or "timed out")))
        except aiohttp.ClientError as exc:
            return _Delivered(envelope(error=("connection", f"{type(exc).__name__}: {exc}")))


def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    session = _SESSIONS.get(loop)
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        session = aiohttp.ClientSession(connector=connector)
        _SESSIONS[loop] = session
    return session


async def close_loop_session() -> None:
    """Close the running loop's shared session (an actor's ends with its process; a
    caller that runs the stage on a loop of its own closes it with this)."""
    session = _SESSIONS.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


@dataclass(frozen=True)
class SessionFactory:
    """``HttpRequestProcessorConfig.session_factory``: picklable, called once per batch
    inside the stage's actor."""

    api_key_env: str | None
    timeout_s: float

    def __call__(self) -> EnvelopeSession:
        return EnvelopeSession(self.api_key_env, self.timeout_s)
