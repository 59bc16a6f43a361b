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

import functools
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

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

_registered: dict[str, DomainPlugin] = {}  # by hand, ahead of entry points
_loaded: dict[str, DomainPlugin] = {}  # entry points already imported


@functools.cache
def _entry_points() -> dict[str, list[EntryPoint]]:
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        same = found.setdefault(ep.name, [])
        if all(other.value != ep.value for other in same):  # one dist seen twice is one
            same.append(ep)
    return found


def reset_registry() -> None:
    """Forget hand registrations and re-read the entry points (after installing a plug-in)."""
    _registered.clear()
    _loaded.clear()
    _entry_points.cache_clear()


def register_domain(plugin: DomainPlugin, *, replace: bool = False) -> None:
    """Register ``plugin`` under its name for this process.

    Raises:
        ConfigError: the name is taken and ``replace`` is false.
    """
    if not replace and plugin.name in available_domains():
        raise ConfigError(f"domain {plugin.name!r} is already registered", key_path="domain")
    _registered[plugin.name] = plugin
    _loaded.pop(plugin.name, None)


def available_domains(needs: str | None = None) -> list[str]:
    """Registered domain names, sorted; with ``needs``, only those supplying that part.

    Raises:
        ValueError: ``needs`` is not a plug-in part.
    """
    names = sorted(set(_registered) | set(_entry_points()))
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


def _load(name: str, points: list[EntryPoint]) -> DomainPlugin:
    if len(points) > 1:
        values = ", ".join(ep.value for ep in points)
        raise ConfigError(
            f"domain {name!r} is declared by several entry points ({values}); "
            "uninstall one of the packages",
            key_path="domain",
        )
    ep = points[0]
    try:
        obj: Any = ep.load()
    except Exception as exc:  # any import error of a third-party plug-in
        raise ConfigError(
            f"domain {name!r}: cannot load entry point {ep.value}: {type(exc).__name__}: {exc}",
            key_path="domain",
        ) from exc
    plugin = obj if isinstance(obj, DomainPlugin) else obj() if callable(obj) else obj
    if not isinstance(plugin, DomainPlugin):
        raise ConfigError(
            f"domain {name!r}: entry point {ep.value} gives {type(plugin).__name__}, "
            "not a DomainPlugin",
            key_path="domain",
        )
    if plugin.name != name:
        raise ConfigError(
            f"entry point {name!r} ({ep.value}) names its plug-in {plugin.name!r}",
            key_path="domain",
        )
    return plugin


def get_plugin(name: str, *, needs: str | None = None) -> DomainPlugin:
    """The plug-in of domain ``name``; with ``needs``, it must supply that part.

    Raises:
        ConfigError: an unknown domain (the message lists the known ones), a
            plug-in that does not load, or one without the part ``needs`` names.
    """
    plugin = _registered.get(name) or _loaded.get(name)
    if plugin is None:
        points = _entry_points().get(name)
        if points is None:
            known = ", ".join(available_domains()) or "none"
            raise ConfigError(
                f"unknown domain {name!r}; known domains: {known} (a plug-in registers in "
                f"the {ENTRY_POINT_GROUP!r} entry point group; a data-only domain names its "
                "files in the recipe's domain section)",
                key_path="domain",
            )
        plugin = _loaded[name] = _load(name, points)
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
