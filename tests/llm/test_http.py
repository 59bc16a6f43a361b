"""The aiohttp transport's request body (``factory.llm.http.encode_body``): the bytes
``json.dumps`` would write, whatever reuse of encoded system messages happens."""

from __future__ import annotations

import json
from typing import Any

import pytest

from factory.llm import http
from factory.llm.http import encode_body

STATIC = "Policy: be exact. " * 400 + 'é, ü, 你好, "quotes", \\ and \n newlines'


def _payload(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


@pytest.mark.parametrize(
    "payload",
    [
        _payload({"role": "system", "content": STATIC}, {"role": "user", "content": "hi"}),
        _payload({"role": "system", "content": STATIC}, {"role": "user", "content": STATIC}),
        _payload({"content": STATIC, "role": "system"}),  # other key order, other bytes
        _payload({"role": "system", "content": "short"}, max_tokens=16, temperature=0.5),
        _payload(
            {"role": "developer", "content": STATIC},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            tools=[{"type": "function", "function": {"name": "f"}}],
            seed=7,
        ),
        _payload({"role": "system", "content": [{"type": "text", "text": STATIC}]}),
        {"model": "m", "prompt": "no messages"},
    ],
    ids=["system+user", "long-user", "key-order", "short", "tools", "content-parts", "none"],
)
def test_a_body_is_byte_for_byte_what_json_dumps_writes(payload: dict[str, Any]) -> None:
    expected = json.dumps(payload, ensure_ascii=False).encode()
    assert encode_body(payload) == expected
    assert encode_body(payload) == expected  # the second time from the reused encoding


def test_a_changed_system_message_is_encoded_anew_and_the_kept_ones_stay_bounded() -> None:
    for i in range(3 * http._REUSED_KEPT):
        payload = _payload({"role": "system", "content": f"{i} {STATIC}"})
        assert encode_body(payload) == json.dumps(payload, ensure_ascii=False).encode()
        assert len(http._encoded) <= http._REUSED_KEPT
