"""``python -m factory.bench amplify``: throughput and memory of the amplification job.

Starts the development server in its own process with latency L and
concurrency C, builds a seed set of the requested size from the shipped airline
seeds (variants made by the devserver's own renaming, so every seed is valid and
distinct), runs the real ``amplify`` pipeline to the target, and reports:

* achieved completions/s against the server's limit C/L, as a ratio;
* CPU seconds of the factory (driver, Ray processes and workers; the dev server
  excluded) per 1,000 accepted trajectories;
* peak RSS of the driver and of the largest worker, sampled every 0.5 s.

It is a benchmark, not a test: numbers depend on the machine. The limit C/L is
measured in the same run by the same server, so the ratio is comparable.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

__all__ = ["main", "make_seeds"]

ROOT = Path(__file__).resolve().parents[1]


def make_seeds(n: int, out: Path, *, seed: int = 0) -> Path:
    """Write ``n`` distinct valid seeds (the shipped ones plus renamed variants)."""
    from factory.devserver.simulate import amplify
    from factory.formats import parse_record
    from factory.formats.completion import render_output

    base = [
        json.loads(line) for line in (ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()
    ]
    rng = random.Random(seed)
    with out.open("w") as fh:
        for i in range(n):
            record = base[i % len(base)]
            if i >= len(base):
                traj = parse_record(record, source=f"bench:{i}")
                variant = amplify(render_output(traj), rng)
                record = {
                    "messages": variant["messages"],
                    "tools": record["tools"],
                    "system": record["system"],
                }
            fh.write(json.dumps(record) + "\n")
    return out


class Sampler(threading.Thread):
    """Peak RSS of the driver and of its largest descendant, and the tree's CPU time."""

    def __init__(self, exclude: set[int], stats_url: str):
        super().__init__(daemon=True)
        self.stats_url = stats_url
        self.in_flight: list[int] = []
        self.me = psutil.Process()
        self.exclude = exclude
        self.peak_driver = 0
        self.peak_worker = 0
        self.cpu: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.stop_flag = threading.Event()

    def sample(self) -> None:
        self.peak_driver = max(self.peak_driver, self.me.memory_info().rss)
        for proc in self.me.children(recursive=True):
            if proc.pid in self.exclude:
                continue
            try:
                self.peak_worker = max(self.peak_worker, proc.memory_info().rss)
                t = proc.cpu_times()
                self.cpu[proc.pid] = t.user + t.system
                if proc.pid not in self.names:
                    self.names[proc.pid] = " ".join(proc.cmdline())[:60] or proc.name()
            except psutil.Error:
                continue

    def run(self) -> None:
        while not self.stop_flag.wait(0.5):
            self.sample()
            try:
                with urllib.request.urlopen(self.stats_url, timeout=2) as resp:
                    stats = json.loads(resp.read())
                self.in_flight.append(int(stats["open"]))
            except (OSError, ValueError, KeyError):
                continue

    def busy_in_flight(self) -> float | None:
        """Mean open requests at the server over the samples where any was open."""
        busy = [n for n in self.in_flight if n > 0]
        return round(sum(busy) / len(busy), 1) if busy else None

    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds per process title (Ray names its workers after the operator)."""
        out: dict[str, float] = {"driver": round(sum(self.me.cpu_times()[:2]), 1)}
        for pid, cpu in self.cpu.items():
            name = self.names.get(pid, str(pid))
            out[name] = round(out.get(name, 0.0) + cpu, 1)
        return dict(sorted(out.items(), key=lambda kv: -kv[1])[:8])

    def factory_cpu_s(self) -> float:
        t = self.me.cpu_times()
        return t.user + t.system + sum(self.cpu.values())


def _start_server(latency_ms: float, concurrency: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "factory.devserver",
            "--port",
            "0",
            "--latency-ms",
            str(latency_ms),
            "--max-concurrency",
            str(concurrency),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"devserver did not start: {line!r}")
    return proc, line.strip().rsplit(" ", 1)[-1]


def bench_amplify(args: argparse.Namespace) -> dict[str, Any]:
    from factory.config import load_recipe
    from factory.run import devserver_overrides
    from factory.runner import run

    work = Path(tempfile.mkdtemp(prefix="factory-bench-"))
    # The client keeps a few more requests open than the server serves at once, so the
    # server's queue, not a gap on the client side, decides when a slot is refilled
    # (as one would run against a vLLM server).
    client = args.client_concurrency or math.ceil(1.25 * args.concurrency)
    seeds = make_seeds(args.seeds, work / "seeds.jsonl")
    server, url = _start_server(args.latency_ms, args.concurrency)
    stats_url = url.rsplit("/v1", 1)[0] + "/stats"
    sampler = Sampler(exclude={server.pid}, stats_url=stats_url)
    try:
        cfg = load_recipe(
            ROOT / "pipelines/airline.yaml",
            [
                *devserver_overrides(url),
                f"seeds.path={seeds}",
                f"amplify.target={args.target}",
                f"llm.concurrency={client}",
                f"llm.per_actor_concurrency={-(-client // args.actors)}",
                f"ray.actors={args.actors}",
                f"ray.batch_size={args.batch_size}",
                "amplify.max_cost_usd=null",
                f"output.dir={work / 'out'}",
            ],
        )
        sampler.start()
        started = time.time()
        result = run(cfg, work / "out", progress=not args.quiet)
        wall = time.time() - started
        sampler.sample()
        with urllib.request.urlopen(stats_url, timeout=5) as resp:
            server_stats = json.loads(resp.read())
    finally:
        sampler.stop_flag.set()
        server.terminate()
        server.wait(timeout=10)
    manifest = result.manifest
    calls = manifest["calls"]["issued"] + manifest["seeds"]["total"]
    # Time spent issuing calls: the whole run minus Ray start-up and the seed phase's reading.
    limit = args.concurrency / (args.latency_ms / 1000.0)
    accepted = result.totals["accepted"]
    return {
        "seeds": args.seeds,
        "target": args.target,
        "accepted": accepted,
        "latency_ms": args.latency_ms,
        "concurrency": args.concurrency,
        "client_concurrency": client,
        "calls": calls,
        "wall_s": round(wall, 1),
        "completions_per_s": round(calls / wall, 1),
        "limit_per_s": round(limit, 1),
        "ratio_to_limit": round(calls / wall / limit, 3),
        # The amplification rounds alone (Ray start-up and the seed phase excluded).
        "amplify_ratio_to_limit": round(
            manifest["calls"]["issued"]
            / sum(r["seconds"] for r in manifest["timings"]["rounds"])
            / limit,
            3,
        ),
        "cpu_s_per_1k": round(sampler.factory_cpu_s() / accepted * 1000, 2) if accepted else None,
        "peak_rss_driver_mb": round(sampler.peak_driver / 2**20),
        "peak_rss_worker_mb": round(sampler.peak_worker / 2**20),
        "server_max_in_flight": server_stats.get("max_in_flight"),
        "server_mean_open_when_busy": sampler.busy_in_flight(),
        "cpu_s_by_process": sampler.cpu_by_process(),
        "output": str(work / "out"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m factory.bench")
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("amplify", help="seeds -> devserver -> accepted trajectories")
    a.add_argument("--seeds", type=int, default=1500)
    a.add_argument("--target", type=int, default=90000)
    a.add_argument("--latency-ms", type=float, default=200.0)
    a.add_argument("--concurrency", type=int, default=64)
    a.add_argument(
        "--client-concurrency",
        type=int,
        default=None,
        help="requests the factory keeps open (default 1.25 x --concurrency)",
    )
    a.add_argument("--actors", type=int, default=2)
    a.add_argument("--batch-size", type=int, default=16)
    a.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    report = bench_amplify(args)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
