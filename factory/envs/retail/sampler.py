"""The retail scenarios for the programmatic (LLM-free) sampler (``factory.envsim.sampler``).

Why (as for the airline): a simulator must see every kind of transition -
refusals, reads, small and large writes - in known proportions and with exact
observations. This sampler walks a retail world as an agent would: locate the
user by email or by name and zip, read the profile and orders, look up
products, confirm, write, with arguments drawn from the *current* state (real
order, item and payment ids, replacement variants of the same product that are
available, gift cards that cover the difference). Every call is executed.

Scenarios (:data:`SCENARIOS`): ``browse``; ``cancel`` a pending order;
``modify_items`` (one to several items of a pending order, priced up or down,
paid or refunded by card, PayPal or a gift card with its balance);
``modify_address`` and ``modify_payment`` of a pending order; ``user_address``;
``return`` and ``exchange`` of one to several items of a delivered order;
``transfer`` to a human. Some episodes go on with another request of the
same user.

Two knobs add calls a careful agent would not make:

* ``invalid_share``: the chance that a call is first made wrongly (an order id
  without ``#``, an order in the wrong status, an unavailable or other-product
  variant, a gift card too poor for the difference, a refund to a method the
  policy does not allow, a reason the tool does not know, the same payment
  method again, wrong types, missing arguments); the world answers
  ``Error: ...``, the agent retries correctly or gives up (writes go wrong twice as
  often, mostly by a rule of the domain). Listed in
  ``metadata["sampler"]["mistakes"]``;
* ``violation_share``: the chance that the agent breaks a policy rule the
  tools do not enforce: acting without locating the user first
  (``unauthenticated``), without the user's explicit yes (``no_confirmation``),
  or on another user's order (``other_users_order``). The world accepts these
  calls; they are listed in ``metadata["sampler"]["violations"]``.

Δ sizes: lists count as whole values (``factory.core.delta``), so a retail call
changes at most about six fields (an address); retail steps fill the
Failure, No-Change, Simple and Medium groups, never Difficult or Beyond.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from typing import Any

from factory.envs.base import Environment
from factory.envs.episode import TRANSFERRED, Abort, Episode, ScenarioSampler
from factory.envs.retail import RetailEnv
from factory.envs.retail.tools import CANCEL_REASONS, WRITE_TOOLS

__all__ = ["DEFAULT_SYSTEM", "SAMPLER", "SCENARIOS", "default_tools", "sample_episode"]

DEFAULT_SYSTEM = (
    "You are a retail customer service agent. Authenticate the user by email or by name and "
    "zip code, then use the tools to help them with their orders and follow the retail policy."
)
#: Scenario -> weight; a scenario no user fits falls back to ``browse``.
SCENARIOS: dict[str, float] = {
    "browse": 0.08,
    "cancel": 0.1,
    "modify_items": 0.14,
    "modify_address": 0.13,
    "modify_payment": 0.11,
    "user_address": 0.12,
    "return": 0.11,
    "exchange": 0.16,
    "transfer": 0.05,
}
FOLLOWUPS = (
    "browse",
    "cancel",
    "modify_address",
    "modify_payment",
    "user_address",
    "return",
    "exchange",
)
FOLLOWUP_SHARE = 0.25  # chance of one more request after a finished one (at most 3 in all)
_STREETS = (
    "Birch Road",
    "Harbor Way",
    "Mill Street",
    "Orchard Lane",
    "Quarry Road",
    "Willow Court",
)
_CITIES = (("Portland", "OR", "972"), ("Madison", "WI", "537"), ("Tucson", "AZ", "857"))
_TOPICS = ("a damaged parcel", "a price match", "a missing refund", "a warranty claim")

#: Wrong-call kinds that are slips of form rather than a rule of the domain.
_GENERIC_MISTAKES = frozenset(
    {"missing_argument", "order_id_without_hash", "unknown_payment", "unknown_user", "wrong_type"}
)

Args = dict[str, Any]
State = dict[str, Any]


# --- reading the state ------------------------------------------------------------------------


def _orders(state: State, user_id: str, *statuses: str) -> list[dict[str, Any]]:
    found = [state["orders"].get(o) for o in state["users"][user_id].get("orders", [])]
    return [o for o in found if isinstance(o, dict) and o.get("status") in statuses]


def _alternatives(state: State, item: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Available variants of the item's product other than the item itself."""
    variants = state["products"].get(item["product_id"], {}).get("variants", {})
    return [v for k, v in variants.items() if k != item["item_id"] and v.get("available")]


def _methods(state: State, user_id: str, source: str | None = None) -> list[str]:
    methods = state["users"][user_id]["payment_methods"]
    return [pid for pid, m in methods.items() if source is None or m["source"] == source]


def _can_pay(state: State, user_id: str, pid: str, amount: float) -> bool:
    method = state["users"][user_id]["payment_methods"][pid]
    return bool(method["source"] != "gift_card" or method["balance"] >= amount)


def _address(rng: random.Random, old: Mapping[str, Any], *, move: bool) -> Args:
    """A new address: a new apartment in the same building, or a move to another city."""
    if not move:
        unit = rng.choice(("Apt", "Suite", "Unit"))
        return {**old, "address2": f"{unit} {rng.randint(1, 999)}"}
    city, state, prefix = rng.choice(_CITIES)
    return {
        "address1": f"{rng.randint(1, 999)} {rng.choice(_STREETS)}",
        "address2": rng.choice(("", f"Suite {rng.randint(100, 999)}")),
        "city": city,
        "state": state,
        "country": "USA",
        "zip": f"{prefix}{rng.randint(0, 99):02d}",
    }


# --- wrong calls ------------------------------------------------------------------------------


def _wrong_calls(ep: _Episode, name: str, args: Args, cost: float) -> dict[str, Args]:
    """Mistaken variants of a call, by kind; each makes the world answer ``Error: ...``."""
    state, rng = ep.state, ep.rng
    out: dict[str, Args] = {}
    if name == "find_user_id_by_email":
        out["unknown_email"] = {"email": args["email"].replace("@", ".mail@", 1)}
        out["wrong_type"] = {"email": [args["email"]]}
    elif name == "find_user_id_by_name_zip":
        if args["zip"].isdigit():
            out["wrong_zip"] = {**args, "zip": str((int(args["zip"]) + 1) % 100000).zfill(5)}
        out["missing_argument"] = {k: v for k, v in args.items() if k != "zip"}
    elif name == "get_user_details":
        out["unknown_user"] = {"user_id": args["user_id"] + "0"}
    elif name == "get_product_details":
        variants = state["products"].get(args["product_id"], {}).get("variants", {})
        if variants:  # an item id where the product id belongs
            out["item_for_product"] = {"product_id": next(iter(variants))}
    elif name == "calculate":
        out["invalid_characters"] = {"expression": "$" + args["expression"]}
    elif name == "transfer_to_human_agents":
        out["missing_argument"] = {}
    elif name == "cancel_pending_order":
        out["invalid_reason"] = {**args, "reason": rng.choice(("changed my mind", "too late"))}
        out["missing_argument"] = {"order_id": args["order_id"]}
    elif name in ("modify_pending_order_address", "modify_user_address"):
        out["missing_argument"] = {k: v for k, v in args.items() if k != "address2"}
        out["wrong_type"] = {**args, "zip": int(args["zip"]) if args["zip"].isdigit() else 0}
    elif name in ("modify_pending_order_items", "exchange_delivered_order_items"):
        out.update(_wrong_replacements(ep, args, cost))
    elif name == "return_delivered_order_items":
        out.update(_wrong_return(ep, args))
    elif name == "modify_pending_order_payment":
        order = state["orders"][args["order_id"]]
        paid = order["payment_history"][0]
        out["same_method"] = {**args, "payment_method_id": paid["payment_method_id"]}
        poor = _poor_gift_cards(state, order["user_id"], paid["amount"])
        if poor:
            out["insufficient_gift_card"] = {**args, "payment_method_id": poor[0]}
    oid = args.get("order_id")
    if isinstance(oid, str):
        out["order_id_without_hash"] = {**args, "order_id": oid.lstrip("#")}
        order = state["orders"].get(oid)
        if order is not None and name in WRITE_TOOLS:
            owned = state["users"][order["user_id"]]["orders"]
            others = [
                o
                for o in owned
                if o in state["orders"] and state["orders"][o]["status"] != order["status"]
            ]
            if others:
                out["wrong_status"] = {**args, "order_id": rng.choice(others)}
    if "payment_method_id" in args and name in WRITE_TOOLS:
        bogus = f"credit_card_{rng.randint(10**6, 10**7 - 1)}"
        out["unknown_payment"] = {**args, "payment_method_id": bogus}
    return out


def _wrong_replacements(ep: _Episode, args: Args, cost: float) -> dict[str, Args]:
    state, rng = ep.state, ep.rng
    order = state["orders"][args["order_id"]]
    items = {i["item_id"]: i for i in order["items"]}
    old, new = args["item_ids"], args["new_item_ids"]
    out: dict[str, Args] = {
        "count_mismatch": {**args, "new_item_ids": new[:-1] or new * 2},
        "wrong_type": {**args, "item_ids": old[0]},
    }
    first = items[old[0]]
    variants = state["products"][first["product_id"]]["variants"]
    unavailable = [k for k, v in variants.items() if not v.get("available")]
    if unavailable:
        out["unavailable_item"] = {**args, "new_item_ids": [rng.choice(unavailable), *new[1:]]}
    foreign = [
        k
        for pid, p in state["products"].items()
        if pid != first["product_id"]
        for k, v in p["variants"].items()
        if v.get("available")
    ]
    if foreign:  # a variant of another product: the same-product rule
        out["other_product_item"] = {**args, "new_item_ids": [rng.choice(foreign), *new[1:]]}
    missing = [i for i in _all_item_ids(state) if i not in items]
    if missing:
        out["item_not_in_order"] = {**args, "item_ids": [rng.choice(missing), *old[1:]]}
    if cost > 0:
        poor = _poor_gift_cards(state, order["user_id"], cost)
        if poor:
            out["insufficient_gift_card"] = {**args, "payment_method_id": poor[0]}
    return out


def _wrong_return(ep: _Episode, args: Args) -> dict[str, Args]:
    state = ep.state
    order = state["orders"][args["order_id"]]
    original = order["payment_history"][0]["payment_method_id"]
    too_many = args["item_ids"] + [args["item_ids"][0]] * len(order["items"])
    out: dict[str, Args] = {"some_item_missing": {**args, "item_ids": too_many}}
    owned = _methods(state, order["user_id"])
    wrong = [p for p in owned if "gift_card" not in p and p != original]
    if wrong:
        out["refund_method_not_allowed"] = {**args, "payment_method_id": wrong[0]}
    return out


def _poor_gift_cards(state: State, user_id: str, amount: float) -> list[str]:
    cards = _methods(state, user_id, "gift_card")
    return [p for p in cards if not _can_pay(state, user_id, p, amount)]


def _all_item_ids(state: State) -> list[str]:
    return [k for p in state["products"].values() for k in p["variants"]]


# --- one episode under construction -----------------------------------------------------------


class _Episode(Episode):
    """A retail conversation (the bookkeeping is ``factory.envs.episode.Episode``)."""

    def __init__(
        self, env: Environment, rng: random.Random, user_id: str, shares: tuple[float, float]
    ):
        super().__init__(env, rng, user_id, shares)
        self.by_email = rng.random() < 0.6  # how the user introduces themselves

    def request(self, text: str) -> None:
        if self.profile is None and not self.turns:
            user = self.state["users"][self.user_id]
            if self.by_email:
                self.user(f"Hi, my email is {user['email']}. {text}")
            else:
                name = user["name"]
                self.user(
                    f"Hi, I'm {name['first_name']} {name['last_name']}, zip code "
                    f"{user['address']['zip']}. {text}"
                )
        else:
            self.user(f"One more thing. {text}")

    def confirm(self, summary: str) -> None:
        if self.violate("no_confirmation"):
            self.say(f"{summary} Doing it now.")
            return
        self.say(f"{summary} Shall I go ahead (yes/no)?")
        self.user(self.rng.choice(("Yes.", "Yes, please.", "Yes, go ahead.")))

    def wrong_calls(self, name: str, args: Args, cost: float) -> dict[str, Args]:
        return _wrong_calls(self, name, args, cost)

    def mistake_chance(self, name: str) -> float:
        # Writes are where the policy's rules bite: they go wrong twice as often, and
        # mostly by a rule (status, balance, same product, refund method) over a typo.
        return min(1.0, 2 * self.invalid_share) if name in WRITE_TOOLS else self.invalid_share

    def pick_mistake(self, wrong: Mapping[str, Args]) -> str:
        rules = sorted(set(wrong) - _GENERIC_MISTAKES)
        pool = rules if rules and self.rng.random() < 0.75 else sorted(wrong)
        return self.rng.choice(pool)

    def identify(self) -> dict[str, Any]:
        """Locate the user (email, else name and zip) and read the profile."""
        user = self.state["users"][self.user_id]
        if self.by_email:
            found = self.act("find_user_id_by_email", {"email": user["email"]})
        else:
            name = user["name"]
            args = {
                "first_name": name["first_name"],
                "last_name": name["last_name"],
                "zip": user["address"]["zip"],
            }
            found = self.act("find_user_id_by_name_zip", args)
        if found != self.user_id:  # another user shares the name and zip: ask for the email
            self.say("I found a different account; could you give me your email?")
            self.user(f"It's {user['email']}.")
            self.act("find_user_id_by_email", {"email": user["email"]})
        profile: dict[str, Any] = json.loads(
            self.act("get_user_details", {"user_id": self.user_id})
        )
        self.profile = profile
        return profile

    def authenticate(self) -> None:
        """Identify the user once, unless the agent skips it (a policy violation)."""
        if self.profile is None and not self.violate("unauthenticated"):
            self.identify()

    def order(self, oid: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.act("get_order_details", {"order_id": oid}))
        return found

    def pay_with(self, candidates: list[str], cost: float, owner: str | None = None) -> str:
        """A method of ``candidates`` that covers ``cost`` (gift cards need the balance)."""
        owner = owner or self.user_id
        fits = [p for p in candidates if _can_pay(self.state, owner, p, cost)]
        if not fits:
            raise Abort("I'm sorry, but none of your payment methods can cover the difference.")
        return self.rng.choice(fits)


# --- scenarios ------------------------------------------------------------------------------------


def _browse(ep: _Episode) -> str:
    state, rng = ep.state, ep.rng
    ep.request("Can you tell me what is in my recent orders?")
    if ep.profile is None:
        ep.identify()
    oids = list(state["users"][ep.user_id]["orders"])
    picked = rng.sample(oids, min(len(oids), rng.randint(1, 3)))
    lines = []
    for oid in picked:
        order = ep.order(oid)
        lines.append(f"{oid}: {len(order['items'])} item(s), {order['status']}")
        if rng.random() < 0.5:
            ep.act("get_product_details", {"product_id": rng.choice(order["items"])["product_id"]})
    if rng.random() < 0.2:
        ep.act("list_all_product_types", {})
    if picked and rng.random() < 0.3:
        prices = [i["price"] for i in state["orders"][picked[0]]["items"]]
        ep.act("calculate", {"expression": " + ".join(map(str, prices))})
    if rng.random() < 0.1:
        ep.act("think", {"thought": f"The user has {len(oids)} order(s)."})
    return "Here is what I found: " + "; ".join(lines) + "." if lines else "You have no orders yet."


def _transfer(ep: _Episode) -> str:
    topic = ep.rng.choice(_TOPICS)
    ep.request(f"I need to talk to a human about {topic}.")
    if ep.profile is None and ep.rng.random() < 0.5:
        ep.identify()
    ep.act("transfer_to_human_agents", {"summary": f"User {ep.user_id} asks about {topic}."})
    return TRANSFERRED


def _target(
    ep: _Episode, status: str, usable: Callable[[State, dict[str, Any]], bool] | None = None
) -> dict[str, Any]:
    """A usable order of the user in ``status`` (or, as a violation, another user's)."""
    state, rng = ep.state, ep.rng
    ok = usable or (lambda _state, _order: True)
    if ep.violate("other_users_order"):
        others = [
            o
            for o in state["orders"].values()
            if o["user_id"] != ep.user_id and o["status"] == status and ok(state, o)
        ]
        if others:
            return rng.choice(others)
        ep.violations.pop()
    return rng.choice([o for o in _orders(state, ep.user_id, status) if ok(state, o)])


def _replaceable(state: State, order: dict[str, Any]) -> bool:
    return any(_alternatives(state, item) for item in order["items"])


def _cancel(ep: _Episode) -> str:
    order = _target(ep, "pending")
    oid, reason = order["order_id"], ep.rng.choice(CANCEL_REASONS)
    why = "I ordered it by mistake" if reason == "ordered by mistake" else "I no longer need it"
    ep.request(f"Please cancel order {oid}, {why}.")
    ep.authenticate()
    ep.order(oid)
    ep.confirm(f"I will cancel {oid} ({reason}); gift card payments are refunded at once.")
    ep.act("cancel_pending_order", {"order_id": oid, "reason": reason})
    return f"Order {oid} is cancelled."


def _replacements(ep: _Episode, order: dict[str, Any]) -> tuple[list[str], list[str], float]:
    """Items of ``order`` to replace (one to four), their new variants, the price difference."""
    state, rng = ep.state, ep.rng
    positions = [i for i, item in enumerate(order["items"]) if _alternatives(state, item)]
    chosen = sorted(rng.sample(positions, rng.randint(1, min(len(positions), 4))))
    old, new, diff = [], [], 0.0
    for index in chosen:
        item = order["items"][index]
        variant = rng.choice(_alternatives(state, item))
        old.append(item["item_id"])
        new.append(variant["item_id"])
        diff += variant["price"] - item["price"]
    return old, new, round(diff, 2)


def _change_items(ep: _Episode, mode: str) -> str:
    """``modify_items`` on a pending order or ``exchange`` on a delivered one."""
    state, rng = ep.state, ep.rng
    if mode == "modify_items":
        status, tool = "pending", "modify_pending_order_items"
    else:
        status, tool = "delivered", "exchange_delivered_order_items"
    order = _target(ep, status, _replaceable)
    old, new, diff = _replacements(ep, order)
    oid = order["order_id"]
    verb = "change" if mode == "modify_items" else "exchange"
    ep.request(f"I'd like to {verb} {len(old)} item(s) of order {oid} for other options.")
    ep.authenticate()
    ep.order(oid)
    for pid in dict.fromkeys(i["product_id"] for i in order["items"] if i["item_id"] in old):
        ep.act("get_product_details", {"product_id": pid})
    if rng.random() < 0.5:
        pairs = zip(_prices(order, old), _new_prices(state, order, old, new), strict=True)
        ep.act("calculate", {"expression": " + ".join(f"({n} - {o})" for o, n in pairs)})
    owner = order["user_id"]
    payment = ep.pay_with(_methods(state, owner), diff, owner)
    direction = f"you pay {diff}" if diff > 0 else f"you get {-diff} back"
    ep.confirm(
        f"{verb.capitalize()} {', '.join(old)} for {', '.join(new)} in {oid}: "
        f"{direction} via {payment}."
    )
    args = {"order_id": oid, "item_ids": old, "new_item_ids": new, "payment_method_id": payment}
    ep.act(tool, args, cost=diff)
    return f"Done: the {verb} for order {oid} is recorded."


def _prices(order: dict[str, Any], old: list[str]) -> list[float]:
    by_id = {i["item_id"]: i["price"] for i in order["items"]}
    return [by_id[i] for i in old]


def _new_prices(state: State, order: dict[str, Any], old: list[str], new: list[str]) -> list[float]:
    product_of = {i["item_id"]: i["product_id"] for i in order["items"]}
    variants = [state["products"][product_of[o]]["variants"] for o in old]
    return [v[n]["price"] for v, n in zip(variants, new, strict=True)]


def _return(ep: _Episode) -> str:
    state, rng = ep.state, ep.rng
    order = _target(ep, "delivered")
    oid = order["order_id"]
    items = [i["item_id"] for i in rng.sample(order["items"], rng.randint(1, len(order["items"])))]
    ep.request(f"I want to return {len(items)} item(s) from order {oid}.")
    ep.authenticate()
    ep.order(oid)
    original = order["payment_history"][0]["payment_method_id"]
    gift_cards = _methods(state, order["user_id"], "gift_card")
    allowed = [original] + [p for p in gift_cards if p != original]
    payment = rng.choice(allowed)
    total = round(sum(_prices(order, items)), 2)
    ep.confirm(f"Return {', '.join(items)} of {oid}; {total} will be refunded to {payment}.")
    args = {"order_id": oid, "item_ids": items, "payment_method_id": payment}
    ep.act("return_delivered_order_items", args)
    return f"The return for {oid} is requested; you will get an email with instructions."


def _modify_address(ep: _Episode) -> str:
    order = _target(ep, "pending")
    oid = order["order_id"]
    address = _address(ep.rng, order["address"], move=ep.rng.random() < 0.4)
    where = f"{address['address1']} {address['address2']}, {address['city']}"
    ep.request(f"Please ship order {oid} to {where}.")
    ep.authenticate()
    ep.order(oid)
    ep.confirm(f"Order {oid} will ship to {where} {address['zip']}.")
    ep.act("modify_pending_order_address", {"order_id": oid, **address})
    return f"The shipping address of {oid} is updated."


def _modify_payment(ep: _Episode) -> str:
    state, rng = ep.state, ep.rng
    fitting = [o for o in _orders(state, ep.user_id, "pending") if _payable_elsewhere(state, o)]
    order = rng.choice(fitting)
    oid, paid = order["order_id"], order["payment_history"][0]
    ep.request(f"Can I pay for order {oid} with a different method?")
    ep.authenticate()
    ep.order(oid)
    others = [p for p in _methods(state, ep.user_id) if p != paid["payment_method_id"]]
    payment = ep.pay_with(others, paid["amount"])
    ep.confirm(
        f"{oid} ({paid['amount']}) will be charged to {payment} and refunded to "
        f"{paid['payment_method_id']}."
    )
    args = {"order_id": oid, "payment_method_id": payment}
    ep.act("modify_pending_order_payment", args, cost=paid["amount"])
    return f"Order {oid} is now paid with {payment}."


def _payable_elsewhere(state: State, order: dict[str, Any]) -> bool:
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        return False
    owner, paid = order["user_id"], history[0]
    return any(
        p != paid["payment_method_id"] and _can_pay(state, owner, p, paid["amount"])
        for p in _methods(state, owner)
    )


def _user_address(ep: _Episode) -> str:
    user = ep.state["users"][ep.user_id]
    address = _address(ep.rng, user["address"], move=ep.rng.random() < 0.3)
    where = f"{address['address1']} {address['address2']}, {address['city']} {address['zip']}"
    ep.request(f"I moved: my address is now {where}.")
    ep.authenticate()
    ep.confirm(f"Your default address becomes {where}.")
    ep.act("modify_user_address", {"user_id": ep.user_id, **address})
    return "Your default address is updated."


_RUN: dict[str, Callable[[_Episode], str]] = {
    "browse": _browse,
    "cancel": _cancel,
    "modify_items": lambda ep: _change_items(ep, "modify_items"),
    "modify_address": _modify_address,
    "modify_payment": _modify_payment,
    "user_address": _user_address,
    "return": _return,
    "exchange": lambda ep: _change_items(ep, "exchange"),
    "transfer": _transfer,
}


def _fits(state: State, scenario: str, user_id: str) -> bool:
    """Whether the user has what the scenario's request is about."""
    if scenario in ("browse", "transfer", "user_address"):
        return True
    if scenario in ("cancel", "modify_address"):
        return bool(_orders(state, user_id, "pending"))
    if scenario == "return":
        return bool(_orders(state, user_id, "delivered"))
    if scenario == "modify_payment":
        return any(_payable_elsewhere(state, o) for o in _orders(state, user_id, "pending"))
    status = "pending" if scenario == "modify_items" else "delivered"
    return any(_replaceable(state, o) for o in _orders(state, user_id, status))


#: The retail episodes (``factory.envs.episode.ScenarioSampler`` walks them).
SAMPLER = ScenarioSampler(
    run=_RUN,
    weights=SCENARIOS,
    followups=FOLLOWUPS,
    fits=_fits,
    episode=_Episode,
    system=DEFAULT_SYSTEM,
    default_tools=RetailEnv.bare_tools,
    write_tools=WRITE_TOOLS,
    followup_share=FOLLOWUP_SHARE,
)
default_tools = SAMPLER.default_tools
sample_episode = SAMPLER.sample_episode
