"""The 16 tau-bench retail tools, as plain functions over the state dict.

Why reimplement instead of depending on tau-bench: the factory forks and steps
thousands of worlds and must know which objects a call may write (copy-on-write
forks, slices). The semantics are tau-bench's, check order included, because
the order decides which error a wrong call hits and what it changed before
failing; ``tests/envs/retail/test_env.py`` replays the 4,073 observations of
``replays-train.json`` to hold us to that, and tests the refusals the replays
never reach.

Conventions kept from tau-bench (``tau_bench/envs/retail/tools/*.py``):

* each tool takes ``data`` (``{"users", "orders", "products"}``) first and
  returns the observation text; a successful write returns ``json.dumps`` of
  the order (or user) it changed;
* a refusal is an exception whose text becomes ``"Error: <text>"``, the bytes
  tau-bench's tools return; Python errors on malformed data (a missing key, an
  empty payment history) surface the same way, as tau-bench's ``step`` does;
* money: gift card balances are rounded to cents after every change; the
  price difference of an exchange is rounded, that of an item modification is
  not (tau-bench stores ``abs(diff)`` as computed, float noise and all);
* returns and exchanges only *request* the change (status ``return requested``
  / ``exchange requested`` plus the items); nothing is refunded or charged yet.
  Cancellations refund gift cards at once, other methods "in 5-7 days" (only a
  refund line in the payment history).
* which payment method is a gift card is decided two ways, as in tau-bench:
  by its ``source`` where the method is read, by ``"gift_card" in the id``
  where only the id of a past payment is at hand (refunds, returns).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from factory.envs.common_tools import calculate, think, transfer_to_human_agents
from factory.errors import EnvironmentError_

__all__ = [
    "CANCEL_REASONS",
    "PARAMETERS",
    "READ_ONLY",
    "TOOLS",
    "WRITE_TOOLS",
    "tau_bench_qualname",
    "write_targets",
]

#: The only reasons ``cancel_pending_order`` accepts (tau-bench's enum).
CANCEL_REASONS = ("no longer needed", "ordered by mistake")

Target = tuple[str, str]


def _refuse(message: str) -> EnvironmentError_:
    return EnvironmentError_(message)


def _order(data: dict[str, Any], order_id: str, status: str, verb: str) -> dict[str, Any]:
    """The order, which must exist and have ``status`` (``non-<status> order cannot be <verb>``)."""
    orders = data["orders"]
    if order_id not in orders:
        raise _refuse("order not found")
    order: dict[str, Any] = orders[order_id]
    if order["status"] != status:
        raise _refuse(f"non-{status} order cannot be {verb}")
    return order


def _check_items(order: dict[str, Any], item_ids: list[str], message: str | None) -> None:
    """Every id of ``item_ids`` (duplicates counted) is in the order as often as asked."""
    held = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > held.count(item_id):
            raise _refuse(message if message is not None else f"{item_id} not found")


def _price_difference(
    data: dict[str, Any], order: dict[str, Any], item_ids: list[str], new_item_ids: list[str]
) -> Any:
    """Sum of new minus old prices; each new item: an available variant of the same product."""
    if len(item_ids) != len(new_item_ids):
        raise _refuse("the number of items to be exchanged should match")
    products = data["products"]
    diff: Any = 0
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
        item = [i for i in order["items"] if i["item_id"] == item_id][0]  # noqa: RUF015 - IndexError text, as tau-bench
        variants = products[item["product_id"]]["variants"]
        if not (new_item_id in variants and variants[new_item_id]["available"]):
            raise _refuse(f"new item {new_item_id} not found or available")
        diff += variants[new_item_id]["price"] - item["price"]
    return diff


def _payment_method(data: dict[str, Any], order: dict[str, Any], method_id: str) -> dict[str, Any]:
    methods = data["users"][order["user_id"]]["payment_methods"]
    if method_id not in methods:
        raise _refuse("payment method not found")
    method: dict[str, Any] = methods[method_id]
    return method


def _add_to_balance(method: dict[str, Any], amount: Any) -> None:
    method["balance"] += amount
    method["balance"] = round(method["balance"], 2)


# --- write tools ------------------------------------------------------------------------


def cancel_pending_order(data: dict[str, Any], order_id: str, reason: str) -> str:
    order = _order(data, order_id, "pending", "cancelled")
    if reason not in CANCEL_REASONS:
        raise _refuse("invalid reason")
    refunds = []
    for payment in order["payment_history"]:
        method_id = payment["payment_method_id"]
        refunds.append(
            {
                "transaction_type": "refund",
                "amount": payment["amount"],
                "payment_method_id": method_id,
            }
        )
        if "gift_card" in method_id:  # gift cards are refunded at once
            _add_to_balance(
                data["users"][order["user_id"]]["payment_methods"][method_id], payment["amount"]
            )
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    order["payment_history"].extend(refunds)
    return json.dumps(order)


def modify_pending_order_items(
    data: dict[str, Any],
    order_id: str,
    item_ids: list[str],
    new_item_ids: list[str],
    payment_method_id: str,
) -> str:
    order = _order(data, order_id, "pending", "modified")
    _check_items(order, item_ids, None)
    diff = _price_difference(data, order, item_ids, new_item_ids)
    method = _payment_method(data, order, payment_method_id)
    if method["source"] == "gift_card" and method["balance"] < diff:
        raise _refuse("insufficient gift card balance to pay for the new item")
    order["payment_history"].append(
        {
            "transaction_type": "payment" if diff > 0 else "refund",
            "amount": abs(diff),
            "payment_method_id": payment_method_id,
        }
    )
    if method["source"] == "gift_card":
        _add_to_balance(method, -diff)
    variants_of = data["products"]
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
        # The first item still carrying the old id: duplicates are replaced one by one.
        item = [i for i in order["items"] if i["item_id"] == item_id][0]  # noqa: RUF015 - IndexError text, as tau-bench
        variant = variants_of[item["product_id"]]["variants"][new_item_id]
        item["item_id"] = new_item_id
        item["price"] = variant["price"]
        item["options"] = variant["options"]
    order["status"] = "pending (item modified)"
    return json.dumps(order)


def _address(
    address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> dict[str, Any]:
    return {
        "address1": address1,
        "address2": address2,
        "city": city,
        "state": state,
        "country": country,
        "zip": zip,
    }


def modify_pending_order_address(
    data: dict[str, Any],
    order_id: str,
    address1: str,
    address2: str,
    city: str,
    state: str,
    country: str,
    zip: str,
) -> str:
    order = _order(data, order_id, "pending", "modified")
    order["address"] = _address(address1, address2, city, state, country, zip)
    return json.dumps(order)


def modify_pending_order_payment(
    data: dict[str, Any], order_id: str, payment_method_id: str
) -> str:
    order = _order(data, order_id, "pending", "modified")
    method = _payment_method(data, order, payment_method_id)
    history = order["payment_history"]
    if len(history) > 1 or history[0]["transaction_type"] != "payment":
        raise _refuse("there should be exactly one payment for a pending order")
    old_id = history[0]["payment_method_id"]
    if old_id == payment_method_id:
        raise _refuse("the new payment method should be different from the current one")
    amount = history[0]["amount"]
    if method["source"] == "gift_card" and method["balance"] < amount:
        raise _refuse("insufficient gift card balance to pay for the order")
    history.extend(
        [
            {
                "transaction_type": "payment",
                "amount": amount,
                "payment_method_id": payment_method_id,
            },
            {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id},
        ]
    )
    if method["source"] == "gift_card":
        _add_to_balance(method, -amount)
    if "gift_card" in old_id:
        _add_to_balance(data["users"][order["user_id"]]["payment_methods"][old_id], amount)
    return json.dumps(order)


def modify_user_address(
    data: dict[str, Any],
    user_id: str,
    address1: str,
    address2: str,
    city: str,
    state: str,
    country: str,
    zip: str,
) -> str:
    users = data["users"]
    if user_id not in users:
        raise _refuse("user not found")
    user = users[user_id]
    user["address"] = _address(address1, address2, city, state, country, zip)
    return json.dumps(user)


def return_delivered_order_items(
    data: dict[str, Any], order_id: str, item_ids: list[str], payment_method_id: str
) -> str:
    order = _order(data, order_id, "delivered", "returned")
    _payment_method(data, order, payment_method_id)
    if (
        "gift_card" not in payment_method_id
        and payment_method_id != order["payment_history"][0]["payment_method_id"]
    ):
        raise _refuse("payment method should be either the original payment method or a gift card")
    _check_items(order, item_ids, "some item not found")
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return json.dumps(order)


def exchange_delivered_order_items(
    data: dict[str, Any],
    order_id: str,
    item_ids: list[str],
    new_item_ids: list[str],
    payment_method_id: str,
) -> str:
    order = _order(data, order_id, "delivered", "exchanged")
    _check_items(order, item_ids, None)
    diff = round(_price_difference(data, order, item_ids, new_item_ids), 2)
    method = _payment_method(data, order, payment_method_id)
    if method["source"] == "gift_card" and method["balance"] < diff:
        raise _refuse("insufficient gift card balance to pay for the price difference")
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = diff
    return json.dumps(order)


# --- read tools ---------------------------------------------------------------------------


def find_user_id_by_email(data: dict[str, Any], email: str) -> str:
    for user_id, profile in data["users"].items():
        if profile["email"].lower() == email.lower():
            return str(user_id)
    raise _refuse("user not found")


def find_user_id_by_name_zip(
    data: dict[str, Any], first_name: str, last_name: str, zip: str
) -> str:
    for user_id, profile in data["users"].items():
        if (
            profile["name"]["first_name"].lower() == first_name.lower()
            and profile["name"]["last_name"].lower() == last_name.lower()
            and profile["address"]["zip"] == zip
        ):
            return str(user_id)
    raise _refuse("user not found")


def _lookup(table: dict[str, Any], key: str, what: str) -> str:
    if key in table:
        return json.dumps(table[key])
    raise _refuse(f"{what} not found")


def get_user_details(data: dict[str, Any], user_id: str) -> str:
    return _lookup(data["users"], user_id, "user")


def get_order_details(data: dict[str, Any], order_id: str) -> str:
    return _lookup(data["orders"], order_id, "order")


def get_product_details(data: dict[str, Any], product_id: str) -> str:
    return _lookup(data["products"], product_id, "product")


def list_all_product_types(data: dict[str, Any]) -> str:
    """Product name -> product id, sorted by name (a later product wins a shared name)."""
    by_name = {product["name"]: product["product_id"] for product in data["products"].values()}
    return json.dumps(dict(sorted(by_name.items())))


# --- registry ---------------------------------------------------------------------------

TOOLS: dict[str, Callable[..., str]] = {
    f.__name__: f
    for f in (
        calculate,
        cancel_pending_order,
        exchange_delivered_order_items,
        find_user_id_by_email,
        find_user_id_by_name_zip,
        get_order_details,
        get_product_details,
        get_user_details,
        list_all_product_types,
        modify_pending_order_address,
        modify_pending_order_items,
        modify_pending_order_payment,
        modify_user_address,
        return_delivered_order_items,
        think,
        transfer_to_human_agents,
    )
}

WRITE_TOOLS = frozenset(
    {
        "cancel_pending_order",
        "exchange_delivered_order_items",
        "modify_pending_order_address",
        "modify_pending_order_items",
        "modify_pending_order_payment",
        "modify_user_address",
        "return_delivered_order_items",
    }
)
READ_ONLY = frozenset(TOOLS) - WRITE_TOOLS
#: Write tools that may change the order's owner (a gift card balance).
_BALANCE_TOOLS = frozenset(
    {"cancel_pending_order", "modify_pending_order_items", "modify_pending_order_payment"}
)


def tau_bench_qualname(name: str) -> str:
    """``get_order_details`` -> ``GetOrderDetails.invoke`` (names in Python's call errors)."""
    return "".join(part.capitalize() for part in name.split("_")) + ".invoke"


def _key(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def write_targets(data: dict[str, Any], name: str, arguments: dict[str, Any]) -> list[Target]:
    """Existing objects (table, id) that the call may modify in place; read tools give []."""
    if name == "modify_user_address":
        user_id = _key(arguments.get("user_id"))
        return [("users", user_id)] if user_id is not None and user_id in data["users"] else []
    if name not in WRITE_TOOLS:
        return []
    order_id = _key(arguments.get("order_id"))
    order = data["orders"].get(order_id) if order_id is not None else None
    if not isinstance(order, dict):
        return []
    targets: list[Target] = [("orders", order_id)]  # type: ignore[list-item]
    user_id = _key(order.get("user_id"))
    if name in _BALANCE_TOOLS and user_id is not None and user_id in data["users"]:
        targets.append(("users", user_id))
    return targets


# --- argument schemas (types only, as tau-bench's get_info() without the prose) -------------


def _obj(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


_STR = {"type": "string"}
_IDS = {"type": "array", "items": _STR}
_ADDRESS = {k: _STR for k in ("address1", "address2", "city", "state", "country", "zip")}

#: JSON-Schema of each tool's arguments (what ``RetailEnv`` checks before running a call).
#: ``reason`` has no enum here on purpose: the tool's own ``invalid reason`` answers it.
PARAMETERS: dict[str, dict[str, Any]] = {
    "calculate": _obj(["expression"], expression=_STR),
    "cancel_pending_order": _obj(["order_id", "reason"], order_id=_STR, reason=_STR),
    "exchange_delivered_order_items": _obj(
        ["order_id", "item_ids", "new_item_ids", "payment_method_id"],
        order_id=_STR,
        item_ids=_IDS,
        new_item_ids=_IDS,
        payment_method_id=_STR,
    ),
    "find_user_id_by_email": _obj(["email"], email=_STR),
    "find_user_id_by_name_zip": _obj(
        ["first_name", "last_name", "zip"], first_name=_STR, last_name=_STR, zip=_STR
    ),
    "get_order_details": _obj(["order_id"], order_id=_STR),
    "get_product_details": _obj(["product_id"], product_id=_STR),
    "get_user_details": _obj(["user_id"], user_id=_STR),
    "list_all_product_types": _obj([]),
    "modify_pending_order_address": _obj(["order_id", *_ADDRESS], order_id=_STR, **_ADDRESS),
    "modify_pending_order_items": _obj(
        ["order_id", "item_ids", "new_item_ids", "payment_method_id"],
        order_id=_STR,
        item_ids=_IDS,
        new_item_ids=_IDS,
        payment_method_id=_STR,
    ),
    "modify_pending_order_payment": _obj(
        ["order_id", "payment_method_id"], order_id=_STR, payment_method_id=_STR
    ),
    "modify_user_address": _obj(["user_id", *_ADDRESS], user_id=_STR, **_ADDRESS),
    "return_delivered_order_items": _obj(
        ["order_id", "item_ids", "payment_method_id"],
        order_id=_STR,
        item_ids=_IDS,
        payment_method_id=_STR,
    ),
    "think": _obj(["thought"], thought=_STR),
    "transfer_to_human_agents": _obj(["summary"], summary=_STR),
}
