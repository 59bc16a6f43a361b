"""N environment servers as Ray actors behave as one environment (issue 12, point 5).

Two servers in Ray actors share one response cache folder and one budget actor:
every LLM call either makes is counted once in the shared budget, and an episode
replayed on the *other* server is answered from the cache the first one wrote,
with identical observations and reward and no new call. A fleet deriving its tasks
from seeds pays for each derivation once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from factory.errors import ConfigError
from factory.simenv.fleet import FleetSpec, start_env_servers
from factory.simenv.runtime import EnvSettings, Runtime
from tests.conftest import ROOT
from tests.helpers import episode_plan, play_remote

pytestmark = pytest.mark.shared

SERVERS = 2
EPISODES = 8


def test_env_servers_on_ray_share_the_cache_and_the_budget(
    ray_session: Any, devserver: Any, taubench_dir: Path, tmp_path: Path
) -> None:
    dev = devserver(seed=9, latency_ms=20)
    tasks = taubench_dir / "gpt-4o-airline.json"
    spec = FleetSpec(
        domain="airline",
        tasks=str(tasks),
        db=str(taubench_dir),
        base_url=dev.url,
        cache_dir=str(tmp_path / "cache"),
        settings={**EnvSettings(mode="hybrid").__dict__},
    )
    plan = episode_plan(Runtime.create("airline", tasks=tasks, db=taubench_dir))[:EPISODES]
    fleet = start_env_servers(SERVERS, spec, caps={"max_calls": 100_000})
    try:
        assert len(set(fleet.urls)) == SERVERS

        def play(shift: int) -> list[Any]:
            async def run_all() -> list[Any]:
                barrier = asyncio.Barrier(len(plan))
                return await asyncio.gather(
                    *(
                        play_remote(fleet.urls[(i + shift) % SERVERS], task, wrong, seed, barrier)
                        for i, (task, wrong, seed) in enumerate(plan)
                    )
                )

            return asyncio.run(run_all())

        first = play(0)
        for (task, wrong, _), (_seen, reward, done, _state) in zip(plan, first, strict=True):
            assert done and reward == (0.0 if wrong else 1.0), (task.task_id, wrong)
        spent = fleet.spend()
        completed = dev.stats()["completed"]
        # Both servers' role calls went through the one budget, each counted once.
        assert spent["calls"] == completed > 0
        assert spent["tokens"] > 0 and spent["refused"] == 0

        second = play(1)  # every episode on the other server: answered from the cache
        for one, two in zip(first, second, strict=True):
            assert one[:3] == two[:3]  # observations, reward, done
        assert dev.stats()["completed"] == completed
        assert fleet.spend()["calls"] == spent["calls"]
    finally:
        fleet.stop()
    writers = [p for p in (tmp_path / "cache").iterdir() if p.suffix == ".jsonl"]
    assert len(writers) >= SERVERS  # one segment file per server process


def test_a_fleet_derives_tasks_from_seeds_once(
    ray_session: Any, devserver: Any, tmp_path: Path
) -> None:
    seeds = str(ROOT / "seeds" / "retail" / "seeds.jsonl")
    spec = FleetSpec(domain="retail", seeds=seeds, settings={"mode": "llm"})
    with pytest.raises(ConfigError, match="shared cache_dir") as exc:
        start_env_servers(SERVERS, spec)
    assert exc.value.key_path == "cache_dir"

    dev = devserver(seed=3, latency_ms=4000)  # long enough for two servers to overlap
    spec = FleetSpec(domain="retail", seeds=seeds, base_url=dev.url,
                     cache_dir=str(tmp_path / "cache"), settings={"mode": "llm"})  # fmt: skip
    fleet = start_env_servers(SERVERS, spec)
    try:
        derived = len(
            [line for line in Path(seeds).read_text(encoding="utf-8").splitlines() if line]
        )
        # the first server paid for every derivation; the second read them from the cache
        assert fleet.spend()["calls"] == dev.stats()["completed"] == derived
    finally:
        fleet.stop()
