from __future__ import annotations

import ast
import builtins
import json
from collections import Counter
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest

from factory.core.delta import apply, same_json
from factory.core.labels import GROUPS
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.envs.airline import AirlineEnv
from factory.envs.airline.tools import TOOLS, WRITE_TOOLS
from factory.envs.registry import available_domains
from factory.envsim.steps import (
    StepError,
    StepSample,
    check_step,
    decompose,
    decompose_calls,
    step_id,
    tool_source,
)
from factory.errors import ConfigError
from tests.helpers import booking_args


@pytest.fixture()
def world(airline_world: dict[str, Any]) -> AirlineEnv:
    return AirlineEnv(airline_world).copy()  # a fork: the session's world stays pristine


def _some_reservation(env: AirlineEnv) -> str:
    return next(iter(env.state["reservations"]))


def test_booking_step_carries_what_it_created(world: AirlineEnv) -> None:
    args = booking_args(world.state)
    uid, env = args["user_id"], world.copy()
    calls = [("get_user_details", {"user_id": uid}), ("book_reservation", args)]
    read, book = list(decompose_calls(calls, env, env_id="w3", user_id=uid))
    assert read.delta == [] and read.labels["group"] == "No-Change"
    assert read.state_before == read.state_after and uid in read.state_before["users"]

    booked = json.loads(book.observation)["reservation_id"]
    assert booked not in book.state_before["reservations"]
    assert book.state_after["reservations"][booked] == env.state["reservations"][booked]
    assert booked in book.state_after["users"][uid]["reservations"]
    paths = {op["path"]: op["op"] for op in book.delta}
    assert paths == {f"/reservations/{booked}": "add", f"/users/{uid}/reservations": "replace"}
    assert book.labels == {
        "kind": "step",
        "outcome": "change",
        "group": "Simple",
        "delta_size": 2,
        "arg_cardinality": 11,
        "task_id": None,
        "user_id": uid,
        "env_id": "w3",
    }
    for sample in (read, book):
        check_step(sample, domain="airline")
        assert same_json(apply(sample.delta, sample.state_before), sample.state_after)
    assert world.state["reservations"].get(booked) is None  # the caller's world is untouched


def test_failed_write_is_a_failure_without_change(world: AirlineEnv) -> None:
    args = booking_args(world.state)
    args["payment_methods"][0]["amount"] += 1
    (sample,) = decompose_calls([("book_reservation", args)], world.copy(), env_id="w3")
    assert sample.observation.startswith("Error: payment amount does not add up")
    assert sample.delta == [] and sample.labels["group"] == "Failure"
    check_step(sample, domain="airline")


def test_decompose_reads_ids_from_metadata_and_lets_callers_override(world: AirlineEnv) -> None:
    rid = _some_reservation(world)
    traj = Trajectory(
        turns=[
            Turn("user", "hi"),
            Turn(
                "assistant",
                tool_calls=[ToolCall("get_reservation_details", {"reservation_id": rid})],
            ),
            Turn("tool", "recorded text is ignored"),
            Turn("assistant", tool_calls=[ToolCall("cancel_reservation", {"reservation_id": rid})]),
            Turn("tool", "..."),
            Turn("assistant", "done"),
        ],
        metadata={"task_id": 7, "user_id": "someone_1"},
    )
    samples = list(decompose(traj, world.copy(), env_id="w3", check=True))
    assert [s.step for s in samples] == [0, 1]
    assert [s.tool for s in samples] == ["get_reservation_details", "cancel_reservation"]
    assert all(s.task_id == "7" and s.user_id == "someone_1" for s in samples)
    assert samples[0].observation == json.dumps(world.state["reservations"][rid])
    assert samples[1].state_after["reservations"][rid]["status"] == "cancelled"
    other = list(decompose(traj, world.copy(), env_id="w3", task_id="t", user_id="u"))
    assert {(s.task_id, s.user_id, s.labels["task_id"]) for s in other} == {("t", "u", "t")}


def test_round_trip_through_json(world: AirlineEnv) -> None:
    args = booking_args(world.state)
    for sample in decompose_calls([("book_reservation", args)], world.copy(), env_id="w3"):
        again = StepSample.from_dict(json.loads(json.dumps(sample.to_dict())))
        assert again == sample
        check_step(again, domain="airline")


def test_step_errors_carry_a_registered_reason() -> None:
    from factory.core.reasons import REASONS

    assert StepError("x").reason in REASONS


def test_from_dict_names_missing_fields() -> None:
    with pytest.raises(StepError, match="lacks field"):
        StepSample.from_dict({"id": "x"})
    with pytest.raises(StepError, match="JSON object"):
        StepSample.from_dict([])  # type: ignore[arg-type]


def test_step_id_is_a_content_hash() -> None:
    a = step_id("w", 0, "think", {"thought": "x"}, {"users": {}})
    assert len(a) == 24 and int(a, 16) >= 0
    assert a == step_id("w", 0, "think", {"thought": "x"}, {"users": {}})
    assert a != step_id("w2", 0, "think", {"thought": "x"}, {"users": {}})
    assert a != step_id("w", 1, "think", {"thought": "x"}, {"users": {}})


def _tampered(sample: StepSample, how: str) -> StepSample:
    bad = StepSample.from_dict(sample.to_dict())
    uid = next(iter(bad.state_before["users"]))
    if how == "delta":
        bad.delta = bad.delta[:-1]
    elif how == "stale_delta":
        bad.delta = [{**bad.delta[0], "before": "something else"}, *bad.delta[1:]]
    elif how == "state_after":
        bad.state_after["users"][uid]["membership"] = "platinum"
    elif how == "observation":
        bad.observation = bad.observation + " "
    elif how == "id":
        bad.id = "0" * 24
    elif how == "labels":
        bad.labels = {**bad.labels, "group": "Beyond"}
    elif how == "insufficient_slice":  # Δ still applies, but the user is not in the slice
        del bad.state_before["users"][uid]
        bad.delta = [op for op in bad.delta if not op["path"].startswith(f"/users/{uid}")]
        bad.state_after = apply(bad.delta, bad.state_before)
    return bad


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("delta", "differs from state_after"),
        ("stale_delta", "does not apply"),
        ("state_after", "differs from state_after"),
        ("observation", "not sufficient"),
        ("id", "content hash"),
        ("labels", "labels"),
        ("insufficient_slice", "not sufficient"),
    ],
)
def test_check_step_catches_every_broken_guarantee(
    world: AirlineEnv, how: str, message: str
) -> None:
    args = booking_args(world.state)
    (sample,) = decompose_calls([("book_reservation", args)], world.copy(), env_id="w3")
    check_step(sample, domain="airline")
    with pytest.raises(StepError, match=message):
        check_step(_tampered(sample, how), domain="airline")


def test_arguments_must_be_objects(world: AirlineEnv) -> None:
    with pytest.raises(StepError, match="must be an object"):
        list(decompose_calls([("think", "not an object")], world.copy(), env_id="w3"))  # type: ignore[list-item]


def test_unknown_domain_has_no_slices(world: AirlineEnv) -> None:
    env = world.copy()
    env.domain = "hotel"  # type: ignore[misc]
    with pytest.raises(ConfigError, match=f"unknown domain 'hotel'; known domains: {_known()} "):
        list(decompose_calls([("think", {"thought": "x"})], env, env_id="w"))


def test_a_domain_without_slicing_is_named_with_those_that_have_it(world: AirlineEnv) -> None:
    from factory.envs import DomainPlugin, register_domain
    from factory.envs.registry import reset_registry

    register_domain(DomainPlugin("bare"))
    try:
        env = world.copy()
        env.domain = "bare"  # type: ignore[misc]
        with pytest.raises(
            ConfigError, match="'bare' supplies no slicing; domains that do: airline"
        ):
            list(decompose_calls([("think", {"thought": "x"})], env, env_id="w"))
    finally:
        reset_registry()


def test_arguments_are_detached_from_the_caller(world: AirlineEnv) -> None:
    args = booking_args(world.state)
    pristine = deepcopy(args)
    (sample,) = decompose_calls([("book_reservation", args)], world.copy(), env_id="w3")
    args["passengers"].append({"first_name": "X", "last_name": "Y", "dob": "2000-01-01"})
    assert sample.arguments == pristine


# --- code(a) -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_tool_source_is_the_function_and_what_it_uses(name: str) -> None:
    source = tool_source("airline", name)
    assert source is not None
    tree = ast.parse(source)
    first = tree.body[0]
    assert isinstance(first, ast.FunctionDef) and first.name == name
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(first):  # every helper the tool calls is included
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            callee = node.func.id
            assert callee in defined or callee in dir(builtins) or callee in {"deepcopy"}


def test_tool_source_includes_the_constants_that_decide_the_outcome() -> None:
    book = tool_source("airline", "book_reservation")
    assert book is not None
    assert "def _flight_cost(" in book and 'NEW_RESERVATION_IDS = ("HATHAT"' in book
    assert 'NOW = "2024-05-15T15:00:00"' in book
    certificate = tool_source("airline", "send_certificate")
    assert certificate is not None and "NEW_CERTIFICATE_IDS = (" in certificate
    assert "def _flight_cost(" not in certificate


def test_tool_source_of_unknown_tools_is_none() -> None:
    assert tool_source("airline", "fly_me") is None
    with pytest.raises(ConfigError, match=f"unknown domain 'hotel'; known domains: {_known()} "):
        tool_source("hotel", "think")


# --- the 200 recorded tau-bench trajectories ----------------------------------------------------


@pytest.mark.shared
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_every_recorded_taubench_step_keeps_the_invariants(taubench_dir: Path) -> None:
    from factory.core.formats import parse_record

    records = json.loads((taubench_dir / "gpt-4o-airline.json").read_text(encoding="utf-8"))
    tools = json.loads((taubench_dir / "tools.json").read_text(encoding="utf-8"))
    pristine = AirlineEnv.from_dir(taubench_dir)
    groups: Counter[str] = Counter()
    steps = writes = 0
    for i, record in enumerate(records):
        traj = parse_record(record, source=f"gpt-4o-airline.json:{i}", default_tools=tools)
        recorded = [t.content for t in traj.turns if t.role == "tool"]
        for sample in decompose(traj, pristine.copy(), env_id="taubench-airline"):
            check_step(sample, domain="airline")
            assert same_json(apply(sample.delta, sample.state_before), sample.state_after)
            assert sample.task_id == str(record["task_id"])
            failed = recorded[sample.step].startswith("Error")
            assert (sample.labels["group"] == "Failure") == failed, (i, sample.step)
            if sample.tool not in WRITE_TOOLS:
                assert sample.delta == []
            writes += bool(sample.delta)
            groups[sample.labels["group"]] += 1
            steps += 1
    assert len(records) == 200 and steps == 1164, steps
    assert writes > 50
    assert set(groups) <= set(GROUPS) and {"Failure", "No-Change", "Simple"} <= set(groups), groups


def _known() -> str:
    return ", ".join(available_domains())
