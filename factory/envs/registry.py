"""The domain registry: plug-ins found through the ``factory.domains`` entry point group.

Why entry points: a domain can live in another package (``pip install
factory-retail`` and its recipes work), and the built-in airline registers
through the same hook, declared in this project's ``pyproject.toml``::

    [project.entry-points."factory.domains"]
    airline = "factory.envs.airline.plugin:plugin"

An entry point names a :class:`~factory.envs.plugin.DomainPlugin` or a
function returning one. Nothing registers on import: names are read from the
installed metadata, and a plug-in's module is imported only when its domain
is asked for. :func:`register_domain` adds one by hand (programs, tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factory.core.plugins import PluginRegistry
from factory.envs.base import Environment
from factory.envs.plugin import PARTS, DomainPlugin
from factory.errors import ConfigError

__all__ = [
    "ENTRY_POINT_GROUP",
    "available_domains",
    "generate_environment",
    "get_environment",
    "get_plugin",
    "register_domain",
    "register_environment",
    "reset_registry",
]

ENTRY_POINT_GROUP = "factory.domains"

_REGISTRY = PluginRegistry(ENTRY_POINT_GROUP, "domain", "domain", DomainPlugin)


# The hooks are the registry's own methods: one way to register, reset and list.
reset_registry = _REGISTRY.reset
register_domain = _REGISTRY.register


def available_domains(needs: str | None = None) -> list[str]:
    """Registered domain names, sorted; with ``needs``, only those supplying that part.

    Raises:
        ValueError: ``needs`` is not a plug-in part.
    """
    names = _REGISTRY.names()
    if needs is None:
        return names
    if needs not in PARTS:
        raise ValueError(f"unknown plug-in part {needs!r}; parts: {', '.join(PARTS)}")
    out = []
    for name in names:
        try:
            if get_plugin(name).has(needs):
                out.append(name)
        except ConfigError:
            continue  # a broken plug-in is reported when it is asked for by name
    return out


def get_plugin(name: str, *, needs: str | None = None) -> DomainPlugin:
    """The plug-in of domain ``name``; with ``needs``, it must supply that part.

    Raises:
        ConfigError: an unknown domain (the message lists the known ones), a
            plug-in that does not load, or one without the part ``needs`` names.
    """
    plugin = _REGISTRY.find(name)
    if plugin is None:
        known = ", ".join(available_domains()) or "none"
        raise ConfigError(
            f"unknown domain {name!r}; known domains: {known} (a plug-in registers in "
            f"the {ENTRY_POINT_GROUP!r} entry point group; a data-only domain names its "
            "files in the recipe's domain section)",
            key_path="domain",
        )
    if needs is not None and not plugin.has(needs):
        others = ", ".join(available_domains(needs)) or "none"
        raise ConfigError(
            f"domain {name!r} supplies no {needs}; domains that do: {others}",
            key_path="domain",
        )
    return plugin


def get_environment(domain: str, **kw: Any) -> Environment:
    """Build the executable world of ``domain``; ``kw`` goes to the plug-in's ``environment``.

    Raises:
        ConfigError: ``domain`` is unknown or has no executable world.
    """
    plugin = get_plugin(domain, needs="environment")
    assert plugin.environment is not None
    return plugin.environment(**kw)


def generate_environment(
    domain: str, seed: int, sizes: Mapping[str, Any] | None = None, **kw: Any
) -> Environment:
    """A generated world of ``domain``: ``environment(seed=seed, **sizes, **kw)``.

    Raises:
        ConfigError: an unknown domain, one without a world, a size key the
            plug-in does not declare, or a size its generator refuses (key path
            ``world_sizes``).
    """
    plugin = get_plugin(domain, needs="environment")
    assert plugin.environment is not None
    unknown = sorted(set(sizes or {}) - plugin.world_sizes)
    if unknown:
        known = ", ".join(sorted(plugin.world_sizes)) or "none"
        raise ConfigError(
            f"unknown world size(s) {', '.join(unknown)}; known: {known}",
            key_path="world_sizes",
        )
    try:
        return plugin.environment(seed=seed, **dict(sizes or {}), **kw)
    except ValueError as exc:  # the generator's size checks
        raise ConfigError(str(exc), key_path="world_sizes") from exc


def register_environment(domain: str, factory: Any, *, replace: bool = False) -> None:
    """Register a domain that is only an executable world (``factory(**kw)`` builds it)."""
    register_domain(DomainPlugin(domain, environment=factory), replace=replace)
