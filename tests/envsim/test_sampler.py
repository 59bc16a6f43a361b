from __future__ import annotations

import json
import random
import time
from collections import Counter

import pytest

from factory.core.delta import apply, diff, same_json
from factory.core.labels import GROUPS, is_error_observation
from factory.core.rules import DomainRules
from factory.core.trajectory import Trajectory, normalize_tool_spec
from factory.core.validate import validate
from factory.envs.airline.sampler import SCENARIOS, default_tools
from factory.envs.airline.tools import WRITE_TOOLS
from factory.envs.pack import Domain
from factory.envsim.sampler import EpisodeSampler, sample_episode, sample_episodes, world_env_id
from factory.envsim.steps import StepSample, check_step, decompose
from factory.errors import ConfigError
from tests.conftest import ROOT

WORLD_SEED = 0


@pytest.fixture(scope="module")
def sampler() -> EpisodeSampler:
    return EpisodeSampler("airline", WORLD_SEED)


@pytest.fixture(scope="module")
def run(sampler: EpisodeSampler) -> list[tuple[Trajectory, list[StepSample]]]:
    """300 episodes of the default mix, each decomposed on a fresh fork."""
    out = []
    for traj in sampler.episodes(300, seed=11):
        out.append((traj, list(decompose(traj, sampler.fresh_env(), env_id=sampler.env_id))))
    return out


# --- determinism ----------------------------------------------------------------------------------


def test_same_seed_same_episodes(sampler: EpisodeSampler) -> None:
    first = [t.to_json() for t in sampler.episodes(25, seed=5)]
    again = [t.to_json() for t in EpisodeSampler("airline", WORLD_SEED).episodes(25, seed=5)]
    assert first == again
    assert first == [t.to_json() for t in sample_episodes("airline", WORLD_SEED, 25, seed=5)]
    other = [t.to_json() for t in sampler.episodes(25, seed=6)]
    assert sum(a != b for a, b in zip(first, other, strict=True)) > 20


def test_an_episode_does_not_depend_on_the_ones_before(sampler: EpisodeSampler) -> None:
    whole = list(sampler.episodes(12, seed=9))
    shard = list(sampler.episodes(4, seed=9, start=8))
    assert [t.to_json() for t in shard] == [t.to_json() for t in whole[8:]]
    assert sampler.episode(3, seed=9).to_json() == whole[3].to_json()


def test_sampling_never_touches_the_world(sampler: EpisodeSampler) -> None:
    before = sampler.fresh_env()
    list(sampler.episodes(30, seed=2))
    assert diff(before.state, sampler.world.state) == []


# --- what a run contains --------------------------------------------------------------------------


def test_every_envsimbench_group_is_populated(
    run: list[tuple[Trajectory, list[StepSample]]],
) -> None:
    groups = Counter(s.labels["group"] for _, steps in run for s in steps)
    by_tool = Counter((s.tool, s.labels["group"]) for _, steps in run for s in steps)
    histogram = {g: groups[g] for g in GROUPS}
    wanted = ("Failure", "No-Change", "Simple", "Medium", "Difficult")
    assert all(groups[g] > 0 for g in wanted), f"step groups of 300 episodes: {histogram}"
    assert groups["Difficult"] >= 3, f"step groups of 300 episodes: {histogram}"
    # Every scenario and write tool is exercised; Difficult steps are stacked bookings.
    assert {t.metadata["sampler"]["scenarios"][0] for t, _ in run} == set(SCENARIOS)
    assert {tool for tool, group in by_tool if group != "Failure"} >= WRITE_TOOLS
    assert {tool for tool, group in by_tool if group == "Difficult"} == {"book_reservation"}
    print(f"step groups of 300 episodes: {histogram}")


def test_every_step_keeps_the_invariants(run: list[tuple[Trajectory, list[StepSample]]]) -> None:
    for traj, steps in run:
        observations = [t.content for t in traj.turns if t.role == "tool"]
        assert [s.observation for s in steps] == observations  # replay == what was sampled
        for sample in steps:
            assert same_json(apply(sample.delta, sample.state_before), sample.state_after)
            check_step(sample, domain="airline")  # includes slice sufficiency
            assert sample.env_id == traj.metadata["env_id"]
            assert sample.task_id == traj.metadata["task_id"]
            assert sample.user_id == traj.metadata["user_id"]


def test_mistakes_are_the_errors(run: list[tuple[Trajectory, list[StepSample]]]) -> None:
    """Every wrong call fails, every failure is a recorded wrong call: valid calls never fail."""
    kinds: Counter[str] = Counter()
    for traj, steps in run:
        mistakes = {m["call"]: m for m in traj.metadata["sampler"]["mistakes"]}
        failed = {s.step for s in steps if is_error_observation(s.observation)}
        assert failed == set(mistakes), traj.metadata["sampler"]
        assert not any(m["accepted"] for m in mistakes.values())
        kinds.update(m["kind"] for m in mistakes.values())
    for kind in ("unknown_reservation", "unknown_user", "wrong_type", "unknown_payment"):
        assert kinds[kind] > 0, kinds
    share = sum(kinds.values()) / sum(len(steps) for _, steps in run)
    assert 0.1 < share < 0.3, share


def test_trajectory_metadata_and_labels(
    sampler: EpisodeSampler, run: list[tuple[Trajectory, list[StepSample]]]
) -> None:
    for traj, steps in run[:60]:
        meta = traj.metadata
        assert meta["id"] == traj.content_id() and meta["format"] == "sampler"
        assert meta["env_id"] == sampler.env_id == "airline-gen-0"
        assert meta["user_id"] in sampler.world.state["users"]
        labels = meta["labels"]
        assert (labels["env_id"], labels["task_id"]) == (meta["env_id"], meta["task_id"])
        assert labels["calls"] == len(steps)
        env = sampler.fresh_env()
        start = env.copy()
        for _, call in traj.calls():
            env.execute(call.name, call.arguments)
        assert labels["delta_size"] == len(diff(start.state, env.state))
        assert traj.turns[0].role == "user" and traj.turns[-1].role == "assistant"
        assert traj.turns[-1].content and not traj.turns[-1].tool_calls
        transferred = any(
            s.tool == "transfer_to_human_agents" and not is_error_observation(s.observation)
            for s in steps
        )
        assert (labels["outcome"] == "transferred") == transferred


def test_valid_episodes_pass_validation_and_never_fail(sampler: EpisodeSampler) -> None:
    """Without mistakes or violations every call succeeds and the rows are fit to train on."""
    tools = json.loads((ROOT / "prompts" / "airline" / "tools.json").read_text(encoding="utf-8"))
    domain = Domain("airline", [normalize_tool_spec(t) for t in tools])
    rules = DomainRules.load(ROOT / "filters" / "airline.yaml")
    clean = EpisodeSampler(
        "airline",
        WORLD_SEED,
        invalid_share=0.0,
        violation_share=0.0,
        tools=domain.tools,
        scenarios={**SCENARIOS, "pileup": 0},  # pileup breaks the one-certificate rule
    )
    clean.world = sampler.world  # same world, generated once
    scenarios: Counter[str] = Counter()
    for traj in clean.episodes(200, seed=4):
        assert validate(traj, rules=rules) == [], traj.metadata["sampler"]
        assert not any(is_error_observation(t.content) for t in traj.turns if t.role == "tool")
        assert traj.metadata["sampler"]["mistakes"] == []
        assert traj.metadata["sampler"]["violations"] == []
        scenarios.update(traj.metadata["sampler"]["scenarios"])
    assert set(scenarios) == set(SCENARIOS) - {"pileup"}, scenarios


def test_payments_follow_the_state(run: list[tuple[Trajectory, list[StepSample]]]) -> None:
    """Bookings use real payment ids, mixed methods, 1-5 passengers, and round trips."""
    bookings = [
        s
        for _, steps in run
        for s in steps
        if s.tool == "book_reservation" and not is_error_observation(s.observation)
    ]
    assert len(bookings) > 30
    sources = Counter()
    for s in bookings:
        owned = s.state_before["users"][s.arguments["user_id"]]["payment_methods"]
        used = [owned[p["payment_id"]]["source"] for p in s.arguments["payment_methods"]]
        sources[tuple(sorted(set(used)))] += 1
        assert 1 <= len(s.arguments["passengers"]) <= 5
    assert sources[("credit_card",)] and sources[("certificate", "credit_card")]
    assert any("gift_card" in combo and "credit_card" in combo for combo in sources)
    assert {s.arguments["flight_type"] for s in bookings} == {"one_way", "round_trip"}
    assert max(len(s.arguments["passengers"]) for s in bookings) == 5


# --- the 10k-step property ------------------------------------------------------------------------


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_ten_thousand_steps_apply_exactly(sampler: EpisodeSampler) -> None:
    """apply(Δ, s) == s' on >= 10k sampled steps (check=True adds slice sufficiency)."""
    started = time.perf_counter()
    steps = 0
    groups: Counter[str] = Counter()
    index = 0
    while steps < 10_000:
        for sample in sampler.steps(50, seed=2024, start=index, check=True):
            assert same_json(apply(sample.delta, sample.state_before), sample.state_after), (
                sample.id
            )
            groups[sample.labels["group"]] += 1
            steps += 1
        index += 50
    elapsed = time.perf_counter() - started  # reported, never asserted (a busy CI machine)
    print(f"{steps} steps from {index} episodes in {elapsed:.1f} s; groups {dict(groups)}")


# --- API edges ------------------------------------------------------------------------------------


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_shares_must_be_probabilities(sampler: EpisodeSampler, share: float) -> None:
    with pytest.raises(ConfigError, match="between 0 and 1"):
        EpisodeSampler("airline", WORLD_SEED, invalid_share=share, world_sizes={"n_users": 1})
    with pytest.raises(ConfigError, match="violation_share"):
        sample_episode(sampler.fresh_env(), rng=random.Random(0), env_id="x", violation_share=share)


def test_unknown_world_sizes_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown world size"):
        EpisodeSampler("airline", 0, world_sizes={"n_planes": 3})


def test_small_worlds_and_their_ids() -> None:
    sizes = {"n_users": 20, "n_flights": 40, "n_reservations": 60}
    small = EpisodeSampler("airline", 1, world_sizes=sizes)
    assert (
        small.env_id
        == world_env_id("airline", 1, sizes)
        != world_env_id("airline", 1)
        == "airline-gen-1"
    )
    assert len(small.world.state["users"]) == 20
    for traj in small.episodes(40, seed=0):
        for sample in decompose(traj, small.fresh_env(), env_id=small.env_id, check=True):
            assert sample.env_id == small.env_id


def test_default_tools_are_the_airline_schemas() -> None:
    tools = default_tools()
    assert len(tools) == 14
    kinds = {t["name"]: t["x-kind"] for t in tools}
    assert {n for n, k in kinds.items() if k == "write"} == WRITE_TOOLS
    assert kinds["get_user_details"] == "read" and kinds["think"] == "generic"
    assert all(normalize_tool_spec(t) == t for t in tools)
