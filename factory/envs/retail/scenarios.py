"""The retail grounding scenarios: the slice of a world one amplification prompt shows.

Why a slice and not the world (as for the airline): the prompt must stay a few
KB, yet every call a model is likely to make about the scenario - locate the
user by email or name and zip, read the profile, the orders and the products
of their items, then cancel, modify, return or exchange - must answer on the
slice exactly as on the world, so that replaying the answer on the full world
(``factory.envsim.grounding``) can hold the model to it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from copy import deepcopy
from typing import Any

from factory.core.delta import same_json
from factory.envs.base import Environment
from factory.errors import ConfigError, short

__all__ = ["MAX_ORDERS", "RetailScenarios"]

MAX_ORDERS = 3  # of the user's orders shown: keeps a scenario to a few KB


class RetailScenarios:
    """Scenarios of one retail world (the plug-in's ``grounding`` part).

    Raises:
        ConfigError: the world has no users.
    """

    def __init__(self, env: Environment):
        self.env = env
        state = env.state
        if not state["users"]:
            raise ConfigError("the grounding world has no users", key_path="world_sizes")
        with_orders = [
            uid
            for uid, user in state["users"].items()
            if any(o in state["orders"] for o in user.get("orders", []))
        ]
        # Users with something to talk about first; a world without orders still works.
        self._users = sorted(with_orders) or sorted(state["users"])

    def scenario(self, index: int, rng_seed: int) -> dict[str, Any]:
        """The state slice shown in the prompt of call ``index`` (same arguments, same slice).

        One user, up to :data:`MAX_ORDERS` of their orders (pending and delivered
        ones first: those a request can change), and every product of those
        orders' items with all its variants, so that a lookup, a product read
        or an item change answers on the slice as on the full world.

        Returns:
            A retail state ``{"users", "orders", "products"}`` (deep copies, in the
            world's order); a ``RetailEnv`` can run on it.
        """
        state = self.env.state
        rng = random.Random(f"grounding:{rng_seed}:{index}")
        user_id = rng.choice(self._users)
        user = state["users"][user_id]
        oids = [o for o in user.get("orders", []) if o in state["orders"]]
        actionable = [
            o for o in oids if state["orders"][o].get("status") in ("pending", "delivered")
        ]
        rest = [o for o in oids if o not in actionable]
        rng.shuffle(actionable)
        rng.shuffle(rest)
        chosen = set((actionable + rest)[:MAX_ORDERS])
        orders = {o: state["orders"][o] for o in oids if o in chosen}
        wanted = {
            item.get("product_id") for order in orders.values() for item in order.get("items", [])
        }
        return {
            "users": {user_id: deepcopy(user)},
            "orders": deepcopy(orders),
            "products": {
                pid: deepcopy(product)
                for pid, product in state["products"].items()
                if pid in wanted
            },
        }

    def mismatch(self, scenario: Mapping[str, Any]) -> str | None:
        """What differs between ``scenario`` and this world, or None."""
        state = self.env.state
        for table in ("users", "orders", "products"):
            for key, value in (scenario.get(table) or {}).items():
                if not same_json(state[table].get(key), value):
                    return f"{table[:-1]} {short(key, 40)} differs"
        return None

    def subject(self, scenario: Mapping[str, Any]) -> str | None:
        """The user a scenario is about (``None`` for a scenario without users)."""
        return next(iter(scenario.get("users") or {}), None)
