"""What the batch provider tests share: requests, a run to the end, the server's log.

The server's request log (``factory.devserver.batchwork``) is the witness: one
``batch_submit`` line per request per batch it was submitted in, one ``batch`` line per
request answered (``completed``), one ``batch_end`` line per batch.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from factory.llm.backends import Backend, LLMRequest, LLMResult

SYSTEM = "You are the airline's agent. " + "Follow the policy. " * 40


def requests(n: int, tag: str = "r") -> list[LLMRequest]:
    """``n`` requests sharing a static system block (the stage's policy), as a stage sends."""
    return [
        LLMRequest.of(
            f"{tag}-{i}",
            [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"say hello number {i}"},
            ],
            static_prefix=1,
        )
        for i in range(n)
    ]


async def collect(backend: Backend, reqs: list[LLMRequest]) -> dict[str, LLMResult]:
    """Every result of one ``run`` (each request exactly once), then close the backend."""
    out: dict[str, LLMResult] = {}
    try:
        async for result in backend.run(reqs):
            assert result.request_id not in out, "a request got two results"
            out[result.request_id] = result
    finally:
        await backend.aclose()
    return out


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def answered(lines: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["request_id"] for r in lines if r.get("kind") == "batch" and r["completed"])


def submitted(lines: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["request_id"] for r in lines if r.get("kind") == "batch_submit")


def ends(lines: list[dict[str, Any]]) -> list[str]:
    return [r["status"] for r in lines if r.get("kind") == "batch_end"]


def answering(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, *answers: Any
) -> list[tuple[str, str, dict[str, Any]]]:
    """Stand a batch backend's control calls (``_call``) in for the provider: each answers
    the next of ``answers`` (a documented shape from the fixtures); what was called comes
    back as (method, path, keyword arguments), for the pure tests of one wire."""
    calls: list[tuple[str, str, dict[str, Any]]] = []
    queue = list(answers)

    async def call(method: str, path: str, **kw: Any) -> Any:
        calls.append((method, path, kw))
        return queue.pop(0)

    monkeypatch.setattr(backend, "_call", call)
    return calls
