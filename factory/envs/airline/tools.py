"""The 14 tau-bench airline tools, as plain functions over the state dict.

Why reimplement instead of depending on tau-bench: the factory must run and
fork thousands of worlds without tau-bench's user simulator or LLM clients,
and must know which objects a call may write (copy-on-write forks, slices).
The semantics are tau-bench's, statement order included, because the order
decides which error a malformed call hits and how much it changed before
failing; ``tests/envs/airline/test_env.py`` replays the 1,164 recorded GPT-4o
observations to hold us to that.

Conventions kept from tau-bench (``tau_bench/envs/airline/tools/*.py``):

* each tool takes ``data`` (the state) first and returns the observation text;
  successful writes return ``json.dumps`` of the object they changed;
* a refusal is an exception whose text becomes ``"Error: <text>"`` (tau-bench
  returns those strings; the env's dispatcher produces the same bytes);
* new reservation ids are ``HATHAT``, ``HATHAU``, ``HATHAV`` (first free one)
  and new certificates ``certificate_3221322`` .. ``certificate_3221324``;
  ``created_at`` of a booking is the domain's "now", ``2024-05-15T15:00:00``;
* quirks are kept on purpose: a missing reservation in
  ``get_reservation_details`` reports ``user not found``; the one-stop search
  builds the next day as ``2024-05-{day+1}`` (no zero padding) and fills in the
  second leg's details from its entry for the *first* leg's date.

Deliberate departures, where tau-bench has no usable answer:
``send_certificate`` with all three certificate ids taken returns an error
(tau-bench returns ``None``, which its ``EnvResponse`` rejects), and
``calculate`` refuses ``**`` chains whose result would exceed about a million
bits (tau-bench would compute for hours, then fail converting to float). And
where its answer names Python internals: a missing or unexpected argument is
reported in the tool's terms (``factory.envs.base.binding_error``), not as
tau-bench's ``SearchDirectFlight.invoke() missing 1 required positional argument``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from copy import deepcopy
from typing import Any

from factory.envs.common_tools import calculate, think, transfer_to_human_agents
from factory.errors import EnvironmentError_

__all__ = [
    "AIRPORTS",
    "NOW",
    "PARAMETERS",
    "READ_ONLY",
    "TOOLS",
    "WRITE_TOOLS",
    "write_targets",
]

NOW = "2024-05-15T15:00:00"
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_CERTIFICATE_IDS = ("certificate_3221322", "certificate_3221323", "certificate_3221324")

#: IATA code -> city, in tau-bench's order (the order of ``list_all_airports``).
AIRPORTS: dict[str, str] = {
    "SFO": "San Francisco",
    "JFK": "New York",
    "LAX": "Los Angeles",
    "ORD": "Chicago",
    "DFW": "Dallas",
    "DEN": "Denver",
    "SEA": "Seattle",
    "ATL": "Atlanta",
    "MIA": "Miami",
    "BOS": "Boston",
    "PHX": "Phoenix",
    "IAH": "Houston",
    "LAS": "Las Vegas",
    "MCO": "Orlando",
    "EWR": "Newark",
    "CLT": "Charlotte",
    "MSP": "Minneapolis",
    "DTW": "Detroit",
    "PHL": "Philadelphia",
    "LGA": "LaGuardia",
}

Table = str
Target = tuple[Table, str]


def _refuse(message: str) -> EnvironmentError_:
    return EnvironmentError_(message)


def _flight_cost(data: dict[str, Any], flight: dict[str, Any], cabin: Any, seats: int) -> int:
    """Check one requested segment is bookable and stamp price/origin/destination on it."""
    flight_number = flight["flight_number"]
    if flight_number not in data["flights"]:
        raise _refuse(f"flight {flight_number} not found")
    flight_data = data["flights"][flight_number]
    if flight["date"] not in flight_data["dates"]:
        raise _refuse(f"flight {flight_number} not found on date {flight['date']}")
    on_date = flight_data["dates"][flight["date"]]
    if on_date["status"] != "available":
        raise _refuse(f"flight {flight_number} not available on date {flight['date']}")
    if on_date["available_seats"][cabin] < seats:
        raise _refuse(f"not enough seats on flight {flight_number}")
    flight["price"] = on_date["prices"][cabin]
    flight["origin"] = flight_data["origin"]
    flight["destination"] = flight_data["destination"]
    cost: int = flight["price"] * seats
    return cost


# --- write tools ------------------------------------------------------------------------


def book_reservation(
    data: dict[str, Any],
    user_id: str,
    origin: str,
    destination: str,
    flight_type: str,
    cabin: str,
    flights: list[dict[str, Any]],
    passengers: list[dict[str, Any]],
    payment_methods: list[dict[str, Any]],
    total_baggages: int,
    nonfree_baggages: int,
    insurance: str,
) -> str:
    reservations, users = data["reservations"], data["users"]
    if user_id not in users:
        raise _refuse("user not found")
    user = users[user_id]
    reservation_id = next((r for r in NEW_RESERVATION_IDS[:-1] if r not in reservations), None)
    reservation_id = reservation_id or NEW_RESERVATION_IDS[-1]
    reservation: dict[str, Any] = {
        "reservation_id": reservation_id,
        "user_id": user_id,
        "origin": origin,
        "destination": destination,
        "flight_type": flight_type,
        "cabin": cabin,
        "flights": deepcopy(flights),
        "passengers": passengers,
        "payment_history": payment_methods,
        "created_at": NOW,
        "total_baggages": total_baggages,
        "nonfree_baggages": nonfree_baggages,
        "insurance": insurance,
    }
    total_price = 0
    for flight in reservation["flights"]:
        total_price += _flight_cost(data, flight, cabin, len(passengers))
    if insurance == "yes":
        total_price += 30 * len(passengers)
    total_price += 50 * nonfree_baggages

    owned = user["payment_methods"]
    for payment in payment_methods:
        payment_id, amount = payment["payment_id"], payment["amount"]
        if payment_id not in owned:
            raise _refuse(f"payment method {payment_id} not found")
        if owned[payment_id]["source"] in ("gift_card", "certificate") and (
            owned[payment_id]["amount"] < amount
        ):
            raise _refuse(f"not enough balance in payment method {payment_id}")
    if sum(p["amount"] for p in payment_methods) != total_price:
        paid = sum(p["amount"] for p in payment_methods)
        raise _refuse(
            f"payment amount does not add up, total price is {total_price}, but paid {paid}"
        )
    for payment in payment_methods:
        payment_id, amount = payment["payment_id"], payment["amount"]
        if owned[payment_id]["source"] == "gift_card":
            owned[payment_id]["amount"] -= amount
        elif owned[payment_id]["source"] == "certificate":
            del owned[payment_id]
    reservations[reservation_id] = reservation
    user["reservations"].append(reservation_id)
    return json.dumps(reservation)


def cancel_reservation(data: dict[str, Any], reservation_id: str) -> str:
    reservations = data["reservations"]
    if reservation_id not in reservations:
        raise _refuse("reservation not found")
    reservation = reservations[reservation_id]
    refunds = [
        {"payment_id": p["payment_id"], "amount": -p["amount"]}
        for p in reservation["payment_history"]
    ]
    reservation["payment_history"].extend(refunds)
    reservation["status"] = "cancelled"
    return json.dumps(reservation)


def _update_payment_method(
    data: dict[str, Any], reservation: dict[str, Any], payment_id: str, total_price: Any
) -> dict[str, Any]:
    """The user's payment method for a reservation change, after tau-bench's checks."""
    methods = data["users"][reservation["user_id"]]["payment_methods"]
    if payment_id not in methods:
        raise _refuse("payment method not found")
    method: dict[str, Any] = methods[payment_id]
    if method["source"] == "certificate":
        raise _refuse("certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < total_price:
        raise _refuse("gift card balance is not enough")
    return method


def update_reservation_baggages(
    data: dict[str, Any],
    reservation_id: str,
    total_baggages: int,
    nonfree_baggages: int,
    payment_id: str,
) -> str:
    reservations = data["reservations"]
    if reservation_id not in reservations:
        raise _refuse("reservation not found")
    reservation = reservations[reservation_id]
    total_price = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
    method = _update_payment_method(data, reservation, payment_id, total_price)
    reservation["total_baggages"] = total_baggages
    reservation["nonfree_baggages"] = nonfree_baggages
    if method["source"] == "gift_card":
        method["amount"] -= total_price
    if total_price != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": total_price})
    return json.dumps(reservation)


def update_reservation_flights(
    data: dict[str, Any],
    reservation_id: str,
    cabin: str,
    flights: list[dict[str, Any]],
    payment_id: str,
) -> str:
    reservations = data["reservations"]
    if reservation_id not in reservations:
        raise _refuse("reservation not found")
    reservation = reservations[reservation_id]
    seats = len(reservation["passengers"])
    total_price = 0
    flights = deepcopy(flights)
    for flight in flights:
        # A segment already booked in the same cabin keeps its original price.
        kept = [
            f
            for f in reservation["flights"]
            if f["flight_number"] == flight["flight_number"]
            and f["date"] == flight["date"]
            and cabin == reservation["cabin"]
        ]
        if kept:
            total_price += kept[0]["price"] * seats
            flight["price"] = kept[0]["price"]
            flight["origin"] = kept[0]["origin"]
            flight["destination"] = kept[0]["destination"]
            continue
        total_price += _flight_cost(data, flight, cabin, seats)
    total_price -= sum(f["price"] for f in reservation["flights"]) * len(reservation["passengers"])
    method = _update_payment_method(data, reservation, payment_id, total_price)
    if method["source"] == "gift_card":
        method["amount"] -= total_price
    reservation["flights"] = flights
    if total_price != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": total_price})
    # Like tau-bench: the flight inventory (seats) is not updated by a change.
    return json.dumps(reservation)


def update_reservation_passengers(
    data: dict[str, Any], reservation_id: str, passengers: list[dict[str, Any]]
) -> str:
    reservations = data["reservations"]
    if reservation_id not in reservations:
        raise _refuse("reservation not found")
    reservation = reservations[reservation_id]
    if len(passengers) != len(reservation["passengers"]):
        raise _refuse("number of passengers does not match")
    reservation["passengers"] = passengers
    return json.dumps(reservation)


def send_certificate(data: dict[str, Any], user_id: str, amount: int) -> str:
    users = data["users"]
    if user_id not in users:
        raise _refuse("user not found")
    user = users[user_id]
    for payment_id in NEW_CERTIFICATE_IDS:
        if payment_id not in user["payment_methods"]:
            user["payment_methods"][payment_id] = {
                "source": "certificate",
                "amount": amount,
                "id": payment_id,
            }
            return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
    raise _refuse(f"user {user_id} already holds the maximum number of new certificates")


# --- read tools ---------------------------------------------------------------------------


def get_user_details(data: dict[str, Any], user_id: str) -> str:
    users = data["users"]
    if user_id in users:
        return json.dumps(users[user_id])
    raise _refuse("user not found")


def get_reservation_details(data: dict[str, Any], reservation_id: str) -> str:
    reservations = data["reservations"]
    if reservation_id in reservations:
        return json.dumps(reservations[reservation_id])
    raise _refuse("user not found")  # sic: tau-bench's message


def _leg(flight: dict[str, Any], on_date: dict[str, Any]) -> dict[str, Any]:
    leg = {k: v for k, v in flight.items() if k != "dates"}
    leg.update(on_date)
    return leg


def search_direct_flight(data: dict[str, Any], origin: str, destination: str, date: str) -> str:
    results = []
    for flight in data["flights"].values():
        if flight["origin"] == origin and flight["destination"] == destination:
            dates = flight["dates"]
            if date in dates and dates[date]["status"] == "available":
                results.append(_leg(flight, dates[date]))
    return json.dumps(results)


def next_day(date: str) -> str:
    """tau-bench's (unpadded, May-only) next day of an overnight first leg."""
    return f"2024-05-{int(date[-2:]) + 1}"


def search_onestop_flight(data: dict[str, Any], origin: str, destination: str, date: str) -> str:
    flights = data["flights"]
    results = []
    for first in flights.values():
        if first["origin"] != origin:
            continue
        for second in flights.values():
            if second["destination"] != destination or first["destination"] != second["origin"]:
                continue
            date2 = next_day(date) if "+1" in first["scheduled_arrival_time_est"] else date
            if first["scheduled_arrival_time_est"] > second["scheduled_departure_time_est"]:
                continue
            if (
                date in first["dates"]
                and date2 in second["dates"]
                and first["dates"][date]["status"] == "available"
                and second["dates"][date2]["status"] == "available"
            ):
                leg1 = _leg(first, first["dates"][date])
                leg1["date"] = date
                leg2 = _leg(second, second["dates"][date])  # sic: date, not date2
                leg2["date"] = date2
                results.append([leg1, leg2])
    return json.dumps(results)


def list_all_airports(data: dict[str, Any]) -> str:
    return json.dumps(AIRPORTS)


# --- registry ---------------------------------------------------------------------------

TOOLS: dict[str, Callable[..., str]] = {
    f.__name__: f
    for f in (
        book_reservation,
        calculate,
        cancel_reservation,
        get_reservation_details,
        get_user_details,
        list_all_airports,
        search_direct_flight,
        search_onestop_flight,
        send_certificate,
        think,
        transfer_to_human_agents,
        update_reservation_baggages,
        update_reservation_flights,
        update_reservation_passengers,
    )
}

WRITE_TOOLS = frozenset(
    {
        "book_reservation",
        "cancel_reservation",
        "send_certificate",
        "update_reservation_baggages",
        "update_reservation_flights",
        "update_reservation_passengers",
    }
)
READ_ONLY = frozenset(TOOLS) - WRITE_TOOLS


def _key(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def write_targets(data: dict[str, Any], name: str, arguments: dict[str, Any]) -> list[Target]:
    """Existing objects (table, id) that the call may modify in place.

    New objects (a booked reservation) are not listed: they are added to the
    table, never written through an existing reference. Read tools return [].
    """
    targets: list[Target] = []
    if name in ("book_reservation", "send_certificate"):
        user_id = _key(arguments.get("user_id"))
        if user_id is not None and user_id in data["users"]:
            targets.append(("users", user_id))
    elif name in WRITE_TOOLS:
        reservation_id = _key(arguments.get("reservation_id"))
        reservation = data["reservations"].get(reservation_id) if reservation_id else None
        if reservation is not None:
            targets.append(("reservations", reservation_id))  # type: ignore[arg-type]
            user_id = _key(reservation.get("user_id"))
            if name != "cancel_reservation" and user_id is not None and user_id in data["users"]:
                targets.append(("users", user_id))
    return targets


# --- argument schemas (types only; tau-bench's get_info() without the prose) -------------


def _obj(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_CABIN = {"type": "string", "enum": ["basic_economy", "economy", "business"]}
_FLIGHTS = {
    "type": "array",
    "items": _obj(["flight_number", "date"], flight_number=_STR, date=_STR),
}
_PASSENGERS = {
    "type": "array",
    "items": _obj(["first_name", "last_name", "dob"], first_name=_STR, last_name=_STR, dob=_STR),
}
_PAYMENTS = {"type": "array", "items": _obj(["payment_id", "amount"], payment_id=_STR, amount=_NUM)}

#: JSON-Schema of each tool's arguments (what ``AirlineEnv`` checks before running a call).
PARAMETERS: dict[str, dict[str, Any]] = {
    "book_reservation": _obj(
        [
            "user_id",
            "origin",
            "destination",
            "flight_type",
            "cabin",
            "flights",
            "passengers",
            "payment_methods",
            "total_baggages",
            "nonfree_baggages",
            "insurance",
        ],
        user_id=_STR,
        origin=_STR,
        destination=_STR,
        flight_type={"type": "string", "enum": ["one_way", "round_trip"]},
        cabin=_CABIN,
        flights=_FLIGHTS,
        passengers=_PASSENGERS,
        payment_methods=_PAYMENTS,
        total_baggages=_INT,
        nonfree_baggages=_INT,
        insurance={"type": "string", "enum": ["yes", "no"]},
    ),
    "calculate": _obj(["expression"], expression=_STR),
    "cancel_reservation": _obj(["reservation_id"], reservation_id=_STR),
    "get_reservation_details": _obj(["reservation_id"], reservation_id=_STR),
    "get_user_details": _obj(["user_id"], user_id=_STR),
    "list_all_airports": _obj([]),
    "search_direct_flight": _obj(
        ["origin", "destination", "date"], origin=_STR, destination=_STR, date=_STR
    ),
    "search_onestop_flight": _obj(
        ["origin", "destination", "date"], origin=_STR, destination=_STR, date=_STR
    ),
    "send_certificate": _obj(["user_id", "amount"], user_id=_STR, amount=_NUM),
    "think": _obj(["thought"], thought=_STR),
    "transfer_to_human_agents": _obj(["summary"], summary=_STR),
    "update_reservation_baggages": _obj(
        ["reservation_id", "total_baggages", "nonfree_baggages", "payment_id"],
        reservation_id=_STR,
        total_baggages=_INT,
        nonfree_baggages=_INT,
        payment_id=_STR,
    ),
    "update_reservation_flights": _obj(
        ["reservation_id", "cabin", "flights", "payment_id"],
        reservation_id=_STR,
        cabin=_CABIN,
        flights=_FLIGHTS,
        payment_id=_STR,
    ),
    "update_reservation_passengers": _obj(
        ["reservation_id", "passengers"], reservation_id=_STR, passengers=_PASSENGERS
    ),
}
