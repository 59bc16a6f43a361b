"""``python -m factory.bench simenv``: steps per second of the environment server.

Set-up: the development server (a thread of this process) answers the user, tool and
judge roles with C generation slots at a fixed latency L, or a heavy-tailed one
(``--latency lognormal``: ``--latency-ms`` the median, p99 ``--latency-p99-ratio`` x it,
like real models); the environment server runs
as its own process (``python -m factory.simenv serve``, as a trainer would reach it);
this process plays ``--episodes`` concurrent WebSocket episodes with a scripted policy
(each task's ground-truth actions, then a closing message), over and over for
``--duration`` seconds. The LLM's limit is C / L calls per second (L the mean latency
the devserver reports having served); the report gives steps/s, LLM calls/s and
``ratio_to_limit`` = LLM calls/s / (C / L): how close the server comes to keeping the
LLM saturated. No response cache, so every role answer is a real call.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["bench_simenv"]

_ROOT = Path(__file__).resolve().parents[2]


async def _episode_loop(url: str, tasks: list[Any], start: int, stop_at: float) -> tuple[int, int]:
    from factory.simenv.server import SimAction, SimClient

    steps = episodes = 0
    i = start
    async with SimClient(base_url=url, connect_timeout_s=300, message_timeout_s=600) as env:
        while time.monotonic() < stop_at:
            task = tasks[i % len(tasks)]
            i += 7
            r = await env.reset(task_id=task.task_id, seed=i)
            for a in task.actions:
                r = await env.step(SimAction(tool_name=a["name"], arguments=a["arguments"]))
                steps += 1
            while not r.done:
                r = await env.step(SimAction(content="Your request is complete."))
                steps += 1
            episodes += 1
    return steps, episodes


def _wait_health(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 300.0) -> None:
    import urllib.request

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the environment server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the environment server did not answer /health")


def bench_simenv(args: Any) -> dict[str, Any]:
    """Run the benchmark (see the module doc); returns the report."""
    from factory.devserver import DevServer, DevServerConfig
    from factory.simenv.tasks import load_tasks

    tasks = [t for t in load_tasks(args.tasks) if t.actions]
    heavy = args.latency == "lognormal"
    dev = DevServer(
        DevServerConfig(
            latency=args.latency,
            latency_ms=args.latency_ms,
            latency_p99_ratio=args.latency_p99_ratio if heavy else None,
            max_concurrency=args.concurrency,
            seed=1,
        )
    ).start()
    port = args.port
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "factory.simenv", "serve", "--domain", args.domain,
        "--mode", args.mode, "--tasks", str(args.tasks), "--db", str(args.db),
        "--base-url", dev.url, "--port", str(port),
        "--max-sessions", str(args.episodes + 8), "--concurrency", str(args.concurrency * 2),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    try:
        _wait_health(url, proc)
        before = dev.stats()

        async def run() -> list[tuple[int, int]]:
            stop_at = time.monotonic() + args.duration
            return await asyncio.gather(
                *(_episode_loop(url, tasks, i, stop_at) for i in range(args.episodes))
            )

        t0 = time.monotonic()
        results = asyncio.run(run())
        wall = time.monotonic() - t0
        after = dev.stats()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        dev.stop()
    steps = sum(s for s, _ in results)
    episodes = sum(e for _, e in results)
    calls = after["completed"] - before["completed"]
    latency = after["latency_mean_s"] or args.latency_ms / 1000
    limit = args.concurrency / latency
    return {
        "mode": args.mode,
        "latency": args.latency,
        "latency_p99_ratio": args.latency_p99_ratio if heavy else None,
        "episodes_in_flight": args.episodes,
        "wall_s": round(wall, 2),
        "episodes": episodes,
        "steps": steps,
        "steps_per_s": round(steps / wall, 2),
        "llm_calls": calls,
        "llm_calls_per_s": round(calls / wall, 2),
        "llm_limit_calls_per_s": round(limit, 2),
        "llm_max_in_flight": after["max_in_flight"],
        "latency_mean_s": latency,
        "ratio_to_limit": round(calls / wall / limit, 3),
        "steps_per_llm_call": round(steps / max(calls, 1), 2),
        "by_kind": {k: v - before["by_kind"].get(k, 0) for k, v in after["by_kind"].items()},
    }
