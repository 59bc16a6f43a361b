"""The ``gemini`` backend's two clients (plain HTTP, google-genai SDK) against the
``aiohttp`` backend (OpenAI wire) on the peer harness's S1 setup, interleaved.

Why here and not in ``../shared/peer-bench/run_bench.py``: the harness's factory system
speaks only the OpenAI wire. This runs the same thing it runs for ``factory`` (a
development server with ``--latency-ms 200 --max-concurrency 64``; ``factory.run
pipelines/airline.yaml`` with the harness's overrides: N amplification calls, no judge,
C=64 over 2 actors) once per system and repetition, the systems interleaved, and reports
calls per second (the server's request log), wall time, the client's CPU seconds (every
process of the run, Ray's included) and each ratio to the aiohttp baseline of the same
repetition.

    .venv/bin/python tests/bench/bench_gemini_clients.py --n 1500 --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = {
    "aiohttp": [],
    "gemini-http": ["llm.backend=gemini", "llm.backend_options.client=http"],
    "gemini-sdk": ["llm.backend=gemini", "llm.backend_options.client=sdk"],
}


def start_server(log: Path) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable,
        "-m",
        "factory.devserver",
        "--port",
        "0",
        "--latency-ms",
        "200",
        "--max-concurrency",
        "64",
        "--request-log",
        str(log),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, line.rsplit(" ", 1)[-1].strip()


class TreeCPU:
    """CPU seconds of a process and all its descendants, sampled (the last seen per pid)."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.cpu: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            try:
                t = p.cpu_times()
                self.cpu[p.pid] = t.user + t.system
            except psutil.Error:
                pass

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.sample()

    def total(self) -> float:
        self.stop.set()
        self.thread.join()
        return sum(self.cpu.values())


def one(system: str, n: int, work: Path) -> dict[str, float]:
    work.mkdir(parents=True, exist_ok=True)
    log = work / f"{system}.log"
    server, url = start_server(log)
    sets = [
        f'llm.endpoints=[{{"base_url": "{url}"}}]',
        "llm.model=factory-dev",
        "prefilter.model=factory-dev",
        "prefilter.enabled=false",
        f"amplify.target={n}",
        f"amplify.max_calls={n}",
        "amplify.max_cost_usd=null",
        "llm.concurrency=64",
        "llm.per_actor_concurrency=32",
        "ray.actors=2",
        *SYSTEMS[system],
    ]
    cmd = [
        sys.executable,
        "-m",
        "factory.run",
        str(ROOT / "pipelines/airline.yaml"),
        *[x for s in sets for x in ("--set", s)],
        "--output",
        str(work / f"out-{system}"),
        "--no-progress",
    ]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "GEMINI_API_KEY": "dev-key"}
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    tree = TreeCPU(proc.pid)
    _, err = proc.communicate()
    wall = time.monotonic() - started
    cpu = tree.total()
    server.terminate()
    server.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{system} failed ({proc.returncode}): {err[-2000:]}")
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    done = [r for r in rows if r.get("status") == 200 and r.get("received")]
    first = min(r["received"] for r in done)
    last = max(r["time"] for r in done)
    return {
        "calls": len(done),
        "calls_per_s": len(done) / (last - first),
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_ms_per_call": 1000 * cpu / max(len(done), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1500)
    p.add_argument("--reps", type=int, default=2)
    a = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
    ray_tmp = tempfile.mkdtemp(prefix="rgb", dir="/tmp")
    os.environ["RAY_TMPDIR"] = ray_tmp
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            for system in SYSTEMS:
                r = one(system, a.n, Path(tmp) / f"rep{rep}")
                results[system].append(r)
                print(json.dumps({"rep": rep, "system": system, **r}), flush=True)
    base = results["aiohttp"]
    print("\nsystem        calls/s  wall_s  cpu_s  cpu_ms/call  ratio calls/s  ratio cpu")
    for system, runs in results.items():
        m = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
        ratio = statistics.mean(
            r["calls_per_s"] / b["calls_per_s"] for r, b in zip(runs, base, strict=True)
        )
        cpu = statistics.mean(r["cpu_s"] / b["cpu_s"] for r, b in zip(runs, base, strict=True))
        print(
            f"{system:12s} {m['calls_per_s']:8.1f} {m['wall_s']:7.1f} {m['cpu_s']:6.1f} "
            f"{m['cpu_ms_per_call']:11.2f} {ratio:14.3f} {cpu:10.3f}"
        )


if __name__ == "__main__":
    main()
