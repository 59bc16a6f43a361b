"""Retail's answers on the development server: short episodes executed on a store state.

Why: a grounded amplification prompt (``prompts/amplify_grounded.j2``) shows a slice
of a real store (one user, their orders, the products in them), and the factory
replays every call of the answer on the full world (``factory.envsim.grounding``).
The devserver (``factory.devserver.grounded``) therefore asks the domain to play a
short, policy-shaped episode about the scenario's user -- identify them by email,
read, confirm, write -- and *executes* each call on a world built over a copy of
the scenario: the observations are the real ones. The reference steers the plot: a
reference that returns items gets a return when the state has a delivered order.

The world is whatever the plug-in passes as ``world`` (the retail ``Environment``);
this module only needs ``execute`` and ``state``, so it runs on any executor with
tau-bench's retail semantics.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Collection
from copy import deepcopy
from typing import Any

from factory.envs.base import Environment
from factory.envs.plugin import DevserverHooks
from factory.envs.scripted import ScriptedEpisode, choose_plot, read_tables

__all__ = [
    "ID_KEYS",
    "OBSERVATION_ENUMS",
    "PLOTS",
    "TABLES",
    "devserver_hooks",
    "grounded_trajectory",
    "read_state",
]

TABLES = ("users", "orders", "products")
#: Episodes the devserver can play, and the reference tool that asks for each.
PLOTS: dict[str, str | None] = {
    "cancel": "cancel_pending_order",
    "modify_items": "modify_pending_order_items",
    "order_address": "modify_pending_order_address",
    "payment": "modify_pending_order_payment",
    "return": "return_delivered_order_items",
    "exchange": "exchange_delivered_order_items",
    "user_address": "modify_user_address",
    "status": "get_order_details",
    "profile": None,
}
#: Enum values a drifting simulator swaps among (the devserver's ``wrong_observation``).
OBSERVATION_ENUMS: dict[str, tuple[str, ...]] = {
    "status": (
        "pending",
        "processed",
        "delivered",
        "cancelled",
        "pending (item modified)",
        "return requested",
        "exchange requested",
    ),
    "source": ("credit_card", "paypal", "gift_card"),
    "transaction_type": ("payment", "refund"),
}
#: JSON keys whose values are item ids besides ``*_id``/``*_ids`` (the devserver renames them).
ID_KEYS = frozenset({"return_items", "exchange_items", "exchange_new_items"})
_GREETINGS = ("Hi!", "Hello.", "Hey there,", "Good afternoon.", "Hi,")
_STREETS = ("Oak Street", "Pine Avenue", "Lakeview Drive", "Hillcrest Road", "River Lane")

State = dict[str, Any]
World = Callable[[State], Environment]


def read_state(value: Any) -> State | None:
    """``value`` if it is a retail state with users (a prompt's environment block), else None."""
    return read_tables(value, TABLES)


# --------------------------------------------------------------------------------------
# The episode
# --------------------------------------------------------------------------------------
class _Episode(ScriptedEpisode):
    """A retail conversation: the user gives their email, the agent finds and reads them."""

    ASK = "Shall I go ahead (yes/no)?"
    YES = ("Yes, please.", "Yes.", "Yes, go ahead.", "Yes, that's right.")
    FAREWELL = "You're welcome! Have a nice day."

    def open(self, request: str) -> None:
        email = self.user["email"]
        self.say_user(f"{self.pick(_GREETINGS)} {request} My email is {email}.")
        self.call(
            "find_user_id_by_email",
            {"email": email},
            "Identify the user by email before anything else.",
        )
        self.call(
            "get_user_details",
            {"user_id": self.user_id},
            "Read the profile: orders and payment methods.",
        )

    def read_order(self, order_id: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.call(
                "get_order_details",
                {"order_id": order_id},
                f"Check the status and items of {order_id} first.",
            )
        )
        return found


def _orders(ep: _Episode, status: str) -> list[dict[str, Any]]:
    """The user's orders in ``status`` that the state holds, in id order."""
    orders = ep.state["orders"]
    return [
        orders[o]
        for o in sorted(ep.user.get("orders") or [])
        if o in orders and orders[o].get("status") == status
    ]


def _method(ep: _Episode, order: dict[str, Any], amount: float, *, other: bool) -> str | None:
    """A saved method that can pay ``amount``: not the order's payer when ``other``."""
    payer = (order.get("payment_history") or [{}])[0].get("payment_method_id")
    for pid, method in sorted((ep.user.get("payment_methods") or {}).items()):
        if other and pid == payer:
            continue
        if method.get("source") == "gift_card" and float(method.get("balance", 0)) < amount:
            continue
        return pid
    return None


def _swap(ep: _Episode, order: dict[str, Any]) -> tuple[dict[str, Any], str, float] | None:
    """(item, new item id, price difference) of an item with another available variant."""
    products = ep.state["products"]
    for item in order.get("items") or []:
        variants = (products.get(item.get("product_id")) or {}).get("variants") or {}
        options = sorted(
            v for v, spec in variants.items() if spec.get("available") and v != item["item_id"]
        )
        if options:
            new = options[0]
            return item, new, round(variants[new]["price"] - item["price"], 2)
    return None


def _describe(item: dict[str, Any]) -> str:
    options = ", ".join(str(v) for v in (item.get("options") or {}).values())
    return f"{item.get('name', 'item')} ({options})" if options else str(item.get("name", "item"))


# --- plots ------------------------------------------------------------------------------
def _profile(ep: _Episode) -> None:
    ep.open(ep.pick(("Which payment methods do I have on file?", "What orders do I have?")))
    methods = ", ".join(sorted(ep.user.get("payment_methods") or {})) or "none"
    orders = ", ".join(ep.user.get("orders") or []) or "none"
    ep.close(f"Your orders: {orders}. Your payment methods: {methods}.")


def _status(ep: _Episode) -> None:
    known = sorted(o for o in ep.user.get("orders") or [] if o in ep.state["orders"])
    order_id = ep.rng.choice(known)
    ep.open(f"What is the status of my order {order_id}?")
    order = ep.read_order(order_id)
    items = "; ".join(_describe(i) for i in order.get("items") or [])
    ep.close(f"Order {order_id} is {order['status']}. It holds: {items}.")


def _cancel(ep: _Episode) -> None:
    order_id = ep.rng.choice(_orders(ep, "pending"))["order_id"]
    reason = ep.pick(("no longer needed", "ordered by mistake"))
    ep.open(f"Please cancel order {order_id}, it was {reason}.")
    order = ep.read_order(order_id)
    paid = sum(p["amount"] for p in order.get("payment_history") or [])
    ep.confirm(
        f"Order {order_id} is pending and can be cancelled (reason: {reason}); "
        f"${paid:.2f} goes back to the original payment method."
    )
    ep.call(
        "cancel_pending_order", {"order_id": order_id, "reason": reason}, "Confirmed; cancel it."
    )
    ep.close(f"Order {order_id} is cancelled and the refund of ${paid:.2f} is on its way.")


def _change_items(ep: _Episode, status: str, tool: str, verb: str) -> None:
    order, (item, new, diff), method = _item_plan(ep, status)
    order_id = order["order_id"]
    ep.open(f"I'd like to {verb} the {item.get('name', 'item')} in order {order_id}.")
    ep.read_order(order_id)
    ep.call(
        "get_product_details",
        {"product_id": item["product_id"]},
        "Look up the other options of this product and their availability.",
    )
    money = f"you pay ${diff:.2f}" if diff > 0 else f"you get ${-diff:.2f} back"
    ep.confirm(
        f"Item {item['item_id']} becomes {new} ({money}, through {method}). Is that the only item? "
        "This can be done only once for the order."
    )
    arguments = {
        "order_id": order_id,
        "item_ids": [item["item_id"]],
        "new_item_ids": [new],
        "payment_method_id": method,
    }
    result = json.loads(ep.call(tool, arguments, "Confirmed; request the change in one call."))
    ep.close(f"Done: order {order_id} is now '{result['status']}'.")


def _item_plan(ep: _Episode, status: str) -> Any:
    """(order, swap, payment method) for an item change of an order in ``status``, or None."""
    for order in _orders(ep, status):
        swap = _swap(ep, order)
        if swap is None:
            continue
        method = _method(ep, order, max(swap[2], 0.0), other=False)
        if method is not None:
            return order, swap, method
    return None


def _return(ep: _Episode) -> None:
    order = ep.rng.choice(_orders(ep, "delivered"))
    order_id = order["order_id"]
    item = order["items"][0]
    payer = order["payment_history"][0]["payment_method_id"]
    ep.open(f"I want to return the {item.get('name', 'item')} from order {order_id}.")
    ep.read_order(order_id)
    ep.confirm(
        f"Return item {item['item_id']} ({_describe(item)}) of order {order_id}; "
        f"${item['price']:.2f} is refunded to {payer}, the original payment method."
    )
    arguments = {"order_id": order_id, "item_ids": [item["item_id"]], "payment_method_id": payer}
    ep.call("return_delivered_order_items", arguments, "Confirmed; request the return.")
    ep.close("The return is requested; you'll get an email explaining how to send it back.")


def _new_address(ep: _Episode) -> dict[str, str]:
    old = ep.user.get("address") or {}
    return {
        "address1": f"{ep.rng.randint(10, 999)} {ep.pick(_STREETS)}",
        "address2": ep.pick(("", f"Apt {ep.rng.randint(1, 40)}")),
        "city": str(old.get("city") or "Springfield"),
        "state": str(old.get("state") or "IL"),
        "country": str(old.get("country") or "USA"),
        "zip": str(old.get("zip") or "62701"),
    }


def _address_text(a: dict[str, str]) -> str:
    second = f", {a['address2']}" if a["address2"] else ""
    return f"{a['address1']}{second}, {a['city']}, {a['state']} {a['zip']}, {a['country']}"


def _order_address(ep: _Episode) -> None:
    order_id = ep.rng.choice(_orders(ep, "pending"))["order_id"]
    address = _new_address(ep)
    ep.open(f"Please ship order {order_id} to {_address_text(address)}.")
    ep.read_order(order_id)
    ep.confirm(f"Order {order_id} is pending; its new shipping address: {_address_text(address)}.")
    ep.call("modify_pending_order_address", {"order_id": order_id, **address}, "Confirmed.")
    ep.close(f"Order {order_id} will be shipped to {_address_text(address)}.")


def _user_address(ep: _Episode) -> None:
    address = _new_address(ep)
    ep.open(f"I moved; my new address is {_address_text(address)}.")
    ep.confirm(f"Your default address becomes {_address_text(address)}.")
    ep.call("modify_user_address", {"user_id": ep.user_id, **address}, "Confirmed; update it.")
    ep.close("Your default address is updated; existing orders keep their shipping address.")


def _payment_plan(ep: _Episode) -> tuple[dict[str, Any], str] | None:
    for order in _orders(ep, "pending"):
        history = order.get("payment_history") or []
        if len(history) != 1 or history[0].get("transaction_type") != "payment":
            continue
        method = _method(ep, order, float(history[0]["amount"]), other=True)
        if method is not None:
            return order, method
    return None


def _payment(ep: _Episode) -> None:
    plan = _payment_plan(ep)
    assert plan is not None  # _feasible checked it
    order, method = plan
    order_id = order["order_id"]
    ep.open(f"Can order {order_id} be paid with {method} instead?")
    ep.read_order(order_id)
    amount = order["payment_history"][0]["amount"]
    ep.confirm(f"{method} is charged ${amount:.2f} for {order_id} and the old method refunded.")
    arguments = {"order_id": order_id, "payment_method_id": method}
    ep.call("modify_pending_order_payment", arguments, "Confirmed; switch the payment method.")
    ep.close(f"Order {order_id} is now paid with {method}.")


_PLAYERS: dict[str, Callable[[_Episode], None]] = {
    "cancel": _cancel,
    "modify_items": lambda ep: _change_items(ep, "pending", "modify_pending_order_items", "change"),
    "order_address": _order_address,
    "payment": _payment,
    "return": _return,
    "exchange": lambda ep: _change_items(
        ep, "delivered", "exchange_delivered_order_items", "exchange"
    ),
    "user_address": _user_address,
    "status": _status,
    "profile": _profile,
}


def _feasible(ep: _Episode, plot: str) -> bool:
    if plot in ("cancel", "order_address"):
        return bool(_orders(ep, "pending"))
    if plot == "return":
        return any(o.get("items") and o.get("payment_history") for o in _orders(ep, "delivered"))
    if plot == "modify_items":
        return _item_plan(ep, "pending") is not None
    if plot == "exchange":
        return _item_plan(ep, "delivered") is not None
    if plot == "payment":
        return _payment_plan(ep) is not None
    if plot == "status":
        return any(o in ep.state["orders"] for o in ep.user.get("orders") or [])
    return True


def grounded_trajectory(
    scenario: State,
    rng: random.Random,
    *,
    world: World,
    reference_tools: Collection[str] = (),
) -> dict[str, Any] | None:
    """A conversation about the scenario's user whose every call was executed on the scenario.

    Args:
        scenario: a retail state (the prompt's environment block); not modified.
        rng: the request's content random source.
        world: builds the executable world over a state (the plug-in's environment).
        reference_tools: tools the reference calls; the first plot they ask for
            that the state allows is played, else a random feasible one.

    Returns:
        ``{"messages": [...]}`` in the amplification output format, or None when
        ``scenario`` is not a retail state with a playable user.
    """
    if read_state(scenario) is None:
        return None
    user_id = next(iter(scenario["users"]))
    if not isinstance(user_id, str) or not isinstance(scenario["users"][user_id].get("email"), str):
        return None
    try:
        env = world(deepcopy(scenario))
        ep = _Episode(env, rng, user_id)
        _PLAYERS[choose_plot(PLOTS, lambda p: _feasible(ep, p), rng, reference_tools)](ep)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None  # a state that is retail-shaped but not consistent enough to play
    return {"messages": ep.messages}


def devserver_hooks(world: World) -> DevserverHooks:
    """The plug-in's ``devserver`` part, playing episodes on worlds ``world`` builds.

    The retail plug-in wires it as ``devserver=devserver_hooks(lambda s: RetailEnv(s))``.
    """

    def play(state: State, rng: random.Random, reference_tools: Collection[str]) -> Any:
        return grounded_trajectory(state, rng, world=world, reference_tools=reference_tools)

    return DevserverHooks(
        read_state=read_state,
        play=play,
        observation_enums=OBSERVATION_ENUMS,
        id_keys=ID_KEYS,
    )
