"""The OpenEnv server of the simulated environment: 64 concurrent isolated episodes.

Half of the episodes follow their task's ground truth, the other half end on a wrong
final action, on the same tasks at the same time; each episode's observations and
reward must equal those of the same episode played alone in process. A shared world
(cross-talk) would change observations (a second booking on a shared world gets
another reservation id) and rewards.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from factory.simenv.runtime import EnvSettings, Runtime
from factory.simenv.server import SimAction, SimClient, ThreadedServer, build_app
from factory.simenv.tasks import Task

pytestmark = pytest.mark.shared

EPISODES = 64


def _actions(task: Task, wrong: bool) -> list[dict[str, Any]]:
    actions = [
        {"name": a["name"], "arguments": copy.deepcopy(a["arguments"])} for a in task.actions
    ]
    if wrong:
        args = actions[-1]["arguments"]
        key = next(k for k, v in args.items() if isinstance(v, str))
        args[key] = args[key] + "_x"  # a different (failing or other) final call
    return actions


def _plan(rt: Runtime) -> list[tuple[Task, bool, int]]:
    writes = rt.spec.pack.write_tools()
    # tasks whose ground truth ends on a write and asks for no output: following it earns 1
    tasks = [t for t in rt.spec.tasks if t.actions and t.actions[-1]["name"] in writes]
    tasks = [t for t in tasks if not t.outputs][:8]
    return [(tasks[i % len(tasks)], i % 2 == 1, i) for i in range(EPISODES)]


async def _remote(url: str, task: Task, wrong: bool, seed: int, barrier: asyncio.Barrier):
    seen = []
    async with SimClient(base_url=url, connect_timeout_s=300, message_timeout_s=300) as env:
        r = await env.reset(task_id=task.task_id, seed=seed)
        seen.append((r.observation.role, r.observation.content, r.observation.task_id))
        await barrier.wait()  # every session is open at once before any step
        for a in _actions(task, wrong):
            r = await env.step(SimAction(tool_name=a["name"], arguments=a["arguments"]))
            seen.append((r.observation.role, r.observation.content, r.observation.name))
        if not r.done:
            r = await env.step(SimAction(content="Everything is done."))
            seen.append((r.observation.role, r.observation.content, r.observation.name))
        state = await env.state()
    return seen, r.reward, r.done, state


async def _local(rt: Runtime, task: Task, wrong: bool, seed: int):
    env = rt.new_env()
    obs = await env.reset(task, seed=seed)
    seen = [(obs["role"], obs["content"], obs["task_id"])]
    for a in _actions(task, wrong):
        r = await env.step(a)
        seen.append((r.observation["role"], r.observation["content"], r.observation.get("name")))
    if not r.done:
        r = await env.step({"content": "Everything is done."})
        seen.append((r.observation["role"], r.observation["content"], r.observation.get("name")))
    return seen, r.reward, r.done


def test_64_concurrent_episodes_through_openenv_are_isolated(
    devserver, taubench_dir: Path, tmp_path: Path
) -> None:
    dev = devserver(seed=9, latency_ms=20)

    def runtime() -> Runtime:
        return Runtime.create(
            "airline", tasks=taubench_dir / "gpt-4o-airline.json", db=taubench_dir,
            base_url=dev.url, cache_dir=tmp_path / "cache", settings=EnvSettings(mode="hybrid"),
        )  # fmt: skip

    served = runtime()
    plan = _plan(served)
    with ThreadedServer(build_app(served)) as server:

        async def run_all() -> list[Any]:
            barrier = asyncio.Barrier(EPISODES)
            return await asyncio.gather(
                *(_remote(server.url, t, w, s, barrier) for t, w, s in plan)
            )

        remote = asyncio.run(run_all())

    local_rt = runtime()

    async def run_local() -> list[Any]:
        out = [await _local(local_rt, t, w, s) for t, w, s in plan]
        await local_rt.aclose()
        return out

    local = asyncio.run(run_local())
    ids = set()
    for (task, wrong, _), (seen, reward, done, state), (l_seen, l_reward, _) in zip(
        plan, remote, local, strict=True
    ):
        assert done and seen == l_seen, f"task {task.task_id} wrong={wrong}: cross-talk"
        assert reward == l_reward == (0.0 if wrong else 1.0), (task.task_id, wrong)
        assert state.task_id == task.task_id and state.step_count == len(seen) - 1
        ids.add(state.episode_id)
    assert len(ids) == EPISODES
