"""The airline's answers on the development server: short episodes executed on a state.

Why: a grounded amplification prompt (``prompts/amplify_grounded.j2``) lists
real entities, and the factory replays every call of the answer on the full
world (``factory.envsim.grounding``). The devserver (``factory.devserver.grounded``)
therefore asks the domain to play a short, policy-shaped episode about the
scenario's user - identify the user, read, confirm, write - and *executes*
each call on a copy of the scenario: the observations are the real ones, and
because a scenario holds everything those calls read
(``factory.envs.airline.scenarios``), replaying the answer on the world
matches call for call. The reference still steers the plot: a reference that
cancels gets a cancellation when the state allows one.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Collection
from copy import deepcopy
from typing import Any

from factory.envs.airline import TABLES, AirlineEnv
from factory.envs.airline.lookups import FREE_BAGS, active_reservations, city, started
from factory.envs.airline.scenarios import BOOKING_WINDOW
from factory.envs.scripted import ScriptedEpisode, choose_plot, read_tables
from factory.errors import ConfigError

__all__ = [
    "ID_KEYS",
    "OBSERVATION_ENUMS",
    "PLACES",
    "PLOTS",
    "SOURCE_ONLY_PLACES",
    "grounded_trajectory",
    "read_state",
]

#: Episodes the devserver can play, and the reference tool that asks for each.
PLOTS: dict[str, str | None] = {
    "cancel": "cancel_reservation",
    "baggage": "update_reservation_baggages",
    "book": "book_reservation",
    "status": "get_reservation_details",
    "profile": None,
}
_DAY_BEFORE = "2024-05-14T15:00:00"  # bookings made after this are within 24 hours of NOW
#: Enum values a drifting simulator swaps among (the devserver's ``wrong_observation``).
OBSERVATION_ENUMS: dict[str, tuple[str, ...]] = {
    "status": ("available", "cancelled", "landed", "delayed", "on time"),
    "membership": ("regular", "silver", "gold"),
    "cabin": ("basic_economy", "economy", "business"),
    "insurance": ("yes", "no"),
    "flight_type": ("one_way", "round_trip"),
}
_GREETINGS = ("Hi!", "Hello.", "Hey there,", "Good afternoon.", "Hi,")

#: Airport code -> city, the places a renamed reference flies between; one code per city
#: so a city always renames with its code.
PLACES: dict[str, str] = {
    "ATL": "Atlanta", "BOS": "Boston", "CLT": "Charlotte", "DEN": "Denver", "DFW": "Dallas",
    "DTW": "Detroit", "EWR": "Newark", "IAH": "Houston", "JFK": "New York", "LAS": "Las Vegas",
    "LAX": "Los Angeles", "MCO": "Orlando", "MIA": "Miami", "MSP": "Minneapolis",
    "ORD": "Chicago", "PHL": "Philadelphia", "PHX": "Phoenix", "SEA": "Seattle",
    "SFO": "San Francisco",
}  # fmt: skip
SOURCE_ONLY_PLACES = {"LGA": "New York"}  # renamed when seen, never chosen as a target
#: JSON keys whose values are ids (the devserver renames them, keeping their shape).
ID_KEYS = frozenset({"reservations", "flight_number", "flight_numbers"})

State = dict[str, Any]


def read_state(value: Any) -> State | None:
    """``value`` if it is an airline state with users (a prompt's environment block), else None."""
    return read_tables(value, TABLES)


# --------------------------------------------------------------------------------------
# The episode
# --------------------------------------------------------------------------------------
class _Episode(ScriptedEpisode):
    """An airline conversation: the user gives their id, the agent reads the profile."""

    YES = ("Yes, please.", "Yes.", "Yes, go ahead.", "Sounds good, yes.")
    FAREWELL = "You're welcome! Have a good trip."

    def open(self, request: str) -> None:
        self.say_user(f"{self.pick(_GREETINGS)} {request} My user id is {self.user_id}.")
        self.call(
            "get_user_details",
            {"user_id": self.user_id},
            "The user gave their user id; look up the profile before anything else.",
        )


def _payer(user: dict[str, Any], cost: int) -> str | None:
    """A credit card, else a gift card that covers ``cost``."""
    methods = user.get("payment_methods") or {}
    cards = sorted(p for p, m in methods.items() if m.get("source") == "credit_card")
    gifts = sorted(
        p
        for p, m in methods.items()
        if m.get("source") == "gift_card" and isinstance(m.get("amount"), (int, float))
        if m["amount"] >= cost
    )
    return (cards or gifts or [None])[0]


def _legs(reservation: dict[str, Any]) -> str:
    return ", ".join(
        f"{leg.get('flight_number')} on {leg.get('date')}" for leg in reservation.get("flights", [])
    )


def _bookable(state: State) -> list[tuple[str, str, str, int]]:
    """(flight, date, cabin, price) with a free seat on a date of the booking window."""
    low, high = BOOKING_WINDOW
    out = []
    for number, flight in state["flights"].items():
        for day, on_date in (flight.get("dates") or {}).items():
            if not (low <= day <= high) or on_date.get("status") != "available":
                continue
            for cabin, seats in (on_date.get("available_seats") or {}).items():
                price = (on_date.get("prices") or {}).get(cabin)
                if isinstance(seats, int) and seats > 0 and isinstance(price, int):
                    out.append((number, day, cabin, price))
    return out


# --- plots ------------------------------------------------------------------------------
def _profile(ep: _Episode) -> None:
    ep.open(ep.pick(("What does my account look like?", "Which payment methods do I have?")))
    user = ep.user
    methods = ", ".join(sorted(user.get("payment_methods") or {})) or "none"
    ep.close(
        f"You are a {user.get('membership', 'regular')} member with "
        f"{len(user.get('reservations') or [])} reservation(s); payment methods on file: {methods}."
    )


def _status(ep: _Episode) -> None:
    reservation = ep.rng.choice(list(ep.env.state["reservations"].values()))
    rid = reservation["reservation_id"]
    ep.open(f"Can you tell me the details of my reservation {rid}?")
    observation = ep.call(
        "get_reservation_details",
        {"reservation_id": rid},
        f"The user owns {rid}; read it to answer.",
    )
    found = json.loads(observation)
    ep.close(
        f"Reservation {rid} is a {found['flight_type'].replace('_', '-')} trip from "
        f"{city(found['origin'])} to {city(found['destination'])} in {found['cabin']}: "
        f"{_legs(found)}, with {len(found['passengers'])} passenger(s) and "
        f"{found['total_baggages']} checked bag(s)."
    )


def _cancel(ep: _Episode) -> None:
    state = ep.env.state
    reservation = ep.rng.choice(active_reservations(state, ep.user_id))
    rid = reservation["reservation_id"]
    reason = ep.pick(("my plans changed", "I have a schedule conflict", "I am sick"))
    ep.open(f"I need to cancel reservation {rid} because {reason}.")
    ep.call(
        "get_reservation_details",
        {"reservation_id": rid},
        f"Check {rid} before deciding whether it can be cancelled.",
    )
    allowed = not started(state, reservation, unknown_departed=False) and (
        str(reservation.get("created_at", "")) >= _DAY_BEFORE
        or reservation.get("cabin") == "business"
        or reservation.get("insurance") == "yes"
    )
    if not allowed:
        ep.close(
            f"I'm sorry, but reservation {rid} cannot be cancelled: it was booked more than "
            "24 hours ago, is not in business class and has no travel insurance (or a flight "
            "has already departed). I can help you change it instead."
        )
        return
    paid = sum(p.get("amount", 0) for p in reservation.get("payment_history", []))
    ep.confirm(f"I can cancel {rid} ({_legs(reservation)}); ${paid} goes back to the payer.")
    ep.call("cancel_reservation", {"reservation_id": rid}, "The user confirmed; cancel it.")
    ep.close(
        f"Reservation {rid} is cancelled. The refund of ${paid} reaches the original payment "
        "method within 5 to 7 business days."
    )


def _baggage_plan(ep: _Episode, added: int) -> tuple[dict[str, Any], int, int, int, str] | None:
    """(reservation, new total, new non-free count, cost, payer) of adding ``added`` bags."""
    user = ep.user
    for reservation in active_reservations(ep.env.state, ep.user_id):
        total = int(reservation.get("total_baggages", 0)) + added
        nonfree = int(reservation.get("nonfree_baggages", 0))
        allowance = FREE_BAGS.get(str(user.get("membership")), FREE_BAGS["regular"])
        free = allowance.get(str(reservation.get("cabin")), 0) * len(
            reservation.get("passengers", [])
        )
        new_nonfree = max(nonfree, total - free)
        cost = 50 * (new_nonfree - nonfree)
        payer = _payer(user, cost)
        if payer is not None:
            return reservation, total, new_nonfree, cost, payer
    return None


def _baggage(ep: _Episode) -> None:
    plan = _baggage_plan(ep, ep.rng.choice((1, 2))) or _baggage_plan(ep, 1)
    assert plan is not None  # _feasible checked it
    reservation, total, nonfree, cost, payer = plan
    rid = reservation["reservation_id"]
    extra = total - int(reservation.get("total_baggages", 0))
    ep.open(f"I'd like to add {extra} checked bag(s) to reservation {rid}.")
    ep.call(
        "get_reservation_details",
        {"reservation_id": rid},
        f"Read {rid} to work out the free allowance.",
    )
    ep.confirm(
        f"That makes {total} checked bags, {nonfree} of them non-free; the change costs ${cost}, "
        f"charged to {payer}."
    )
    arguments = {
        "reservation_id": rid,
        "total_baggages": total,
        "nonfree_baggages": nonfree,
        "payment_id": payer,
    }
    ep.call("update_reservation_baggages", arguments, "Confirmed; update the bags.")
    ep.close(f"Done: reservation {rid} now has {total} checked bags.")


def _book(ep: _Episode) -> None:
    user = ep.user
    options = [o for o in _bookable(ep.env.state) if _payer(user, o[3]) is not None]
    number, day, cabin, price = ep.rng.choice(options)
    flight = ep.env.state["flights"][number]
    origin, destination = flight["origin"], flight["destination"]
    ep.open(f"I want to fly from {city(origin)} to {city(destination)} on {day}.")
    found = json.loads(
        ep.call(
            "search_direct_flight",
            {"origin": origin, "destination": destination, "date": day},
            "Search direct flights on the route and date the user asked for.",
        )
    )
    listing = "; ".join(
        f"{f['flight_number']} at {f['scheduled_departure_time_est']}" for f in found
    )
    ep.say(f"I found these direct flights: {listing}. Which one, and in which cabin?")
    ep.say_user(f"{number} in {cabin.replace('_', ' ')}, just me, no bags and no insurance.")
    payer = _payer(user, price)
    assert payer is not None
    name = user.get("name") or {}
    passenger = {
        "first_name": name.get("first_name", ""),
        "last_name": name.get("last_name", ""),
        "dob": user.get("dob", ""),
    }
    ep.confirm(
        f"One-way {number} on {day} in {cabin}, for {passenger['first_name']} "
        f"{passenger['last_name']}, no checked bags, no insurance: ${price}, paid with {payer}."
    )
    arguments = {
        "user_id": ep.user_id,
        "origin": origin,
        "destination": destination,
        "flight_type": "one_way",
        "cabin": cabin,
        "flights": [{"flight_number": number, "date": day}],
        "passengers": [passenger],
        "payment_methods": [{"payment_id": payer, "amount": price}],
        "total_baggages": 0,
        "nonfree_baggages": 0,
        "insurance": "no",
    }
    booked = ep.call("book_reservation", arguments, "The user confirmed; book it.")
    rid = json.loads(booked).get("reservation_id") if booked.startswith("{") else None
    ep.close(f"You are booked: reservation {rid}, {number} on {day}.")


_PLAYERS: dict[str, Callable[[_Episode], None]] = {
    "cancel": _cancel,
    "baggage": _baggage,
    "book": _book,
    "status": _status,
    "profile": _profile,
}


def _feasible(ep: _Episode, plot: str) -> bool:
    state = ep.env.state
    if plot == "status":
        return bool(state["reservations"])
    if plot == "cancel":
        return bool(active_reservations(state, ep.user_id))
    if plot == "baggage":
        return _baggage_plan(ep, 1) is not None
    if plot == "book":
        return any(_payer(ep.user, o[3]) is not None for o in _bookable(state))
    return True


def grounded_trajectory(
    scenario: State, rng: random.Random, *, reference_tools: Collection[str] = ()
) -> dict[str, Any] | None:
    """A conversation about the scenario's user whose every call was executed on the scenario.

    Args:
        scenario: an airline state (the prompt's environment block); not modified.
        rng: the request's content random source.
        reference_tools: tools the reference calls; the first plot they ask for
            that the state allows is played, else a random feasible one.

    Returns:
        ``{"messages": [...]}`` in the amplification output format, or None when
        ``scenario`` is not an airline state with a valid user.
    """
    try:
        env = AirlineEnv(deepcopy(scenario))
    except ConfigError:
        return None
    user_id = next(iter(scenario["users"]))
    if not isinstance(user_id, str):
        return None
    ep = _Episode(env, rng, user_id)
    try:
        _PLAYERS[choose_plot(PLOTS, lambda p: _feasible(ep, p), rng, reference_tools)](ep)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a state that is airline-shaped but not consistent enough to play
    return {"messages": ep.messages}
