"""``python -m factory.bench amplify | storm | postprocess``: throughput, memory, fault
tolerance and the cost of post-processing one row.

``storm`` runs the amplification job twice as a user would (``python -m factory.run``,
each with its own devserver): clean, then under issue 8's fault storm (429s, 5xx,
300 s stalls, malformed JSON) with the shipped recipe's timeout and attempts, and
prints the wall-time ratio; ``--timeout`` caps a run and reports how far it got.
``amplify --latency both`` runs a fixed and a heavy-tailed (lognormal, p99 = 10 x
median) server and reports each ratio to its own limit C / mean latency.

``amplify``: throughput and memory of the amplification job.

Starts the development server in its own process with latency L and
concurrency C, builds a seed set of the requested size from the recipe's own
seeds (variants made by the devserver's own renaming, so every seed is valid and
distinct), runs the real ``amplify`` pipeline to the target, and reports:

* achieved completions/s against the server's limit C/L, as a ratio;
* CPU seconds of the factory (driver, Ray processes and workers; the dev server
  excluded) per 1,000 accepted trajectories;
* peak RSS of the driver and of the largest worker, sampled every 0.5 s.

It is a benchmark, not a test: numbers depend on the machine. The limit C/L is
measured in the same run by the same server, so the ratio is comparable.

Modules: this one (the shared seeds and server helpers, ``amplify`` and ``storm``),
``postprocess`` (post-processing per row, old against new code), ``__main__`` (the
command line).

``--recipe`` names the amplification recipe (a path, or a name under ``pipelines/``
as for ``factory.run``). Without it the benchmark takes the one ``amplify`` recipe
shipped in ``pipelines/`` (today ``pipelines/airline.yaml``), so the engine names no
domain; once a second domain ships one, ``--recipe`` is required and the error
lists the candidates.
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

from factory.bench.postprocess import postprocess_completions
from factory.errors import ConfigError

__all__ = [
    "bench_amplify",
    "bench_storm",
    "default_recipe",
    "main",
    "make_seeds",
    "postprocess_completions",
    "recipe_seed_files",
]


def default_recipe(pipelines: Path | None = None) -> Path:
    """The ``amplify`` recipe the benchmarks time unless ``--recipe`` names one: the
    first, by file name, of those in ``pipelines/`` that call endpoints online for one
    domain. Not a batch API's (answers take hours), not one that starts its own servers
    (``llm.serve``: it cannot be pointed at the benchmark's development server), not a
    mixed recipe (``parts``). The report names the recipe it used.

    Raises:
        ConfigError: none is shipped (pass ``--recipe``).
    """
    from factory import packs
    from factory.llm.backends import get_backend
    from factory.recipe import AmplifyRecipe, load_recipe

    pipelines = pipelines or packs.folder("pipelines")

    def timed(path: Path) -> bool:
        cfg = load_recipe(path)
        if not isinstance(cfg, AmplifyRecipe):  # one domain, LLM calls
            return False
        return cfg.llm.serve is None and not get_backend(cfg.llm.backend).batched

    found = [path for path in sorted(pipelines.glob("*.yaml")) if timed(path)]
    if not found:
        raise ConfigError(
            f"pass --recipe: no online amplify recipe in {pipelines}", key_path="recipe"
        )
    return found[0]


def recipe_seed_files(recipe: Path) -> list[str]:
    """The seed files the recipe itself reads (``seeds.path``: a file, folder or glob).

    Raises:
        ConfigError: the recipe names no seed files (a Hugging Face dataset instead).
    """
    from factory.engine.pipeline import expand_seed_paths
    from factory.recipe import load_recipe

    cfg = load_recipe(recipe)
    seeds = cfg.seed_sections()
    if len(seeds) != 1 or seeds[0].path is None:
        raise ConfigError("the benchmark needs seed files (seeds.path)", key_path="seeds.path")
    return expand_seed_paths(seeds[0])


def make_seeds(n: int, out: Path, *, recipe: Path, seed: int = 0) -> Path:
    """Write ``n`` distinct valid seeds (the recipe's own ones plus renamed variants)."""
    from factory.core.formats import parse_record
    from factory.core.formats.completion import render_output
    from factory.devserver.simulate import amplify

    base = [
        json.loads(line)
        for path in recipe_seed_files(recipe)
        for line in Path(path).read_text().splitlines()
        if line.strip()
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


def _start_server(
    latency_ms: float, concurrency: int, *extra: str
) -> tuple[subprocess.Popen[str], str]:
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
            *extra,
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


def _server_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.rsplit("/v1", 1)[0] + "/stats", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def llm_phase_rate(request_log: Path) -> float:
    """Answers with status 200 per second of the LLM phase, read from the devserver's
    request log: first request received -> last answer sent."""
    rows = [json.loads(line) for line in request_log.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("received") is not None]
    if not rows:
        return 0.0
    span = max(r["time"] for r in rows) - min(r["received"] for r in rows)
    return sum(1 for r in rows if r["status"] == 200) / span if span > 0 else 0.0


def _latency_args(kind: str, p99_ratio: float) -> list[str]:
    """Devserver options of a latency distribution: ``fixed`` or ``lognormal`` (median =
    --latency-ms, p99 = ratio x median)."""
    if kind == "lognormal":
        return ["--latency", "lognormal", "--latency-p99-ratio", str(p99_ratio)]
    return ["--latency", "fixed"]


def bench_amplify(args: argparse.Namespace, latency: str = "fixed") -> dict[str, Any]:
    from factory.engine.runner import run
    from factory.recipe import load_recipe
    from factory.run import devserver_overrides

    load_recipe(args.recipe, args.overrides)  # a bad --set fails here, before any process
    work = Path(tempfile.mkdtemp(prefix="factory-bench-"))
    # The client keeps a few more requests open than the server serves at once, so the
    # server's queue, not a gap on the client side, decides when a slot is refilled
    # (as one would run against a vLLM server).
    client = args.client_concurrency or math.ceil(1.25 * args.concurrency)
    seeds = make_seeds(args.seeds, work / "seeds.jsonl", recipe=args.recipe)
    requests = work / "requests.jsonl"
    server, url = _start_server(
        args.latency_ms,
        args.concurrency,
        *_latency_args(latency, args.latency_p99_ratio),
        "--request-log",
        str(requests),
    )
    stats_url = url.rsplit("/v1", 1)[0] + "/stats"
    sampler = Sampler(exclude={server.pid}, stats_url=stats_url)
    try:
        cfg = load_recipe(
            args.recipe,
            [
                *args.overrides,
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
    # The limit: C slots, each busy for the mean latency the server really served in this
    # run (for a fixed latency that is L itself; for a heavy tail the sampled mean).
    mean_latency_s = server_stats.get("latency_mean_s") or args.latency_ms / 1000.0
    if latency == "fixed":
        mean_latency_s = args.latency_ms / 1000.0
    limit = args.concurrency / mean_latency_s
    accepted = result.totals["accepted"]
    return {
        "recipe": str(args.recipe),
        "seeds": args.seeds,
        "target": args.target,
        "accepted": accepted,
        "latency": latency,
        "latency_ms": args.latency_ms,
        "latency_p99_ratio": args.latency_p99_ratio if latency == "lognormal" else None,
        "served_mean_latency_ms": round(mean_latency_s * 1000, 1),
        "concurrency": args.concurrency,
        "client_concurrency": client,
        "calls": calls,
        "wall_s": round(wall, 1),
        "completions_per_s": round(calls / wall, 1),
        "limit_per_s": round(limit, 1),
        "ratio_to_limit": round(calls / wall / limit, 3),
        # The LLM phase alone (Ray start-up, the seed phase and the tail excluded).
        "amplify_ratio_to_limit": round(llm_phase_rate(requests) / limit, 3),
        "streaming_share": streaming_share(manifest),
        "cpu_s_per_1k": round(sampler.factory_cpu_s() / accepted * 1000, 2) if accepted else None,
        "peak_rss_driver_mb": round(sampler.peak_driver / 2**20),
        "peak_rss_worker_mb": round(sampler.peak_worker / 2**20),
        "server_max_in_flight": server_stats.get("max_in_flight"),
        "server_mean_open_when_busy": sampler.busy_in_flight(),
        "cpu_s_by_process": sampler.cpu_by_process(),
        "output": str(work / "out"),
    }


def amplify_seconds(manifest: dict[str, Any]) -> float:
    """Seconds of the amplification phase: from the first call to the last one used."""
    t = manifest.get("timings") or {}
    return float(t.get("calls_done", manifest["wall_time_s"])) - float(t.get("calls_started", 0))


def streaming_share(manifest: dict[str, Any]) -> float | None:
    """Over what share of the amplification phase accepted rows reached the driver: from
    the phase's start to the last time the accepted count grew, read off the manifest's
    timeline (issue 22: at least 0.7; rows held until a round ended gave ~0.1)."""
    t = manifest.get("timings") or {}
    start, end = t.get("calls_started"), t.get("calls_done")
    timeline = manifest.get("timeline") or {}
    cols = timeline.get("columns") or []
    if start is None or end is None or "accepted" not in cols or end <= start:
        return None
    sec, acc = cols.index("seconds"), cols.index("accepted")
    points = [(p[sec], p[acc]) for p in timeline.get("points") or [] if start <= p[sec] <= end + 1]
    grew = [s for (s, a), (_, before) in zip(points[1:], points[:-1], strict=False) if a > before]
    if not points:
        return None
    first = next((s for s, a in points if a > 0), None)
    if first is None or not grew:
        return None
    return round((max(grew) - start) / (end - start) - (first - start) / (end - start), 3)


STORM_DEFECTS = "rate_limit=0.2,server_error=0.05,stall=0.02,malformed_json=0.1"


def _kill_ray(tmpdir: str) -> None:
    """Stop the Ray a capped run started: its processes name its private temp dir (a
    killed driver does not take its Ray workers with it)."""
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(tmpdir in part for part in proc.info["cmdline"] or ()):
                proc.kill()
        except psutil.Error:
            continue


def _storm_run(
    args: argparse.Namespace, seeds: Path, work: Path, name: str, defects: str
) -> dict[str, Any]:
    """``_one_storm_run``, again (in a fresh folder) when Ray itself failed to start, which
    happens on a machine loaded far beyond its cores; the report says so."""
    report = _one_storm_run(args, seeds, work, name, defects)
    for retry in range(2):
        if "timed out during startup" not in report.get("stderr_tail", ""):
            break
        report = _one_storm_run(args, seeds, work, f"{name}-again{retry + 1}", defects)
        report["ray_start_retries"] = retry + 1
    return report


def _one_storm_run(
    args: argparse.Namespace, seeds: Path, work: Path, name: str, defects: str
) -> dict[str, Any]:
    """One amplification run as ``python -m factory.run`` against its own devserver, capped
    at ``--timeout`` seconds; the server's counters say how far a capped run got."""
    extra = ["--defects", defects] if defects else []
    if getattr(args, "request_log", None):
        Path(args.request_log).mkdir(parents=True, exist_ok=True)
        extra += ["--request-log", str(Path(args.request_log) / f"{name}.jsonl")]
    server, url = _start_server(args.latency_ms, args.concurrency, *extra)
    out = work / name
    tmpdir = tempfile.mkdtemp(prefix="rb", dir="/tmp")
    client = math.ceil(1.25 * args.concurrency)
    sets = [
        *[x for item in _devserver_sets(url) for x in ("--set", item)],
        *("--set", f"seeds.path={seeds}"),
        *("--set", f"amplify.target={args.target}"),
        *("--set", f"llm.concurrency={client}"),
        *("--set", f"llm.per_actor_concurrency={-(-client // args.actors)}"),
        *("--set", f"ray.actors={args.actors}"),
        *("--set", "amplify.max_cost_usd=null"),
    ]
    env = {**os.environ, "RAY_TMPDIR": tmpdir, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "factory.run", str(args.recipe), *sets,
         "--output", str(out), "--no-progress"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        try:
            _, err = proc.communicate(timeout=args.timeout)
            finished = True
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            finished = False
        wall = time.time() - started
        stats = _server_stats(url)
    finally:
        _kill_ray(tmpdir)
        server.terminate()
        server.wait(timeout=10)
    report: dict[str, Any] = {
        "finished": finished,
        "exit_code": proc.returncode if finished else None,
        "wall_s": round(wall, 1),
        "server_requests": stats["requests"],
        "server_completed": stats["completed"],
        "server_by_status": stats["by_status"],
        "server_by_defect": stats["by_defect"],
        "output": str(out),
    }
    manifest = out / "manifest.json"
    if finished and manifest.is_file():
        m = json.loads(manifest.read_text())
        report["calls"] = m["calls"]["issued"] + m["seeds"]["total"]
        report["totals"] = m["totals"]
        report["retries"] = m.get("retries")
        report["timings"] = m.get("timings")  # seeds phase and each round, in seconds
    elif finished:
        report["stderr_tail"] = err[-2000:]
    return report


def _devserver_sets(url: str) -> list[str]:
    from factory.run import devserver_overrides

    return devserver_overrides(url)


def bench_storm(args: argparse.Namespace) -> dict[str, Any]:
    """The fault storm of issue 8 beside a clean run of the same recipe: the shipped
    recipe's timeout (600 s) and attempts (6), the devserver's default 300 s stalls."""
    work = Path(tempfile.mkdtemp(prefix="factory-storm-"))
    seeds = make_seeds(args.seeds, work / "seeds.jsonl", recipe=args.recipe)
    clean = _storm_run(args, seeds, work, "clean", "")
    storm = _storm_run(args, seeds, work, "storm", args.defects)
    done = all(r["finished"] and r["exit_code"] == 0 for r in (clean, storm))
    ratio = storm["wall_s"] / clean["wall_s"] if done else None
    return {
        "recipe": str(args.recipe),
        "seeds": args.seeds,
        "target": args.target,
        "defects": args.defects,
        "timeout_s": args.timeout,
        "clean": clean,
        "storm": storm,
        "storm_to_clean_wall_ratio": round(ratio, 2) if ratio else None,
    }


# --- postprocess: parse + repair + validate + export per row, no Ray (issue 9) -------------


def main(argv: list[str] | None = None) -> int:
    """The command line (``python -m factory.bench``)."""
    from factory.bench.__main__ import main as cli

    return cli(argv)
