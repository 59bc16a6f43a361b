"""Nothing lost, nothing paid twice: budget stops, resumes, kill -9, fault storms."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from factory.bench.nodes import cache_entries
from factory.engine.runner import run
from tests.helpers import cli_args, dev_overrides, read_rows, recipe

pytestmark = pytest.mark.ray

# Cached prompt tokens priced like the others: costs then do not depend on which
# server's prefix cache saw a prompt first, so two runs are comparable to the cent.
PRICE = (
    "prices={factory-dev: {input_per_mtok: 2.0, cached_input_per_mtok: 2.0, output_per_mtok: 8.0}}"
)
SLOW = ("llm.concurrency=8", "llm.per_actor_concurrency=4")  # more calls than slots


def ids(out: Path) -> set[str]:
    rows = read_rows(out)
    assert len(rows) == len({r["id"] for r in rows}), "duplicate rows in data/"
    return {r["id"] for r in rows}


def completed_twice(log: Path) -> list[str]:
    counts = Counter(
        e["request_id"] for e in map(json.loads, log.read_text().splitlines()) if e["completed"]
    )
    return [h for h, n in counts.items() if n > 1]


def test_cost_cap_then_resume_costs_what_an_uninterrupted_run_costs(
    ray_session, devserver, tmp_path
) -> None:
    a = devserver(seed=11)
    out_a = tmp_path / "a"
    full = run(
        recipe("airline.yaml", out_a, *dev_overrides(a.url, target=120), PRICE, *SLOW),
        out_a,
        progress=False,
    )
    cost = full.manifest["cost_usd"]
    assert full.totals["accepted"] == 120 and cost > 0

    log = tmp_path / "requests.jsonl"
    b = devserver(seed=11, request_log=str(log))
    out_b = tmp_path / "b"
    cap = round(cost / 2, 6)
    capped_cfg = recipe(
        "airline.yaml",
        out_b,
        *dev_overrides(b.url, target=120),
        PRICE,
        *SLOW,
        f"amplify.max_cost_usd={cap}",
    )
    capped = run(capped_cfg, out_b, progress=False)
    assert capped.stopped_by == "max_cost_usd" and capped.exit_code == 4
    spent = capped.manifest["cost_usd"]
    per_call_max = max(r["cost_usd"] for r in _rows_with_cost(out_a))
    assert cap <= spent <= cap + 8 * per_call_max  # over by at most the 8 calls in flight
    assert json.loads((out_b / "run.json").read_text())["status"] == "stopped"
    # the cap cut the run short: calls are issued only while the budget has room for them
    assert capped.manifest["budget"]["stopped_by"] == "max_cost_usd"
    assert capped.totals["accepted"] < 120 and not capped.manifest["target"]["reached"]
    assert not (out_b / "unstored").exists()  # the reserve goes when a run ends

    resumed_cfg = recipe(
        "airline.yaml",
        out_b,
        *dev_overrides(b.url, target=120),
        PRICE,
        *SLOW,
        "amplify.max_cost_usd=null",
    )
    # What the resume's plan says before its first call (issue 39): that it resumes, and
    # what the folder's cached answers cost (all of what the stopped run paid).
    from factory import preflight

    prior = preflight.prior_run(
        out_b, resumed_cfg, fresh=False, drop_cache=False, retry_failed=False
    )
    assert prior.resumes == "it was stopped (max_cost_usd)"
    assert prior.cost_usd == pytest.approx(spent, abs=1e-6)
    assert prior.answers == capped.manifest["budget"]["calls"]
    assert preflight.measured(out_b, resumed_cfg) == (
        capped.totals["accepted"] + capped.totals["surplus"],
        capped.totals["total"],
    )
    resumed = run(resumed_cfg, out_b, progress=False)
    assert resumed.extra["mode"] == "resume"
    assert ids(out_b) == ids(out_a)
    assert resumed.manifest["cost_usd"] == pytest.approx(cost, rel=1e-9)
    assert resumed.manifest["cost_usd_paid_this_run"] == pytest.approx(cost - spent, abs=1e-6)
    assert resumed.manifest["responses_from_cache"] > 0
    assert completed_twice(log) == []  # no completed request was paid for twice


def _rows_with_cost(out: Path) -> list[dict]:
    """Every cached completion of a run (the cache's segments are JSON lines)."""
    return [
        json.loads(line)["v"]
        for seg in (out / "cache").glob("*.jsonl")
        for line in seg.read_text().splitlines()
        if line
    ]


def test_changed_recipe_is_refused_and_a_finished_run_is_left_alone(
    ray_session, devserver, tmp_path
) -> None:
    from factory.errors import ConfigError

    server = devserver(seed=12)
    out = tmp_path / "o"
    cfg = recipe("airline.yaml", out, *dev_overrides(server.url, target=10))
    run(cfg, out, progress=False)
    again = run(
        recipe("airline.yaml", out, *dev_overrides(server.url, target=10)), out, progress=False
    )
    assert "already complete" in again.extra["report"]
    with pytest.raises(ConfigError) as info:
        run(
            recipe("airline.yaml", out, *dev_overrides(server.url, target=10), "amplify.seed=5"),
            out,
            progress=False,
        )
    assert info.value.key_path == "amplify.seed"


def test_fault_storm_finishes_and_accounts_for_every_call(ray_session, devserver, tmp_path) -> None:
    server = devserver(
        seed=13,
        retry_after_s=0.05,
        stall_s=30,
        defects={"rate_limit": 0.2, "server_error": 0.05, "stall": 0.02, "malformed_json": 0.1},
    )
    out = tmp_path / "o"
    cfg = recipe(
        "airline.yaml",
        out,
        *dev_overrides(server.url, target=60),
        "llm.timeout_s=2",
        "llm.retry.max_attempts=6",
    )
    result = run(cfg, out, progress=False)
    t = result.totals
    assert t["accepted"] == 60
    assert t["accepted"] + t["surplus"] + t["rejected"] + t["failed"] == t["total"]
    assert result.manifest["calls"]["issued"] == t["total"]
    stats = server.stats()
    assert stats["by_defect"].get("rate_limit", 0) > 0 and stats["by_defect"].get("stall", 0) > 0
    assert result.manifest["reasons"]["postprocess"].get("unparsable_completion", 0) > 0


# The lifeline's promise (factory/engine/watchdog.py): no request leaves a worker later than this
# after its driver died: the socket closes with the driver, and every request checks it first.
STOP_BOUND_S = 0.5


def _cache_keys(out: Path) -> set[str]:
    """Request ids stored in the cache (torn lines skipped, as the cache's reader does)."""
    from factory.io.cache import decode_line

    keys: set[str] = set()
    for seg in (out / "cache").glob("*.jsonl"):
        for line in seg.read_bytes().splitlines(keepends=True):
            try:
                key = json.loads(line)["k"]
            except (ValueError, KeyError, TypeError):
                continue
            if decode_line(line, key) is not None:
                keys.add(key)
    return keys


def _wait_gone(procs: list, what: str) -> None:
    """Poll until every process of ``procs`` has exited (generous deadline, no timing)."""
    import psutil

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.time() + 90
    while any(alive(p) for p in procs):
        assert time.time() < deadline, f"{what} outlived the driver"
        time.sleep(0.1)


@pytest.mark.timeout(1800)  # four runs, three Ray start-ups: generous on a busy machine
def test_kill_9_at_random_points_then_resume_equals_an_uninterrupted_run(
    ray_session, devserver, tmp_path
) -> None:
    """Killed the way users' runs die (SIGKILL of the driver alone, as the OOM killer
    does; then of its whole process group), a run re-pays on resume only requests that
    were in flight at a kill, and no request leaves the killed run later than
    STOP_BOUND_S after its kill."""
    import psutil

    ref = devserver(seed=14, latency_ms=40)
    out_ref = tmp_path / "ref"
    run(
        recipe("airline.yaml", out_ref, *dev_overrides(ref.url, target=120)),
        out_ref,
        progress=False,
    )

    log = tmp_path / "requests.jsonl"
    server = devserver(seed=14, latency_ms=40, request_log=str(log))
    out = tmp_path / "killed"
    args = cli_args(out, *dev_overrides(server.url, target=120))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "RAY_ADDRESS")}
    kills: list[tuple[float, float]] = []  # (kill time, start of the next run)
    stored: set[str] = set()  # request ids the cache held after the kills
    for kill_after, whole_group in ((15, False), (70, True)):  # judge, then amplify calls
        env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rk", dir="/tmp")  # a private Ray
        proc = subprocess.Popen(
            args,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # Generous: on a 2-core machine shared with a CPU hog and a test suite, a run
        # took over 300 s to store its first answers. Whatever fails, kill the run.
        deadline = time.time() + 1200
        try:
            while cache_entries(out) < kill_after:
                assert proc.poll() is None, "the run ended before it could be killed"
                assert time.time() < deadline, "the run made no progress"
                time.sleep(0.05)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        tree = psutil.Process(proc.pid).children(recursive=True)  # Ray and its workers
        if whole_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the driver alone, like the OOM killer
        killed_at = time.time()
        proc.wait()
        _wait_gone(tree, "a process of the killed run")
        assert json.loads((out / "run.json").read_text())["status"] == "running"
        stored |= _cache_keys(out)
        kills.append((killed_at, time.time()))

    resumed_at = time.time()
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rk", dir="/tmp")
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ids(out) == ids(out_ref)

    entries = [json.loads(line) for line in log.read_text().splitlines()]
    # Nothing leaves a killed run later than STOP_BOUND_S after its kill.
    late = [
        e
        for e in entries
        for k, next_start in kills
        if k + STOP_BOUND_S < e["received"] < next_start
    ]
    assert not late, f"{len(late)} requests reached the server after a kill: {late[:3]}"
    # Nothing stored is asked for again.
    asked_again = {e["request_id"] for e in entries if e["received"] >= resumed_at} & stored
    assert not asked_again, f"stored responses were requested again: {sorted(asked_again)[:3]}"
    # What a crash re-pays: requests the server completed for a killed run whose answer
    # was never stored, i.e. requests in flight at a kill (sent before the kill's stop
    # bound, answered no earlier than the moment before the kill a received answer
    # takes to be stored).
    first: dict[str, dict] = {}
    for e in entries:
        if e["completed"]:
            first.setdefault(e["request_id"], e)
    repeats = completed_twice(log)
    not_in_flight = [
        first[h]
        for h in repeats
        if not any(
            first[h]["received"] <= k + STOP_BOUND_S and first[h]["time"] >= k - 5.0
            for k, _ in kills
        )
    ]
    assert not not_in_flight, f"re-paid requests that were not in flight: {not_in_flight[:3]}"
    assert len(repeats) <= 64 * len(kills)  # at most what was in flight


def test_failed_calls_are_retried_with_retry_failed(ray_session, devserver, tmp_path) -> None:
    flaky = devserver(seed=15, defects={"server_error": 0.3})
    out = tmp_path / "o"
    first = run(
        recipe(
            "airline.yaml",
            out,
            *dev_overrides(flaky.url, target=40),
            "llm.retry.max_attempts=1",
            "prefilter.enabled=false",
        ),
        out,
        progress=False,
    )
    assert first.totals["failed"] > 0 and first.totals["accepted"] == 40
    healthy = devserver(seed=15)  # the endpoints may change between runs of one output
    again = run(
        recipe(
            "airline.yaml",
            out,
            *dev_overrides(healthy.url, target=40),
            "llm.retry.max_attempts=1",
            "prefilter.enabled=false",
        ),
        out,
        progress=False,
        retry_failed=True,
    )
    assert again.extra["mode"] == "resume"
    assert again.totals["failed"] == 0 and again.totals["accepted"] == 40
    assert again.manifest["responses_from_cache"] > 0


def _ours(proc: Any) -> bool:
    """Whether ``proc`` belongs to this test process's Ray session (its ``RAY_TMPDIR``), not
    to another session on the machine (a second pytest worker, a developer's own run)."""
    import psutil

    try:
        return bool(proc.environ().get("RAY_TMPDIR") == os.environ.get("RAY_TMPDIR"))
    except psutil.Error:
        return False


def test_an_actor_killed_mid_run_is_restarted_and_nothing_is_lost(
    ray_session, devserver, tmp_path
) -> None:
    import threading

    import psutil

    server = devserver(seed=16, latency_ms=100)
    out = tmp_path / "o"
    cfg = recipe(
        "airline.yaml",
        out,
        *dev_overrides(server.url, target=150),
        *SLOW,
        "prefilter.enabled=false",
    )
    killed: list[int] = []

    def kill_one_actor() -> None:
        deadline = time.time() + 60
        while time.time() < deadline and not killed:
            if cache_entries(out) >= 30:
                for proc in psutil.process_iter(["cmdline"]):
                    if "ray::WorkerActor" in " ".join(proc.info["cmdline"] or []) and _ours(proc):
                        proc.kill()
                        killed.append(proc.pid)
                        return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_actor)
    killer.start()
    result = run(cfg, out, progress=False)
    killer.join()
    assert killed, "no amplify actor was found to kill"
    t = result.totals
    assert t["accepted"] == 150
    assert t["accepted"] + t["surplus"] + t["rejected"] + t["failed"] == t["total"]
    assert len(ids(out)) == 150
