"""The airline's grounding scenarios: the slice of a world one amplification prompt shows.

Why a slice and not the world: the prompt must stay a few KB, yet every call a
model is likely to make about the scenario (read the user, their reservations,
search the routes offered) must answer on the slice exactly as on the world,
so that replaying the answer on the full world (``factory.envsim.grounding``) can
hold the model to it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from copy import deepcopy
from typing import Any

from factory.core.delta import same_json
from factory.envs.base import Environment
from factory.envs.slicing import trim
from factory.errors import ConfigError, short

__all__ = ["BOOKING_WINDOW", "MAX_RESERVATIONS", "OFFERED_ROUTES", "AirlineScenarios"]

#: Dates (inclusive, ISO) on which a scenario offers bookable flights: after the domain's
#: "now" (2024-05-15) and inside the generated worlds' 30 days of May.
BOOKING_WINDOW: tuple[str, str] = ("2024-05-16", "2024-05-30")
MAX_RESERVATIONS = 2  # of the user's reservations shown: keeps a scenario to a few KB
OFFERED_ROUTES = 2  # bookable direct routes shown, each on one date of BOOKING_WINDOW


def _bookable(on_date: Any) -> bool:
    if not isinstance(on_date, dict) or on_date.get("status") != "available":
        return False
    seats = on_date.get("available_seats")
    return isinstance(seats, dict) and any(isinstance(n, int) and n > 0 for n in seats.values())


class AirlineScenarios:
    """Scenarios of one airline world (the plug-in's ``grounding`` part).

    Raises:
        ConfigError: the world has no users.
    """

    def __init__(self, env: Environment):
        self.env = env
        state = env.state
        if not state["users"]:
            raise ConfigError("the grounding world has no users", key_path="world_sizes")
        with_reservations = [
            uid
            for uid, user in state["users"].items()
            if any(r in state["reservations"] for r in user.get("reservations", []))
        ]
        # Users with something to talk about first; a world without reservations still works.
        self._users = sorted(with_reservations) or sorted(state["users"])
        self._by_route: dict[tuple[str, str], list[str]] = {}
        for number, flight in state["flights"].items():
            self._by_route.setdefault((flight["origin"], flight["destination"]), []).append(number)
        low, high = BOOKING_WINDOW
        self._dates: dict[tuple[str, str], list[str]] = {}
        for route, numbers in self._by_route.items():
            dates = {
                d
                for n in numbers
                for d, on_date in state["flights"][n].get("dates", {}).items()
                if low <= d <= high and _bookable(on_date)
            }
            if dates:
                self._dates[route] = sorted(dates)
        self._routes = sorted(self._dates)

    def scenario(self, index: int, rng_seed: int) -> dict[str, Any]:
        """The state slice shown in the prompt of call ``index`` (same arguments, same slice).

        One user, up to :data:`MAX_RESERVATIONS` of their reservations, the flights of
        those reservations on their dates, and :data:`OFFERED_ROUTES` direct routes the
        user could book (preferably from their reservations' origins), each on one date
        of :data:`BOOKING_WINDOW` with free seats. For every (route, date) the slice
        holds, it holds every flight of that route flying that date, so
        ``search_direct_flight`` answers on the slice exactly as on the full world
        for any route and date it lists.

        Returns:
            An airline state ``{"users", "flights", "reservations"}`` (deep copies,
            flights in the world's order); an ``AirlineEnv`` can run on it.
        """
        state = self.env.state
        rng = random.Random(f"grounding:{rng_seed}:{index}")
        user_id = rng.choice(self._users)
        user = state["users"][user_id]
        rids = [r for r in user.get("reservations", []) if r in state["reservations"]]
        if len(rids) > MAX_RESERVATIONS:
            chosen = set(rng.sample(rids, MAX_RESERVATIONS))
            rids = [r for r in rids if r in chosen]
        reservations = {rid: state["reservations"][rid] for rid in rids}
        wanted: dict[str, set[str]] = {}
        for reservation in reservations.values():
            for leg in reservation.get("flights", []):
                if leg.get("flight_number") in state["flights"]:
                    wanted.setdefault(leg["flight_number"], set()).add(leg.get("date"))
        pairs = {
            ((state["flights"][n]["origin"], state["flights"][n]["destination"]), d)
            for n, dates in wanted.items()
            for d in dates
        }
        for route in self._offered_routes(rng, {r.get("origin") for r in reservations.values()}):
            pairs.add((route, rng.choice(self._dates[route])))
        # Close over (route, date): every flight of a listed route on a listed date is in,
        # so a direct search answers on the slice exactly as on the world. Where no flight
        # of the route is available that day (past dates), a search finds nothing on
        # either side, so those pairs need no closing.
        for route, day in pairs:
            numbers = self._by_route.get(route, [])
            flights = [(n, state["flights"][n].get("dates", {})) for n in numbers]
            if any(
                day in dates and dates[day].get("status") == "available" for _, dates in flights
            ):
                for number, dates in flights:
                    if day in dates:
                        wanted.setdefault(number, set()).add(day)
        return {
            "users": {user_id: deepcopy(user)},
            "flights": {
                number: trim(flight, "dates", wanted[number])
                for number, flight in state["flights"].items()
                if number in wanted
            },
            "reservations": deepcopy(reservations),
        }

    def _offered_routes(self, rng: random.Random, origins: set[Any]) -> list[tuple[str, str]]:
        near = [r for r in self._routes if r[0] in origins]
        far = [r for r in self._routes if r[0] not in origins]
        want = min(len(self._routes), OFFERED_ROUTES)
        picked = rng.sample(near, min(len(near), want))
        picked += rng.sample(far, want - len(picked))
        return sorted(picked)

    def mismatch(self, scenario: Mapping[str, Any]) -> str | None:
        """What differs between ``scenario`` and this world, or None."""
        state = self.env.state
        for table in ("users", "reservations"):
            for key, value in (scenario.get(table) or {}).items():
                if not same_json(state[table].get(key), value):
                    return f"{table[:-1]} {short(key, 40)} differs"
        for number, flight in (scenario.get("flights") or {}).items():
            full = state["flights"].get(number)
            if full is None or not same_json(
                trim(full, "dates", set(flight.get("dates", {}))), flight
            ):
                return f"flight {short(number, 40)} differs"
        return None

    def subject(self, scenario: Mapping[str, Any]) -> str | None:
        """The user a scenario is about (``None`` for a scenario without users)."""
        return next(iter(scenario.get("users") or {}), None)
