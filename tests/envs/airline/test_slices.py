from __future__ import annotations

import copy
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from factory.core.delta import apply, diff, same_json
from factory.envs.airline import AirlineEnv
from factory.envs.airline.slices import empty_slice, project, slice_for
from factory.envs.airline.tools import AIRPORTS, WRITE_TOOLS
from factory.envs.airline.world import CABINS, generate_world

MAX_SLICE_BYTES = 32_000


def check_step(env: AirlineEnv, name: str, args: Any) -> str:
    """Run one call on the world and on its slice; every slice/Δ guarantee must hold."""
    before = env.copy()  # a copy-on-write snapshot: diffs below skip shared objects
    part = slice_for(env.state, name, args)
    pristine = copy.deepcopy(part)
    on_slice = AirlineEnv(part).copy()

    observation = env.execute(name, args)
    assert on_slice.execute(name, args) == observation, (name, args)
    assert part == pristine
    assert len(json.dumps(part)) < MAX_SLICE_BYTES

    full_delta = diff(before.state, env.state)
    slice_delta = diff(part, on_slice.state)
    assert slice_delta == full_delta, (name, args)
    assert same_json(apply(slice_delta, part), project(env.state, like=on_slice.state))
    assert same_json(apply(full_delta, before.state), env.state)
    if name not in WRITE_TOOLS:
        assert full_delta == []
    return observation


# --- the 200 recorded trajectories --------------------------------------------------------


@pytest.fixture(scope="module")
def taubench(taubench_dir: Path) -> tuple[AirlineEnv, list[dict[str, Any]]]:
    records = json.loads((taubench_dir / "gpt-4o-airline.json").read_text(encoding="utf-8"))
    return AirlineEnv.from_dir(taubench_dir), records


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_every_recorded_step_slices_exactly(taubench: tuple[AirlineEnv, list]) -> None:
    base, records = taubench
    steps, changed = 0, 0
    for record in records:
        env = base.copy()
        for message in record["traj"]:
            for call in message.get("tool_calls") or []:
                function = call["function"]
                before = env.copy()
                check_step(env, function["name"], json.loads(function["arguments"]))
                changed += diff(before.state, env.state) != []
                steps += 1
    assert steps == 1164
    assert changed > 50  # the replay does exercise writes


# --- generated worlds, random calls -------------------------------------------------------


def _pick_dates(rng: random.Random) -> str:
    return rng.choice(
        [
            "2024-05-05",
            "2024-05-09",
            "2024-05-14",
            "2024-05-15",
            "2024-05-18",
            "2024-05-20",
            "2024-05-25",
            "2024-05-30",
            "2024-06-02",
            "2024-05-4",
        ]
    )


def _leg_price(state: dict, leg: dict, cabin: str) -> int | None:
    info = state["flights"][leg["flight_number"]]["dates"].get(leg["date"], {})
    return info.get("prices", {}).get(cabin) if info.get("status") == "available" else None


def random_call(rng: random.Random, state: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    users, flights = list(state["users"]), list(state["flights"].values())
    reservations = list(state["reservations"])
    user_id = rng.choice(users)
    user = state["users"][user_id]
    methods = list(user["payment_methods"])
    rid = rng.choice([*reservations, "HATHAT", "NOPE00"])
    tool = rng.choice(
        [
            "get_user_details",
            "get_reservation_details",
            "search_direct_flight",
            "search_onestop_flight",
            "book_reservation",
            "book_reservation",
            "cancel_reservation",
            "update_reservation_flights",
            "update_reservation_flights",
            "update_reservation_baggages",
            "update_reservation_passengers",
            "send_certificate",
            "calculate",
            "think",
        ]
    )
    if tool == "get_user_details":
        return tool, {"user_id": rng.choice([user_id, "ghost_0000"])}
    if tool in ("get_reservation_details", "cancel_reservation"):
        return tool, {"reservation_id": rid}
    if tool == "search_direct_flight":
        f = rng.choice(flights)
        return tool, {
            "origin": f["origin"],
            "destination": f["destination"],
            "date": _pick_dates(rng),
        }
    if tool == "search_onestop_flight":
        a, b = rng.sample(list(AIRPORTS), 2)
        return tool, {"origin": a, "destination": b, "date": _pick_dates(rng)}
    if tool == "send_certificate":
        return tool, {"user_id": user_id, "amount": rng.choice([50, 100.5])}
    if tool == "calculate":
        return tool, {"expression": rng.choice(["1 + 2", "3 / 0", "2 ** 5"])}
    if tool == "think":
        return tool, {"thought": "..."}
    if tool == "book_reservation":
        cabin = rng.choice(CABINS)
        f = rng.choice(flights)
        legs = [
            {
                "flight_number": f["flight_number"],
                "date": rng.choice([d for d in f["dates"] if d > "2024-05-15"] or ["2024-05-20"]),
            }
        ]
        pax = [{"first_name": "A", "last_name": "B", "dob": "1990-01-01"}] * rng.randint(1, 2)
        insurance = rng.choice(["yes", "no"])
        nonfree = rng.randint(0, 1)
        price = _leg_price(state, legs[0], cabin) or 0
        total = price * len(pax) + (30 * len(pax) if insurance == "yes" else 0) + 50 * nonfree
        total += rng.choice([0, 0, 0, 7])
        split = rng.randint(0, total)
        payments = [
            {"payment_id": rng.choice(methods), "amount": split},
            {"payment_id": rng.choice(methods), "amount": total - split},
        ]
        return tool, {
            "user_id": user_id,
            "origin": f["origin"],
            "destination": f["destination"],
            "flight_type": "one_way",
            "cabin": cabin,
            "flights": legs,
            "passengers": pax,
            "payment_methods": payments[: rng.randint(1, 2)],
            "total_baggages": nonfree,
            "nonfree_baggages": nonfree,
            "insurance": insurance,
        }
    res = state["reservations"].get(rid) or state["reservations"][reservations[0]]
    owner = state["users"][res["user_id"]]
    payment_id = rng.choice([*owner["payment_methods"], "credit_card_0"])
    if tool == "update_reservation_baggages":
        return tool, {
            "reservation_id": rid,
            "total_baggages": rng.randint(0, 4),
            "nonfree_baggages": rng.randint(0, 3),
            "payment_id": payment_id,
        }
    if tool == "update_reservation_passengers":
        count = len(res["passengers"]) + rng.choice([0, 0, 1])
        pax = [{"first_name": "P", "last_name": str(i), "dob": "2000-01-01"} for i in range(count)]
        return tool, {"reservation_id": rid, "passengers": pax}
    legs = [{"flight_number": leg["flight_number"], "date": leg["date"]} for leg in res["flights"]]
    same_route = [
        f
        for f in flights
        if f["origin"] == res["flights"][0]["origin"]
        and f["destination"] == res["flights"][0]["destination"]
    ]
    legs[0] = {
        "flight_number": rng.choice(same_route)["flight_number"],
        "date": rng.choice(["2024-05-20", "2024-05-22", legs[0]["date"]]),
    }
    return tool, {
        "reservation_id": rid,
        "cabin": rng.choice([res["cabin"], *CABINS]),
        "flights": legs,
        "payment_id": payment_id,
    }


@pytest.mark.parametrize("seed", range(4))
def test_random_calls_on_generated_worlds_slice_exactly(seed: int) -> None:
    rng = random.Random(seed)
    env = AirlineEnv(generate_world(seed, n_users=30, n_flights=40, n_reservations=80))
    succeeded: Counter[str] = Counter()
    for _ in range(250):
        name, args = random_call(rng, env.state)
        observation = check_step(env, name, args)
        succeeded[name] += not observation.startswith("Error")
    for tool in (
        "book_reservation",
        "cancel_reservation",
        "update_reservation_flights",
        "update_reservation_baggages",
        "update_reservation_passengers",
    ):
        assert succeeded[tool] > 0, (tool, succeeded)


# --- unit behaviour ---------------------------------------------------------------------------


@pytest.fixture()
def world(airline_world: dict[str, Any]) -> dict[str, Any]:
    return airline_world


@pytest.mark.parametrize(
    "tool", ["calculate", "think", "list_all_airports", "transfer_to_human_agents", "no_such_tool"]
)
def test_stateless_tools_have_empty_slices(world: dict[str, Any], tool: str) -> None:
    assert slice_for(world, tool, {"expression": "1"}) == empty_slice()


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("get_user_details", {"user_id": ["x"]}),
        ("get_reservation_details", None),
        ("book_reservation", {"user_id": 3, "flights": "HAT001"}),
        ("update_reservation_flights", {"reservation_id": {}, "flights": [1, None]}),
        ("search_onestop_flight", {"origin": "JFK", "destination": "SEA", "date": 20240520}),
    ],
)
def test_malformed_arguments_select_nothing_and_never_raise(
    world: dict[str, Any], tool: str, args: Any
) -> None:
    part = slice_for(world, tool, args)
    assert part["users"] == {} and part["reservations"] == {}


def test_reservation_slices_hold_owner_and_trimmed_flights(world: dict[str, Any]) -> None:
    rid, res = next(iter(world["reservations"].items()))
    part = slice_for(world, "cancel_reservation", {"reservation_id": rid})
    assert list(part["users"]) == [res["user_id"]]
    assert list(part["reservations"]) == [rid]
    for leg in res["flights"]:
        assert leg["date"] in part["flights"][leg["flight_number"]]["dates"]
    assert all(len(f["dates"]) <= len(res["flights"]) for f in part["flights"].values())


def test_slices_are_independent_copies(world: dict[str, Any]) -> None:
    uid = next(iter(world["users"]))
    part = slice_for(world, "get_user_details", {"user_id": uid})
    part["users"][uid]["email"] = "changed"
    assert world["users"][uid]["email"] != "changed"


def test_project_takes_the_same_objects_and_dates(world: dict[str, Any]) -> None:
    flight_number = next(iter(world["flights"]))
    like = {
        "users": {next(iter(world["users"])): {}, "missing_user": {}},
        "flights": {flight_number: {"dates": {"2024-05-20": {}}}},
        "reservations": {},
    }
    out = project(world, like)
    assert list(out["users"]) == [next(iter(world["users"]))]
    assert out["users"][next(iter(world["users"]))] == world["users"][next(iter(world["users"]))]
    assert list(out["flights"][flight_number]["dates"]) == ["2024-05-20"]
    assert out["reservations"] == {}
