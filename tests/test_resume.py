"""Nothing lost, nothing paid twice: budget stops, resumes, kill -9, fault storms."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from factory.runner import run

from .conftest import ROOT
from .helpers import dev_overrides, read_rows, recipe

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
        e["body_hash"] for e in map(json.loads, log.read_text().splitlines()) if e["completed"]
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
    assert capped.manifest["unissued"] > 0

    resumed = run(
        recipe(
            "airline.yaml",
            out_b,
            *dev_overrides(b.url, target=120),
            PRICE,
            *SLOW,
            "amplify.max_cost_usd=null",
        ),
        out_b,
        progress=False,
    )
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


def _cache_entries(out: Path) -> int:
    return (
        sum(len(p.read_bytes().splitlines()) for p in (out / "cache").glob("*.jsonl"))
        if (out / "cache").is_dir()
        else 0
    )


def test_kill_9_at_random_points_then_resume_equals_an_uninterrupted_run(
    ray_session, devserver, tmp_path
) -> None:
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
    args = [
        sys.executable,
        "-m",
        "factory.run",
        str(ROOT / "pipelines/airline.yaml"),
        "-o",
        str(out),
        "--no-progress",
        *[x for o in dev_overrides(server.url, target=120) for x in ("--set", o)],
    ]
    env = {
        **os.environ,
        "RAY_TMPDIR": os.environ.get("RAY_TMPDIR", "/tmp"),
        "PYTEST_CURRENT_TEST": "",
    }
    env.pop("PYTEST_CURRENT_TEST")
    kills: list[float] = []
    for kill_after in (15, 70):  # cached responses when the driver is killed
        proc = subprocess.Popen(
            args,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.time() + 120
        while _cache_entries(out) < kill_after and proc.poll() is None:
            assert time.time() < deadline, "the run made no progress"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started
        kills.append(time.time())
        proc.wait()
        assert json.loads((out / "run.json").read_text())["status"] == "running"
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ids(out) == ids(out_ref)
    # A response the server finished in the instant before the kill, whose process died
    # before it could store it, is asked for again: nothing can avoid that (the
    # server cannot know the client never stored it). Every other completed request was
    # stored and never issued twice. So each repeat must have been in flight at a kill.
    first_done: dict[str, float] = {}
    for e in map(json.loads, log.read_text().splitlines()):
        if e["completed"]:
            first_done.setdefault(e["body_hash"], e["time"])
    repeats = completed_twice(log)
    in_flight_at_kill = [
        h for h in repeats if any(k - 5.0 <= first_done[h] <= k + 0.5 for k in kills)
    ]
    assert repeats == in_flight_at_kill, "a stored response was requested again"
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
            if _cache_entries(out) >= 30:
                for proc in psutil.process_iter(["cmdline"]):
                    if "AsyncStageUDF" in " ".join(proc.info["cmdline"] or []):
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
