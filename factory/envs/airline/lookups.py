"""Reading an airline state the way the policy talks about it (shared by the airline modules).

Why one module: the sampler and the grounding scenarios all ask "is this trip under
way?", "which reservations are still active?", "how many bags fly free?"; one answer keeps
them agreeing
with each other and with the policy (``prompts/airline/policy.md``).
Functions read, never write, and tolerate the malformed states a prompt may
carry (missing keys read as absent).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from factory.envs.airline.tools import AIRPORTS, NEW_CERTIFICATE_IDS, NEW_RESERVATION_IDS, NOW

__all__ = [
    "FREE_BAGS",
    "PLACES",
    "TODAY",
    "active_reservations",
    "city",
    "on_date",
    "simulator_facts",
    "started",
]

State = dict[str, Any]

TODAY = NOW[:10]
#: Airport code -> city, the places a varied reference flies between (the plug-in's
#: ``places``): one code per city so a city always renames with its code; LGA, a second
#: New York airport, is renamed when a reference names it, never chosen.
PLACES: dict[str, str] = {
    "ATL": "Atlanta", "BOS": "Boston", "CLT": "Charlotte", "DEN": "Denver", "DFW": "Dallas",
    "DTW": "Detroit", "EWR": "Newark", "IAH": "Houston", "JFK": "New York", "LAS": "Las Vegas",
    "LAX": "Los Angeles", "MCO": "Orlando", "MIA": "Miami", "MSP": "Minneapolis",
    "ORD": "Chicago", "PHL": "Philadelphia", "PHX": "Phoenix", "SEA": "Seattle",
    "SFO": "San Francisco", "LGA": "New York",
}  # fmt: skip
#: Free checked bags per passenger by membership and cabin (the domain policy's table).
FREE_BAGS = {
    "regular": {"basic_economy": 0, "economy": 1, "business": 2},
    "silver": {"basic_economy": 1, "economy": 2, "business": 3},
    "gold": {"basic_economy": 2, "economy": 3, "business": 3},
}


def on_date(state: State, leg: Mapping[str, Any]) -> dict[str, Any]:
    """The flight of ``leg`` on its date (status, seats, prices); ``{}`` if the state lacks it."""
    flight = state["flights"].get(leg.get("flight_number"), {})
    found: dict[str, Any] = flight.get("dates", {}).get(leg.get("date")) or {}
    return found


def started(state: State, reservation: Mapping[str, Any], *, unknown_departed: bool = True) -> bool:
    """Whether a segment of ``reservation`` has departed (flown dates, ``landed``, ``flying``).

    Args:
        unknown_departed: whether a leg whose flight date the state does not hold
            counts as departed. The sampler walks whole worlds, where that means a
            broken reservation, so it plays safe; a devserver scenario is a slice
            that may leave such legs out, so it does not.
    """
    statuses = ("landed", "flying", None) if unknown_departed else ("landed", "flying")
    return any(
        str(leg.get("date")) < TODAY or on_date(state, leg).get("status") in statuses
        for leg in reservation.get("flights") or []
    )


def active_reservations(state: State, user_id: str) -> list[dict[str, Any]]:
    """The user's reservations that the state holds and that are not cancelled."""
    ids = state["users"][user_id].get("reservations") or []
    found = [state["reservations"].get(r) for r in ids]
    return [r for r in found if isinstance(r, dict) and r.get("status") != "cancelled"]


def city(code: Any) -> str:
    """``"Boston (BOS)"`` for an airport code (the code alone where it is unknown)."""
    return f"{AIRPORTS.get(code, code)} ({code})"


def simulator_facts(tool: str) -> str:
    """What no state slice shows about ``tool``: the airline's "now", new ids, the airports.

    Why: a booking's ``created_at`` is the domain's fixed current time, its id the
    first free one of a fixed list, and ``list_all_airports`` answers a table
    that lives in the code; without these lines a simulator would have to
    memorise them (issue 10: 1,958 of 6,230 rows were not derivable from their
    prompt). The slice of a booking shows every existing reservation among
    those ids, and the user's payment methods show the certificates, so the
    rules below decide the new ids from the prompt alone.
    """
    first, second, last = NEW_RESERVATION_IDS
    lines = [f"- The current time is {NOW} (EST)."]
    if tool == "book_reservation":
        lines += [
            "- A new reservation's created_at is the current time.",
            f"- A new reservation's id is {first}; if {first} is already a reservation, "
            f"{second}; if both are, {last}.",
        ]
    elif tool == "send_certificate":
        lines.append(
            f"- A new certificate's id is the first of {', '.join(NEW_CERTIFICATE_IDS)} "
            "that is not among the user's payment methods."
        )
    elif tool == "list_all_airports":
        lines.append(f"- The airports (code: city), in this order: {json.dumps(AIRPORTS)}")
    return "\n".join(lines)
