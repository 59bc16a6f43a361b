"""Grounding: scenarios, replay on the executor, verify/ground/off, the grounded prompt and
the devserver's grounded answers replayed on the world."""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import openai
import pytest

from factory.core.delta import changed_size, diff
from factory.core.formats.completion import parse_output, render_output
from factory.core.labels import call_observations
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.core.validate import validate
from factory.devserver import DevServer, DevServerConfig
from factory.devserver.simulate import AMPLIFY_MARKER, extract_block
from factory.engine.prompts import DIRECTIONS, PromptTemplate
from factory.envs.airline import AirlineEnv
from factory.envs.airline.scenarios import BOOKING_WINDOW
from factory.envs.pack import Domain, load_domain
from factory.envsim.grounding import (
    ENV_STATE_MARKER,
    GroundingWorld,
    apply_mode,
    render_scenario,
    replay,
)
from factory.envsim.sampler import EpisodeSampler
from factory.errors import ConfigError
from factory.recipe import load_recipe
from tests.conftest import ROOT as REPO_ROOT
from tests.helpers import booking_args

ROOT = REPO_ROOT
SIZES = {"n_users": 40, "n_flights": 60, "n_reservations": 120}
WORLD_SEED = 3


@pytest.fixture(scope="module")
def world() -> GroundingWorld:
    return GroundingWorld("airline", WORLD_SEED, SIZES)


@pytest.fixture(scope="module")
def episodes() -> list[Trajectory]:
    sampler = EpisodeSampler("airline", WORLD_SEED, world_sizes=SIZES)
    return list(sampler.episodes(40, seed=11))


@pytest.fixture(scope="module")
def domain() -> Domain:
    return load_domain(load_recipe(ROOT / "pipelines" / "airline.yaml", []).domain)


def _tool_turns(traj: Trajectory) -> list[int]:
    return [i for i, t in enumerate(traj.turns) if t.role == "tool"]


def _with_calls(traj: Trajectory, n: int = 2) -> bool:
    return len(traj.calls()) >= n


# --- scenarios ----------------------------------------------------------------------------
def test_scenario_is_deterministic_and_varies(world: GroundingWorld) -> None:
    assert world.scenario(5, 1) == world.scenario(5, 1)
    again = GroundingWorld("airline", WORLD_SEED, SIZES)
    assert again.scenario(5, 1) == world.scenario(5, 1)
    users = {world.subject(world.scenario(i, 1)) for i in range(30)}
    assert len(users) > 10
    assert world.scenario(5, 1) != world.scenario(5, 2)


@pytest.mark.slow
def test_scenario_does_not_depend_on_the_hash_seed() -> None:
    code = (
        "import json; "
        "from factory.envsim.grounding import GroundingWorld as G, render_scenario as r; "
        f"w = G('airline', {WORLD_SEED}, {SIZES!r}); "
        "print(json.dumps([r(w.scenario(i, 4)) for i in range(5)]))"
    )
    outs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        outs.add(run.stdout)
    assert len(outs) == 1


def test_scenario_is_a_small_consistent_slice(world: GroundingWorld) -> None:
    full = world.env.state
    sizes = []
    for i in range(60):
        scenario = world.scenario(i, 0)
        text = render_scenario(scenario)
        assert json.loads(text) == scenario
        sizes.append(len(text))
        AirlineEnv(copy.deepcopy(scenario))  # a state the executor runs on
        (user_id, user), *others = scenario["users"].items()
        assert not others and user == full["users"][user_id]
        assert world.subject(scenario) == user_id
        assert 1 <= len(scenario["reservations"]) <= 2
        for rid, reservation in scenario["reservations"].items():
            assert rid in user["reservations"] and reservation["user_id"] == user_id
            for leg in reservation["flights"]:
                assert leg["date"] in scenario["flights"][leg["flight_number"]]["dates"]
        low, high = BOOKING_WINDOW
        bookable = [
            (n, d)
            for n, f in scenario["flights"].items()
            for d, on in f["dates"].items()
            if low <= d <= high and on["status"] == "available"
        ]
        assert bookable
        assert list(scenario["flights"]) == [n for n in full["flights"] if n in scenario["flights"]]
        world.fresh_env(scenario)  # every object equals the world's
    assert max(sizes) < 16_000 and statistics.mean(sizes) < 10_000


def test_direct_searches_on_the_slice_answer_as_on_the_world(world: GroundingWorld) -> None:
    checked = 0
    for i in range(40):
        scenario = world.scenario(i, 7)
        on_slice = AirlineEnv(copy.deepcopy(scenario))
        full = world.fresh_env()
        for flight in scenario["flights"].values():
            for day in flight["dates"]:
                args = {"origin": flight["origin"], "destination": flight["destination"]}
                args["date"] = day
                expected = full.execute("search_direct_flight", args)
                assert on_slice.execute("search_direct_flight", args) == expected
                checked += 1
    assert checked > 200


def test_fresh_env_is_a_fork_of_the_whole_world(world: GroundingWorld) -> None:
    scenario = world.scenario(0, 0)
    env = world.fresh_env(scenario)
    assert len(env.state["users"]) == SIZES["n_users"]
    rid = next(iter(scenario["reservations"]))
    before = copy.deepcopy(world.env.state["reservations"][rid])
    assert env.execute("cancel_reservation", {"reservation_id": rid}).startswith("{")
    assert world.env.state["reservations"][rid] == before
    assert world.fresh_env().state["reservations"][rid] == before


def test_fresh_env_refuses_a_scenario_of_another_world(world: GroundingWorld) -> None:
    other = GroundingWorld("airline", WORLD_SEED + 1, SIZES).scenario(0, 0)
    with pytest.raises(ConfigError, match="does not come from this world"):
        world.fresh_env(other)
    tampered = world.scenario(0, 0)
    flight = next(iter(tampered["flights"].values()))
    next(iter(flight["dates"].values()))["status"] = "teleported"
    with pytest.raises(ConfigError, match="flight"):
        world.fresh_env(tampered)


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ({"domain": "hotel"}, "domain"),
        ({"sizes": {"n_planes": 3}}, "world_sizes"),
        ({"sizes": {"n_users": 0, "n_reservations": 0}}, "world_sizes"),
        ({"sizes": {"n_users": -1}}, "world_sizes"),
        ({"db_dir": "/nonexistent/db"}, "db"),
    ],
)
def test_bad_worlds_are_config_errors(args: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        GroundingWorld(**{"domain": "airline", **args})
    assert info.value.key_path == key


@pytest.mark.shared
def test_a_taubench_database_grounds_too(taubench_dir: Path) -> None:
    world = GroundingWorld("airline", db_dir=taubench_dir)
    scenario = world.scenario(3, 0)
    world.fresh_env(scenario)
    assert world.env_id == "airline-db-taubench-airline"
    assert scenario["reservations"] and len(render_scenario(scenario)) < 20_000


# --- replay -------------------------------------------------------------------------------
def test_replaying_executed_episodes_is_faithful_with_exact_delta(
    world: GroundingWorld, episodes: list[Trajectory]
) -> None:
    pristine = copy.deepcopy(world.env.state)
    sizes = set()
    for traj in episodes:
        env = world.fresh_env()
        result = replay(traj, env)
        assert result.fidelity == 1.0 and result.first_mismatch is None
        assert result.total == result.matched == len(traj.calls())
        assert result.observations == tuple(obs for _, obs in call_observations(traj))
        assert result.delta_size == len(diff(pristine, env.state))
        assert result.delta_size == traj.metadata["labels"]["delta_size"]
        sizes.add(result.delta_size)
    assert world.env.state == pristine  # replays never touch the world
    assert len(sizes) > 3  # reads, small and larger writes


def test_delta_size_of_a_booking_is_exact(world: GroundingWorld) -> None:
    state = world.env.state
    uid, user = next(
        (u, p)
        for u, p in state["users"].items()
        if any(
            m["source"] == "gift_card" and m["amount"] >= 1 for m in p["payment_methods"].values()
        )
    )
    card = next(p for p, m in user["payment_methods"].items() if m["source"] == "credit_card")
    gift = next(p for p, m in user["payment_methods"].items() if m["source"] == "gift_card")
    (paid,) = booking_args(state, user_id=uid)["payment_methods"]
    price = paid["amount"]

    def booking(payments: list[dict[str, Any]]) -> Trajectory:
        args = booking_args(state, user_id=uid, payments=payments)
        turns = [
            Turn("user", "Book it."),
            Turn("assistant", tool_calls=[ToolCall("book_reservation", args)]),
            Turn("tool", "(simulated)", name="book_reservation"),
            Turn("assistant", "Booked."),
        ]
        return Trajectory(turns=turns)

    # New reservation + the user's reservation list.
    by_card = replay(booking([{"payment_id": card, "amount": price}]), world.fresh_env())
    assert by_card.delta_size == 2 and by_card.observations[0].startswith('{"reservation_id"')
    # ... + the gift card's balance.
    split = [{"payment_id": gift, "amount": 1}, {"payment_id": card, "amount": price - 1}]
    env = world.fresh_env()
    by_gift = replay(booking(split), env)
    assert by_gift.delta_size == 3 == len(diff(world.env.state, env.state))
    # A refused booking changes nothing.
    refused = replay(booking([{"payment_id": card, "amount": price + 1}]), world.fresh_env())
    assert refused.delta_size == 0 and refused.observations[0].startswith("Error: ")


def test_changed_size_is_exact_without_shared_objects() -> None:
    before = {"users": {"a": {"n": 1}, "b": {"n": 2}}, "meta": 1, "gone": {"x": 1}}
    after = copy.deepcopy(before)
    after["users"]["a"]["n"] = 1.0  # a type change is a change
    after["users"]["c"] = {"n": 3}
    after["meta"] = 2
    del after["gone"]
    after["new"] = []
    assert changed_size(before, after) == len(diff(before, after)) == 5
    assert changed_size(before, copy.deepcopy(before)) == 0


def test_a_wrong_observation_is_the_first_mismatch(
    world: GroundingWorld, episodes: list[Trajectory]
) -> None:
    traj = next(t for t in episodes if _with_calls(t, 3))
    tool_turns = _tool_turns(traj)
    broken = copy.deepcopy(traj)
    broken.turns[tool_turns[1]].content = "Error: made up by the simulator"
    result = replay(broken, world.fresh_env())
    assert [s.matched for s in result.steps][:2] == [True, False]
    call_turn, call = traj.calls()[1]
    assert result.first_mismatch == {"index": 1, "turn": call_turn, "tool": call.name}
    assert result.fidelity == pytest.approx((result.total - 1) / result.total)
    assert result.steps[1].simulated == "Error: made up by the simulator"


def test_observations_compare_as_typed_json_or_stripped_text(
    world: GroundingWorld, episodes: list[Trajectory]
) -> None:
    traj = next(t for t in episodes if t.turns[_tool_turns(t)[0]].content.startswith("{"))
    first = _tool_turns(traj)[0]
    pretty = copy.deepcopy(traj)
    pretty.turns[first].content = json.dumps(json.loads(traj.turns[first].content), indent=2)
    assert replay(pretty, world.fresh_env()).steps[0].matched
    padded = copy.deepcopy(traj)
    padded.turns[first].content = "  " + traj.turns[first].content + "\n"
    assert replay(padded, world.fresh_env()).steps[0].matched
    typed = copy.deepcopy(traj)
    value = json.loads(traj.turns[first].content)
    value["membership" if "membership" in value else "reservation_id"] = True
    typed.turns[first].content = json.dumps(value)
    assert not replay(typed, world.fresh_env()).steps[0].matched


def test_an_unanswered_call_is_a_mismatch(
    world: GroundingWorld, episodes: list[Trajectory]
) -> None:
    traj = next(t for t in episodes if _with_calls(t, 2))
    broken = copy.deepcopy(traj)
    del broken.turns[_tool_turns(traj)[0]]
    result = replay(broken, world.fresh_env())
    assert result.first_mismatch is not None and result.first_mismatch["index"] == 0
    assert result.steps[0].simulated is None and not result.steps[0].matched


def test_calls_are_paired_with_observations_by_id() -> None:
    env = AirlineEnv({"users": {}, "flights": {}, "reservations": {}})
    turns = [
        Turn("user", "Two things."),
        Turn(
            "assistant",
            tool_calls=[
                ToolCall("think", {"thought": "a"}, id="c1"),
                ToolCall("list_all_airports", {}, id="c2"),
            ],
        ),
        Turn(
            "tool",
            env.execute("list_all_airports", {}),
            name="list_all_airports",
            tool_call_id="c2",
        ),
        Turn("tool", "", name="think", tool_call_id="c1"),
        Turn("assistant", "Done."),
    ]
    result = replay(Trajectory(turns=turns), env)
    assert [(s.tool, s.matched) for s in result.steps] == [
        ("think", True),
        ("list_all_airports", True),
    ]


def test_a_trajectory_without_calls_is_faithful(world: GroundingWorld) -> None:
    traj = Trajectory(turns=[Turn("user", "hi"), Turn("assistant", "Hello!")])
    result = replay(traj, world.fresh_env())
    assert (result.fidelity, result.total, result.delta_size, result.first_mismatch) == (
        1.0,
        0,
        0,
        None,
    )
    for mode in ("verify", "ground", "off"):
        kept, info = apply_mode(traj, result, mode)
        assert kept is not None and info["fidelity"] == 1.0


# --- modes --------------------------------------------------------------------------------
@pytest.fixture()
def corrupted(world: GroundingWorld, episodes: list[Trajectory]) -> tuple[Trajectory, Trajectory]:
    traj = next(t for t in episodes if _with_calls(t, 3))
    broken = copy.deepcopy(traj)
    broken.turns[_tool_turns(traj)[-1]].content = "Transfer successful"
    return traj, broken


def test_verify_rejects_a_contradiction_and_keeps_a_faithful_trajectory(
    world: GroundingWorld, corrupted: tuple[Trajectory, Trajectory]
) -> None:
    traj, broken = corrupted
    kept, info = apply_mode(traj, replay(traj, world.fresh_env()), "verify")
    assert kept is traj and "reason" not in info and info["fidelity"] == 1.0
    result = replay(broken, world.fresh_env())
    rejected, info = apply_mode(broken, result, "verify")
    assert rejected is None
    assert info["reason"] == "contradicts_executor"
    assert result.steps[-1].tool in info["message"] and "Transfer successful" in info["message"]
    assert {k: info[k] for k in ("matched", "total")} == {
        "matched": result.total - 1,
        "total": result.total,
    }
    assert info["delta_size"] == result.delta_size


def test_ground_replaces_observations_and_then_replays_faithfully(
    world: GroundingWorld, corrupted: tuple[Trajectory, Trajectory]
) -> None:
    traj, broken = corrupted
    untouched = copy.deepcopy(broken)
    grounded, info = apply_mode(broken, replay(broken, world.fresh_env()), "ground")
    assert grounded is not None and grounded is not broken
    assert broken.to_dict() == untouched.to_dict()
    assert info["observations_replaced"] == 1 and info["observations_added"] == 0
    assert info["fidelity"] < 1.0  # the numbers describe the trajectory as written
    assert [t.to_dict() for t in grounded.turns] == [t.to_dict() for t in traj.turns]
    assert replay(grounded, world.fresh_env()).fidelity == 1.0


def test_ground_inserts_missing_observations(
    world: GroundingWorld, episodes: list[Trajectory], domain: Domain
) -> None:
    traj = next(t for t in episodes if _with_calls(t, 2))
    broken = copy.deepcopy(traj)
    del broken.turns[_tool_turns(traj)[1]]
    grounded, info = apply_mode(broken, replay(broken, world.fresh_env()), "ground")
    assert grounded is not None
    assert info["observations_added"] == 1 and info["observations_replaced"] == 0
    assert [t.to_dict() for t in grounded.turns] == [t.to_dict() for t in traj.turns]
    grounded.tools = domain.tools
    assert validate(grounded, rules=domain.rules) == validate(
        Trajectory(turns=traj.turns, tools=domain.tools), rules=domain.rules
    )


def test_off_keeps_the_trajectory_and_reports(
    world: GroundingWorld, corrupted: tuple[Trajectory, Trajectory]
) -> None:
    _, broken = corrupted
    result = replay(broken, world.fresh_env())
    kept, info = apply_mode(broken, result, "off")
    assert kept is broken
    assert info == {
        "fidelity": result.fidelity,
        "matched": result.matched,
        "total": result.total,
        "delta_size": result.delta_size,
    }


def test_apply_mode_refuses_unknown_modes_and_foreign_results(
    world: GroundingWorld, corrupted: tuple[Trajectory, Trajectory]
) -> None:
    traj, _ = corrupted
    result = replay(traj, world.fresh_env())
    with pytest.raises(ConfigError) as info:
        apply_mode(traj, result, "fix")
    assert info.value.key_path == "grounding.mode"
    shorter = Trajectory(turns=traj.turns[:2])
    with pytest.raises(ValueError, match="does not come from replaying"):
        apply_mode(shorter, result, "ground")


# --- the grounded prompt ------------------------------------------------------------------
def _render(reference: Trajectory, scenario: dict[str, Any], variation: int = 0) -> list[Any]:
    """The grounded prompt as PromptTemplate would render it with ``scenario_json``."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROOT / "prompts"), undefined=jinja2.StrictUndefined
    )
    template = env.get_template("amplify_grounded.j2")
    ctx = {
        "variation": variation + 1,
        "direction": DIRECTIONS[variation % len(DIRECTIONS)],
        "reference_json": json.dumps(render_output(reference), indent=1),
        "scenario_json": render_scenario(scenario),
        "tools_json": "[]",
        "policy": "Be helpful.",
    }

    def block(name: str) -> str:
        return "".join(template.blocks[name](template.new_context(ctx))).strip()

    return [
        {"role": "system", "content": block("system")},
        {"role": "user", "content": block("user")},
    ]


def test_grounded_template_extends_the_amplify_system_block(domain: Domain) -> None:
    plain = PromptTemplate(ROOT / "prompts" / "amplify.j2", domain)
    grounded = PromptTemplate(ROOT / "prompts" / "amplify_grounded.j2", domain)
    assert grounded.static.startswith(plain.static + "\n\n## Environment state\n")
    assert ENV_STATE_MARKER in grounded.static[len(plain.static) :]


def test_grounded_prompt_carries_the_scenario_before_the_reference(
    world: GroundingWorld, episodes: list[Trajectory]
) -> None:
    scenario = world.scenario(2, 0)
    text = _render(episodes[0], scenario)[1]["content"]
    assert text.index(ENV_STATE_MARKER) < text.index(AMPLIFY_MARKER)
    state_block = extract_block(text, ENV_STATE_MARKER)
    reference_block = extract_block(text, AMPLIFY_MARKER)
    assert state_block is not None and reference_block is not None
    assert json.loads(state_block) == scenario
    assert json.loads(reference_block) == render_output(episodes[0])


# --- the devserver answers grounded prompts -----------------------------------------------
@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[DevServer, DevServer]]:
    with (
        DevServer(DevServerConfig(fence_rate=0.5, seed=1)) as clean,
        DevServer(DevServerConfig(fence_rate=0.5, seed=1, wrong_observation=1.0)) as wrong,
    ):
        yield clean, wrong


def _answer(server: DevServer, messages: list[Any]) -> Trajectory:
    with openai.OpenAI(base_url=server.url, api_key="test", max_retries=0) as client:
        reply = client.chat.completions.create(model="factory-dev", messages=messages)
    content = reply.choices[0].message.content
    assert content is not None
    return parse_output(content)


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_devserver_answers_are_faithful_to_the_world(
    world: GroundingWorld,
    episodes: list[Trajectory],
    servers: tuple[DevServer, DevServer],
    domain: Domain,
) -> None:
    clean, _ = servers
    plots = set()
    for i in range(12):
        scenario = world.scenario(i, 5)
        traj = _answer(clean, _render(episodes[i], scenario, variation=i))
        calls = traj.calls()
        assert calls[0][1].arguments == {"user_id": world.subject(scenario)}
        plots.add(calls[-1][1].name)
        result = replay(traj, world.fresh_env(scenario))
        assert result.fidelity == 1.0, result.first_mismatch
        traj.tools = domain.tools
        assert validate(traj, rules=domain.rules) == []
    assert len(plots) >= 3
    assert clean.stats()["grounded_answers"] == 12
    assert clean.stats()["wrong_observations"] == 0


def test_devserver_wrong_observations_are_caught_and_fixed(
    world: GroundingWorld, episodes: list[Trajectory], servers: tuple[DevServer, DevServer]
) -> None:
    _, wrong = servers
    for i in range(6):
        scenario = world.scenario(i, 5)
        traj = _answer(wrong, _render(episodes[i], scenario))
        result = replay(traj, world.fresh_env(scenario))
        assert result.fidelity < 1.0 and result.total - result.matched == 1
        assert apply_mode(traj, result, "verify")[0] is None
        fixed, info = apply_mode(traj, result, "ground")
        assert fixed is not None and info["observations_replaced"] == 1
        assert replay(fixed, world.fresh_env(scenario)).fidelity == 1.0
    stats = wrong.stats()
    assert stats["wrong_observations"] == stats["grounded_answers"] == 6
