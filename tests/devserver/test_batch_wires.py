"""The devserver's Anthropic and Gemini batch endpoints refuse what the real APIs refuse,
in their own error shapes (the lifecycle against them:
tests/llm/backends/test_batch_providers.py)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any


def _post(url: str, body: Any, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={**headers, "content-type":
                                                          "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _get(url: str, headers: dict[str, str]) -> dict[str, Any]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return dict(json.loads(r.read()))


def _until(url: str, headers: dict[str, str], ended: Any) -> dict[str, Any]:
    """Poll ``url`` until ``ended(body)`` (the batch's task must not outlive the server)."""
    for _ in range(400):
        body = _get(url, headers)
        if ended(body):
            return body
        time.sleep(0.025)
    raise AssertionError(f"{url} never ended")


def test_message_batches_need_the_key_and_valid_custom_ids(devserver) -> None:
    server = devserver(batch_delay_s=0.1)
    url = f"{server.url}/messages/batches"
    one = {
        "custom_id": "a",
        "params": {
            "model": "factory-dev",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}],
        },
    }
    version = {"anthropic-version": "2023-06-01"}
    status, body = _post(url, {"requests": [one]}, version)
    assert status == 401 and body["error"]["type"] == "authentication_error"
    keyed = {**version, "x-api-key": "k"}
    status, body = _post(url, {"requests": [{**one, "custom_id": "a b"}]}, keyed)
    assert status == 400 and "custom_id" in body["error"]["message"]
    status, body = _post(url, {"requests": [one, one]}, keyed)
    assert status == 400 and "duplicate" in body["error"]["message"]
    status, body = _post(url, {"requests": [one]}, keyed)
    assert status == 200 and body["type"] == "message_batch"
    assert body["processing_status"] == "in_progress" and body["request_counts"]["processing"] == 1
    done = _until(f"{url}/{body['id']}", keyed, lambda b: b["processing_status"] == "ended")
    assert done["request_counts"]["succeeded"] == 1 and done["results_url"].endswith("/results")


def test_the_gemini_batch_api_needs_the_key_and_inline_requests(devserver) -> None:
    server = devserver(batch_delay_s=0.1)
    base = server.url.rsplit("/v1", 1)[0]
    url = f"{base}/v1beta/models/factory-dev:batchGenerateContent"
    request = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    batch = {"batch": {"display_name": "x", "input_config": {"requests": {"requests": [
        {"request": request, "metadata": {"key": "a"}}]}}}}  # fmt: skip
    status, body = _post(url, batch, {})
    assert status == 401 and body["error"]["status"] == "UNAUTHENTICATED"
    key = {"x-goog-api-key": "k"}
    status, body = _post(url, {"batch": {"inputConfig": {"fileName": "files/x"}}}, key)
    assert status == 400 and "inline" in body["error"]["message"]
    status, body = _post(url, batch, key)  # snake_case names are read, as Google's parser does
    assert status == 200 and body["name"].startswith("batches/")
    assert body["metadata"]["state"] == "BATCH_STATE_PENDING"
    assert body["metadata"]["displayName"] == "x"
    done = _until(f"{base}/v1beta/{body['name']}", key, lambda b: b.get("done"))
    assert done["metadata"]["state"] == "BATCH_STATE_SUCCEEDED"
    (line,) = done["metadata"]["output"]["inlinedResponses"]["inlinedResponses"]
    assert line["metadata"] == {"key": "a"} and line["response"]["candidates"]
