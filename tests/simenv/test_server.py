"""The OpenEnv server of the simulated environment: 64 concurrent isolated episodes, and
the ``serve`` command (retail from tau-bench's task file, and from seeds).

Half of the episodes follow their task's ground truth, the other half end on a wrong
final action, on the same tasks at the same time; each episode's observations and
reward must equal those of the same episode played alone in process. A shared world
(cross-talk) would change observations (a second booking on a shared world gets
another reservation id) and rewards.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from factory.core.trajectory import Trajectory
from factory.io.readers import read_seeds
from factory.simenv.runtime import EnvSettings, Runtime
from factory.simenv.server import ThreadedServer, build_app
from factory.simenv.spec import DomainSpec
from factory.simenv.tasks import Task, load_tasks
from tests.conftest import ROOT
from tests.helpers import EPISODES, episode_plan, play_remote, task_actions
from tests.helpers.served import Served, episode_steps

pytestmark = pytest.mark.shared

RETAIL_SEEDS = ROOT / "seeds" / "retail" / "seeds.jsonl"


async def _local(rt: Runtime, task: Task, wrong: bool, seed: int):
    env = rt.new_env()
    obs = await env.reset(task, seed=seed)
    seen = [(obs["role"], obs["content"], obs["task_id"])]
    for a in task_actions(task, wrong):
        r = await env.step(a)
        seen.append((r.observation["role"], r.observation["content"], r.observation.get("name")))
    if not r.done:
        r = await env.step({"content": "Everything is done."})
        seen.append((r.observation["role"], r.observation["content"], r.observation.get("name")))
    return seen, r.reward, r.done


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
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
    plan = episode_plan(served)
    with ThreadedServer(build_app(served)) as server:

        async def run_all() -> list[Any]:
            barrier = asyncio.Barrier(EPISODES)
            return await asyncio.gather(
                *(play_remote(server.url, t, w, s, barrier) for t, w, s in plan)
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


# --- the command a trainer's launcher runs: python -m factory.simenv serve ----------------------


@pytest.mark.slow
def test_serve_command_plays_retail_task_file_episodes_and_writes_rollouts_on_sigterm(
    retail_dir: Path, tmp_path: Path
) -> None:
    spec = DomainSpec.load(
        "retail", tasks=load_tasks(retail_dir / "replays-train.json"), db=retail_dir
    )
    writes = spec.pack.write_tools()

    def succeeds(task: Task) -> bool:
        world = spec.fork()
        assert world is not None
        return not any(
            world.execute(a["name"], a["arguments"]).startswith("Error") for a in task.actions
        )

    task = next(
        t for t in spec.tasks
        if t.actions and t.actions[-1]["name"] in writes and not t.outputs and succeeds(t)
    )  # fmt: skip
    out = tmp_path / "rollouts"
    served = Served(
        "--domain", "retail", "--mode", "executor", "--db", str(retail_dir),
        "--tasks", str(retail_dir / "replays-train.json"), "--rollouts", str(out),
    )  # fmt: skip
    try:
        right = asyncio.run(
            episode_steps(served.url, task.task_id, task_actions(task, wrong=False))
        )
        wrong = asyncio.run(episode_steps(served.url, task.task_id, task_actions(task, wrong=True)))
    finally:
        code = served.stop()
    assert code == 0, served.lines
    assert not [line for line in served.lines if "Traceback" in line], served.lines
    assert right[0].observation.task_id == task.task_id and right[0].observation.tools
    assert (right[-1].done, right[-1].reward, wrong[-1].done, wrong[-1].reward) == (
        True, 1.0, True, 0.0,
    )  # fmt: skip
    # the shards are finished by the shutdown SIGTERM starts: one row per episode
    rows = pq.read_table(out / "data").to_pylist()
    rewards = sorted(json.loads(r["meta"])["reward"] for r in rows)
    assert rewards == [0.0, 1.0]


@pytest.mark.slow
def test_serve_command_derives_tasks_from_seeds_and_simulates_their_tools(
    tmp_path: Path,
) -> None:
    seeds = [t for t in read_seeds(RETAIL_SEEDS) if isinstance(t, Trajectory)]
    writes = DomainSpec.pack_of("retail").write_tools()
    seed = next(t for t in seeds if any(c.name in writes for _, c in t.calls()))
    folder = tmp_path / "seeds"
    folder.mkdir()
    (folder / "retail.jsonl").write_text(RETAIL_SEEDS.read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "broken.jsonl").write_text("{not json\n", encoding="utf-8")
    served = Served(
        "--domain", "retail", "--mode", "llm", "--seeds", str(folder),
        "--cache", str(tmp_path / "cache"),
    )  # fmt: skip
    try:
        calls = [{"name": c.name, "arguments": c.arguments} for _, c in seed.calls()]
        steps = asyncio.run(episode_steps(served.url, f"seed-{seed.id}", calls))
    finally:
        code = served.stop()
    assert code == 0, served.lines
    assert not [line for line in served.lines if "Traceback" in line], served.lines
    said = "\n".join(served.lines)
    assert f"derived {len(seeds)} tasks from {folder}; 1 records rejected, 0 derivations" in said
    assert f"rejected {folder / 'broken.jsonl'}:0: " in said
    # the LLM tool simulator (the devserver's) answers each call as the seed recorded it
    recorded = [t.content for t in seed.turns if t.role == "tool"]
    observed = [s.observation.content for s in steps[1:] if s.observation.role == "tool"]
    assert observed == recorded
    end = steps[-1]
    assert end.done and end.reward == 1.0
    assert end.observation.info["rewards"]["source"] == "judge"
