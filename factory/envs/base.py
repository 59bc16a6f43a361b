"""What an executable world looks like to the rest of the factory.

Why an interface: the sampler, the grounding stage and the fidelity replay only
need "here is a state, run this call, give me the observation, fork the world";
they must not care which domain they drive. A domain implements
:class:`Environment` and is added to :data:`BUILTIN` (explicitly, so importing
a domain module never registers anything as a side effect).

Contract every implementation keeps:

* ``execute`` never raises for anything a model can send. An unknown tool,
  arguments that are not an object, a missing or wrong-typed argument and every
  refusal of the tool itself come back as an observation starting ``Error: ``,
  the way tau-bench turns tool exceptions into ``f"Error: {e}"``.
* ``copy()`` forks the world: calls on the copy never change the original and
  the other way round.
* ``state`` is a JSON-like dict (what ``json.dumps`` accepts). Treat it as
  read-only; change a world only through ``execute``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from factory.errors import ConfigError

__all__ = [
    "BUILTIN",
    "Environment",
    "available_domains",
    "error_observation",
    "get_environment",
    "register_environment",
]

ERROR_PREFIX = "Error: "


def error_observation(message: object) -> str:
    """The observation text of a refused call: ``Error: <message>``."""
    return f"{ERROR_PREFIX}{message}"


@runtime_checkable
class Environment(Protocol):
    """An executable world of one domain."""

    domain: str

    @property
    def state(self) -> dict[str, Any]:
        """The whole current state (read-only view)."""
        ...

    @property
    def tool_names(self) -> tuple[str, ...]:
        """Names of the tools ``execute`` knows, in a stable order."""
        ...

    def execute(self, name: str, arguments: Any) -> str:
        """Run one tool call and return its observation text (never raises)."""
        ...

    def copy(self) -> Environment:
        """An independent fork of this world."""
        ...


EnvFactory = Callable[..., Environment]


def _airline(**kw: Any) -> Environment:
    from factory.envs.airline import AirlineEnv

    return AirlineEnv.create(**kw)


#: Domains shipped with the factory; built lazily so unused domains cost nothing.
BUILTIN: dict[str, EnvFactory] = {"airline": _airline}

_registry: dict[str, EnvFactory] = dict(BUILTIN)


def register_environment(domain: str, factory: EnvFactory, *, replace: bool = False) -> None:
    """Make ``get_environment(domain, **kw)`` call ``factory(**kw)``.

    Raises:
        ConfigError: ``domain`` is taken and ``replace`` is false.
    """
    if domain in _registry and not replace:
        raise ConfigError(f"an environment for domain {domain!r} is already registered")
    _registry[domain] = factory


def available_domains() -> list[str]:
    """Domains ``get_environment`` can build, sorted."""
    return sorted(_registry)


def get_environment(domain: str, **kw: Any) -> Environment:
    """Build the executable world of ``domain``; ``kw`` goes to the domain's factory.

    For ``airline``: ``db_dir=PATH`` (tau-bench JSON files), ``state=DICT``, or
    ``seed=INT`` plus ``generate_world`` sizes; nothing at all means ``seed=0``.

    Raises:
        ConfigError: no environment is registered for ``domain``.
    """
    try:
        factory = _registry[domain]
    except KeyError:
        raise ConfigError(
            f"no executable environment for domain {domain!r}; "
            f"available: {', '.join(available_domains()) or 'none'}",
            key_path="domain",
        ) from None
    return factory(**kw)
