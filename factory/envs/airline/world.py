"""A deterministic generator of airline worlds in tau-bench's schema.

Why generate: the factory ships no third-party database, and sampling many
trajectories from one fixed world teaches a model that world's ids. A seed
gives a fresh, internally consistent world (same seed, same bytes) around the
domain's "now", 2024-05-15 15:00 EST: flights before today have landed or were
cancelled, today's are landed / flying / on time / delayed by the clock, later
ones are bookable with seats and prices per cabin; every reservation points at
a user that lists it, at that user's payment method, at flights that exist on
its dates, and its payment equals tau-bench's price formula.

    python -m factory.envs.airline.world --seed 0 --out DIR
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from factory.envs.airline.tools import AIRPORTS, NEW_CERTIFICATE_IDS, NEW_RESERVATION_IDS

__all__ = ["CABINS", "TODAY", "check_world", "generate_world", "main", "write_world"]

TODAY = date(2024, 5, 15)
NOW = datetime(2024, 5, 15, 15, 0)
CABINS = ("basic_economy", "economy", "business")
_PRICE_RANGE = {"basic_economy": (50, 100), "economy": (100, 200), "business": (200, 500)}

# fmt: off
_FIRST = (
    "Aarav", "Amelia", "Anya", "Chen", "Daiki", "Emma", "Ethan", "Fatima", "Harper", "Isabella",
    "Ivan", "Juan", "Lei", "Liam", "Lucas", "Mei", "Mia", "Mohamed", "Noah", "Olivia", "Omar",
    "Priya", "Raj", "Sofia", "Sophia", "Yara", "Yusuf", "Zoe",
)
_LAST = (
    "Ahmed", "Brown", "Davis", "Garcia", "Gonzalez", "Hernandez", "Ito", "Jackson", "Johnson",
    "Khan", "Kim", "Lee", "Li", "Lopez", "Martin", "Moore", "Muller", "Nguyen", "Patel", "Rossi",
    "Santos", "Silva", "Smith", "Taylor", "Thomas", "Wilson",
)
_STREETS = (
    "Cedar Street", "Elm Avenue", "Hillcrest Drive", "Lakeview Road", "Main Street",
    "Maple Drive", "Oak Lane", "Pine Court", "River Road", "Sunset Drive",
)
# fmt: on
_CITIES = (
    ("Austin", "TX", "787"),
    ("Boston", "MA", "021"),
    ("Charlotte", "NC", "282"),
    ("Chicago", "IL", "606"),
    ("Denver", "CO", "802"),
    ("Houston", "TX", "770"),
    ("Los Angeles", "CA", "900"),
    ("Miami", "FL", "331"),
    ("New York", "NY", "100"),
    ("Philadelphia", "PA", "191"),
    ("Phoenix", "AZ", "850"),
    ("San Francisco", "CA", "941"),
    ("Seattle", "WA", "981"),
)
_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _hhmm(minutes: int) -> str:
    """Minutes after midnight of the departure day -> ``HH:MM:00`` (``+1`` past midnight)."""
    day, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return text + "+1" if day else text


def _stamp(day: date, minutes: int) -> str:
    return (datetime(day.year, day.month, day.day) + timedelta(minutes=minutes)).isoformat()


class _World:
    """Builds one world; all randomness comes from one ``random.Random``."""

    def __init__(self, seed: int, first_date: date, n_days: int, reserved: Sequence[str] = ()):
        self.rng = random.Random(seed)
        self.days = [first_date + timedelta(days=i) for i in range(n_days)]
        self.flights: dict[str, Any] = {}
        self.users: dict[str, Any] = {}
        self.reservations: dict[str, Any] = {}
        self._used_ids: set[str] = set(reserved)

    # --- flights ------------------------------------------------------------------------
    def make_flights(self, n_flights: int) -> None:
        rng, airports = self.rng, list(AIRPORTS)
        # Routes come in both directions (return trips exist); every route gets a flight first.
        pairs = [(a, b) for i, a in enumerate(airports) for b in airports[i + 1 :]]
        routes = [
            route
            for a, b in rng.sample(pairs, max(1, min(len(pairs), n_flights // 6 + 1)))
            for route in ((a, b), (b, a))
        ]
        durations = {r: rng.choice(range(60, 361, 30)) for r in routes}
        base_prices = {r: rng.uniform(0.6, 1.4) for r in routes}
        for i in range(n_flights):
            route = routes[i] if i < len(routes) else rng.choice(routes)
            departure = rng.choice(range(5 * 60, 23 * 60 + 1, 60))
            arrival = departure + durations[route]
            self.flights[f"HAT{i + 1:03d}"] = {
                "flight_number": f"HAT{i + 1:03d}",
                "origin": route[0],
                "destination": route[1],
                "scheduled_departure_time_est": _hhmm(departure),
                "scheduled_arrival_time_est": _hhmm(arrival),
                "dates": {
                    d.isoformat(): self._on_date(d, departure, arrival, base_prices[route])
                    for d in self.days
                },
            }

    def _on_date(self, day: date, departure: int, arrival: int, price: float) -> dict[str, Any]:
        rng = self.rng
        now = (NOW - datetime(day.year, day.month, day.day)).total_seconds() // 60
        if day > TODAY:
            return {
                "status": "available",
                "available_seats": {c: rng.randint(0, 20) for c in CABINS},
                "prices": {c: max(1, round(rng.randint(*_PRICE_RANGE[c]) * price)) for c in CABINS},
            }
        if day < TODAY and rng.random() < 0.1:
            return {"status": "cancelled"}
        shift = rng.randint(-30, 30)
        if arrival + shift <= now:
            return {
                "status": "landed",
                "actual_departure_time_est": _stamp(day, departure + shift),
                "actual_arrival_time_est": _stamp(day, arrival + shift + rng.randint(-15, 15)),
            }
        if departure + shift <= now:
            return {
                "status": "flying",
                "actual_departure_time_est": _stamp(day, departure + shift),
                "estimated_arrival_time_est": _stamp(day, arrival + shift),
            }
        delay = rng.choice((0, 0, 0, 60, 90, 150))
        return {
            "status": "delayed" if delay else "on time",
            "estimated_departure_time_est": _stamp(day, departure + delay + shift),
            "estimated_arrival_time_est": _stamp(day, arrival + delay + shift),
        }

    # --- users --------------------------------------------------------------------------
    def _person(self) -> dict[str, str]:
        rng = self.rng
        born = date(1950, 1, 1) + timedelta(days=rng.randint(0, 55 * 365))
        return {
            "first_name": rng.choice(_FIRST),
            "last_name": rng.choice(_LAST),
            "dob": born.isoformat(),
        }

    def _unique(self, make: Callable[[], str]) -> str:
        while True:
            value = make()
            if value not in self._used_ids:
                self._used_ids.add(value)
                return value

    def _payment_method(self, source: str) -> dict[str, Any]:
        rng = self.rng
        pid = self._unique(lambda: f"{source}_{rng.randint(1_000_000, 9_999_999)}")
        if source == "credit_card":
            return {
                "source": source,
                "brand": rng.choice(("visa", "mastercard")),
                "last_four": f"{rng.randint(0, 9999):04d}",
                "id": pid,
            }
        amount = rng.choice((100, 150, 200, 250, 500)) if source == "certificate" else None
        amount = amount if amount is not None else rng.randint(0, 300)
        return {"source": source, "amount": amount, "id": pid}

    def _user_id(self, first: str, last: str) -> str:
        return f"{first}_{last}_{self.rng.randint(1000, 9999)}".lower()

    def make_users(self, n_users: int) -> None:
        rng = self.rng
        for _ in range(n_users):
            person = self._person()
            first, last = person["first_name"], person["last_name"]
            uid = self._unique(partial(self._user_id, first, last))
            city, state, zip_prefix = rng.choice(_CITIES)
            extra = ["credit_card", "gift_card", "gift_card", "certificate", "certificate"]
            sources = ["credit_card", *rng.sample(extra, rng.randint(0, 3))]
            methods = [self._payment_method(s) for s in sources]
            rng.shuffle(methods)
            self.users[uid] = {
                "name": {"first_name": first, "last_name": last},
                "address": {
                    "address1": f"{rng.randint(1, 999)} {rng.choice(_STREETS)}",
                    "address2": f"Suite {rng.randint(100, 999)}",
                    "city": city,
                    "country": "USA",
                    "state": state,
                    "zip": f"{zip_prefix}{rng.randint(0, 99):02d}",
                },
                "email": f"{first}.{last}{rng.randint(1000, 9999)}@example.com".lower(),
                "dob": person["dob"],
                "payment_methods": {m["id"]: m for m in methods},
                "saved_passengers": [self._person() for _ in range(rng.randint(1, 2))],
                "membership": rng.choice(("regular", "silver", "gold")),
                "reservations": [],
            }

    # --- reservations -------------------------------------------------------------------
    def _departures(self) -> dict[str, list[dict[str, Any]]]:
        by_origin: dict[str, list[dict[str, Any]]] = {}
        for flight in self.flights.values():
            by_origin.setdefault(flight["origin"], []).append(flight)
        return by_origin

    def _connections(
        self, by_origin: dict[str, list[dict[str, Any]]], first: dict[str, Any], day: date
    ) -> tuple[list[dict[str, Any]], date]:
        """Flights leaving ``first``'s arrival airport after it lands, and their date."""
        overnight = first["scheduled_arrival_time_est"].endswith("+1")
        second_day = day + timedelta(days=1) if overnight else day
        onward = [
            f
            for f in by_origin.get(first["destination"], [])
            if f["destination"] != first["origin"]
            and second_day.isoformat() in f["dates"]
            and (
                overnight
                or first["scheduled_arrival_time_est"] <= f["scheduled_departure_time_est"]
            )
        ]
        return onward, second_day

    def _outbound(
        self, by_origin: dict[str, list[dict[str, Any]]], origin: str, day: date
    ) -> list[tuple[dict[str, Any], date]]:
        """A direct flight from ``origin``, or two connecting legs."""
        first = self.rng.choice(by_origin[origin])
        legs = [(first, day)]
        onward, second_day = self._connections(by_origin, first, day)
        if onward and self.rng.random() < 0.5:
            legs.append((self.rng.choice(onward), second_day))
        return legs

    def _return(
        self, by_origin: dict[str, list[dict[str, Any]]], origin: str, target: str, day: date
    ) -> list[tuple[dict[str, Any], date]] | None:
        """A direct or one-stop way from ``origin`` back to ``target`` on ``day``, if any."""
        options: list[list[tuple[dict[str, Any], date]]] = []
        for first in by_origin.get(origin, []):
            if first["destination"] == target:
                options.append([(first, day)])
                continue
            onward, second_day = self._connections(by_origin, first, day)
            options += [
                [(first, day), (f, second_day)] for f in onward if f["destination"] == target
            ]
        return self.rng.choice(options) if options else None

    def make_reservations(self, n_reservations: int) -> None:
        rng = self.rng
        by_origin = self._departures()
        user_ids = list(self.users)
        if not user_ids or not by_origin:
            return
        origins = sorted(by_origin)
        for _ in range(n_reservations):
            user_id = rng.choice(user_ids)
            user = self.users[user_id]
            origin = rng.choice(origins)
            day = rng.choice(self.days)
            outbound = self._outbound(by_origin, origin, day)
            destination = outbound[-1][0]["destination"]
            legs = list(outbound)
            back_days = [d for d in self.days if outbound[-1][1] < d <= day + timedelta(days=7)]
            if back_days and rng.random() < 0.5:
                legs += self._return(by_origin, destination, origin, rng.choice(back_days)) or []
            cabin = rng.choice(CABINS)
            flights = [self._booked_leg(f, d, cabin) for f, d in legs]
            passengers = [self._traveller(user) for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4)))]
            insurance = rng.choice(("yes", "no"))
            total = sum(f["price"] for f in flights) * len(passengers)
            total += 30 * len(passengers) if insurance == "yes" else 0
            payers = [m for m in user["payment_methods"].values() if m["source"] != "certificate"]
            created = datetime(2024, 4, 30) + timedelta(seconds=rng.randint(0, 15 * 86400 - 1))
            reservation_id = self._unique(lambda: "".join(rng.choice(_ID_CHARS) for _ in range(6)))
            self.reservations[reservation_id] = {
                "reservation_id": reservation_id,
                "user_id": user_id,
                "origin": origin,
                "destination": destination,
                "flight_type": "one_way" if len(legs) == len(outbound) else "round_trip",
                "cabin": cabin,
                "flights": flights,
                "passengers": passengers,
                "payment_history": [{"payment_id": rng.choice(payers)["id"], "amount": total}],
                "created_at": created.isoformat(),
                "total_baggages": rng.choice((0, 0, 1, 1, 2, 3)),
                "nonfree_baggages": 0,
                "insurance": insurance,
            }
            user["reservations"].append(reservation_id)

    def _booked_leg(self, flight: dict[str, Any], day: date, cabin: str) -> dict[str, Any]:
        on_date = flight["dates"][day.isoformat()]
        if "prices" in on_date:
            price = on_date["prices"][cabin]
        else:
            price = self.rng.randint(*_PRICE_RANGE[cabin])
        return {
            "origin": flight["origin"],
            "destination": flight["destination"],
            "flight_number": flight["flight_number"],
            "date": day.isoformat(),
            "price": price,
        }

    def _traveller(self, user: dict[str, Any]) -> dict[str, str]:
        rng = self.rng
        roll = rng.random()
        if roll < 0.5:
            return {**user["name"], "dob": user["dob"]}
        if roll < 0.8:
            return dict(rng.choice(user["saved_passengers"]))
        return self._person()


def generate_world(
    seed: int,
    n_users: int = 500,
    n_flights: int = 300,
    n_reservations: int = 2000,
    *,
    first_date: date = date(2024, 5, 1),
    n_days: int = 30,
) -> dict[str, Any]:
    """A consistent airline state ``{"users", "flights", "reservations"}``.

    Defaults match tau-bench's sizes; the same arguments give identical output.

    Raises:
        ValueError: a size is negative, there are reservations but no flights,
            or ``n_days`` is not positive.
    """
    if min(n_users, n_flights, n_reservations) < 0 or n_days < 1:
        raise ValueError("sizes must be >= 0 and n_days >= 1")
    if n_reservations and not (n_flights and n_users):
        raise ValueError("reservations need at least one user and one flight")
    # The ids the tools hand out to new reservations and certificates stay free.
    world = _World(seed, first_date, n_days, NEW_RESERVATION_IDS + NEW_CERTIFICATE_IDS)
    world.make_flights(n_flights)
    world.make_users(n_users)
    world.make_reservations(n_reservations)
    return {"users": world.users, "flights": world.flights, "reservations": world.reservations}


def check_world(state: dict[str, Any]) -> list[str]:
    """Broken references of an airline state (empty list: consistent)."""
    problems: list[str] = []
    users, flights, reservations = state["users"], state["flights"], state["reservations"]
    for uid, user in users.items():
        problems += [
            f"user {uid}: reservation {r} missing"
            for r in user["reservations"]
            if r not in reservations
        ]
    for rid, res in reservations.items():
        user = users.get(res["user_id"])
        if user is None:
            problems.append(f"reservation {rid}: user {res['user_id']} missing")
            continue
        if rid not in user["reservations"]:
            problems.append(f"reservation {rid}: not listed by user {res['user_id']}")
        for pay in res["payment_history"]:
            if pay["payment_id"] not in user["payment_methods"]:
                problems.append(f"reservation {rid}: payment {pay['payment_id']} missing")
        for leg in res["flights"]:
            flight = flights.get(leg["flight_number"])
            if flight is None or leg["date"] not in flight["dates"]:
                problems.append(
                    f"reservation {rid}: flight {leg['flight_number']} on {leg['date']} missing"
                )
    return problems


def write_world(state: dict[str, Any], out: str | Path) -> list[Path]:
    """Write ``users.json``, ``flights.json``, ``reservations.json`` into ``out``."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for table in ("users", "flights", "reservations"):
        path = root / f"{table}.json"
        path.write_text(
            json.dumps(state[table], indent=4, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m factory.envs.airline.world",
        description="Generate a tau-bench-format airline database.",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="folder for the three JSON files")
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--flights", type=int, default=300)
    parser.add_argument("--reservations", type=int, default=2000)
    args = parser.parse_args(argv)
    try:
        state = generate_world(args.seed, args.users, args.flights, args.reservations)
    except ValueError as exc:
        parser.error(str(exc))
    write_world(state, args.out)
    sizes = ", ".join(f"{len(state[t])} {t}" for t in ("users", "flights", "reservations"))
    print(f"wrote {sizes} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
