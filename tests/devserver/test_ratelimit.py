"""The devserver's provider budget (``--rpm``/``--tpm``): the pure buckets, the header
formats, and the chat core's 429s and headers over HTTP."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from factory.devserver import DevServer, DevServerConfig
from factory.devserver.__main__ import build_parser, config_from_args
from factory.devserver.ratelimit import RateLimiter, go_duration
from factory.errors import ConfigError
from factory.llm.backends.openai_wire import parse_duration, rate_limits_from_headers


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.012, "12ms"),
        (0.0595, "59.5ms"),
        (1.0, "1s"),
        (7.66, "7.66s"),
        (179.56, "2m59.56s"),
        (360.0, "6m0s"),
        (3600.0, "1h0m0s"),
    ],
)
def test_reset_times_are_written_as_openai_writes_them_and_read_back(
    seconds: float, text: str
) -> None:
    assert go_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "soon", "1s2", "-1s", "nan", "inf"])
def test_a_reset_time_that_is_not_a_duration_reads_as_absent(bad: str) -> None:
    assert parse_duration(bad) is None


def test_requests_refill_continuously_and_a_refusal_costs_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(120, None, window_s=1.0, clock=clock)  # 2 a second, 2 at most
    first, second, third = (limiter.admit(10) for _ in range(3))
    assert (first.limited, second.limited, third.limited) == (None, None, "requests")
    assert first.headers["x-ratelimit-limit-requests"] == "120"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-reset-requests"] == "500ms"  # one request, 2 a second
    assert "x-ratelimit-limit-tokens" not in first.headers  # no token budget set
    assert third.retry_after_s == pytest.approx(0.5)
    assert third.headers["retry-after"] == "1" and third.headers["retry-after-ms"] == "500"
    assert third.headers["x-ratelimit-remaining-requests"] == "0"
    clock.now += 0.25  # a quarter second: half a request back, still short
    assert limiter.admit(10).retry_after_s == pytest.approx(0.25)
    clock.now += 0.25
    assert limiter.admit(10).limited is None  # the refusals took nothing
    clock.now += 10.0  # never above the capacity
    assert limiter.admit(10).headers["x-ratelimit-remaining-requests"] == "1"


def test_tokens_are_metered_by_cost_and_name_the_budget_that_refused() -> None:
    clock = Clock()
    limiter = RateLimiter(6000, 6000, window_s=60.0, clock=clock)  # 100 tokens a second
    assert limiter.admit(5000).limited is None
    refused = limiter.admit(1500)
    assert refused.limited == "tokens"
    assert refused.retry_after_s == pytest.approx(5.0)  # 500 short at 100 a second
    assert refused.headers["x-ratelimit-remaining-tokens"] == "1000"
    assert refused.headers["x-ratelimit-remaining-requests"] == "5999"  # not charged
    assert refused.headers["x-ratelimit-reset-tokens"] == "50s"
    too_large = limiter.admit(7000)  # more than the bucket ever holds
    assert too_large.limited == "tokens" and too_large.retry_after_s == 60.0


def test_the_headers_state_what_a_pacer_needs() -> None:
    """Written by the devserver, read by the OpenAI wire into ``RateLimits``."""
    limiter = RateLimiter(6000, 600_000, window_s=1.0, clock=Clock())
    limits = rate_limits_from_headers(limiter.admit(1000).headers)
    assert limits is not None
    assert (limits.requests_limit, limits.requests_remaining) == (6000, 99)
    assert (limits.tokens_limit, limits.tokens_remaining) == (600_000, 9000)
    # capacity = remaining + reset x rate: one quantum of 100 requests, 10,000 tokens
    assert limits.requests_remaining + limits.requests_reset_s * 100 == pytest.approx(100)
    assert limits.tokens_remaining + limits.tokens_reset_s * 10_000 == pytest.approx(10_000)
    assert rate_limits_from_headers({"content-type": "application/json"}) is None


@pytest.mark.parametrize(
    ("key", "value"), [("rate_rpm", 0), ("rate_tpm", -5.0), ("rate_window_s", 0.0)]
)
def test_a_budget_that_is_not_positive_is_refused_naming_its_key(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"devserver.{key}"):
        DevServerConfig(**{key: value})  # type: ignore[arg-type]


def test_the_command_line_sets_the_budget() -> None:
    args = build_parser().parse_args(["--rpm", "6000", "--tpm", "9e7", "--rate-window", "1"])
    config = config_from_args(args)
    assert (config.rate_rpm, config.rate_tpm, config.rate_window_s) == (6000, 9e7, 1.0)


def _post(server: DevServer, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    req = urllib.request.Request(
        server.url + "/chat/completions", data=json.dumps(body).encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def test_every_answer_carries_the_budget_and_a_refusal_is_counted_and_logged(
    devserver: Any, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(rate_rpm=6, rate_tpm=1_000_000, request_log=str(log))  # 1 in 10 s
    body = {"model": "factory-dev", "messages": [{"role": "user", "content": "hi"}]}
    status, headers, _ = _post(server, {**body, "max_tokens": 100})
    assert status == 200
    lowered = {k.lower(): v for k, v in headers.items()}
    assert lowered["x-ratelimit-limit-requests"] == "6"
    assert lowered["x-ratelimit-remaining-requests"] == "5"
    # the prompt's estimate (one short message: 1 + 4 tokens) plus max_tokens
    assert int(lowered["x-ratelimit-remaining-tokens"]) == 1_000_000 - 105
    for _ in range(5):
        assert _post(server, body)[0] == 200
    status, headers, answer = _post(server, body)
    lowered = {k.lower(): v for k, v in headers.items()}
    assert status == 429 and answer["error"]["type"] == "requests"
    assert lowered["x-ratelimit-remaining-requests"] == "0"
    assert 0 < int(lowered["retry-after-ms"]) <= 10_000
    assert lowered["retry-after"] == str(math.ceil(int(lowered["retry-after-ms"]) / 1000))
    stats = json.loads(urllib.request.urlopen(server.url.removesuffix("/v1") + "/stats").read())
    assert (stats["rate_limited"], stats["by_status"]) == (1, {"200": 6, "429": 1})
    server.stop()
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["rate_limited"] for r in rows].count("requests") == 1
    assert rows[-1]["status"] == 429 and rows[-1]["rate_limited"] == "requests"
    assert sum(r["status"] == 200 and r["rate_limited"] is None for r in rows) == 6
