"""The executable airline world: tau-bench's database and tools behind ``Environment``.

The machinery (copy-on-write forks, argument checks, ``Error: ...`` observations) is
``factory.envs.tables.TableWorld``; this module names the airline's tables and tools.
"""

from __future__ import annotations

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
    generator = "factory.envs.airline.world:generate_world"
    write_targets = write_targets
