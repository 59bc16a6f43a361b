"""A deterministic generator of retail worlds in tau-bench's schema.

Why generate: the factory ships no third-party database, and sampling many
trajectories from one fixed world teaches a model that world's ids. A seed
gives a fresh, internally consistent world (same seed, same bytes): every
product lists its variants under their item ids; every order belongs to a
user that lists it, holds items that are variants of the products they name
(at the variant's price), is paid by a method of its user for exactly the sum
of its items, and carries what its status implies (pending: no fulfilment;
processed/delivered: a tracking id for all items; cancelled: a refund line).
Users hold credit cards, PayPal and gift cards (with balances), and some have
no orders at all, as in tau-bench's data.

    python -m factory.envs.retail.world --seed 0 --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

__all__ = ["CATALOGUE", "STATUSES", "check_world", "generate_world", "main", "write_world"]

#: Product type -> (price range in dollars, option name -> values). Our own catalogue.
CATALOGUE: dict[str, tuple[tuple[int, int], dict[str, tuple[str, ...]]]] = {
    "Backpack": (
        (40, 220),
        {
            "color": ("black", "grey", "green", "navy"),
            "size": ("small", "medium", "large"),
            "material": ("nylon", "leather", "polyester"),
        },
    ),
    "Bluetooth Speaker": (
        (40, 320),
        {
            "color": ("black", "blue", "red"),
            "battery life": ("10 hours", "20 hours"),
            "water resistance": ("yes", "no"),
        },
    ),
    "Coffee Maker": (
        (60, 320),
        {
            "color": ("black", "stainless steel", "white"),
            "capacity": ("4 cups", "8 cups", "12 cups"),
            "type": ("drip", "french press", "espresso"),
        },
    ),
    "Desk Lamp": (
        (30, 180),
        {
            "color": ("white", "black", "silver"),
            "brightness": ("low", "medium", "high"),
            "power source": ("USB", "AC adapter", "battery"),
        },
    ),
    "Electric Kettle": (
        (25, 150),
        {
            "capacity": ("1L", "1.5L", "2L"),
            "material": ("glass", "plastic", "stainless steel"),
            "color": ("white", "black", "silver"),
        },
    ),
    "Fleece Jacket": (
        (60, 190),
        {
            "size": ("S", "M", "L", "XL"),
            "color": ("black", "navy", "red"),
            "zipper": ("full", "half"),
        },
    ),
    "Garden Hose": (
        (20, 120),
        {
            "length": ("25ft", "50ft", "100ft"),
            "material": ("rubber", "vinyl", "latex"),
            "color": ("green", "blue", "black"),
        },
    ),
    "Headphones": (
        (60, 420),
        {
            "type": ("on-ear", "over-ear", "in-ear"),
            "connectivity": ("wired", "wireless"),
            "color": ("black", "white", "red"),
        },
    ),
    "Hiking Boots": (
        (80, 280),
        {
            "size": ("8", "9", "10", "11", "12"),
            "material": ("leather", "synthetic"),
            "waterproof": ("yes", "no"),
        },
    ),
    "Laptop": (
        (600, 2800),
        {
            "screen size": ("13-inch", "15-inch", "17-inch"),
            "processor": ("i5", "i7", "i9"),
            "ram": ("8GB", "16GB", "32GB"),
            "storage": ("256GB SSD", "512GB SSD", "1TB SSD"),
        },
    ),
    "Mechanical Keyboard": (
        (60, 280),
        {
            "switch type": ("linear", "tactile", "clicky"),
            "backlight": ("none", "white", "RGB"),
            "size": ("full size", "80%", "60%"),
        },
    ),
    "Office Chair": (
        (120, 520),
        {
            "material": ("fabric", "mesh", "leather"),
            "color": ("black", "gray", "blue"),
            "armrest": ("fixed", "adjustable"),
        },
    ),
    "Running Shoes": (
        (60, 220),
        {
            "size": ("7", "8", "9", "10", "11"),
            "color": ("black", "white", "red", "yellow"),
            "material": ("mesh", "synthetic"),
        },
    ),
    "Smart Watch": (
        (150, 520),
        {
            "color": ("black", "silver", "gold"),
            "band material": ("silicone", "leather", "metal"),
            "display": ("LCD", "AMOLED"),
        },
    ),
    "T-Shirt": (
        (15, 60),
        {
            "color": ("black", "white", "blue", "red"),
            "size": ("S", "M", "L", "XL"),
            "material": ("cotton", "polyester"),
        },
    ),
    "Tablet": (
        (200, 1100),
        {
            "screen size": ("8-inch", "10-inch", "12-inch"),
            "storage": ("64GB", "128GB", "256GB"),
            "color": ("black", "silver", "gold"),
        },
    ),
    "Vacuum Cleaner": (
        (90, 650),
        {
            "type": ("upright", "canister", "robotic"),
            "bagged/bagless": ("bagged", "bagless"),
            "features": ("HEPA filter", "pet hair removal", "cordless"),
        },
    ),
    "Water Bottle": (
        (10, 60),
        {
            "capacity": ("500ml", "750ml", "1000ml"),
            "material": ("glass", "plastic", "stainless steel"),
            "color": ("blue", "black", "green"),
        },
    ),
    "Wireless Earbuds": (
        (50, 320),
        {
            "color": ("black", "white", "blue"),
            "battery life": ("4 hours", "6 hours", "8 hours"),
            "water resistance": ("IPX4", "IPX7", "not resistant"),
        },
    ),
    "Yoga Mat": (
        (20, 140),
        {
            "thickness": ("4mm", "6mm", "8mm"),
            "material": ("PVC", "natural rubber", "TPE"),
            "color": ("green", "pink", "purple", "blue"),
        },
    ),
}

#: Order statuses a generated world holds, with their weights.
STATUSES: dict[str, float] = {
    "pending": 0.42,
    "processed": 0.1,
    "delivered": 0.38,
    "cancelled": 0.1,
}

_FIRST = (
    "Aarav", "Amelia", "Anya", "Chen", "Daiki", "Emma", "Ethan", "Fatima", "Harper", "Isabella",
    "Ivan", "Juan", "Lei", "Liam", "Lucas", "Mei", "Mia", "Mohamed", "Noah", "Olivia", "Omar",
    "Priya", "Raj", "Sofia", "Yara", "Yusuf", "Zoe",
)  # fmt: skip
_LAST = (
    "Ahmed", "Brown", "Davis", "Garcia", "Hernandez", "Ito", "Jackson", "Johnson", "Khan", "Kim",
    "Lee", "Li", "Lopez", "Martin", "Moore", "Muller", "Nguyen", "Patel", "Rossi", "Santos",
    "Silva", "Smith", "Taylor", "Thomas", "Wilson",
)  # fmt: skip
_STREETS = (
    "Broadway", "Cedar Street", "Elm Avenue", "Hillcrest Drive", "Lakeview Road", "Main Street",
    "Maple Drive", "Oak Lane", "Park Avenue", "Pine Court", "River Road", "Sunset Drive",
)  # fmt: skip
_CITIES = (
    ("Austin", "TX", "787"), ("Boston", "MA", "021"), ("Charlotte", "NC", "282"),
    ("Chicago", "IL", "606"), ("Columbus", "OH", "432"), ("Denver", "CO", "802"),
    ("Houston", "TX", "770"), ("Los Angeles", "CA", "900"), ("Philadelphia", "PA", "191"),
    ("Phoenix", "AZ", "850"), ("San Diego", "CA", "921"), ("Seattle", "WA", "981"),
)  # fmt: skip


class _World:
    """Builds one world; all randomness comes from one ``random.Random``."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.products: dict[str, Any] = {}
        self.users: dict[str, Any] = {}
        self.orders: dict[str, Any] = {}
        self._used: set[str] = set()

    def _unique(self, make: Callable[[], str]) -> str:
        while True:
            value = make()
            if value not in self._used:
                self._used.add(value)
                return value

    def _tagged(self, head: str, tail: str) -> str:
        return f"{head}{self.rng.randint(1000, 9999)}{tail}"

    def _tagged_zip(self, head: str, prefix: str) -> str:
        return f"{head}{prefix}{self.rng.randint(0, 99):02d}"

    def _digits(self, n: int) -> str:
        return str(self.rng.randint(10 ** (n - 1), 10**n - 1))

    # --- products -------------------------------------------------------------------------
    def make_products(self, n_products: int, max_variants: int) -> None:
        rng = self.rng
        names = sorted(CATALOGUE)
        for index in range(n_products):
            # Past the catalogue's size a type repeats under a numbered name (names stay unique).
            base = names[index % len(names)]
            name = base if index < len(names) else f"{base} {index // len(names) + 1}"
            (low, high), options = CATALOGUE[base]
            combos = list(itertools.product(*options.values()))
            chosen = rng.sample(combos, min(len(combos), rng.randint(3, max(3, max_variants))))
            product_id = self._unique(lambda: self._digits(10))
            variants: dict[str, Any] = {}
            for combo in chosen:
                item_id = self._unique(lambda: self._digits(10))
                variants[item_id] = {
                    "item_id": item_id,
                    "options": dict(zip(options, combo, strict=True)),
                    "available": rng.random() < 0.65,
                    "price": round(rng.uniform(low, high), 2),
                }
            self.products[product_id] = {
                "name": name,
                "product_id": product_id,
                "variants": variants,
            }

    # --- users ----------------------------------------------------------------------------
    def _payment_method(self, source: str) -> dict[str, Any]:
        rng = self.rng
        pid = self._unique(lambda: f"{source}_{self._digits(7)}")
        if source == "credit_card":
            return {
                "source": source,
                "brand": rng.choice(("visa", "mastercard")),
                "last_four": f"{rng.randint(0, 9999):04d}",
                "id": pid,
            }
        if source == "gift_card":
            return {"source": source, "balance": rng.randint(0, 200), "id": pid}
        return {"source": source, "id": pid}

    def make_users(self, n_users: int) -> None:
        rng = self.rng
        for _ in range(n_users):
            first, last = rng.choice(_FIRST), rng.choice(_LAST)
            uid = self._unique(partial(self._tagged, f"{first}_{last}_".lower(), ""))
            city, state, prefix = rng.choice(_CITIES)
            # Name and zip identify a user (tau-bench's second lookup), so no two share both.
            zip_code = self._unique(partial(self._tagged_zip, f"{first}|{last}|", prefix))
            zip_code = zip_code.rsplit("|", 1)[1]
            sources = rng.sample(
                ("credit_card", "paypal", "gift_card"), rng.choice((1, 1, 2, 2, 3))
            )
            if rng.random() < 0.1:
                sources.append(rng.choice(("credit_card", "gift_card")))
            methods = [self._payment_method(s) for s in sources]
            self.users[uid] = {
                "name": {"first_name": first, "last_name": last},
                "address": {
                    "address1": f"{rng.randint(1, 999)} {rng.choice(_STREETS)}",
                    "address2": f"Suite {rng.randint(100, 999)}",
                    "city": city,
                    "country": "USA",
                    "state": state,
                    "zip": zip_code,
                },
                "email": self._unique(
                    partial(self._tagged, f"{first}.{last}".lower(), "@example.com")
                ),
                "payment_methods": {m["id"]: m for m in methods},
                "orders": [],
            }

    # --- orders ---------------------------------------------------------------------------
    def _item(self, product: dict[str, Any]) -> dict[str, Any]:
        variant = self.rng.choice(list(product["variants"].values()))
        return {
            "name": product["name"],
            "product_id": product["product_id"],
            "item_id": variant["item_id"],
            "price": variant["price"],
            "options": dict(variant["options"]),
        }

    def make_orders(self, n_orders: int) -> None:
        rng = self.rng
        if not self.users or not self.products:
            return
        user_ids = sorted(self.users)
        # About one user in eight has no orders, as in tau-bench's data.
        buyers = [u for u in user_ids if rng.random() >= 0.125] or user_ids
        products = [self.products[p] for p in sorted(self.products)]
        statuses, weights = list(STATUSES), list(STATUSES.values())
        for _ in range(n_orders):
            user_id = rng.choice(buyers)
            user = self.users[user_id]
            items = [self._item(rng.choice(products)) for _ in range(rng.randint(1, 5))]
            if rng.random() < 0.05:  # the same item twice
                items.append(dict(items[0], options=dict(items[0]["options"])))
            status = rng.choices(statuses, weights)[0]
            method = rng.choice(sorted(user["payment_methods"]))
            total = round(sum(i["price"] for i in items), 2)
            history = [
                {"transaction_type": "payment", "amount": total, "payment_method_id": method}
            ]
            if status == "cancelled":
                history.append(dict(history[0], transaction_type="refund"))
            address = dict(user["address"])
            if rng.random() < 0.2:  # shipped elsewhere once
                city, state, prefix = rng.choice(_CITIES)
                address.update(
                    address1=f"{rng.randint(1, 999)} {rng.choice(_STREETS)}",
                    city=city,
                    state=state,
                    zip=f"{prefix}{rng.randint(0, 99):02d}",
                )
            fulfillments = []
            if status in ("processed", "delivered") or (
                status == "cancelled" and rng.random() < 0.5
            ):
                fulfillments.append(
                    {"tracking_id": [self._digits(12)], "item_ids": [i["item_id"] for i in items]}
                )
            order_id = self._unique(lambda: f"#W{self._digits(7)}")
            self.orders[order_id] = {
                "order_id": order_id,
                "user_id": user_id,
                "address": address,
                "items": items,
                "fulfillments": fulfillments,
                "status": status,
                "payment_history": history,
            }
            user["orders"].append(order_id)


def generate_world(
    seed: int,
    n_users: int = 500,
    n_products: int = 50,
    n_orders: int = 1000,
    max_variants: int = 12,
) -> dict[str, Any]:
    """A consistent retail state ``{"users", "orders", "products"}``.

    Args:
        seed: the only source of randomness (same seed and sizes, same world).
        n_users, n_products, n_orders: table sizes.
        max_variants: most variants per product (each product has at least 3,
            fewer only when its type has fewer option combinations).

    Raises:
        ValueError: a negative size, or orders without users or products to make them of.
    """
    if min(n_users, n_products, n_orders) < 0 or max_variants < 1:
        raise ValueError("world sizes must be >= 0 (max_variants >= 1)")
    if n_orders and not (n_users and n_products):
        raise ValueError("orders need at least one user and one product")
    world = _World(seed)
    world.make_products(n_products, max_variants)
    world.make_users(n_users)
    world.make_orders(n_orders)
    return {"users": world.users, "orders": world.orders, "products": world.products}


def check_world(state: dict[str, Any]) -> list[str]:
    """Referential-integrity problems of a retail state ([] when consistent).

    Checked: every order's user exists and lists it (and every listed order
    exists and names its user); every item is a variant of its product with the
    variant's options; payment methods of payments belong to the order's user;
    fulfilment item ids are the order's; each variant is keyed by its item id.
    """
    problems: list[str] = []
    users, orders, products = state["users"], state["orders"], state["products"]
    for pid, product in products.items():
        if product.get("product_id") != pid:
            problems.append(f"product {pid}: product_id differs from its key")
        for iid, variant in product.get("variants", {}).items():
            if variant.get("item_id") != iid:
                problems.append(f"product {pid}: variant {iid} keyed under another id")
    for uid, user in users.items():
        for oid in user.get("orders", []):
            if orders.get(oid, {}).get("user_id") != uid:
                problems.append(f"user {uid}: order {oid} missing or not theirs")
    for oid, order in orders.items():
        uid = order.get("user_id")
        if order.get("order_id") != oid:
            problems.append(f"order {oid}: order_id differs from its key")
        if uid not in users or oid not in users[uid].get("orders", []):
            problems.append(f"order {oid}: user {uid} missing or does not list it")
            continue
        for item in order.get("items", []):
            variant = (
                products.get(item.get("product_id"), {})
                .get("variants", {})
                .get(item.get("item_id"))
            )
            if variant is None:
                problems.append(
                    f"order {oid}: item {item.get('item_id')} is no variant of its product"
                )
            elif variant["options"] != item.get("options"):
                problems.append(f"order {oid}: item {item.get('item_id')} options differ")
        for payment in order.get("payment_history", []):
            if payment.get("payment_method_id") not in users[uid]["payment_methods"]:
                problems.append(
                    f"order {oid}: payment method {payment.get('payment_method_id')} not the user's"
                )
        held = [i.get("item_id") for i in order.get("items", [])]
        for fulfillment in order.get("fulfillments", []):
            if any(i not in held for i in fulfillment.get("item_ids", [])):
                problems.append(f"order {oid}: fulfilment names an item the order lacks")
    return problems


def write_world(state: dict[str, Any], out: str | Path) -> Path:
    """Write ``users.json``, ``orders.json``, ``products.json`` (tau-bench layout) to ``out``."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    for table in ("users", "orders", "products"):
        (root / f"{table}.json").write_text(json.dumps(state[table], indent=1), encoding="utf-8")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m factory.envs.retail.world", description="Generate a retail world."
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="folder for users/orders/products.json")
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--products", type=int, default=50)
    parser.add_argument("--orders", type=int, default=1000)
    args = parser.parse_args(argv)
    state = generate_world(args.seed, args.users, args.products, args.orders)
    problems = check_world(state)
    if problems:  # pragma: no cover - the generator keeps its own invariants
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(
        f"wrote {write_world(state, args.out)}: {len(state['users'])} users, "
        f"{len(state['orders'])} orders, {len(state['products'])} products"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
