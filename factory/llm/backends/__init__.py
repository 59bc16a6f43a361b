"""The LLM backend registry: ``llm.backend`` name -> backend module and config model.

Adding a provider is one module in this package (issue 35, point 7): a module that
defines ``plugin`` (a :class:`~factory.llm.backends.base.BackendPlugin`: name, config
model, ``build``) is the backend of its own name, and one that also defines
``batch_plugin`` is the backend ``<module>_batch`` too (its provider's batch API, in the
same module as its wire format). The built-ins are found from the package's files
(:func:`builtin_backends`), without importing them. A backend in another package
declares the same ``module:plugin`` string in the ``factory.llm_backends`` entry point
group of its ``pyproject.toml``::

    [project.entry-points."factory.llm_backends"]
    mybatch = "mypackage.backend:plugin"

Built-ins and entry points are loaded by the same code, lazily: nothing
registers on import, and a backend's module (with its SDK) is imported only
when a recipe names it. :func:`register_backend` adds one by hand (programs,
tests).
"""

from __future__ import annotations

import pkgutil
import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError as PydanticValidationError

from factory.core.plugins import PluginRegistry
from factory.errors import ConfigError
from factory.llm.backends.base import (
    Backend,
    BackendOptions,
    BackendPlugin,
    BackendSetup,
    BatchJournal,
    LLMRequest,
    LLMResult,
    OnlineBackend,
)

if TYPE_CHECKING:
    from factory.llm.pricing import Price
    from factory.recipe import LLMConfig

__all__ = [
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendOptions",
    "BackendPlugin",
    "BackendSetup",
    "BatchJournal",
    "LLMRequest",
    "LLMResult",
    "OnlineBackend",
    "available_backends",
    "backend_options",
    "build_backend",
    "builtin_backends",
    "get_backend",
    "register_backend",
    "reset_registry",
]

ENTRY_POINT_GROUP = "factory.llm_backends"

_DEFINES = re.compile(r"^(plugin|batch_plugin)\s*[:=]", re.M)


def builtin_backends() -> dict[str, str]:
    """The built-in backends' registry lines (entry point syntax), from the package's
    files: a module (or subpackage) defining ``plugin`` at top level is the backend of its
    name, one defining ``batch_plugin`` also ``<name>_batch``. Read as text, so listing
    the backends imports no SDK."""
    here = Path(__file__).parent
    found: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules([str(here)]), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        path = here / info.name / "__init__.py" if info.ispkg else here / f"{info.name}.py"
        module = f"{__name__}.{info.name}"
        for attr in _DEFINES.findall(path.read_text(encoding="utf-8")):
            name = info.name if attr == "plugin" else f"{info.name}_batch"
            found[name] = f"{module}:{attr}"
    return found


BUILTIN_BACKENDS: dict[str, str] = builtin_backends()

_REGISTRY = PluginRegistry(
    ENTRY_POINT_GROUP, "backend", "llm.backend", BackendPlugin, BUILTIN_BACKENDS
)


# The hooks are the registry's own methods: one way to register, reset and list.
reset_registry = _REGISTRY.reset
register_backend = _REGISTRY.register
available_backends = _REGISTRY.names


def get_backend(name: str) -> BackendPlugin:
    """The plug-in registered as ``name``.

    Raises:
        ConfigError: an unknown name (the message lists the choices) or a plug-in
            that does not load; ``key_path`` is ``llm.backend``.
    """
    plugin = _REGISTRY.find(name)
    if plugin is None:
        raise ConfigError(
            f"unknown backend {name!r}; choices: {', '.join(available_backends())} (a plug-in "
            f"registers in the {ENTRY_POINT_GROUP!r} entry point group)",
            key_path="llm.backend",
        )
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
    before_send: Callable[[], None] | None = None,
    batch_journal: BatchJournal | None = None,
    run_dir: str | None = None,
    actors: int = 1,
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
        before_send=before_send,
        batch_journal=batch_journal,
        run_dir=run_dir,
        actors=actors,
        **({"sleep": sleep} if sleep is not None else {}),
    )
    return plugin.build(setup)
