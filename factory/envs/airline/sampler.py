"""The airline's scenarios for the programmatic (LLM-free) sampler (``factory.envsim.sampler``).

Why: a simulator (world model) must see every kind of transition - refusals,
reads that change nothing, writes touching one to a dozen fields - in known
proportions and with exact observations. LLM agents produce mostly easy reads
and cannot be steered to the rare large writes. This sampler walks the world
as an agent would (identify the user, read, search, confirm, write) with
arguments drawn from the *current* state: real reservation and payment ids,
flights bookable on the date with enough seats, totals that add up. Every call
is executed, so each observation is the world's own answer.

An episode plays a *scenario* (:data:`SCENARIOS`), sometimes followed by more
requests of the same user. Two knobs add calls a careful agent would not make:

* ``invalid_share``: the chance that a call is first made wrongly (unknown or
  malformed ids, wrong types, a gift card or certificate asked for more than it
  allows, a total that does not add up, a date the flight does not fly); the
  world answers ``Error: ...`` and the agent retries correctly or gives up.
  Listed in ``metadata["sampler"]["mistakes"]`` with their call index;
* ``violation_share``: the chance that the agent breaks a policy rule the tools
  do not enforce (cancelling a started or non-refundable trip, removing bags,
  compensating an ineligible user). The world accepts these calls; they are
  listed in ``metadata["sampler"]["violations"]``.

The ``pileup`` scenario is off-policy on purpose: it issues goodwill
certificates, then pays a booking with every certificate and gift card the
user holds. A booking changes 2 fields plus one per stored-value method it
uses, so this is how a generated world yields single steps with |Δ| >= 7
(EnvSimBench's Difficult group); such episodes carry ``multiple_certificates``.

Determinism: an episode uses only the ``rng`` it is given; the driver
(``factory.envsim.sampler.EpisodeSampler``) numbers episodes and forks the world.

One module on purpose (about 870 lines): the ten scenarios, the episode under
construction and the wrong-call variants share private helpers; split, each
part would import the others' internals.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from datetime import date, timedelta
from typing import Any

from factory.envs.airline import AirlineEnv
from factory.envs.airline.lookups import (
    FREE_BAGS,
    TODAY,
    active_reservations,
    city,
    on_date,
    started,
)
from factory.envs.airline.tools import (
    NEW_CERTIFICATE_IDS,
    NOW,
    WRITE_TOOLS,
    search_onestop_flight,
)
from factory.envs.episode import TRANSFERRED, Abort, Episode, ScenarioSampler

__all__ = ["DEFAULT_SYSTEM", "SAMPLER", "SCENARIOS", "default_tools", "sample_episode"]

DEFAULT_SYSTEM = (
    "You are an airline customer service agent. The current time is 2024-05-15 15:00:00 EST. "
    "Use the tools to help the user and follow the airline policy."
)
CABINS = ("basic_economy", "economy", "business")
#: Scenario -> weight; a scenario no user fits falls back to ``browse``.
SCENARIOS: dict[str, float] = {
    "browse": 0.13,
    "book": 0.25,
    "cancel": 0.12,
    "change_flights": 0.09,
    "change_cabin": 0.06,
    "baggage": 0.1,
    "passengers": 0.07,
    "compensation": 0.06,
    "pileup": 0.08,
    "transfer": 0.04,
}
FOLLOWUPS = ("browse", "cancel", "change_flights", "change_cabin", "baggage", "passengers")
FOLLOWUP_SHARE = 0.25  # chance of one more request after a finished one (at most 3 in all)
_NAMES = ("Ana", "Ben", "Chloe", "Dev", "Elif", "Femi", "Grace", "Hugo", "Ines", "Jonas", "Kai")
_SURNAMES = ("Adams", "Baker", "Costa", "Dubois", "Evans", "Fischer", "Horvat", "Ivanova", "Jones")
_TOPICS = (
    "a refund for a meal voucher",
    "adding a sixth passenger to my booking",
    "a lost bag from my last trip",
    "changing the name on my account",
)

Args = dict[str, Any]
State = dict[str, Any]


# --- reading the state ----------------------------------------------------------------------


def _bookable(state: State, leg: Mapping[str, Any], cabin: str, seats: int) -> bool:
    info = on_date(state, leg)
    return info.get("status") == "available" and info["available_seats"][cabin] >= seats


def _price(state: State, leg: Mapping[str, Any], cabin: str) -> int:
    price: int = on_date(state, leg)["prices"][cabin]
    return price


def _airline_cancelled(state: State, reservation: dict[str, Any]) -> bool:
    return any(on_date(state, leg).get("status") == "cancelled" for leg in reservation["flights"])


def _changeable(state: State, reservation: dict[str, Any], mode: str) -> bool:
    if started(state, reservation):
        return False
    if mode == "change_cabin":
        return all(
            on_date(state, leg).get("status") == "available" for leg in reservation["flights"]
        )
    one_leg_each_way = len(reservation["flights"]) == (
        2 if reservation["flight_type"] == "round_trip" else 1
    )
    return reservation["cabin"] != "basic_economy" and one_leg_each_way


def _methods(profile: dict[str, Any], source: str) -> list[str]:
    return [pid for pid, m in profile["payment_methods"].items() if m["source"] == source]


def _shift(day: str, days: int) -> str:
    return (date.fromisoformat(day) + timedelta(days=days)).isoformat()


# --- wrong calls --------------------------------------------------------------------------------


def _wrong_calls(ep: _Episode, name: str, args: Args, cost: float) -> dict[str, Args]:
    """Mistaken variants of a call, by kind; each one makes the world answer ``Error: ...``."""
    state, rng = ep.state, ep.rng
    out: dict[str, Args] = {}
    if name == "list_all_airports":
        out["unexpected_argument"] = {"city": "Boston"}
    elif name == "transfer_to_human_agents":
        out["missing_argument"] = {}
    elif name == "calculate":
        out["invalid_characters"] = {"expression": args["expression"] + " USD"}
    elif name.startswith("search_"):
        out["wrong_type"] = {**args, "date": int(args["date"].replace("-", ""))}
        out["missing_argument"] = {k: v for k, v in args.items() if k != "date"}
    elif name == "send_certificate":
        out["wrong_type"] = {**args, "amount": str(args["amount"])}
    elif name == "update_reservation_baggages":
        out["wrong_type"] = {**args, "total_baggages": str(args["total_baggages"])}
    elif name == "update_reservation_flights":
        out["bad_enum"] = {**args, "cabin": "first"}
        legs = args["flights"]
        out["unknown_date"] = {**args, "flights": [{**legs[0], "date": "2024-06-31"}, *legs[1:]]}
    elif name == "update_reservation_passengers":
        people = args["passengers"]
        out["passenger_count"] = {**args, "passengers": people[:-1] or people * 2}
        out["wrong_type"] = {**args, "passengers": [{**p, "dob": 19900101} for p in people]}
    elif name == "book_reservation":
        out.update(_wrong_bookings(ep, args, int(cost)))
    user_id = args.get("user_id")
    if isinstance(user_id, str) and user_id + "0" not in state["users"]:
        out["unknown_user"] = {**args, "user_id": user_id + "0"}
        if name == "get_user_details":
            out["wrong_type"] = {"user_id": [user_id]}
    rid = args.get("reservation_id")
    if isinstance(rid, str):
        bogus = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(6))
        if bogus not in state["reservations"]:
            out["unknown_reservation"] = {**args, "reservation_id": bogus}
        if rid.lower() not in state["reservations"]:
            out["lowercase_id"] = {**args, "reservation_id": rid.lower()}
        if name == "cancel_reservation":
            out["wrong_type"] = {"reservation_id": [rid]}
    if "payment_id" in args and ep.profile is not None:
        methods = ep.profile["payment_methods"]
        out["unknown_payment"] = {**args, "payment_id": _unknown_payment(ep)}
        certificates = _methods(ep.profile, "certificate")
        poor = [p for p in _methods(ep.profile, "gift_card") if methods[p]["amount"] < cost]
        if certificates:
            out["certificate_payment"] = {**args, "payment_id": certificates[0]}
        if poor:
            out["insufficient_gift_card"] = {**args, "payment_id": poor[0]}
    return out


def _unknown_payment(ep: _Episode) -> str:
    owned = ep.profile["payment_methods"] if ep.profile else {}
    while True:
        pid = f"credit_card_{ep.rng.randint(1_000_000, 9_999_999)}"
        if pid not in owned:
            return pid


def _wrong_bookings(ep: _Episode, args: Args, total: int) -> dict[str, Args]:
    state, rng, profile = ep.state, ep.rng, ep.profile or {"payment_methods": {}}
    payments, legs, seats = args["payment_methods"], args["flights"], len(args["passengers"])
    last = payments[-1]
    out = {
        "payment_mismatch": [
            *payments[:-1],
            {**last, "amount": last["amount"] + rng.choice((1, 30, 50))},
        ],
        "unknown_payment": [*payments[:-1], {**last, "payment_id": _unknown_payment(ep)}],
    }
    gifts, cards = _methods(profile, "gift_card"), _methods(profile, "credit_card")
    if gifts and cards:
        over = int(profile["payment_methods"][gifts[0]]["amount"]) + 25
        if over < total:
            out["insufficient_balance"] = [
                {"payment_id": gifts[0], "amount": over},
                {"payment_id": cards[0], "amount": total - over},
            ]
    wrong = {kind: {**args, "payment_methods": pay} for kind, pay in out.items()}
    past = [
        d
        for d, i in state["flights"][legs[0]["flight_number"]]["dates"].items()
        if i.get("status") != "available"
    ]
    if past:
        wrong["unavailable_date"] = {
            **args,
            "flights": [{**legs[0], "date": rng.choice(past)}, *legs[1:]],
        }
    for cabin in CABINS:
        if any(on_date(state, leg)["available_seats"][cabin] < seats for leg in legs):
            wrong["not_enough_seats"] = {**args, "cabin": cabin}
            break
    wrong["wrong_type"] = {**args, "total_baggages": str(args["total_baggages"])}
    wrong["bad_enum"] = {**args, "flight_type": "roundtrip"}
    return wrong


# --- one episode under construction -------------------------------------------------------


class _Episode(Episode):
    """An airline conversation (the bookkeeping is ``factory.envs.episode.Episode``)."""

    def wrong_calls(self, name: str, args: Args, cost: float) -> dict[str, Args]:
        return _wrong_calls(self, name, args, cost)

    def request(self, text: str) -> None:
        """The user's request: the opening line, or a follow-up once the agent knows them."""
        if self.profile is None:
            self.user(f"Hi, my user id is {self.user_id}. {text}")
        else:
            self.user(f"One more thing. {text}")

    def confirm(self, summary: str) -> None:
        self.say(f"{summary} Shall I go ahead?")
        self.user(self.rng.choice(("Yes, please.", "Yes, go ahead.", "Sounds good, do it.")))

    def identify(self) -> dict[str, Any]:
        profile: dict[str, Any] = json.loads(
            self.act("get_user_details", {"user_id": self.user_id})
        )
        self.profile = profile
        return profile

    def known_profile(self) -> dict[str, Any]:
        return self.profile if self.profile is not None else self.identify()

    def lookup(self, rid: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.act("get_reservation_details", {"reservation_id": rid})
        )
        return found

    def pay_with(self, cost: float) -> str:
        """A method the user picks for a change: a card, or a gift card that covers ``cost``."""
        methods = self.known_profile()["payment_methods"]
        return self.rng.choice(
            [
                pid
                for pid, m in methods.items()
                if m["source"] == "credit_card"
                or (m["source"] == "gift_card" and m["amount"] >= cost)
            ]
        )


# --- scenarios ------------------------------------------------------------------------------------


def _browse(ep: _Episode) -> str:
    state, rng = ep.state, ep.rng
    rids = list(state["users"][ep.user_id]["reservations"])
    picked = rng.sample(rids, min(len(rids), rng.randint(1, 3)))
    ep.request("Can you tell me what is on my reservations?")
    ep.known_profile()
    lines = []
    for rid in picked:
        r = ep.lookup(rid)
        lines.append(
            f"{rid}: {r['origin']} to {r['destination']}, {len(r['passengers'])} passenger(s)"
        )
    if picked and rng.random() < 0.4:
        leg = rng.choice(state["reservations"][picked[0]]["flights"])
        ep.act("search_direct_flight", {k: leg[k] for k in ("origin", "destination", "date")})
    if rng.random() < 0.2:
        ep.act("list_all_airports", {})
    if picked and rng.random() < 0.3:
        paid = [
            p["amount"] for rid in picked for p in state["reservations"][rid]["payment_history"]
        ]
        ep.act("calculate", {"expression": " + ".join(map(str, paid))})
    return (
        "Here is what I found: " + "; ".join(lines) + "." if lines else "You have no reservations."
    )


def _transfer(ep: _Episode) -> str:
    topic = ep.rng.choice(_TOPICS)
    ep.request(f"I need a human agent about {topic}.")
    if ep.rng.random() < 0.5:
        ep.identify()
    ep.act("transfer_to_human_agents", {"summary": f"User {ep.user_id} asks about {topic}."})
    return TRANSFERRED


def _cancel(ep: _Episode) -> str:
    state, rng = ep.state, ep.rng
    reservation = rng.choice(active_reservations(state, ep.user_id))
    rid = reservation["reservation_id"]
    reasons = ["change of plans", "health reasons", "bad weather"]
    reasons += ["the airline cancelled my flight"] if _airline_cancelled(state, reservation) else []
    reason = rng.choice(reasons)
    ep.request(f"Please cancel reservation {rid}, {reason}.")
    ep.known_profile()
    reservation = ep.lookup(rid)
    if started(state, reservation) and not ep.violate("cancel_started_trip"):
        if rng.random() < 0.6:
            summary = f"User {ep.user_id} wants to cancel {rid}, which has already started."
            ep.act("transfer_to_human_agents", {"summary": summary})
            return TRANSFERRED
        return f"Unfortunately, reservation {rid} has a flown segment, so I cannot cancel it."
    eligible = (
        reservation["created_at"] >= _shift(TODAY, -1) + NOW[10:]
        or _airline_cancelled(state, reservation)
        or reservation["cabin"] == "business"
        or (reservation["insurance"] == "yes" and reason in ("health reasons", "bad weather"))
    )
    if not eligible and not ep.violate("cancel_not_eligible"):
        return (
            f"Unfortunately, reservation {rid} is not eligible for cancellation under the policy."
        )
    ep.confirm(f"I will cancel reservation {rid} and refund the original payment methods.")
    ep.act("cancel_reservation", {"reservation_id": rid})
    return f"Reservation {rid} is cancelled; refunds arrive in 5 to 7 business days."


def _change(ep: _Episode, mode: str) -> str:
    """A new date for one leg (``change_flights``) or a new cabin for all (``change_cabin``)."""
    state, rng = ep.state, ep.rng
    reservation = rng.choice(
        [r for r in active_reservations(state, ep.user_id) if _changeable(state, r, mode)]
    )
    rid, cabin, seats = (
        reservation["reservation_id"],
        reservation["cabin"],
        len(reservation["passengers"]),
    )
    legs = [
        {"flight_number": f["flight_number"], "date": f["date"]} for f in reservation["flights"]
    ]
    search: Args | None = None
    if mode == "change_cabin":
        cabins = [
            c for c in CABINS if c != cabin and all(_bookable(state, g, c, seats) for g in legs)
        ]
        cabin = rng.choice(cabins or [c for c in CABINS if c != cabin])
        ep.request(f"I'd like to move reservation {rid} to {cabin.replace('_', ' ')}.")
        possible = bool(cabins)
    else:
        index = rng.randrange(len(legs))
        old = reservation["flights"][index]
        low = legs[0]["date"] if index == 1 else _shift(TODAY, 1)
        high = legs[1]["date"] if index == 0 and len(legs) == 2 else _shift(old["date"], 7)
        options = [
            {"flight_number": f["flight_number"], "date": day}
            for f in state["flights"].values()
            if (f["origin"], f["destination"]) == (old["origin"], old["destination"])
            for day in f["dates"]
            if low <= day <= high and day != old["date"]
        ]
        options = [o for o in options if _bookable(state, o, cabin, seats)]
        possible = bool(options)
        legs[index] = rng.choice(options) if options else {**legs[index], "date": high[:10]}
        search = {
            "origin": old["origin"],
            "destination": old["destination"],
            "date": legs[index]["date"],
        }
        ep.request(f"Can I move my {city(old['origin'])} flight on {rid} to {search['date']}?")
    ep.known_profile()
    reservation = ep.lookup(rid)
    if search is not None:
        ep.act("search_direct_flight", search)
    if not possible:
        return f"I'm afraid there is no option with {seats} free seat(s) for that change."
    new_total = 0
    for leg in legs:  # the tool's rule: a segment kept in the same cabin keeps its price
        kept = [
            f["price"]
            for f in reservation["flights"]
            if (f["flight_number"], f["date"], cabin)
            == (leg["flight_number"], leg["date"], reservation["cabin"])
        ]
        new_total += (kept[0] if kept else _price(state, leg, cabin)) * seats
    old_total = sum(f["price"] for f in reservation["flights"]) * seats
    cost = new_total - old_total
    if rng.random() < 0.4:
        ep.act("calculate", {"expression": f"{new_total} - {old_total}"})
    payment_id = ep.pay_with(cost)
    ep.confirm(f"The change to {rid} costs {cost} dollars, settled with {payment_id}.")
    args = {"reservation_id": rid, "cabin": cabin, "flights": legs, "payment_id": payment_id}
    ep.act("update_reservation_flights", args, cost=cost)
    return f"Reservation {rid} is updated; the difference of {cost} dollars went to {payment_id}."


def _baggage(ep: _Episode) -> str:
    state, rng = ep.state, ep.rng
    reservation = rng.choice(
        [r for r in active_reservations(state, ep.user_id) if not started(state, r)]
    )
    rid, total, nonfree = (
        reservation[k] for k in ("reservation_id", "total_baggages", "nonfree_baggages")
    )
    added = rng.randint(1, 3)
    ep.request(f"I want to add {added} checked bag(s) to reservation {rid}.")
    profile = ep.known_profile()
    ep.lookup(rid)
    free = FREE_BAGS.get(profile["membership"], FREE_BAGS["regular"])[reservation["cabin"]]
    new_total = max(0, total - added) if ep.violate("removed_bags") else total + added
    new_nonfree = max(nonfree, new_total - free * len(reservation["passengers"]))
    cost = 50 * (new_nonfree - nonfree)
    payment_id = ep.pay_with(cost)
    ep.confirm(
        f"{rid} will have {new_total} bag(s), {new_nonfree} paid: {cost} dollars on {payment_id}."
    )
    args = {"reservation_id": rid, "total_baggages": new_total, "nonfree_baggages": new_nonfree}
    ep.act("update_reservation_baggages", {**args, "payment_id": payment_id}, cost=cost)
    return f"Done: reservation {rid} now has {new_total} checked bag(s)."


def _passengers(ep: _Episode) -> str:
    reservation = ep.rng.choice(active_reservations(ep.state, ep.user_id))
    rid, people = reservation["reservation_id"], [dict(p) for p in reservation["passengers"]]
    index = ep.rng.randrange(len(people))
    if ep.rng.random() < 0.5:
        people[index]["dob"] = _person(ep.rng)["dob"]
    else:
        people[index]["first_name"] = ep.rng.choice(_NAMES)
    who = people[index]
    ep.request(
        f"Passenger {index + 1} on {rid} is {who['first_name']} {who['last_name']} ({who['dob']})."
    )
    ep.known_profile()
    ep.lookup(rid)
    ep.confirm(f"I will update passenger {index + 1} of reservation {rid}.")
    ep.act("update_reservation_passengers", {"reservation_id": rid, "passengers": people})
    return f"Passenger {index + 1} of reservation {rid} is updated."


def _compensation(ep: _Episode) -> str:
    state = ep.state
    reservation = ep.rng.choice(
        [r for r in active_reservations(state, ep.user_id) if _airline_cancelled(state, r)]
    )
    rid = reservation["reservation_id"]
    ep.request(f"My flight on reservation {rid} was cancelled. I expect something for that.")
    profile = ep.known_profile()
    ep.lookup(rid)
    eligible = (
        profile["membership"] in ("silver", "gold")
        or reservation["insurance"] == "yes"
        or reservation["cabin"] == "business"
    )
    if not eligible and not ep.violate("compensation_not_eligible"):
        return (
            "Unfortunately, a regular member flying economy without insurance gets no compensation."
        )
    amount = 100 * len(reservation["passengers"])
    ep.confirm(f"I can offer a travel certificate of {amount} dollars.")
    ep.act("send_certificate", {"user_id": ep.user_id, "amount": amount})
    return f"A certificate of {amount} dollars is now in your profile."


# --- booking --------------------------------------------------------------------------------------


def _person(rng: random.Random) -> dict[str, str]:
    born = date(1950, 1, 1) + timedelta(days=rng.randint(0, 20000))
    return {
        "first_name": rng.choice(_NAMES),
        "last_name": rng.choice(_SURNAMES),
        "dob": born.isoformat(),
    }


def _plan_trip(ep: _Episode) -> tuple[str, str, str, bool]:
    """Origin, destination, date and one-stop-ness of a trip that has bookable flights."""
    state, rng = ep.state, ep.rng
    flights = list(state["flights"].values())
    for _ in range(50):
        first = rng.choice(flights)
        days = [d for d, info in first["dates"].items() if info.get("status") == "available"]
        if not days:
            continue
        day = rng.choice(days)
        if rng.random() < 0.35:
            onward = sorted(
                {g["destination"] for g in flights if g["origin"] == first["destination"]}
                - {first["origin"]}
            )
            rng.shuffle(onward)
            for destination in onward[:4]:
                if json.loads(search_onestop_flight(state, first["origin"], destination, day)):
                    return first["origin"], destination, day, True
        return first["origin"], first["destination"], day, False
    raise Abort("I'm sorry, but there are no bookable flights at the moment.")


def _search(
    ep: _Episode, origin: str, destination: str, day: str, onestop: bool
) -> list[list[Args]]:
    """Search as the agent would; the options as lists of ``{flight_number, date}`` legs."""
    args = {"origin": origin, "destination": destination, "date": day}
    name = "search_onestop_flight" if onestop else "search_direct_flight"
    try:
        results = json.loads(ep.act(name, args))
    except ValueError:
        return []
    if onestop:
        return [
            [{"flight_number": g["flight_number"], "date": g["date"]} for g in o] for o in results
        ]
    return [[{"flight_number": r["flight_number"], "date": day}] for r in results]


def _travellers(rng: random.Random, profile: dict[str, Any], seats: int) -> list[dict[str, str]]:
    known = [{**profile["name"], "dob": profile["dob"]}] if rng.random() < 0.8 else []
    known += [dict(p) for p in profile.get("saved_passengers", [])]
    known += [_person(rng) for _ in range(seats - len(known))]
    return known[:seats]


def _plan_payment(
    rng: random.Random, profile: dict[str, Any], total: int, *, stacked: bool
) -> list[Args] | None:
    """Amounts per method adding up to ``total``; ``None`` when no card can pay the rest.

    A compliant plan uses at most one certificate and three gift cards; a stacked
    one drains every certificate and gift card before the card.
    """
    methods = profile["payment_methods"]
    gifts = [pid for pid in _methods(profile, "gift_card") if methods[pid]["amount"] >= 1]
    certificates = _methods(profile, "certificate")
    stored: list[str] = certificates + gifts if stacked else []
    style = "stacked" if stacked else rng.choice(("card", "certificate", "gift_card", "mixed"))
    if style in ("certificate", "mixed") and certificates:
        stored.append(rng.choice(certificates))
    if style in ("gift_card", "mixed") and gifts:
        stored += rng.sample(gifts, rng.randint(1, min(3, len(gifts))))
    payments, remaining = [], total
    for pid in stored:
        amount = min(int(methods[pid]["amount"]), remaining)
        if amount > 0:
            payments.append({"payment_id": pid, "amount": amount})
            remaining -= amount
    cards = _methods(profile, "credit_card")
    if remaining > 0:
        if not cards:
            return None
        payments.append({"payment_id": rng.choice(cards), "amount": remaining})
    return payments


def _book(ep: _Episode, *, stacked: bool = False) -> str:
    state, rng = ep.state, ep.rng
    origin, destination, day, onestop = _plan_trip(ep)
    back = _shift(day, rng.randint(1, 5)) if rng.random() < (0.7 if stacked else 0.4) else None
    seats = rng.choice((3, 4, 5) if stacked else (1, 1, 1, 2, 2, 3, 4, 5))
    cabin = "business" if stacked else rng.choice(CABINS)
    ep.request(
        f"I'd like to book a {'round' if back else 'one-way'} trip from {city(origin)} to "
        f"{city(destination)} on {day}{f', back on {back}' if back else ''}, "
        f"{cabin.replace('_', ' ')}, for {seats} passenger(s)."
    )
    profile = ep.identify() if stacked else ep.known_profile()  # stacked: see new certificates
    if rng.random() < 0.15:
        ep.act("list_all_airports", {})
    found = _search(ep, origin, destination, day, onestop)
    for option_cabin in (cabin, *(c for c in CABINS if c != cabin)):
        options = [o for o in found if all(_bookable(state, g, option_cabin, seats) for g in o)]
        if options:
            cabin, legs = option_cabin, list(rng.choice(options))
            break
    else:
        return f"I'm sorry, no flight {origin}-{destination} on {day} has {seats} free seat(s)."
    if back:
        found = _search(ep, destination, origin, back, onestop=False)
        found = found or _search(ep, destination, origin, back, onestop=True)
        returns = [o for o in found if all(_bookable(state, g, cabin, seats) for g in o)]
        if returns:
            legs += rng.choice(returns)
        else:
            ep.say(f"No return flight on {back} has {seats} seat(s) in {cabin}. Would one way do?")
            ep.user("Fine, one way then.")
            back = None
    free = FREE_BAGS.get(profile["membership"], FREE_BAGS["regular"])[cabin] * seats
    bags = rng.randint(0, 2 * seats)
    nonfree, insurance = max(0, bags - free), rng.choice(("yes", "no"))
    prices = [_price(state, leg, cabin) for leg in legs]
    total = sum(prices) * seats + (30 * seats if insurance == "yes" else 0) + 50 * nonfree
    if rng.random() < 0.5:
        expression = f"({' + '.join(map(str, prices))}) * {seats}"
        expression += (f" + 30 * {seats}" if insurance == "yes" else "") + (
            f" + 50 * {nonfree}" if nonfree else ""
        )
        ep.act("calculate", {"expression": expression})
    payments = _plan_payment(rng, profile, total, stacked=stacked)
    if payments is None:
        return "I'm sorry, but no payment method in your profile can cover this booking."
    sources = [profile["payment_methods"][p["payment_id"]]["source"] for p in payments]
    if sources.count("certificate") > 1:
        ep.violations.append("multiple_certificates")
    if sources.count("gift_card") > 3:
        ep.violations.append("too_many_gift_cards")
    if rng.random() < 0.2:
        ep.act("think", {"thought": f"{seats} passenger(s), total {total}, paid by {payments}."})
    paying = ", ".join(f"{p['amount']} on {p['payment_id']}" for p in payments)
    ep.confirm(f"The total is {total} dollars ({paying}); {bags} bag(s); insurance: {insurance}.")
    args = {
        "user_id": ep.user_id,
        "origin": origin,
        "destination": destination,
        "flight_type": "round_trip" if back else "one_way",
        "cabin": cabin,
        "flights": legs,
        "passengers": _travellers(rng, profile, seats),
        "payment_methods": payments,
        "total_baggages": bags,
        "nonfree_baggages": nonfree,
        "insurance": insurance,
    }
    booked = json.loads(ep.act("book_reservation", args, cost=total))
    return f"Your reservation {booked.get('reservation_id')} is booked for {total} dollars."


def _pileup(ep: _Episode) -> str:
    """Goodwill certificates for several trips, then a booking paid with every balance held."""
    rids = ep.state["users"][ep.user_id]["reservations"]
    ep.request("All my recent trips were disrupted and I want compensation for each of them.")
    profile = ep.known_profile()
    ep.violations.append("unverified_compensation")
    for _ in [c for c in NEW_CERTIFICATE_IDS if c not in profile["payment_methods"]]:
        rid = ep.rng.choice(rids)
        amount = ep.rng.choice((50, 100)) * len(ep.lookup(rid)["passengers"])
        ep.confirm(f"For reservation {rid} I can offer a certificate of {amount} dollars.")
        ep.act("send_certificate", {"user_id": ep.user_id, "amount": amount})
    ep.say("The certificates are in your profile now.")
    return _book(ep, stacked=True)


_RUN: dict[str, Callable[[_Episode], str]] = {
    "browse": _browse,
    "book": _book,
    "cancel": _cancel,
    "change_flights": lambda ep: _change(ep, "change_flights"),
    "change_cabin": lambda ep: _change(ep, "change_cabin"),
    "baggage": _baggage,
    "passengers": _passengers,
    "compensation": _compensation,
    "pileup": _pileup,
    "transfer": _transfer,
}


def _fits(state: State, scenario: str, user_id: str) -> bool:
    """Whether the user has what the scenario's request is about."""
    user = state["users"][user_id]
    sources = [m["source"] for m in user["payment_methods"].values()]
    card = "credit_card" in sources
    if scenario in ("browse", "transfer"):
        return True
    if scenario == "book":
        return card
    if scenario == "pileup":
        fresh = not set(NEW_CERTIFICATE_IDS) & set(user["payment_methods"])
        return (
            card
            and fresh
            and len(sources) - sources.count("credit_card") >= 2
            and bool(user["reservations"])
        )
    active = active_reservations(state, user_id)
    if scenario in ("cancel", "passengers"):
        return bool(active)
    if scenario == "compensation":
        return any(_airline_cancelled(state, r) for r in active)
    if scenario == "baggage":
        return card and any(not started(state, r) for r in active)
    return card and any(_changeable(state, r, scenario) for r in active)


def _refresh_profile(ep: Episode) -> None:
    """Before a follow-up the agent knows the profile as it is now (it saw every change)."""
    ep.profile = json.loads(json.dumps(ep.state["users"][ep.user_id]))


#: The airline's episodes (``factory.envs.episode.ScenarioSampler`` walks them).
SAMPLER = ScenarioSampler(
    run=_RUN,
    weights=SCENARIOS,
    followups=FOLLOWUPS,
    fits=_fits,
    episode=_Episode,
    system=DEFAULT_SYSTEM,
    default_tools=AirlineEnv.bare_tools,
    write_tools=WRITE_TOOLS,
    followup_share=FOLLOWUP_SHARE,
    may_follow=lambda ep: ep.profile is not None,  # only a user the agent has identified
    before_followup=_refresh_profile,
)
default_tools = SAMPLER.default_tools
sample_episode = SAMPLER.sample_episode
