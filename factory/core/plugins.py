"""One registry for plug-ins named in an entry point group (issue 9: one way to do each thing).

Domains (``factory.domains``) and LLM backends (``factory.llm_backends``) are
both found this way: a name declared in an entry point group of an installed
distribution, a built-in line in the same ``module:attr`` syntax, or a plug-in
registered by hand (programs, tests), which wins over both. Nothing is imported
until a name is asked for, so a plug-in's module (and its SDK) costs nothing
unless a recipe uses it, and one broken plug-in does not hide the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, Protocol, TypeVar

from factory.errors import ConfigError, short

__all__ = ["Named", "PluginRegistry"]


class Named(Protocol):
    """What every plug-in has: the name it is registered under."""

    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class PluginRegistry(Generic[T]):
    """Plug-ins of one kind: hand registrations, then built-ins and entry points, loaded lazily.

    Args:
        group: the entry point group third-party packages declare plug-ins in.
        kind: what a plug-in is, for messages ("domain", "backend").
        key_path: the recipe key every error names ("domain", "llm.backend").
        expected: the plug-in type; an entry point may also name a function returning one.
        builtins: name -> ``module:attr`` lines loaded exactly like entry points.
    """

    def __init__(
        self,
        group: str,
        kind: str,
        key_path: str,
        expected: type[T],
        builtins: Mapping[str, str] | None = None,
    ) -> None:
        self.group = group
        self.kind = kind
        self.key_path = key_path
        self.expected = expected
        self.builtins = builtins if builtins is not None else {}  # read at each (re)scan
        self._registered: dict[str, T] = {}  # by hand, ahead of everything else
        self._loaded: dict[str, T] = {}  # built-ins and entry points already imported
        self._declared: dict[str, list[str]] | None = None  # read from metadata once

    def _error(self, message: str) -> ConfigError:
        return ConfigError(message, key_path=self.key_path)

    def declared(self) -> dict[str, list[str]]:
        """Name -> ``module:attr`` values: the built-ins, then the installed entry points."""
        if self._declared is None:
            found = {name: [value] for name, value in self.builtins.items()}
            for ep in entry_points(group=self.group):
                same = found.setdefault(ep.name, [])
                if ep.value not in same:  # one distribution seen twice is one
                    same.append(ep.value)
            self._declared = found
        return self._declared

    def reset(self) -> None:
        """Forget hand registrations and re-read the entry points (after installing a plug-in)."""
        self._registered.clear()
        self._loaded.clear()
        self._declared = None

    def register(self, plugin: T, *, replace: bool = False) -> None:
        """Register ``plugin`` under its name for this process.

        Raises:
            ConfigError: the name is taken and ``replace`` is false.
        """
        if not replace and plugin.name in self.names():
            raise self._error(f"{self.kind} {plugin.name!r} is already registered")
        self._registered[plugin.name] = plugin
        self._loaded.pop(plugin.name, None)

    def names(self) -> list[str]:
        """Every registered or declared name, sorted (nothing is imported)."""
        return sorted(set(self._registered) | set(self.declared()))

    def find(self, name: str) -> T | None:
        """The plug-in ``name``, imported on first use; None when nothing declares it.

        The caller words the unknown-name error: it knows what else to suggest.

        Raises:
            ConfigError: ``name`` is declared more than once, or its plug-in does not load.
        """
        plugin = self._registered.get(name)
        if plugin is None:
            plugin = self._loaded.get(name)
        if plugin is None:
            values = self.declared().get(name)
            if values is None:
                return None
            plugin = self._loaded[name] = self._load(name, values)
        return plugin

    def _load(self, name: str, values: list[str]) -> T:
        what = f"{self.kind} {name!r}"
        if len(values) > 1:
            raise self._error(
                f"{what} is declared more than once ({', '.join(values)}); "
                "uninstall one of the packages"
            )
        value = values[0]
        try:
            obj: Any = EntryPoint(name, value, self.group).load()
        except Exception as exc:  # any import error of a third-party plug-in
            raise self._error(
                f"{what}: cannot load entry point {value}: {type(exc).__name__}: {short(str(exc))}"
            ) from exc
        plugin = obj if isinstance(obj, self.expected) else obj() if callable(obj) else obj
        if not isinstance(plugin, self.expected):
            raise self._error(
                f"{what}: entry point {value} gives {type(plugin).__name__}, "
                f"not a {self.expected.__name__}"
            )
        if plugin.name != name:
            raise self._error(f"{what} ({value}) names its plug-in {plugin.name!r}")
        return plugin
