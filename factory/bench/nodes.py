"""``python -m factory.bench nodes``: a run on a three-node Ray cluster that loses a node.

A real multi-node cluster on this machine (``LocalCluster``: Ray's own
``ray.cluster_utils.Cluster``, a head and two nodes of 1 CPU each, every process
on 127.0.0.1), the factory's driver joined to it as ``ray job submit`` would
(``RAY_ADDRESS``), one worker per node (``ray.num_cpus=1``), the development
server at a heavy-tailed latency. A node is lost the way nodes die: ``kill -9``
of its raylet. Reported, each from one sitting (issue 33):

* ``clean`` and ``killed``: the same run without and with a node killed at the
  middle (half of the run's answers stored), and the wall-time ratio;
* calls paid again per lost node: requests the server completed twice (the
  request log), against the requests in flight on the lost worker at the kill;
* the driver's own CPU per 1,000 accepted rows (``os.wait4``'s rusage of the
  driver process), and from it the accepted-rows rate at which one driver
  would become the ceiling;
* ``--trials N``: N runs killed at random points (while the run starts, in the
  middle, while it stops, while it writes its last shards), each checked against
  an uninterrupted run's shards byte for byte, with the count paid again.

The cluster helpers are shared with the test suite (``tests/e2e/test_nodes.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "LocalCluster",
    "bench_nodes",
    "driver_env",
    "repaid",
    "shard_digest",
]

#: Every node and the driver on loopback: Ray otherwise swaps 127.0.0.1 for this
#: machine's outward address (``resolve_ip_for_localhost``).
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class LocalCluster:
    """A Ray cluster of several nodes on this machine (``ray.cluster_utils.Cluster``).

    Each node is a raylet of its own with ``cpus`` CPUs; the head too. Authentication
    off, usage stats off, everything under a short private ``RAY_TMPDIR``.
    """

    def __init__(self, nodes: int = 3, cpus: float = 1) -> None:
        os.environ.update(LOOPBACK)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ["RAY_AUTH_MODE"] = "disabled"
        self.tmp = tempfile.mkdtemp(prefix="rn", dir="/tmp")
        os.environ["RAY_TMPDIR"] = self.tmp
        self.temp_dir = os.path.join(self.tmp, "ray")
        os.makedirs(self.temp_dir)
        from ray.cluster_utils import Cluster

        self.cpus = cpus
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": cpus,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
                "temp_dir": self.temp_dir,
            },
        )
        self.extra: list[Any] = []
        for _ in range(nodes - 1):
            self.add_node(wait=False)
        self.cluster.wait_for_nodes()

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_node(self, *, wait: bool = True, resources: dict[str, float] | None = None) -> Any:
        """One more node of ``cpus`` CPUs (and custom ``resources``, as a fake GPU)."""
        node = self.cluster.add_node(
            num_cpus=self.cpus,
            node_ip_address="127.0.0.1",
            temp_dir=self.temp_dir,
            wait=wait,
            resources=resources or {},
        )
        self.extra.append(node)
        return node

    def kill_node(self, node: Any) -> int:
        """``kill -9`` of the node's raylet (its workers notice and exit); returns its pid."""
        pid = int(node.all_processes["raylet"][0].process.pid)
        os.kill(pid, signal.SIGKILL)
        self.extra.remove(node)
        return pid

    def node_of_pid(self, pid: int) -> Any:
        """The non-head node a process runs under (its raylet is an ancestor)."""
        import psutil

        ancestors = {p.pid for p in psutil.Process(pid).parents()}
        for node in self.extra:
            if int(node.all_processes["raylet"][0].process.pid) in ancestors:
                return node
        return None

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.cluster.shutdown()
        _kill_tree(self.tmp)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _kill_tree(tmpdir: str) -> None:
    """Whatever still runs under the cluster's temp dir (workers of a killed raylet)."""
    import psutil

    for proc in psutil.process_iter(["pid", "cmdline", "environ"]):
        with contextlib.suppress(psutil.Error):
            env = proc.info.get("environ") or {}
            cmd = " ".join(proc.info["cmdline"] or ())
            if env.get("RAY_TMPDIR") == tmpdir or tmpdir in cmd:
                proc.kill()


def driver_env(cluster: LocalCluster) -> dict[str, str]:
    """The environment of a driver joining ``cluster`` as ``ray job submit`` runs one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(LOOPBACK, RAY_ADDRESS=cluster.address, RAY_AUTH_MODE="disabled")
    env["RAY_TMPDIR"] = cluster.tmp
    return env


def worker_pids(tmpdir: str) -> list[int]:
    """The factory's worker actors of the cluster under ``tmpdir``."""
    import psutil

    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "environ"]):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(proc.info["cmdline"] or ())
            if (
                "ray::WorkerActor" in cmd
                and (proc.info.get("environ") or {}).get("RAY_TMPDIR") == tmpdir
            ):
                out.append(proc.info["pid"])
    return out


def cache_entries(out: Path) -> int:
    folder = out / "cache"
    if not folder.is_dir():
        return 0
    return sum(len(p.read_bytes().splitlines()) for p in folder.glob("*.jsonl"))


def shard_digest(out: Path) -> dict[str, str]:
    """sha256 of every file under ``out/data`` by name: byte-identical output, or not."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((out / "data").glob("*"))
        if p.is_file()
    }


def repaid(request_log: Path) -> int:
    """Requests the server completed more than once (each repeat is paid again)."""
    counts = Counter(
        e["request_id"]
        for e in map(json.loads, request_log.read_text().splitlines())
        if e.get("completed")
    )
    return sum(n - 1 for n in counts.values() if n > 1)


def in_flight_at(request_log: Path, at: float) -> int:
    """Requests received before ``at`` and not answered by then (on any worker)."""
    entries = [json.loads(line) for line in request_log.read_text().splitlines()]
    return sum(1 for e in entries if e["received"] <= at < e["time"])


class Driver:
    """``python -m factory.run`` joined to a cluster, its stderr kept, its CPU measured."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.started = time.time()
        self.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.cpu_s: float | None = None
        self.code: int | None = None
        self.wall_s: float | None = None

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    def running(self) -> bool:
        return self.code is None and not self._reap()

    def _reap(self) -> bool:
        """Whether the driver has exited (its exit code and CPU time then kept)."""
        if self.code is not None:
            return True
        pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
        if not pid:
            return False
        self.cpu_s = usage.ru_utime + usage.ru_stime  # the kernel's rusage of the driver
        self.code = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.code
        self.wall_s = time.time() - self.started
        self._reader.join(timeout=10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return True

    def wait(self, timeout: float) -> int:
        """Wait for the exit; its CPU time from the kernel's rusage (``wait4``)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self._reap():
                assert self.code is not None
                return self.code
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"the run did not end in {timeout:.0f} s: {self.stderr[-20:]}")

    def kill(self) -> None:
        """End the driver (if it still runs) and reap it."""
        if self.code is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                while not self._reap():
                    time.sleep(0.01)


def run_args(recipe: str, out: Path, url: str, *, target: int, extra: list[str]) -> list[str]:
    """The driver's command: the recipe against the development server at ``url``, one
    worker per 1-CPU node."""
    from factory.run import devserver_overrides

    sets = [
        *devserver_overrides(url),
        f"amplify.target={target}",
        "amplify.max_cost_usd=null",
        "llm.concurrency=9",
        "llm.per_actor_concurrency=3",
        "llm.retry.base_delay_s=0.05",
        "llm.retry.max_delay_s=0.5",
        "llm.deadline.hedge_share=0",  # a hedge's second answer would count as paid again
        "ray.actors=3",
        "ray.num_cpus=1",
        *extra,
    ]
    args = [sys.executable, "-m", "factory.run", recipe, "-o", str(out), "--no-progress"]
    return [*args, *[x for s in sets for x in ("--set", s)]]


@contextlib.contextmanager
def devserver(latency_ms: float, log: Path, seed: int) -> Iterator[str]:
    """The development server in its own process, heavy-tailed, with a request log."""
    from factory.bench import _start_server

    proc, url = _start_server(
        latency_ms, 64, "--latency", "lognormal", "--latency-p99-ratio", "10",
        "--seed", str(seed), "--request-log", str(log),
    )  # fmt: skip
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def one_run(
    work: Path,
    name: str,
    *,
    recipe: str,
    target: int,
    latency_ms: float,
    seed: int,
    kill_at: float | None = None,
    answers: int | None = None,
    add_node_after_s: float | None = None,
    timeout_s: float = 900,
) -> dict[str, Any]:
    """One run on a fresh three-node cluster; ``kill_at``: kill the node of a worker once
    that share of the run's ``answers`` (a clean run's count; default ``target``) are
    stored (0: a few seconds after the start, before or while the workers start; 1: at the
    last answer, while the run stops and writes its last shards)."""
    out = work / name
    log = work / f"{name}.requests.jsonl"
    report: dict[str, Any] = {"name": name, "kill_at": kill_at}
    with devserver(latency_ms, log, seed) as url, LocalCluster() as cluster:
        driver = Driver(run_args(recipe, out, url, target=target, extra=[]), driver_env(cluster))
        try:
            if kill_at is not None:
                want = kill_at * (answers or target)
                report.update(_kill_when(cluster, driver, out, kill_at, want))
            if add_node_after_s is not None and "killed_at" in report:
                time.sleep(add_node_after_s)
                cluster.add_node()
                report["node_added_after_s"] = round(time.time() - report["killed_at"], 1)
            code = driver.wait(timeout_s)
        finally:
            driver.kill()
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    report.update(
        exit_code=code,
        wall_s=round(driver.wall_s or 0.0, 1),
        driver_cpu_s=round(driver.cpu_s or 0.0, 2),
        totals=manifest.get("totals"),
        repaid=repaid(log),
        shards=shard_digest(out),
        worker_lines=[line for line in driver.stderr if line.startswith("workers:")],
        stderr_tail=driver.stderr[-15:] if code != 0 else [],
    )
    if "killed_at" in report:
        report["in_flight_at_kill"] = in_flight_at(log, report["killed_at"])
    return report


def _kill_when(
    cluster: LocalCluster, driver: Driver, out: Path, kill_at: float, want: float
) -> dict[str, Any]:
    """Wait for the kill point (``want`` answers stored), then ``kill -9`` the raylet of a
    node that runs a worker."""
    if kill_at <= 0:
        time.sleep(random.uniform(1.0, 8.0))  # the driver joins, the actors start
    else:
        while cache_entries(out) < want and driver.running():
            time.sleep(0.02)
    victims = [n for n in (cluster.node_of_pid(p) for p in worker_pids(cluster.tmp)) if n]
    node = victims[0] if victims else (cluster.extra[0] if cluster.extra else None)
    if node is None:
        return {"killed": None}
    pid = cluster.kill_node(node)
    now = time.time()
    return {
        "killed": pid,
        "killed_at": now,
        "answers_at_kill": cache_entries(out),
        "run_over_at_kill": not driver.running(),
    }


def bench_nodes(args: argparse.Namespace) -> dict[str, Any]:
    """Clean against killed at the middle (the ratio), or ``--trials`` random kill points
    against one uninterrupted run's shards."""
    work = Path(tempfile.mkdtemp(prefix="factory-nodes-"))
    common: dict[str, Any] = {
        "recipe": args.recipe,
        "target": args.target,
        "latency_ms": args.latency_ms,
        "seed": args.seed,
    }
    clean = one_run(work, "clean", **common)
    if clean["exit_code"] != 0 or not clean["shards"]:  # nothing to compare the others with
        raise RuntimeError(f"the clean run failed: {clean['stderr_tail']}")
    answers = cache_entries(work / "clean")
    report: dict[str, Any] = {"clean": _brief(clean), "answers": answers}
    accepted = (clean["totals"] or {}).get("accepted") or 0
    if accepted and not args.trials:
        # The driver's CPU per row, start-up apart: a run of a quarter the size in the same
        # sitting, and the difference (Ray's and the factory's start-up cost the same).
        small = one_run(work, "small", **{**common, "target": max(1, args.target // 4)})
        rows = accepted - ((small["totals"] or {}).get("accepted") or 0)
        per_1k = (clean["driver_cpu_s"] - small["driver_cpu_s"]) / rows * 1000 if rows else 0
        report["small"] = _brief(small)
        report["driver_cpu_s_whole_run_per_1k_accepted"] = round(
            clean["driver_cpu_s"] / accepted * 1000, 2
        )
        report["driver_cpu_s_per_1k_accepted"] = round(per_1k, 2)
        # One driver process is one core: past this many rows a second it is the ceiling.
        report["driver_ceiling_rows_per_s"] = round(1000 / per_1k) if per_1k > 0 else None
    if not args.trials:
        killed = one_run(
            work,
            "killed",
            kill_at=0.5,
            answers=answers,
            add_node_after_s=args.add_node_after,
            **common,
        )
        report["killed"] = _brief(killed)
        report["same_shards"] = killed["shards"] == clean["shards"]
        report["wall_ratio_killed_to_clean"] = round(killed["wall_s"] / clean["wall_s"], 3)
        return report
    rng = random.Random(args.seed)
    trials = []
    for i in range(args.trials):
        # the start, the middle, or the end (from the last answers to the last shards)
        point = rng.choice([0.0, rng.uniform(0.05, 0.95), rng.uniform(0.97, 1.0)])
        if args.at_end:
            point = rng.uniform(0.97, 1.0)
        one = one_run(work, f"trial{i}", kill_at=round(point, 3), answers=answers, **common)
        one["same_shards"] = one["shards"] == clean["shards"]
        trials.append(_brief(one))
        print(json.dumps(trials[-1]), file=sys.stderr, flush=True)
    report["trials"] = trials
    report["passed"] = sum(1 for t in trials if t["exit_code"] == 0 and t["same_shards"])
    return report


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k != "shards"}
