"""The library plug-in: the entry point ``library = "factory_library.plugin:plugin"``."""

from __future__ import annotations

from factory.envs.plugin import DataPack, DomainPlugin
from factory.envs.table_domain import table_plugin


def plugin() -> DomainPlugin:
    """The library domain: its world, its pack (package data) and its sampler's scenarios."""
    from factory_library import LibraryWorld
    from factory_library.sampler import SAMPLER

    pack = DataPack.of_package(
        "factory_library", tools="pack/tools.json", policy="pack/policy.md", rules="pack/rules.yaml"
    )
    return table_plugin("library", LibraryWorld, pack=pack, sampler=SAMPLER)
