from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from factory.envs.airline import AirlineEnv
from factory.envs.airline.tools import NEW_RESERVATION_IDS
from factory.envs.airline.world import CABINS, check_world, generate_world, main, write_world
from tests.conftest import ROOT as REPO_ROOT
from tests.helpers import booking_args

ROOT = REPO_ROOT
SMALL = {"n_users": 40, "n_flights": 30, "n_reservations": 120}

DATE_KEYS = {
    "available": {"status", "available_seats", "prices"},
    "cancelled": {"status"},
    "landed": {"status", "actual_departure_time_est", "actual_arrival_time_est"},
    "flying": {"status", "actual_departure_time_est", "estimated_arrival_time_est"},
    "on time": {"status", "estimated_departure_time_est", "estimated_arrival_time_est"},
    "delayed": {"status", "estimated_departure_time_est", "estimated_arrival_time_est"},
}


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    return generate_world(7, **SMALL)


def test_same_seed_same_bytes_and_seeds_differ() -> None:
    a, b = generate_world(3, **SMALL), generate_world(3, **SMALL)
    assert json.dumps(a) == json.dumps(b)
    assert json.dumps(a) != json.dumps(generate_world(4, **SMALL))


@pytest.mark.parametrize("seed", range(6))
def test_worlds_are_consistent(seed: int) -> None:
    state = generate_world(seed, **SMALL)
    assert check_world(state) == []
    assert [len(state[t]) for t in ("users", "flights", "reservations")] == [40, 30, 120]


def test_default_sizes_match_tau_bench() -> None:
    state = generate_world(0)
    assert [len(state[t]) for t in ("users", "flights", "reservations")] == [500, 300, 2000]
    assert check_world(state) == []


@pytest.mark.parametrize("sizes", [(0, 0, 0), (1, 1, 0), (3, 1, 5)])
def test_tiny_worlds(sizes: tuple[int, int, int]) -> None:
    state = generate_world(1, *sizes)
    assert check_world(state) == []


@pytest.mark.parametrize(("sizes", "days"), [((-1, 1, 1), 30), ((1, 1, 1), 0), ((0, 1, 2), 30)])
def test_bad_sizes_are_refused(sizes: tuple[int, int, int], days: int) -> None:
    with pytest.raises(ValueError):
        generate_world(0, *sizes, n_days=days)


def test_flight_dates_follow_the_clock(world: dict[str, Any]) -> None:
    for flight in world["flights"].values():
        assert flight["origin"] != flight["destination"]
        for day, info in flight["dates"].items():
            assert set(info) == DATE_KEYS[info["status"]], (flight["flight_number"], day)
            if day > "2024-05-15":
                assert info["status"] == "available"
                assert set(info["prices"]) == set(CABINS) == set(info["available_seats"])
            elif day < "2024-05-15":
                assert info["status"] in ("landed", "cancelled")
            else:
                assert info["status"] in ("landed", "flying", "on time", "delayed")


def test_reservations_follow_tau_bench_price_rules(world: dict[str, Any]) -> None:
    for rid, res in world["reservations"].items():
        assert rid not in NEW_RESERVATION_IDS and re.fullmatch("[A-Z0-9]{6}", rid)
        pax = len(res["passengers"])
        total = sum(f["price"] for f in res["flights"]) * pax
        total += 30 * pax if res["insurance"] == "yes" else 0
        assert sum(p["amount"] for p in res["payment_history"]) == total
        legs = res["flights"]
        assert legs[0]["origin"] == res["origin"]
        if res["flight_type"] == "round_trip":
            assert legs[-1]["destination"] == res["origin"]
            assert any(leg["destination"] == res["destination"] for leg in legs[:-1])
        else:
            assert legs[-1]["destination"] == res["destination"]
        for leg in legs:
            flight = world["flights"][leg["flight_number"]]
            assert (leg["origin"], leg["destination"]) == (flight["origin"], flight["destination"])


def test_generated_world_is_bookable(world: dict[str, Any]) -> None:
    env = AirlineEnv(world).copy()
    user_id, user = next(iter(world["users"].items()))
    me = [{**user["name"], "dob": user["dob"]}]
    args = booking_args(world, user_id=user_id, date="2024-05-20", passengers=me)
    obs = env.execute("book_reservation", args)
    assert json.loads(obs)["reservation_id"] == "HATHAT"
    assert check_world(env.state) == []


def test_tau_bench_database_is_consistent(taubench_dir: Path) -> None:
    assert check_world(AirlineEnv.from_dir(taubench_dir).state) == []


def test_schema_matches_tau_bench(taubench_dir: Path, world: dict[str, Any]) -> None:
    ref = AirlineEnv.from_dir(taubench_dir).state
    for table in ("users", "flights", "reservations"):
        ours = {tuple(sorted(v)) for v in world[table].values()}
        theirs = {tuple(sorted(v)) for v in ref[table].values()}
        assert ours == theirs, table
    ref_payment = {
        tuple(sorted(p)) for u in ref["users"].values() for p in u["payment_methods"].values()
    }
    ours_payment = {
        tuple(sorted(p)) for u in world["users"].values() for p in u["payment_methods"].values()
    }
    assert ours_payment == ref_payment


def test_cli_writes_loadable_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "--seed",
                "2",
                "--out",
                str(tmp_path),
                "--users",
                "5",
                "--flights",
                "6",
                "--reservations",
                "9",
            ]
        )
        == 0
    )
    assert "5 users, 6 flights, 9 reservations" in capsys.readouterr().out
    env = AirlineEnv.from_dir(tmp_path)
    assert env.state == generate_world(2, 5, 6, 9)


@pytest.mark.slow
def test_cli_module_entry_point(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "factory.envs.airline.world",
            "--seed",
            "0",
            "--out",
            str(tmp_path),
            "--users",
            "2",
            "--flights",
            "2",
            "--reservations",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "flights.json",
        "reservations.json",
        "users.json",
    ]


def test_write_world_round_trips(tmp_path: Path, world: dict[str, Any]) -> None:
    paths = write_world(world, tmp_path / "db")
    assert [p.name for p in paths] == ["users.json", "flights.json", "reservations.json"]
    assert AirlineEnv.from_dir(tmp_path / "db").state == world
