"""What an executable world looks like to the rest of the factory.

Why an interface: the sampler, the grounding stage and the fidelity replay only
need "here is a state, run this call, give me the observation, fork the world";
they must not care which domain they drive. A domain implements
:class:`Environment` and supplies it through its plug-in
(``factory.envs.plugin``), found by the registry (``factory.envs.registry``).

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

from typing import Any, Protocol, runtime_checkable

__all__ = ["Environment", "error_observation"]

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
