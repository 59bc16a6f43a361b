"""Library loans: members borrow books (a third-party domain of the factory).

The world is a :class:`factory.envs.tables.TableWorld` of three tables (``members``,
``books``, ``loans``) and three tools; the plug-in (``factory_library.plugin``) takes every
part a table world does not have to state from the factory's defaults.
"""

from __future__ import annotations

from factory.envs.tables import TableWorld
from factory_library.tools import PARAMETERS, TOOLS, WRITE_TOOLS, write_targets

__all__ = ["TABLES", "LibraryWorld"]

TABLES = ("members", "books", "loans")


class LibraryWorld(TableWorld):
    """A library over ``{"members", "books", "loans"}``, ids ``M0001``, ``B0001``, ``L-...``."""

    domain = "library"
    tables = TABLES
    tools = TOOLS
    write_tools = WRITE_TOOLS
    parameters = PARAMETERS
    generator = "factory_library.world:generate_world"
    write_targets = write_targets
