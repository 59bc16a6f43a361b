"""The driver's watch over the endpoints: a dead one is named, a dead run is stopped."""

from __future__ import annotations

from typing import Any

from factory.engine.health import UNREACHABLE, EndpointWatch, merge_reports


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NoLedger:
    last_success = None


def _view(**kw: Any) -> dict[str, Any]:
    base = {"answers": 0, "failures": 0, "in_flight": 0, "oldest_s": 0.0,
            "since_answer_s": None, "last_error": None}  # fmt: skip
    return {**base, **kw}


def test_reports_of_workers_merge_into_one_view_per_endpoint() -> None:
    merged = merge_reports(
        [
            {"a": _view(answers=3, in_flight=2, oldest_s=4.0, since_answer_s=9.0)},
            {"a": _view(failures=2, oldest_s=7.0, since_answer_s=1.5, last_error="boom")},
            {"b": _view(in_flight=1)},
        ]
    )
    assert merged["a"]["answers"] == 3 and merged["a"]["failures"] == 2
    assert merged["a"]["in_flight"] == 2 and merged["a"]["oldest_s"] == 7.0
    assert merged["a"]["since_answer_s"] == 1.5 and merged["a"]["last_error"] == "boom"
    assert merged["b"]["since_answer_s"] is None


def test_an_endpoint_that_refuses_connections_is_named_once_then_the_run_stops() -> None:
    clock, lines = Clock(), []
    watch = EndpointWatch(60.0, print_line=lines.append, clock=clock)
    refused = _view(failures=4, last_error="LLMServerError: connection refused")
    assert watch.report({0: {"http://x/v1": refused}}, NoLedger()) is None
    assert lines == []  # not yet: 20 s of silence first
    clock.now += 21
    assert watch.report({0: {"http://x/v1": {**refused, "failures": 9}}}, NoLedger()) is None
    assert len(lines) == 1 and "http://x/v1" in lines[0] and "connection refused" in lines[0]
    clock.now += 10
    watch.report({1: {"http://x/v1": {**refused, "failures": 12}}}, NoLedger())
    assert len(lines) == 1  # said once
    clock.now += 30
    assert watch.report({}, NoLedger()) == UNREACHABLE
    assert watch.message is not None and "llm.stall_s" in watch.message


def test_an_endpoint_that_answers_nothing_is_named_by_its_waiting_requests() -> None:
    clock, lines = Clock(), []
    watch = EndpointWatch(None, print_line=lines.append, clock=clock)
    clock.now += 25
    silent = _view(in_flight=8, oldest_s=25.0)
    assert watch.report({0: {"http://y/v1": silent}}, NoLedger()) is None
    assert len(lines) == 1 and "answers nothing" in lines[0] and "8 requests" in lines[0]
    clock.now += 10_000
    assert watch.report({0: {"http://y/v1": silent}}, NoLedger()) is None  # stall_s null


def test_answers_keep_a_slow_run_alive() -> None:
    clock, lines = Clock(), []
    watch = EndpointWatch(30.0, print_line=lines.append, clock=clock)
    for _ in range(10):
        clock.now += 10
        busy = _view(answers=5, in_flight=4, oldest_s=8.0, since_answer_s=2.0)
        assert watch.report({0: {"http://z/v1": busy}}, NoLedger()) is None
    assert lines == []
