"""A run on a three-node Ray cluster that loses a node (issue 33), end to end.

The cluster is real (``factory.bench.nodes.LocalCluster``: a head and two nodes, 1 CPU
each, raylets of their own on 127.0.0.1), the driver joins it as ``ray job submit``
runs one (``RAY_ADDRESS``), one worker per node. A node is lost the way nodes die:
``kill -9`` of its raylet, mid-run, with the driver alive. Random kill points (the
start, the stop, the last shards) are ``python -m factory.bench nodes --trials 20``,
in BENCHMARKS.md; this is one promise, one run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from factory.bench.nodes import (
    Driver,
    LocalCluster,
    cache_entries,
    driver_env,
    in_flight_at,
    repaid,
    run_args,
    shard_digest,
    worker_pids,
)
from tests.conftest import ROOT

pytestmark = pytest.mark.ray

TARGET = 120


@pytest.fixture(scope="module")
def cluster() -> LocalCluster:
    with LocalCluster(nodes=3, cpus=1) as made:
        yield made


def _run(cluster: LocalCluster, out: Path, url: str) -> Driver:
    recipe = str(ROOT / "pipelines" / "airline.yaml")
    return Driver(run_args(recipe, out, url, target=TARGET, extra=[]), driver_env(cluster))


@pytest.mark.timeout(1500)
def test_a_lost_node_costs_only_its_calls_in_flight_and_a_new_node_gets_its_worker(
    cluster: LocalCluster, devserver, tmp_path: Path
) -> None:
    """Killed at the middle: the run ends 0 with the shards of an uninterrupted run, byte
    for byte, no call filed as failed (a dying worker's items are not "interrupted"), the
    calls paid again at most those in flight at the kill; the console says the run went
    on with 2 of 3 workers, and a node added afterwards gets the lost worker back."""
    reference = devserver(seed=33, latency_ms=100)
    ref = _run(cluster, tmp_path / "ref", reference.url)
    assert ref.wait(600) == 0, ref.stderr[-20:]

    log = tmp_path / "requests.jsonl"
    server = devserver(seed=33, latency_ms=100, request_log=str(log))
    out = tmp_path / "killed"
    driver = _run(cluster, out, server.url)
    try:
        deadline = time.time() + 600
        while cache_entries(out) < TARGET // 2:
            assert driver.running(), driver.stderr[-20:]
            assert time.time() < deadline, "the run made no progress"
            time.sleep(0.02)
        nodes = {cluster.node_of_pid(p) for p in worker_pids(cluster.tmp)} - {None}
        assert nodes, "no worker runs on a non-head node"
        # Answers slow down until the lost worker is back (latency draws nothing from the
        # answers' randomness), so the run cannot end before a new node could start.
        server.config.latency_ms = 3000
        cluster.kill_node(nodes.pop())
        killed_at = time.time()
        added = back = False
        while driver.running():
            lines = list(driver.stderr)
            if not added and any("2 of 3 workers running" in line for line in lines):
                cluster.add_node()  # the lost worker comes back here
                added = True
            if added and not back and any("started on node" in line for line in lines):
                server.config.latency_ms = 100
                back = True
            time.sleep(0.05)
        code = driver.wait(60)
    finally:
        driver.kill()
    assert code == 0, driver.stderr[-20:]
    assert shard_digest(out) == shard_digest(tmp_path / "ref")
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    assert totals["failed"] == 0 and totals["accepted"] == TARGET, totals
    paid_again = repaid(log)
    assert paid_again <= in_flight_at(log, killed_at), (paid_again, in_flight_at(log, killed_at))
    assert paid_again <= 3  # one worker's LLM slots (llm.per_actor_concurrency)
    lines = [line for line in driver.stderr if line.startswith("workers: ")]
    assert any("lost (" in line and "2 of 3 workers running" in line for line in lines), lines
    assert added and back, lines  # the new node got the lost worker while the run went on
    assert any("3 of 3 workers running" in line for line in lines), lines
    assert not any("driver is gone" in line for line in driver.stderr), driver.stderr
