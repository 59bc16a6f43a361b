"""The airline domain as a plug-in: the table world and what is its own.

Registered through the ``factory.domains`` entry point group in ``pyproject.toml``
(``airline = "factory.envs.airline.plugin:plugin"``), the same hook a domain in another
package uses; importing this module registers nothing. Every other part is a default of a
table world (``factory.envs.table_domain``): the shipped pack, the environment and its
sizes, the tool functions.
"""

from __future__ import annotations

from factory.envs.plugin import DomainPlugin
from factory.envs.table_domain import table_plugin

__all__ = ["plugin"]


def plugin() -> DomainPlugin:
    """The airline plug-in (the entry point's target)."""
    from factory.envs.airline import AirlineEnv, slices
    from factory.envs.airline.lookups import PLACES, simulator_facts
    from factory.envs.airline.sampler import SAMPLER
    from factory.envs.airline.scenarios import AirlineScenarios

    return table_plugin(
        "airline",
        AirlineEnv,
        slices=slices,
        sampler=SAMPLER,
        grounding=AirlineScenarios,
        # tau-bench's user addresses say "state" where its recorded trajectories say "province".
        fidelity_renames={"province": "state"},
        places=PLACES,
        simulator_facts=simulator_facts,
    )
