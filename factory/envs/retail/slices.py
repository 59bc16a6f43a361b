"""State slices: the part of a retail world one call reads or writes.

Why (as for the airline): a step sample must carry kilobytes, not the whole
database, and a model predicting an observation or a Δ should see exactly the
objects that decide it. A slice is a state of the same schema
(``{"users", "orders", "products"}``) holding only:

* a lookup by email or by name and zip: every user that matches (in the
  world's order, so the first match is the same user);
* the user a call names; the order a call names and, for a write on an order
  (payments, refunds, gift card balances), its owner;
* the products a call reads: the one ``get_product_details`` names (whole);
  for an item modification or exchange, the products of the items it
  replaces, keeping only the ``variants`` it asks for (the new item ids);
  for ``list_all_product_types``, every product with no variants at all.

The guarantee (tested on every call of the replays and on sampled episodes):
running the call on its slice gives the same observation as on the full
state, and the slice after the run equals ``project(full_state_after,
like=slice_after)``. Slices are deep copies; running on one never touches the
world it came from.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

from factory.envs.slicing import project_like, trim

__all__ = ["TABLES", "TRIMMED", "project", "slice_for"]

TABLES = ("users", "orders", "products")
#: Per table, the mapping field a slice may trim to the keys a call reads.
TRIMMED = {"products": "variants"}

_ORDER_WRITES = frozenset(
    {
        "cancel_pending_order",
        "exchange_delivered_order_items",
        "modify_pending_order_items",
        "modify_pending_order_payment",
        "return_delivered_order_items",
        "modify_pending_order_address",
    }
)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _matching_users(state: dict[str, Any], tool_name: str, args: dict[str, Any]) -> list[str]:
    users = state["users"]
    if tool_name == "find_user_id_by_email":
        email = _text(args.get("email"))
        if email is None:
            return []
        return [u for u, p in users.items() if str(p.get("email", "")).lower() == email.lower()]
    first, last, zip_code = (_text(args.get(k)) for k in ("first_name", "last_name", "zip"))
    if first is None or last is None or zip_code is None:
        return []
    return [
        uid
        for uid, p in users.items()
        if str(p.get("name", {}).get("first_name", "")).lower() == first.lower()
        and str(p.get("name", {}).get("last_name", "")).lower() == last.lower()
        and p.get("address", {}).get("zip") == zip_code
    ]


def slice_for(state: dict[str, Any], tool_name: str, arguments: Any) -> dict[str, Any]:
    """The part of ``state`` that ``tool_name(**arguments)`` reads or writes.

    Args:
        state: a full retail state (tau-bench layout).
        tool_name: any name; tools that read no state (and unknown ones) give an
            empty slice.
        arguments: the call's arguments; malformed values select nothing.

    Returns:
        A deep-copied state of the same schema; each table keeps the world's order.
    """
    args = arguments if isinstance(arguments, dict) else {}
    users: list[str] = []
    orders: list[str] = []
    products: dict[str, set[str] | None] = {}  # product id -> variants kept (None: all)
    if tool_name in ("find_user_id_by_email", "find_user_id_by_name_zip"):
        users = _matching_users(state, tool_name, args)
    elif tool_name in ("get_user_details", "modify_user_address"):
        users = [u for u in [_text(args.get("user_id"))] if u is not None]
    elif tool_name == "get_product_details":
        pid = _text(args.get("product_id"))
        if pid is not None:
            products[pid] = None
    elif tool_name == "list_all_product_types":
        products = {pid: set() for pid in state["products"]}
    elif tool_name == "get_order_details" or tool_name in _ORDER_WRITES:
        oid = _text(args.get("order_id"))
        order = state["orders"].get(oid) if oid is not None else None
        if isinstance(order, dict):
            orders = [oid]  # type: ignore[list-item]
            if tool_name in _ORDER_WRITES:
                users = [u for u in [_text(order.get("user_id"))] if u is not None]
            if tool_name in ("exchange_delivered_order_items", "modify_pending_order_items"):
                wanted = set(_strings(args.get("new_item_ids")))
                named = set(_strings(args.get("item_ids")))
                for item in order.get("items") or []:
                    if isinstance(item, dict) and item.get("item_id") in named:
                        pid = _text(item.get("product_id"))
                        if pid is not None:
                            products[pid] = wanted
    return {
        "users": {u: deepcopy(p) for u, p in state["users"].items() if u in set(users)},
        "orders": {o: deepcopy(state["orders"][o]) for o in orders if o in state["orders"]},
        "products": {
            pid: deepcopy(product)
            if products[pid] is None
            else trim(product, "variants", products[pid] or ())
            for pid, product in state["products"].items()
            if pid in products
        },
    }


def project(state: dict[str, Any], like: dict[str, Any]) -> dict[str, Any]:
    """The objects of ``state`` that ``like`` (a slice) holds, trimmed the same way.

    Returns:
        A deep-copied state with ``like``'s tables and ids (for products, ``like``'s
        variants); ids of ``like`` missing from ``state`` are left out.
    """
    return project_like(state, like, TRIMMED)
