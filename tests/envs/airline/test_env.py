from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory.envs import Environment, available_domains, get_environment, register_environment
from factory.envs.airline import AirlineEnv
from factory.envs.airline.tools import PARAMETERS, TOOLS, WRITE_TOOLS
from factory.errors import ConfigError
from tests.helpers import booking_args

# --- a small hand-made world ----------------------------------------------------------------


def _flight(number: str, origin: str, dest: str, dep: str, arr: str, **dates: Any) -> dict:
    return {
        "flight_number": number,
        "origin": origin,
        "destination": dest,
        "scheduled_departure_time_est": dep,
        "scheduled_arrival_time_est": arr,
        "dates": {d.replace("_", "-"): v for d, v in dates.items()},
    }


def _open(seats: int = 5, prices: tuple[int, int, int] = (50, 100, 300)) -> dict:
    cabins = ("basic_economy", "economy", "business")
    return {
        "status": "available",
        "available_seats": dict.fromkeys(cabins, seats),
        "prices": dict(zip(cabins, prices, strict=True)),
    }


def make_state() -> dict[str, Any]:
    user = {
        "name": {"first_name": "Ada", "last_name": "Lee"},
        "address": {
            "address1": "1 Main",
            "address2": "",
            "city": "Austin",
            "country": "USA",
            "state": "TX",
            "zip": "78701",
        },
        "email": "ada@example.com",
        "dob": "1990-01-01",
        "payment_methods": {
            "credit_card_1": {
                "source": "credit_card",
                "brand": "visa",
                "last_four": "1111",
                "id": "credit_card_1",
            },
            "gift_card_1": {"source": "gift_card", "amount": 500, "id": "gift_card_1"},
            "certificate_1": {"source": "certificate", "amount": 100, "id": "certificate_1"},
        },
        "saved_passengers": [],
        "membership": "gold",
        "reservations": ["RES001"],
    }
    flights = {
        "HAT001": _flight(
            "HAT001",
            "JFK",
            "SEA",
            "08:00:00",
            "12:00:00",
            **{
                "2024_05_20": _open(),
                "2024_05_21": _open(seats=1),
                "2024_05_10": {"status": "landed"},
            },
        ),
        "HAT002": _flight(
            "HAT002",
            "SEA",
            "JFK",
            "09:00:00",
            "14:00:00",
            **{"2024_05_25": _open(prices=(60, 120, 400))},
        ),
        "HAT003": _flight(
            "HAT003",
            "JFK",
            "ORD",
            "06:00:00",
            "08:00:00",
            **{"2024_05_20": _open(prices=(40, 80, 200))},
        ),
        "HAT004": _flight(
            "HAT004",
            "ORD",
            "SEA",
            "09:00:00",
            "11:00:00",
            **{"2024_05_20": _open(prices=(45, 90, 210))},
        ),
        "HAT005": _flight(
            "HAT005",
            "JFK",
            "ORD",
            "22:00:00",
            "01:00:00+1",
            **{"2024_05_05": _open(), "2024_05_06": {"status": "cancelled"}},
        ),
        "HAT006": _flight(
            "HAT006",
            "ORD",
            "SEA",
            "05:00:00",
            "07:00:00",
            **{"2024_05_06": _open(), "2024_05_5": _open()},
        ),
    }
    reservation = {
        "reservation_id": "RES001",
        "user_id": "ada_lee_1",
        "origin": "JFK",
        "destination": "SEA",
        "flight_type": "one_way",
        "cabin": "economy",
        "flights": [
            {
                "origin": "JFK",
                "destination": "SEA",
                "flight_number": "HAT001",
                "date": "2024-05-20",
                "price": 100,
            }
        ],
        "passengers": [{"first_name": "Ada", "last_name": "Lee", "dob": "1990-01-01"}],
        "payment_history": [{"payment_id": "credit_card_1", "amount": 100}],
        "created_at": "2024-05-01T10:00:00",
        "total_baggages": 1,
        "nonfree_baggages": 0,
        "insurance": "no",
    }
    return {
        "users": {"ada_lee_1": user},
        "flights": flights,
        "reservations": {"RES001": reservation},
    }


@pytest.fixture
def env() -> AirlineEnv:
    return AirlineEnv(make_state())


ADA = [{"first_name": "Ada", "last_name": "Lee", "dob": "1990-01-01"}]


def booking(**over: Any) -> dict[str, Any]:
    """Ada's booking of HAT001 on 2024-05-20 in economy, 100 on credit_card_1."""
    return {**booking_args(make_state(), passengers=ADA), **over}


# --- reads -----------------------------------------------------------------------------------


def test_reads_serialise_the_stored_objects(env: AirlineEnv) -> None:
    assert env.execute("get_user_details", {"user_id": "ada_lee_1"}) == json.dumps(
        env.state["users"]["ada_lee_1"]
    )
    assert (
        json.loads(env.execute("get_reservation_details", {"reservation_id": "RES001"}))["user_id"]
        == "ada_lee_1"
    )


@pytest.mark.parametrize(
    ("tool", "args", "observation"),
    [
        ("get_user_details", {"user_id": "nobody"}, "Error: user not found"),
        # tau-bench's message for a missing reservation, kept as is
        ("get_reservation_details", {"reservation_id": "NOPE00"}, "Error: user not found"),
        ("cancel_reservation", {"reservation_id": "NOPE00"}, "Error: reservation not found"),
        ("think", {"thought": "hmm"}, ""),
        ("transfer_to_human_agents", {"summary": "help"}, "Transfer successful"),
        ("calculate", {"expression": "2 + 2"}, "4.0"),
        ("calculate", {"expression": "10 / 3"}, "3.33"),
        ("calculate", {"expression": "(100 - 20) * 1.5"}, "120.0"),
        ("calculate", {"expression": "2 ** 10"}, "1024.0"),
        ("calculate", {"expression": "1 / 0"}, "Error: division by zero"),
        ("calculate", {"expression": "1 +"}, "Error: invalid syntax (<string>, line 1)"),
        ("calculate", {"expression": "import os"}, "Error: invalid characters in expression"),
        ("calculate", {"expression": "(1)(2)"}, "Error: 'int' object is not callable"),
        ("calculate", {"expression": "9**9**9**9"}, "Error: result too large"),
        ("calculate", {"expression": "(2**3)(1)"}, "Error: 'int' object is not callable"),
    ],
)
def test_fixed_observations(env: AirlineEnv, tool: str, args: dict, observation: str) -> None:
    assert env.execute(tool, args) == observation


def test_list_all_airports_in_tau_bench_order(env: AirlineEnv) -> None:
    airports = json.loads(env.execute("list_all_airports", {}))
    assert list(airports)[:3] == ["SFO", "JFK", "LAX"] and len(airports) == 20


def test_search_direct_merges_the_date_and_skips_unavailable(env: AirlineEnv) -> None:
    found = json.loads(
        env.execute(
            "search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}
        )
    )
    assert [f["flight_number"] for f in found] == ["HAT001"]
    assert "dates" not in found[0] and found[0]["status"] == "available"
    assert found[0]["prices"]["economy"] == 100
    none = env.execute(
        "search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-10"}
    )
    assert none == "[]"


def test_search_onestop_pairs_legs(env: AirlineEnv) -> None:
    found = json.loads(
        env.execute(
            "search_onestop_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}
        )
    )
    assert [[leg["flight_number"] for leg in pair] for pair in found] == [["HAT003", "HAT004"]]
    assert [leg["date"] for leg in found[0]] == ["2024-05-20", "2024-05-20"]


def test_search_onestop_keeps_tau_bench_next_day_quirks(env: AirlineEnv) -> None:
    # HAT005 lands after midnight, so the second leg is looked up on tau-bench's next day,
    # f"2024-05-{day + 1}" without zero padding: "2024-05-6", which HAT006 does not have.
    found = json.loads(
        env.execute(
            "search_onestop_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-05"}
        )
    )
    assert found == []
    # From "2024-05-04" the next day is "2024-05-5", which HAT006 has; the second leg's
    # details are then read from the *first* leg's date, which HAT006 lacks.
    state = make_state()
    state["flights"]["HAT005"]["dates"]["2024-05-04"] = _open()
    observation = AirlineEnv(state).execute(
        "search_onestop_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-04"}
    )
    assert observation == "Error: '2024-05-04'"


# --- writes ----------------------------------------------------------------------------------


def test_book_reservation_prices_pays_and_assigns_ids(env: AirlineEnv) -> None:
    args = booking(
        passengers=[{"first_name": "A", "last_name": "B", "dob": "2000-01-01"}] * 2,
        payment_methods=[
            {"payment_id": "certificate_1", "amount": 100},
            {"payment_id": "gift_card_1", "amount": 200},
            {"payment_id": "credit_card_1", "amount": 10},
        ],
        insurance="yes",
        nonfree_baggages=1,
        total_baggages=3,
    )
    result = json.loads(env.execute("book_reservation", args))
    # 2 x 100 + 2 x 30 insurance + 50 bag = 310
    assert result["reservation_id"] == "HATHAT"
    assert result["created_at"] == "2024-05-15T15:00:00"
    assert result["flights"] == [
        {
            "flight_number": "HAT001",
            "date": "2024-05-20",
            "price": 100,
            "origin": "JFK",
            "destination": "SEA",
        }
    ]
    user = env.state["users"]["ada_lee_1"]
    assert "certificate_1" not in user["payment_methods"]
    assert user["payment_methods"]["gift_card_1"]["amount"] == 300
    assert user["reservations"] == ["RES001", "HATHAT"]
    assert env.state["reservations"]["HATHAT"] == result
    # seats are not taken (tau-bench does not update inventory)
    assert env.state["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["economy"] == 5
    ids = [
        json.loads(env.execute("book_reservation", booking()))["reservation_id"] for _ in range(3)
    ]
    assert ids == ["HATHAU", "HATHAV", "HATHAV"]


@pytest.mark.parametrize(
    ("over", "observation"),
    [
        ({"user_id": "nobody"}, "Error: user not found"),
        (
            {"flights": [{"flight_number": "HAT999", "date": "2024-05-20"}]},
            "Error: flight HAT999 not found",
        ),
        (
            {"flights": [{"flight_number": "HAT001", "date": "2024-06-01"}]},
            "Error: flight HAT001 not found on date 2024-06-01",
        ),
        (
            {"flights": [{"flight_number": "HAT001", "date": "2024-05-10"}]},
            "Error: flight HAT001 not available on date 2024-05-10",
        ),
        (
            {
                "flights": [{"flight_number": "HAT001", "date": "2024-05-21"}],
                "passengers": [{"first_name": "A", "last_name": "B", "dob": "2000-01-01"}] * 2,
            },
            "Error: not enough seats on flight HAT001",
        ),
        (
            {"payment_methods": [{"payment_id": "credit_card_9", "amount": 100}]},
            "Error: payment method credit_card_9 not found",
        ),
        (
            {"payment_methods": [{"payment_id": "certificate_1", "amount": 101}]},
            "Error: not enough balance in payment method certificate_1",
        ),
        (
            {"payment_methods": [{"payment_id": "credit_card_1", "amount": 99}]},
            "Error: payment amount does not add up, total price is 100, but paid 99",
        ),
    ],
)
def test_book_reservation_refusals_change_nothing(
    env: AirlineEnv, over: dict, observation: str
) -> None:
    before = copy.deepcopy(env.state)
    assert env.execute("book_reservation", booking(**over)) == observation
    assert env.state == before


def test_book_with_a_certificate_listed_twice_fails_half_way_like_tau_bench(
    env: AirlineEnv,
) -> None:
    twice = [{"payment_id": "certificate_1", "amount": 50}] * 2
    assert env.execute("book_reservation", booking(payment_methods=twice)) == (
        "Error: 'certificate_1'"
    )
    assert "certificate_1" not in env.state["users"]["ada_lee_1"]["payment_methods"]
    assert "HATHAT" not in env.state["reservations"]


def test_cancel_refunds_every_payment(env: AirlineEnv) -> None:
    result = json.loads(env.execute("cancel_reservation", {"reservation_id": "RES001"}))
    assert result["status"] == "cancelled"
    assert result["payment_history"] == [
        {"payment_id": "credit_card_1", "amount": 100},
        {"payment_id": "credit_card_1", "amount": -100},
    ]


def test_update_baggages(env: AirlineEnv) -> None:
    args = {
        "reservation_id": "RES001",
        "total_baggages": 3,
        "nonfree_baggages": 2,
        "payment_id": "gift_card_1",
    }
    result = json.loads(env.execute("update_reservation_baggages", args))
    assert result["payment_history"][-1] == {"payment_id": "gift_card_1", "amount": 100}
    assert env.state["users"]["ada_lee_1"]["payment_methods"]["gift_card_1"]["amount"] == 400
    fewer = json.loads(env.execute("update_reservation_baggages", {**args, "nonfree_baggages": 1}))
    assert len(fewer["payment_history"]) == 2  # no charge, no entry
    assert env.execute("update_reservation_baggages", {**args, "payment_id": "certificate_1"}) == (
        "Error: certificate cannot be used to update reservation"
    )
    big = {**args, "nonfree_baggages": 20}
    assert (
        env.execute("update_reservation_baggages", big) == "Error: gift card balance is not enough"
    )
    assert env.execute("update_reservation_baggages", {**args, "payment_id": "x"}) == (
        "Error: payment method not found"
    )


def test_update_flights_charges_the_difference(env: AirlineEnv) -> None:
    change = {
        "reservation_id": "RES001",
        "cabin": "business",
        "payment_id": "gift_card_1",
        "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}],
    }
    result = json.loads(env.execute("update_reservation_flights", change))
    assert result["flights"][0]["price"] == 300
    assert result["payment_history"][-1] == {"payment_id": "gift_card_1", "amount": 200}
    assert result["cabin"] == "economy"  # tau-bench does not store the new cabin
    assert env.state["users"]["ada_lee_1"]["payment_methods"]["gift_card_1"]["amount"] == 300


def test_update_flights_keeps_price_of_unchanged_segments(env: AirlineEnv) -> None:
    env.state["flights"]["HAT001"]["dates"]["2024-05-20"]["prices"]["economy"] = 999
    keep = {
        "reservation_id": "RES001",
        "cabin": "economy",
        "payment_id": "credit_card_1",
        "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}],
    }
    result = json.loads(env.execute("update_reservation_flights", keep))
    assert result["flights"][0]["price"] == 100 and len(result["payment_history"]) == 1
    cheaper = {**keep, "flights": [{"flight_number": "HAT003", "date": "2024-05-20"}]}
    result = json.loads(env.execute("update_reservation_flights", cheaper))
    assert result["payment_history"][-1] == {"payment_id": "credit_card_1", "amount": -20}


def test_update_passengers_needs_the_same_count(env: AirlineEnv) -> None:
    two = [{"first_name": "A", "last_name": "B", "dob": "2000-01-01"}] * 2
    assert env.execute(
        "update_reservation_passengers", {"reservation_id": "RES001", "passengers": two}
    ) == ("Error: number of passengers does not match")
    result = json.loads(
        env.execute(
            "update_reservation_passengers", {"reservation_id": "RES001", "passengers": two[:1]}
        )
    )
    assert result["passengers"] == two[:1]


def test_send_certificate_uses_three_fixed_ids(env: AirlineEnv) -> None:
    observations = [
        env.execute("send_certificate", {"user_id": "ada_lee_1", "amount": 50}) for _ in range(4)
    ]
    assert (
        observations[0] == "Certificate certificate_3221322 added to user ada_lee_1 with amount 50."
    )
    assert observations[2].startswith("Certificate certificate_3221324")
    assert observations[3].startswith("Error: ")


# --- the dispatcher: malformed calls are observations -------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "observation"),
    [
        ("fly_me", {}, "Error: unknown tool 'fly_me'"),
        (["fly_me"], {}, "Error: unknown tool ['fly_me']"),
        (
            "get_user_details",
            ["ada_lee_1"],
            "Error: arguments of get_user_details must be a JSON object, not list",
        ),
        (
            "get_user_details",
            {},
            "Error: missing required argument 'user_id' for get_user_details "
            "(get_user_details takes 'user_id')",
        ),
        (
            "get_user_details",
            {"user_id": "a", "extra": 1},
            "Error: unexpected argument 'extra' for get_user_details "
            "(get_user_details takes 'user_id')",
        ),
        (
            "search_onestop_flight",
            {"origin": "JFK"},
            "Error: missing required arguments 'destination', 'date' for search_onestop_flight "
            "(search_onestop_flight takes 'origin', 'destination', 'date')",
        ),
        (
            "get_user_details",
            {"user_id": "a", "data": {}},
            "Error: unexpected argument 'data' for get_user_details "
            "(get_user_details takes 'user_id')",
        ),
        (
            "get_user_details",
            {"user_id": 5},
            "Error: invalid argument user_id for get_user_details: 5 is not of type 'string'",
        ),
        (
            "book_reservation",
            booking(cabin="first"),
            "Error: invalid argument cabin for book_reservation: 'first' is not one of "
            "['basic_economy', 'economy', 'business']",
        ),
        (
            "book_reservation",
            booking(flights=[{"flight_number": "HAT001"}]),
            "Error: invalid argument flights[0] for book_reservation: "
            "'date' is a required property",
        ),
        (
            "get_user_details",
            {"user_id": {1, 2}},
            "Error: arguments of get_user_details are not "
            "JSON: Object of type set is not JSON serializable",
        ),
    ],
)
def test_malformed_calls_are_error_observations(
    env: AirlineEnv, tool: Any, args: Any, observation: str
) -> None:
    before = copy.deepcopy(env.state)
    assert env.execute(tool, args) == observation
    assert env.state == before


def test_without_validation_wrong_types_behave_as_in_tau_bench() -> None:
    raw = AirlineEnv(make_state(), validate_arguments=False)
    args = {
        "reservation_id": "RES001",
        "total_baggages": 1,
        "nonfree_baggages": "2",
        "payment_id": "credit_card_1",
    }
    assert raw.execute("update_reservation_baggages", args) == (
        "Error: unsupported operand type(s) for -: 'str' and 'int'"
    )
    assert raw.execute("get_user_details", {"user_id": ["x"]}) == "Error: unhashable type: 'list'"
    stored = json.loads(
        raw.execute(
            "update_reservation_baggages", {**args, "nonfree_baggages": 0, "total_baggages": "lots"}
        )
    )
    assert stored["total_baggages"] == "lots"


def test_arguments_are_detached_from_the_caller(env: AirlineEnv) -> None:
    passengers = [{"first_name": "X", "last_name": "Y", "dob": "2000-01-01"}]
    env.execute(
        "update_reservation_passengers", {"reservation_id": "RES001", "passengers": passengers}
    )
    passengers[0]["first_name"] = "changed"
    assert env.state["reservations"]["RES001"]["passengers"][0]["first_name"] == "X"


ARG_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.text(max_size=6)
    | st.sampled_from(["ada_lee_1", "RES001", "HAT001", "2024-05-20", "gift_card_1", "economy"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["flight_number", "date", "payment_id", "amount", "first_name"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=8,
)


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from([*TOOLS, "nope"]))
    keys = [*PARAMETERS.get(name, {}).get("properties", {}), "data", "zzz"]
    args = draw(st.dictionaries(st.sampled_from(keys), ARG_VALUES, max_size=len(keys)))
    return name, args


@settings(max_examples=100, deadline=None)
@given(st.lists(calls(), min_size=1, max_size=4), st.booleans())
def test_execute_never_raises_and_keeps_state_json(
    sequence: list[tuple[str, dict[str, Any]]], validate: bool
) -> None:
    env = AirlineEnv(make_state(), validate_arguments=validate)
    for name, args in sequence:
        assert isinstance(env.execute(name, args), str)
    json.dumps(env.state)


# --- forks are independent, and cheap ---------------------------------------------------------


def test_copy_on_write_forks() -> None:
    base = AirlineEnv(make_state())
    pristine = copy.deepcopy(base.state)
    fork = base.copy()
    fork.execute("cancel_reservation", {"reservation_id": "RES001"})
    fork.execute(
        "book_reservation", booking(payment_methods=[{"payment_id": "gift_card_1", "amount": 100}])
    )
    assert base.state == pristine
    assert fork.state["flights"]["HAT001"] is base.state["flights"]["HAT001"]  # untouched: shared
    assert fork.state["users"]["ada_lee_1"] is not base.state["users"]["ada_lee_1"]
    # writes on the original after forking do not leak into the fork either
    snapshot = copy.deepcopy(fork.state)
    grandchild = fork.copy()
    base.execute("send_certificate", {"user_id": "ada_lee_1", "amount": 10})
    fork.execute("send_certificate", {"user_id": "ada_lee_1", "amount": 20})
    assert grandchild.state == snapshot
    assert (
        base.state["users"]["ada_lee_1"]["payment_methods"]["certificate_3221322"]["amount"] == 10
    )


# --- construction and registry -----------------------------------------------------------------


def test_registry_builds_airline_worlds(tmp_path: Path) -> None:
    assert "airline" in available_domains()
    env = get_environment("airline", seed=3, n_users=4, n_flights=5, n_reservations=6)
    assert isinstance(env, Environment)
    assert env.tool_names == tuple(TOOLS) and len(env.tool_names) == 14
    assert set(WRITE_TOOLS) < set(env.tool_names)
    assert get_environment("airline", state=make_state()).state == make_state()
    known = ", ".join(available_domains())
    with pytest.raises(ConfigError, match=rf"unknown domain 'hotel'; known domains: {known} \("):
        get_environment("hotel")
    with pytest.raises(ConfigError, match="already registered"):
        register_environment("airline", AirlineEnv.create)
    with pytest.raises(ConfigError, match="at most one"):
        get_environment("airline", seed=1, state=make_state())
    with pytest.raises(ConfigError, match=r"users\.json"):
        AirlineEnv.from_dir(tmp_path)
    with pytest.raises(ConfigError, match="lacks table"):
        AirlineEnv({"users": {}})


def test_from_dir_keeps_the_raw_state(taubench_dir: Path) -> None:
    env = AirlineEnv.from_dir(taubench_dir)
    raw = json.loads((taubench_dir / "users.json").read_text(encoding="utf-8"))
    assert env.state["users"] == raw
    assert len(env.state["reservations"]) == 2000
