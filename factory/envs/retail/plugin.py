"""The retail domain as a plug-in: the table world and what is its own.

Registered through the ``factory.domains`` entry point group in ``pyproject.toml``
(``retail = "factory.envs.retail.plugin:plugin"``), the same hook the airline and any
third-party domain use; importing this module registers nothing. Every other part is a
default of a table world (``factory.envs.table_domain``).
"""

from __future__ import annotations

from factory.envs.plugin import DomainPlugin
from factory.envs.table_domain import table_plugin

__all__ = ["plugin"]


def plugin() -> DomainPlugin:
    """The retail plug-in (the entry point's target)."""
    from factory.envs.retail import RetailEnv, slices
    from factory.envs.retail.sampler import SAMPLER
    from factory.envs.retail.scenarios import RetailScenarios

    return table_plugin(
        "retail", RetailEnv, slices=slices, sampler=SAMPLER, grounding=RetailScenarios
    )
