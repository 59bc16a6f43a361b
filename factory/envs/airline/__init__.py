"""The executable airline world: tau-bench's database and tools behind ``Environment``.

The machinery (copy-on-write forks, argument checks, ``Error: ...`` observations) is
``factory.envs.tables.TableWorld``; this module names the airline's tables and tools.
"""

from __future__ import annotations

from typing import Any

from factory.envs.airline.tools import PARAMETERS, TOOLS, WRITE_TOOLS, write_targets
from factory.envs.tables import TableWorld

__all__ = ["TABLES", "AirlineEnv"]

TABLES = ("users", "flights", "reservations")


class AirlineEnv(TableWorld):
    """tau-bench's airline world over a ``{"users", "flights", "reservations"}`` state
    (arguments: ``TableWorld``'s)."""

    domain = "airline"
    tables = TABLES
    tools = TOOLS
    write_tools = WRITE_TOOLS
    parameters = PARAMETERS

    @staticmethod
    def generate(seed: int, **world: Any) -> dict[str, Any]:
        from factory.envs.airline.world import generate_world

        return generate_world(seed, **world)

    def writes(self, name: str, arguments: dict[str, Any]) -> list[tuple[str, str]]:
        return write_targets(self._state, name, arguments)
