"""``llm.backend: openai_batch`` end to end: the real Ray pipeline against the development
server's Batch API (judge and amplification calls go out as batches).

A run reaches its target with the manifest accounting for every request (batch ids and
outcomes, an expired batch and per-request errors included); a run whose driver is
killed (SIGKILL) while its batches are in progress, then resumed, writes the data set an
uninterrupted run writes, and the server's log shows no request in two live batches and
none answered twice.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from factory.engine.runner import run
from tests.helpers import cli_args, dev_overrides, read_rows, recipe

BATCH = [
    "llm.backend=openai_batch",
    "llm.backend_options={poll_interval_s: 0.2, poll_backoff: 1.5, poll_max_s: 1.0}",
    "prices.factory-dev={input_per_mtok: 1.25, cached_input_per_mtok: 0.125, "
    "output_per_mtok: 10.0, batch_share: 0.5}",
]


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_log(lines: list[dict[str, Any]]) -> None:
    """No request answered twice; no request submitted while a batch holding it lives."""
    answered = Counter(
        r["request_id"] for r in lines if r.get("kind") == "batch" and r["completed"]
    )
    assert answered and max(answered.values()) == 1, answered.most_common(3)
    ended = {r["batch_id"]: r["time"] for r in lines if r.get("kind") == "batch_end"}
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in lines:
        if r.get("kind") == "batch_submit":
            spans[r["request_id"]].append((r["time"], ended.get(r["batch_id"], float("inf"))))
    for rid, held in spans.items():
        held.sort()
        for (_, end), (start, _) in itertools.pairwise(held):
            assert start >= end, f"{rid} was submitted while a batch holding it lived"


def _ids(out: Path) -> set[str]:
    return {r["id"] for r in read_rows(out)}


def test_batch_run_reaches_its_target_and_accounts_for_every_request(
    ray_session, devserver, tmp_path
) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(
        batch_delay_s=1.0,
        batch_error_rate=0.1,
        batch_expire_first=1,
        request_log=str(log),
        seed=5,
    )
    out = tmp_path / "out"
    cfg = recipe("airline.yaml", out, *dev_overrides(server.url, target=30), *BATCH)
    run(cfg, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    t = manifest["totals"]
    assert t["accepted"] >= 30 and manifest["target"]["reached"]
    assert t["accepted"] + t["surplus"] + t["rejected"] + t["failed"] == t["total"]
    lines = _log(log)
    _check_log(lines)
    batches = manifest["batches"]
    assert batches["by_status"].get("expired") == 1, batches["by_status"]
    assert set(batches["by_status"]) <= {"completed", "expired"}
    # Every request the server received is in a recorded batch, every answer counted.
    submitted = [r for r in lines if r.get("kind") == "batch_submit"]
    assert batches["requests_submitted"] == len(submitted)
    assert {b["id"] for b in batches["batches"]} == {r["batch_id"] for r in submitted}
    answered = sum(1 for r in lines if r.get("kind") == "batch" and r["completed"])
    assert batches["requests_completed"] == answered
    assert manifest["cost_usd"] > 0  # paid at the Batch tier
    rows = read_rows(out)
    assert len(rows) >= 30


def test_driver_killed_while_batches_run_then_resumed_equals_an_uninterrupted_run(
    ray_session, devserver, tmp_path
) -> None:
    import psutil

    ref = devserver(batch_delay_s=1.0, seed=9)
    out_ref = tmp_path / "ref"
    run(
        recipe("airline.yaml", out_ref, *dev_overrides(ref.url, target=40), *BATCH),
        out_ref,
        progress=False,
    )

    log = tmp_path / "requests.jsonl"
    # Slow batches: the driver is killed while amplification batches are in progress.
    server = devserver(batch_delay_s=6.0, seed=9, request_log=str(log))
    out = tmp_path / "killed"
    args = cli_args(out, *dev_overrides(server.url, target=40), *BATCH)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "RAY_ADDRESS")}
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # a private Ray
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip

    def amplify_batch_live() -> bool:
        for path in (out / "batches").glob("*.json") if (out / "batches").is_dir() else []:
            try:
                entry = json.loads(path.read_text())
            except ValueError:
                continue
            if entry.get("status") in ("validating", "in_progress") and any(
                r.startswith("amplify-") for r in entry["request_ids"]
            ):
                return True
        return False

    deadline = time.time() + 1200  # generous: a busy 2-core machine
    try:
        while not amplify_batch_live():
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.time() < deadline, "the run submitted no amplification batch"
            time.sleep(0.05)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    tree = psutil.Process(proc.pid).children(recursive=True)  # Ray and its workers
    os.kill(proc.pid, signal.SIGKILL)  # the driver alone, like the OOM killer
    proc.wait()
    _wait_gone(tree)
    assert json.loads((out / "run.json").read_text())["status"] == "running"

    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rb", dir="/tmp")
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _ids(out) == _ids(out_ref)
    _check_log(_log(log))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["batches"]["count"] >= 2


def _wait_gone(procs: list[Any]) -> None:
    import psutil

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.time() + 120
    while any(alive(p) for p in procs):
        if time.time() > deadline:
            left = [p.pid for p in procs if alive(p)]
            for p in procs:
                if alive(p):
                    p.kill()
            raise AssertionError(f"processes of the killed run still alive: {left}")
        time.sleep(0.2)
