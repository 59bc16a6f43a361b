"""The simulated environment (issue 12): modes, validation, rewards, replay from the cache.

Episodes run tau-bench airline tasks on the tau-bench database; the user, the LLM tool
simulator and the judge are the development server's (``factory.devserver.roles``).
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from factory.devserver import roles as dev_roles
from factory.envsim import roles
from factory.errors import ConfigError, LLMError, RepairError
from factory.simenv.env import check_consistency
from factory.simenv.gym import GymEnv
from factory.simenv.runtime import EnvSettings, Runtime
from factory.simenv.spec import DomainSpec
from factory.simenv.tasks import Task, derive_task, load_tasks
from tests.conftest import ROOT

pytestmark = pytest.mark.shared

RETAIL_SEEDS = ROOT / "seeds" / "retail" / "seeds.jsonl"


@pytest.fixture()
def runtime_for(taubench_dir: Path, devserver, tmp_path: Path):
    made: list[Runtime] = []

    def make(mode: str = "executor", *, url: str | None = "dev", **settings: Any) -> Runtime:
        base_url = devserver(seed=5).url if url == "dev" else url
        rt = Runtime.create(
            "airline",
            tasks=taubench_dir / "gpt-4o-airline.json",
            db=taubench_dir,
            base_url=base_url,
            cache_dir=tmp_path / "cache",
            settings=EnvSettings(mode=mode, **settings),
        )
        made.append(rt)
        return rt

    return make


def _write_task(rt: Runtime) -> Task:
    """The first task whose ground truth writes something (book/cancel/update)."""
    return next(t for t in rt.spec.tasks if t.actions and t.actions[-1]["name"] != "think")


async def _play(rt: Runtime, task: Task, actions: list[dict[str, Any]], seed: int = 0):
    env = rt.new_env()
    observations = [await env.reset(task, seed=seed)]
    result = None
    for action in actions:
        result = await env.step(action)
        observations.append(result.observation)
    if result is None or not result.done:
        result = await env.step({"content": "All done. Your request is complete."})
        observations.append(result.observation)
    await rt.aclose()
    return env, observations, result


def _gt(task: Task) -> list[dict[str, Any]]:
    return [{"name": a["name"], "arguments": a["arguments"]} for a in task.actions]


def test_ground_truth_policy_gets_reward_1_from_executor_and_judge(runtime_for) -> None:
    rt = runtime_for("executor")
    task = _write_task(rt)
    env, _, result = asyncio.run(_play(rt, task, _gt(task)))
    assert result.done
    rewards = result.info["rewards"]
    assert rewards["executor"]["reward"] == 1.0
    assert rewards["judge"]["reward"] == 1.0
    assert rewards["source"] == "executor" and result.reward == 1.0
    assert env.counts["invalid_calls"] == 0


def test_wrong_final_action_gets_reward_0_from_both(runtime_for) -> None:
    rt = runtime_for("executor")
    task = next(
        t for t in rt.spec.tasks if t.actions and t.actions[-1]["name"] == "book_reservation"
    )
    actions = _gt(task)
    last = copy.deepcopy(actions[-1])
    last["arguments"]["cabin"] = (
        "business" if last["arguments"]["cabin"] != "business" else "economy"
    )
    _, _, result = asyncio.run(_play(rt, task, [*actions[:-1], last]))
    rewards = result.info["rewards"]
    assert rewards["executor"]["reward"] == 0.0, rewards
    assert rewards["judge"]["reward"] == 0.0, rewards
    assert any("book_reservation" in r for r in rewards["judge"]["reasons"])
    assert result.reward == 0.0


def test_invalid_tool_call_gets_an_informative_error_and_the_episode_continues(runtime_for) -> None:
    rt = runtime_for("executor")
    task = _write_task(rt)

    async def run() -> tuple[Any, Any]:
        env = rt.new_env()
        await env.reset(task)
        bad = await env.step({"name": task.actions[0]["name"], "arguments": {"user_id": 7}})
        unknown = await env.step({"name": "teleport", "arguments": "{}"})
        broken = await env.step({"name": task.actions[0]["name"], "arguments": "{not json"})
        steps = [bad, unknown, broken]
        for action in _gt(task):
            steps.append(await env.step(action))
        steps.append(await env.step({"content": "Done."}))
        await rt.aclose()
        return env, steps

    env, steps = asyncio.run(run())
    bad, unknown, broken = steps[:3]
    for r in (bad, unknown, broken):
        assert not r.done and r.observation["content"].startswith("Error: invalid tool call")
    assert "user_id" in bad.observation["content"] and "wrong_type" in bad.observation["content"]
    assert "missing_argument" in bad.observation["content"]
    assert (
        "unknown_tool" in unknown.observation["content"]
        and "teleport" in unknown.observation["content"]
    )
    assert "not a JSON object" in broken.observation["content"]
    assert env.counts["invalid_calls"] == 3
    assert steps[-1].done and steps[-1].reward == 1.0  # invalid calls never touched the world


def test_replay_from_the_cache_gives_identical_observations_and_reward(
    runtime_for, taubench_dir: Path, tmp_path: Path
) -> None:
    rt = runtime_for("hybrid", simulate_tools=frozenset({"get_user_details"}))
    task = _write_task(rt)
    actions = [{"name": "get_user_details", "arguments": {"user_id": task.user_id}}, *_gt(task)]
    _, first, r1 = asyncio.run(_play(rt, task, actions, seed=11))
    # No LLM at all now: every answer must come from the cache.
    replay = Runtime.create(
        "airline", tasks=taubench_dir / "gpt-4o-airline.json", db=taubench_dir,
        cache_dir=tmp_path / "cache",
        settings=EnvSettings(mode="hybrid", simulate_tools=frozenset({"get_user_details"})),
    )  # fmt: skip
    env2, second, r2 = asyncio.run(_play(replay, task, actions, seed=11))
    for episode in (first, second):  # the episode id is fresh per reset (uuid), not content
        episode[0].pop("episode_id")
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert (r1.reward, r1.info["rewards"]) == (r2.reward, r2.info["rewards"])
    assert env2.llm is not None and env2.llm.stats.calls == 0 and env2.llm.stats.cache_hits > 0
    # A different seed is a different episode: a replay-only runtime cannot answer it.
    with pytest.raises(LLMError, match="not in the cache"):
        asyncio.run(_play(replay, task, actions, seed=12))


def test_hybrid_simulates_with_the_llm_and_checks_against_the_state(runtime_for) -> None:
    rt = runtime_for("hybrid", simulate_tools=frozenset({"get_user_details"}))
    task = _write_task(rt)

    async def run() -> Any:
        env = rt.new_env()
        await env.reset(task)
        r = await env.step({"name": "get_user_details", "arguments": {"user_id": task.user_id}})
        await rt.aclose()
        return env, r

    env, r = asyncio.run(run())
    assert r.info["answered_by"] == "llm"
    assert r.info["consistency"]["ok"] and r.info["consistency"]["checked"] >= 1
    assert json.loads(r.observation["content"])["reservations"]
    assert env.counts["simulated_calls"] == 1
    state = {"users": {"u1": {}}, "reservations": {"R1": {}}}
    assert check_consistency('{"user_id": "u1", "reservations": ["R1"]}', state)["ok"]
    bad = check_consistency('{"user_id": "u2", "x": {"reservation_id": "R9"}}', state)
    assert not bad["ok"] and bad["unknown"] == ["users/u2", "reservations/R9"]
    assert check_consistency("Error: no such user", state)["checked"] == 0


def test_consistency_compares_what_a_read_says_about_a_row_with_the_row() -> None:
    row = {"reservation_id": "R1", "cabin": "economy", "status": None, "flights": [{"n": 1}]}
    state = {"users": {"u1": {"name": "Ann"}}, "reservations": {"R1": row}}
    same = '{"reservation_id": "R1", "user_id": "u1", "cabin": "economy", "flights": [{"n": 1}]}'
    check = check_consistency(same, state)
    assert check["ok"] and check["compared"] == 3 and check["mismatched"] == []
    drift = '{"x": [{"reservation_id": "R1", "cabin": "business", "flights": [{"n": 2}]}]}'
    check = check_consistency(drift, state)
    assert not check["ok"] and check["unknown"] == []
    assert sorted(check["mismatched"]) == ["reservations/R1.cabin", "reservations/R1.flights"]
    # a simulated write describes a change the world never made: ids only
    assert check_consistency(drift, state, values=False)["ok"]
    # a row that does not carry its own id (users here) is not compared: the object
    # naming it is about something else (a reservation's owner)
    assert check_consistency('{"user_id": "u1", "name": "Bob"}', state)["compared"] == 0


def test_hybrid_catches_a_simulated_read_that_misses_a_write(runtime_for) -> None:
    rt = runtime_for("hybrid", simulate_tools=frozenset({"get_reservation_details"}))

    def read_then_written(task: Task) -> str | None:
        """A reservation the reference reads before the task's ground truth writes it."""
        read = {
            c["arguments"].get("reservation_id")
            for m in task.reference
            for c in m.get("tool_calls", ())
            if c["name"] == "get_reservation_details" and isinstance(c["arguments"], dict)
        }
        written = [a["arguments"].get("reservation_id") for a in task.actions]
        return next((r for r in written if r in read), None)

    task = next(t for t in rt.spec.tasks if read_then_written(t) and t.actions)
    rid = read_then_written(task)
    write = next(a for a in task.actions if a["arguments"].get("reservation_id") == rid)
    look = {"name": "get_reservation_details", "arguments": {"reservation_id": rid}}

    async def run() -> Any:
        env = rt.new_env()
        await env.reset(task)
        before = await env.step(look)
        wrote = await env.step(write)
        after = await env.step(look)
        await rt.aclose()
        return env, before, wrote, after

    env, before, wrote, after = asyncio.run(run())
    assert before.info["answered_by"] == after.info["answered_by"] == "llm"
    assert wrote.info["answered_by"] == "executor"
    assert before.info["consistency"]["ok"] and before.info["consistency"]["compared"] > 3
    # the simulator repeats the reference's answer, which predates the write
    assert not after.info["consistency"]["ok"]
    assert any(
        m.startswith(f"reservations/{rid}.") for m in after.info["consistency"]["mismatched"]
    )
    assert env.counts["inconsistent_simulations"] == 1


def test_llm_mode_has_no_world_and_rewards_by_the_judge(runtime_for) -> None:
    rt = runtime_for("llm")
    task = _write_task(rt)
    env, obs, result = asyncio.run(_play(rt, task, _gt(task)))
    assert env.world is None and "executor" not in result.info["rewards"]
    assert result.info["rewards"]["source"] == "judge"
    assert result.reward == 1.0  # the devserver's tool answers come from the reference
    assert all(o["content"] for o in obs if o["role"] == "tool")


def test_modes_needing_a_world_refuse_without_one(taubench_dir: Path) -> None:
    spec = DomainSpec.load("airline", tasks=load_tasks(taubench_dir / "gpt-4o-airline.json"))
    with pytest.raises(ConfigError, match="--mode llm"):
        Runtime(spec, settings=EnvSettings(mode="executor")).new_env()


def test_gym_style_class(runtime_for) -> None:
    rt = runtime_for("executor")
    task = _write_task(rt)
    env = GymEnv(rt)
    try:
        obs, info = env.reset(seed=1, options={"task": task.task_id})
        assert info["task_id"] == task.task_id and obs["tools"] and obs["content"]
        for action in _gt(task):
            obs, reward, terminated, truncated, info = env.step(action)
            assert not terminated and reward == 0.0
        obs, reward, terminated, truncated, info = env.step({"content": "Done."})
        assert terminated and not truncated and reward == 1.0
    finally:
        env.close()


def test_tasks_from_the_taubench_file(taubench_dir: Path) -> None:
    tasks = load_tasks(taubench_dir / "gpt-4o-airline.json")
    assert len(tasks) == len({t.task_id for t in tasks}) >= 50
    t = tasks[0]
    assert t.instruction and t.user_id and all(set(a) == {"name", "arguments"} for a in t.actions)
    assert t.reference and all(
        "function" not in c for m in t.reference for c in m.get("tool_calls", ())
    )


def test_derive_task_from_a_seed_is_cached(devserver, taubench_dir: Path, tmp_path: Path) -> None:
    from factory.core.trajectory import ToolCall, Trajectory, Turn

    cancel = ToolCall("cancel_reservation", {"reservation_id": "ABC123"})
    seed = Trajectory(turns=[
        Turn("user", "Please cancel reservation ABC123, I am u_1."),
        Turn("assistant", "", tool_calls=[cancel]),
        Turn("tool", '{"status": "cancelled"}', name="cancel_reservation"),
        Turn("assistant", "Cancelled."),
    ])  # fmt: skip
    server = devserver(seed=2)
    rt = Runtime.create("airline", tasks=taubench_dir / "gpt-4o-airline.json",
                        base_url=server.url, cache_dir=tmp_path / "c")  # fmt: skip

    async def run() -> tuple[Task, Task, Any]:
        llm = rt.role_llm()
        a = await derive_task(seed, llm, write_tools={"cancel_reservation"})
        b = await derive_task(seed, llm, write_tools={"cancel_reservation"})
        stats = llm.stats
        await rt.aclose()
        return a, b, stats

    a, b, stats = asyncio.run(run())
    assert a == b and "cancel reservation ABC123" in a.instruction
    assert a.actions == ({"name": "cancel_reservation", "arguments": {"reservation_id": "ABC123"}},)
    assert "cancel_reservation" in a.expected_outcome
    assert (stats.calls, stats.cache_hits) == (1, 1)


def test_tasks_from_seed_files_account_for_every_record_and_replay_from_the_cache(
    devserver, tmp_path: Path
) -> None:
    folder = tmp_path / "seeds"
    folder.mkdir()
    (folder / "a.jsonl").write_text(RETAIL_SEEDS.read_text(encoding="utf-8"), encoding="utf-8")
    first = RETAIL_SEEDS.read_text(encoding="utf-8").splitlines()[0]
    bad = f'{{"conversations": "not a list"}}\n{{oops\n{first}\n'
    (folder / "b.jsonl").write_text(bad, encoding="utf-8")
    good = sum(1 for line in RETAIL_SEEDS.read_text(encoding="utf-8").splitlines() if line)
    cache = tmp_path / "cache"
    rt = Runtime.create("retail", seeds=folder, base_url=devserver(seed=4).url, cache_dir=cache)
    derived = rt.derived
    assert derived is not None and not derived.failed
    assert len(derived.tasks) == len(rt.spec.tasks) == good
    assert sorted(where for where, _ in derived.rejected) == [
        f"{folder / 'b.jsonl'}:{i}" for i in (0, 1, 2)
    ]
    assert all(why for _, why in derived.rejected)
    assert (
        dict(derived.rejected)[f"{folder / 'b.jsonl'}:2"] == f"duplicate of {folder / 'a.jsonl'}:0"
    )
    assert {t.origin for t in derived.tasks} == {"seed"}
    writes = rt.spec.pack.write_tools()
    assert any(t.actions for t in derived.tasks)
    assert all(a["name"] in writes for t in derived.tasks for a in t.actions)
    # no endpoint at all: every derivation is answered by the cache, identically
    again = Runtime.create("retail", seeds=folder, cache_dir=cache)
    assert again.derived is not None and again.derived.tasks == derived.tasks

    with pytest.raises(ConfigError, match="needs an LLM") as exc:
        Runtime.create("retail", seeds=folder)
    assert exc.value.key_path == "seeds"
    with pytest.raises(ConfigError, match="exactly one of"):
        Runtime.create("retail", seeds=folder, tasks=folder / "a.jsonl", cache_dir=cache)
    with pytest.raises(ConfigError, match="exactly one of"):
        Runtime.create("retail", cache_dir=cache)


def test_a_seed_task_whose_calls_fail_on_the_served_world_is_rewarded_by_the_judge(
    devserver, retail_dir: Path, tmp_path: Path
) -> None:
    url = devserver(seed=4).url
    rt = Runtime.create(
        "retail", seeds=RETAIL_SEEDS, db=retail_dir, base_url=url,
        cache_dir=tmp_path / "c", settings=EnvSettings(mode="executor"),
    )  # fmt: skip
    task = next(t for t in rt.spec.tasks if t.actions)
    assert rt.spec.expected_state(task) is None  # the seed's order is not in tau-bench's store
    _, observations, result = asyncio.run(_play(rt, task, _gt(task)))
    assert any(str(o.get("content", "")).startswith("Error") for o in observations[1:])
    rewards = result.info["rewards"]
    assert "executor" not in rewards and rewards["source"] == "judge"
    assert result.reward == rewards["judge"]["reward"] == 0.0
    # a task file's ground truth is replayed as tau-bench does, a failing action included
    files = Runtime.create("retail", tasks=retail_dir / "replays-train.json", db=retail_dir)
    assert files.spec.expected_state(files.spec.task("train-24", 0)) is not None


def test_devserver_roles_are_recognised_and_deterministic() -> None:
    import random

    msgs = roles.user_messages("You are u_1. You want a refund.", [])
    assert dev_roles.kind_of(msgs) == "rl_user"
    assert dev_roles.answer("rl_user", msgs, random.Random(0)).startswith("Hi! I am u_1")
    later = roles.user_messages("x", [{"role": "agent", "content": "Shall I proceed?"}])
    assert dev_roles.answer("rl_user", later, random.Random(1)) == dev_roles.answer(
        "rl_user", later, random.Random(1)
    )
    end = roles.user_messages("x", [{"role": "agent", "content": "It is done."}])
    assert roles.parse_user_answer(dev_roles.answer("rl_user", end, random.Random(0)))[1]
    said = [{"role": "assistant", "content": "It costs 3,27"}]
    judge = roles.judge_messages(
        instruction="x", expected_actions=[], outputs=["327"], expected_outcome="", episode=said
    )
    assert roles.parse_judgement(dev_roles.answer("rl_judge", judge, random.Random(0)))[0] == 1.0
    assert dev_roles.kind_of([{"role": "user", "content": "hello"}]) is None


@pytest.mark.slow
def test_rollouts_are_sharegpt_rows_llamafactory_reads(runtime_for, tmp_path: Path) -> None:
    import datasets

    from factory.simenv.rollout import RolloutWriter
    from tests.helpers import lfcompat
    from tests.helpers.lfcompat import check_rows, converted

    rt = runtime_for("executor")
    task = _write_task(rt)
    bad = {"name": task.actions[0]["name"], "arguments": {"user_id": 7}}
    env, _, result = asyncio.run(_play(rt, task, [bad, *_gt(task)]))
    out = tmp_path / "rollouts"
    writer = RolloutWriter(out)
    assert writer.add(env)
    writer.close()
    ds = datasets.load_dataset("parquet", data_dir=str(out / "data"), split="train")
    row = ds[0]
    meta = json.loads(row["meta"])
    assert meta["reward"] == result.reward == 1.0 and meta["task_id"] == task.task_id
    labels = meta["labels"]
    assert labels["reward_executor"] == labels["reward_judge"] == 1.0
    assert labels["invalid_calls"] == 1 and labels["trimmed_turns"] == 1
    assert row["conversations"][-1]["from"] == "gpt"
    assert [c["from"] for c in row["conversations"]].count("function_call") == len(task.actions) + 1
    lf = lfcompat.load()
    lfcompat.LOGGER.warnings.clear()
    n, rows = converted(lf, out)
    assert n == 1
    check_rows(lf, rows)
    assert lfcompat.LOGGER.warnings == []


def test_serve_refuses_a_mode_without_a_world(taubench_dir: Path, capsys) -> None:
    from factory.simenv.__main__ import main

    code = main(["serve", "--domain", "airline", "--mode", "executor",
                 "--tasks", str(taubench_dir / "gpt-4o-airline.json")])  # fmt: skip
    assert code == 2
    assert "--mode llm" in capsys.readouterr().err


def test_serve_exits_2_when_no_seed_gives_a_task(tmp_path: Path, capsys) -> None:
    from factory.simenv.__main__ import main

    bad = tmp_path / "seeds.jsonl"
    bad.write_text('{"conversations": "not a list"}\n', encoding="utf-8")
    # no trajectory, so nothing is asked: the endpoint is never dialled
    code = main(["serve", "--domain", "retail", "--mode", "llm", "--seeds", str(bad),
                 "--base-url", "http://127.0.0.1:9/v1"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no seed of" in err and f"{bad}:0" in err


def test_role_llm_stores_before_parsing_and_obeys_the_budget(tmp_path: Path) -> None:
    from factory.engine.budget import BudgetState
    from factory.errors import BudgetExceeded
    from factory.io.cache import ResponseCache
    from factory.llm.backends import OnlineBackend
    from factory.llm.types import Completion, Usage
    from factory.simenv.llm import RoleLLM

    class Fake(OnlineBackend):
        model = "m"
        sent = 0

        async def complete(self, request: Any) -> Completion:
            Fake.sent += 1
            usage = Usage(input=6, output=4)
            return Completion("not json at all", None, usage, 0.5, "fake", 1, 0.0, "m", None)

    budget = BudgetState(max_calls=1)
    cache = ResponseCache(str(tmp_path / "c"))
    llm = RoleLLM(Fake(), model="m", cache=cache, budget=budget)
    judge = roles.judge_messages(
        instruction="x", expected_actions=[], outputs=[], expected_outcome="", episode=[]
    )

    async def run() -> None:
        text = await llm.complete("judge", judge, seed=1)
        with pytest.raises(RepairError):
            roles.parse_judgement(text)  # unparsable, yet paid for and stored
        assert await llm.complete("judge", judge, seed=1) == text  # from the cache
        with pytest.raises(BudgetExceeded):
            await llm.complete("judge", judge, seed=2)

    asyncio.run(run())
    assert Fake.sent == 1 and len(cache) == 1
    assert budget.calls == 1 and budget.refused == 1 and budget.cost_usd == 1.0  # hit counted
    assert (llm.stats.calls, llm.stats.cache_hits) == (1, 1)
