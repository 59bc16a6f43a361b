"""State slices: the part of an airline world one action reads or writes.

Why: a step sample (state before, action, observation, Δ) must carry
kilobytes, not the 5 MB database, and a model asked to predict an
observation or a Δ should see exactly the objects that decide it. A slice is
a state of the same schema (``{"users", "flights", "reservations"}``) holding
only:

* the user an action names, or the owner of the reservation it names;
* that reservation;
* the flights it books, changes, or searches (a direct search: the flights of
  that route; a one-stop search: every flight leaving the origin and every
  flight reaching the destination from one of their arrival airports), and
  the flights of the named reservation; each flight keeps only the ``dates``
  the action looks up (a search's date, the next day for overnight first legs,
  the booked dates);
* the existing reservations among the ids a booking would take (``HATHAT`` ...),
  since they decide which id the booking gets.

The guarantee (tested on every step of the 200 recorded trajectories and on
generated worlds): running the action on its slice gives the same observation
as on the full state, and the slice after the run equals
``project(full_state_after, like=slice_after)`` (which includes objects the
action created). It holds for well-formed states; slices are independent deep
copies, so running on them never touches the world they came from.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import suppress
from copy import deepcopy
from typing import Any

from factory.envs.airline.tools import NEW_RESERVATION_IDS, next_day
from factory.envs.slicing import project_like, trim

__all__ = ["TABLES", "TRIMMED", "empty_slice", "project", "slice_for", "trim"]

TABLES = ("users", "flights", "reservations")
#: Per table, the mapping field a slice may trim to the keys an action reads.
TRIMMED = {"flights": "dates"}

_USER_TOOLS = frozenset({"get_user_details", "send_certificate", "book_reservation"})
_RESERVATION_TOOLS = frozenset(
    {
        "get_reservation_details",
        "cancel_reservation",
        "update_reservation_baggages",
        "update_reservation_flights",
        "update_reservation_passengers",
    }
)


def empty_slice() -> dict[str, Any]:
    return {table: {} for table in TABLES}


class _Picker:
    """Collects the ids (and flight dates) an action touches."""

    def __init__(self, state: dict[str, Any]):
        self.state = state
        self.users: list[str] = []
        self.reservations: list[str] = []
        self.flight_dates: dict[str, set[str]] = {}

    def user(self, user_id: Any) -> None:
        known = isinstance(user_id, str) and user_id in self.state["users"]
        if known and user_id not in self.users:
            self.users.append(user_id)

    def reservation(self, reservation_id: Any) -> dict[str, Any] | None:
        if not (isinstance(reservation_id, str) and reservation_id in self.state["reservations"]):
            return None
        if reservation_id not in self.reservations:
            self.reservations.append(reservation_id)
        found: dict[str, Any] = self.state["reservations"][reservation_id]
        return found

    def flight(self, number: Any, *dates: Any) -> None:
        if isinstance(number, str) and number in self.state["flights"]:
            self.flight_dates.setdefault(number, set()).update(
                d for d in dates if isinstance(d, str)
            )

    def legs(self, legs: Any) -> None:
        for leg in _dicts(legs):
            self.flight(leg.get("flight_number"), leg.get("date"))


def _dicts(value: Any) -> Iterable[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _pick_reservation_action(pick: _Picker, tool_name: str, arguments: dict[str, Any]) -> None:
    reservation = pick.reservation(arguments.get("reservation_id"))
    if reservation is None:
        return
    pick.user(reservation.get("user_id"))
    pick.legs(reservation.get("flights"))
    if tool_name == "update_reservation_flights":
        pick.legs(arguments.get("flights"))


def _pick_search(pick: _Picker, tool_name: str, arguments: dict[str, Any]) -> None:
    origin, destination, date = (arguments.get(k) for k in ("origin", "destination", "date"))
    flights = pick.state["flights"].values()
    if tool_name == "search_direct_flight":
        for f in flights:
            if f.get("origin") == origin and f.get("destination") == destination:
                pick.flight(f.get("flight_number"), date)
        return
    firsts = [f for f in flights if f.get("origin") == origin]
    for f in firsts:
        pick.flight(f.get("flight_number"), date)
    # Per connecting airport: the second-leg dates its first legs can ask for.
    wanted: dict[str, set[str]] = {}
    for f in firsts:
        dates = wanted.setdefault(str(f.get("destination")), set())
        if isinstance(date, str):
            dates.add(date)
            if "+1" in str(f.get("scheduled_arrival_time_est", "")):
                # A date without a numeric day fails the search on this pair, slice or not.
                with suppress(ValueError):
                    dates.add(next_day(date))
    for f in flights:
        if f.get("destination") == destination and str(f.get("origin")) in wanted:
            pick.flight(f.get("flight_number"), *wanted[str(f.get("origin"))])


def slice_for(state: dict[str, Any], tool_name: str, arguments: Any) -> dict[str, Any]:
    """The part of ``state`` that ``tool_name(**arguments)`` reads or writes.

    Args:
        state: a full airline state (tau-bench layout).
        tool_name: any name; tools that read no state (and unknown ones) give an
            empty slice.
        arguments: the call's arguments; malformed values select nothing.

    Returns:
        A deep-copied state of the same schema; flights keep their order from
        ``state`` (searches return results in that order).
    """
    pick = _Picker(state)
    args = arguments if isinstance(arguments, dict) else {}
    if tool_name in _USER_TOOLS:
        pick.user(args.get("user_id"))
        if tool_name == "book_reservation":
            pick.legs(args.get("flights"))
            for rid in NEW_RESERVATION_IDS:
                pick.reservation(rid)
    elif tool_name in _RESERVATION_TOOLS:
        _pick_reservation_action(pick, tool_name, args)
    elif tool_name in ("search_direct_flight", "search_onestop_flight"):
        _pick_search(pick, tool_name, args)
    return {
        "users": {uid: deepcopy(state["users"][uid]) for uid in pick.users},
        "flights": {
            number: trim(flight, "dates", pick.flight_dates[number])
            for number, flight in state["flights"].items()
            if number in pick.flight_dates
        },
        "reservations": {rid: deepcopy(state["reservations"][rid]) for rid in pick.reservations},
    }


def project(state: dict[str, Any], like: dict[str, Any]) -> dict[str, Any]:
    """The objects of ``state`` that ``like`` (a slice) holds, trimmed the same way.

    Pass the slice *after* running an action on it to include what the action
    created (a new reservation); ids of ``like`` missing from ``state`` are
    left out.

    Returns:
        A deep-copied state with ``like``'s tables and ids (and, for flights,
        ``like``'s dates).
    """
    return project_like(state, like, TRIMMED)
