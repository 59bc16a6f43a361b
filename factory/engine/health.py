"""The driver's watch over the LLM endpoints: name a dead one, give up on a dead run.

Why: an endpoint with nothing listening, or one that accepts connections and never
answers, left a run in its judge phase for minutes with nothing on the console
(issue 22). Every worker reports its endpoints' state with its results
(``EndpointPool.health``: answers, failures, requests in flight and the age of the
oldest, the last failure); ``EndpointWatch.report`` merges the reports and

* names an endpoint on the console once it has gone ``warn_s`` without an answer
  while requests to it failed ("refuses connections: ...") or waited ("answers
  nothing: N requests waiting for 31 s");
* stops the run (``unreachable``, exit code 8) once no LLM call at all has
  succeeded for ``llm.stall_s`` while calls were out.

Pure apart from the clock and the console line (``print_line``, injectable).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["UNREACHABLE", "EndpointWatch", "merge_reports"]

UNREACHABLE = "unreachable"
WARN_S = 20.0


def merge_reports(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One view per endpoint over every worker's report (sums and worst cases)."""
    out: dict[str, dict[str, Any]] = {}
    for report in reports:
        for name, h in report.items():
            m = out.setdefault(
                name,
                {
                    "answers": 0,
                    "failures": 0,
                    "in_flight": 0,
                    "oldest_s": 0.0,
                    "since_answer_s": None,
                    "last_error": None,
                },
            )
            m["answers"] += int(h.get("answers") or 0)
            m["failures"] += int(h.get("failures") or 0)
            m["in_flight"] += int(h.get("in_flight") or 0)
            m["oldest_s"] = max(m["oldest_s"], float(h.get("oldest_s") or 0.0))
            since = h.get("since_answer_s")
            if since is not None:
                m["since_answer_s"] = (
                    since if m["since_answer_s"] is None else min(m["since_answer_s"], since)
                )
            m["last_error"] = h.get("last_error") or m["last_error"]
    return out


class EndpointWatch:
    """See the module docstring.

    Args:
        stall_s: no successful call for this long (with calls out) ends the run; None: never.
        warn_s: an endpoint silent this long is named on the console.
        print_line: where the warnings go.
        clock: wall-clock seconds (tests inject one).
    """

    def __init__(
        self,
        stall_s: float | None,
        *,
        warn_s: float = WARN_S,
        print_line: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.stall_s = stall_s
        self.warn_s = warn_s
        self.clock = clock
        self.started = clock()
        self.print_line = print_line or _console_line
        self.state: dict[int, dict[str, Any]] = {}  # the latest report of each worker
        self.last_progress = self.started  # the last time any endpoint answered
        self.warned: dict[str, str] = {}
        self.message: str | None = None

    def report(self, reports: dict[int, dict[str, Any]], ledger: Any) -> str | None:
        """Take the replying workers' reports (worker -> its endpoints' state); warn;
        return ``UNREACHABLE`` when the run should stop."""
        now = self.clock()
        self.state.update(reports)
        merged = merge_reports(list(self.state.values()))
        for name, h in merged.items():
            since = h["since_answer_s"]
            if since is not None and since < self.warn_s:
                self.last_progress = max(self.last_progress, now - since)
                self.warned.pop(name, None)
                continue
            silent = now - self.started if since is None else since
            if silent < self.warn_s:
                continue
            line = _describe(name, h, silent)
            if line is not None and self.warned.get(name) != line.split(":")[1]:
                self.warned[name] = line.split(":")[1]
                self.print_line(line)
        if getattr(ledger, "last_success", None):
            self.last_progress = max(self.last_progress, ledger.last_success)
        waiting = any(h["in_flight"] or h["failures"] for h in merged.values())
        if self.stall_s is not None and waiting and now - self.last_progress >= self.stall_s:
            names = ", ".join(sorted(merged)) or "the endpoints"
            self.message = (
                f"no LLM call succeeded for {now - self.last_progress:.0f} s (llm.stall_s: "
                f"{self.stall_s:g}); {names} unreachable or silent; the run stopped and is "
                "resumable: fix the endpoint and run the same command again"
            )
            return UNREACHABLE
        return None


def _describe(name: str, h: dict[str, Any], silent: float) -> str | None:
    if h["failures"] and h["last_error"]:
        return (
            f"endpoint {name}: refuses or fails every request ({h['failures']} failed "
            f"attempts, no answer for {silent:.0f} s; last: {h['last_error']})"
        )
    if h["in_flight"] and h["oldest_s"] >= WARN_S:
        return (
            f"endpoint {name}: answers nothing ({h['in_flight']} requests waiting, the oldest "
            f"for {h['oldest_s']:.0f} s)"
        )
    return None


def _console_line(line: str) -> None:
    from factory.engine.console import console

    print(f"warning: {line}", file=console(), flush=True)
