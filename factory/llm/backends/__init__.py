"""The LLM backend registry: ``llm.backend`` name -> backend module and config model.

Adding a backend is one module that exports ``plugin`` (a
:class:`~factory.llm.backends.base.BackendPlugin`: name, config model, ``build``)
and one line in :data:`BUILTIN_BACKENDS`. A backend in another package needs no
line here: it declares the same ``module:plugin`` string in the
``factory.llm_backends`` entry point group of its ``pyproject.toml``::

    [project.entry-points."factory.llm_backends"]
    mybatch = "mypackage.backend:plugin"

Built-ins and entry points are loaded by the same code, lazily: nothing
registers on import, and a backend's module (with its SDK) is imported only
when a recipe names it. :func:`register_backend` adds one by hand (programs,
tests).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError as PydanticValidationError

from factory.errors import ConfigError, short
from factory.llm.backends.base import (
    Backend,
    BackendOptions,
    BackendPlugin,
    BackendSetup,
    LLMRequest,
    LLMResult,
    OnlineBackend,
)

if TYPE_CHECKING:
    from factory.config import LLMConfig
    from factory.llm.pricing import Price

__all__ = [
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendOptions",
    "BackendPlugin",
    "BackendSetup",
    "LLMRequest",
    "LLMResult",
    "OnlineBackend",
    "available_backends",
    "backend_options",
    "build_backend",
    "get_backend",
    "register_backend",
    "reset_registry",
]

ENTRY_POINT_GROUP = "factory.llm_backends"

# The registry lines of the built-in backends, in entry point syntax.
BUILTIN_BACKENDS: dict[str, str] = {
    "aiohttp": "factory.llm.backends.aiohttp:plugin",
    "openai": "factory.llm.backends.openai:plugin",
}

_registered: dict[str, BackendPlugin] = {}  # by hand, ahead of everything else
_loaded: dict[str, BackendPlugin] = {}  # built-ins and entry points already imported


@functools.cache
def _declared() -> dict[str, list[str]]:
    """Name -> ``module:attr`` values: the built-ins, then the installed entry points."""
    found = {name: [value] for name, value in BUILTIN_BACKENDS.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        same = found.setdefault(ep.name, [])
        if ep.value not in same:  # one distribution seen twice is one
            same.append(ep.value)
    return found


def reset_registry() -> None:
    """Forget hand registrations and re-read the entry points (after installing a plug-in)."""
    _registered.clear()
    _loaded.clear()
    _declared.cache_clear()


def register_backend(plugin: BackendPlugin, *, replace: bool = False) -> None:
    """Register ``plugin`` under its name for this process.

    Raises:
        ConfigError: the name is taken and ``replace`` is false.
    """
    if not replace and plugin.name in available_backends():
        raise ConfigError(f"backend {plugin.name!r} is already registered", key_path="llm.backend")
    _registered[plugin.name] = plugin
    _loaded.pop(plugin.name, None)


def available_backends() -> list[str]:
    """Every backend name a recipe may use, sorted."""
    return sorted(set(_registered) | set(_declared()))


def _load(name: str, values: list[str]) -> BackendPlugin:
    if len(values) > 1:
        raise ConfigError(
            f"backend {name!r} is declared more than once ({', '.join(values)}); "
            "uninstall one of the packages",
            key_path="llm.backend",
        )
    value = values[0]
    try:
        obj: Any = EntryPoint(name, value, ENTRY_POINT_GROUP).load()
    except Exception as exc:  # any import error of a third-party plug-in
        raise ConfigError(
            f"backend {name!r}: cannot load {value}: {type(exc).__name__}: {short(str(exc))}",
            key_path="llm.backend",
        ) from exc
    plugin = obj if isinstance(obj, BackendPlugin) else obj() if callable(obj) else obj
    if not isinstance(plugin, BackendPlugin):
        raise ConfigError(
            f"backend {name!r}: {value} gives {type(plugin).__name__}, not a BackendPlugin",
            key_path="llm.backend",
        )
    if plugin.name != name:
        raise ConfigError(
            f"backend {name!r} ({value}) names its plug-in {plugin.name!r}",
            key_path="llm.backend",
        )
    return plugin


def get_backend(name: str) -> BackendPlugin:
    """The plug-in registered as ``name``.

    Raises:
        ConfigError: an unknown name (the message lists the choices) or a plug-in
            that does not load; ``key_path`` is ``llm.backend``.
    """
    plugin = _registered.get(name) or _loaded.get(name)
    if plugin is not None:
        return plugin
    values = _declared().get(name)
    if values is None:
        raise ConfigError(
            f"unknown backend {name!r}; choices: {', '.join(available_backends())} (a plug-in "
            f"registers in the {ENTRY_POINT_GROUP!r} entry point group)",
            key_path="llm.backend",
        )
    plugin = _loaded[name] = _load(name, values)
    return plugin


def backend_options(plugin: BackendPlugin, raw: Mapping[str, Any]) -> BackendOptions:
    """``llm.backend_options`` validated by the backend's config model.

    Raises:
        ConfigError: an unknown or ill-typed option, naming its key path.
    """
    try:
        return plugin.options.model_validate(dict(raw))
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        key = "llm.backend_options" + (f".{where}" if where else "")
        known = ", ".join(plugin.options.model_fields) or "none"
        raise ConfigError(
            f"{first['msg']} (backend {plugin.name!r}; its options: {known})", key_path=key
        ) from None


def build_backend(
    llm: LLMConfig,
    model: str,
    *,
    concurrency: int,
    price: Price | None,
    sleep: Callable[[float], Awaitable[object]] | None = None,
) -> Backend:
    """The backend ``llm.backend`` names, built for ``model`` (one per actor).

    Raises:
        ConfigError: unknown backend, bad options, or what the backend's build refuses
            (a missing key names its variable).
    """
    plugin = get_backend(llm.backend)
    setup = BackendSetup(
        llm=llm,
        model=model,
        options=backend_options(plugin, llm.backend_options),
        concurrency=concurrency,
        price=price,
        **({"sleep": sleep} if sleep is not None else {}),
    )
    return plugin.build(setup)
