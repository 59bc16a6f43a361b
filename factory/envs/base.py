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
  the way tau-bench turns tool exceptions into ``f"Error: {e}"``, worded in the
  tool's own terms (:func:`binding_error`), never in the implementation's.
* ``copy()`` forks the world: calls on the copy never change the original and
  the other way round.
* ``state`` is a JSON-like dict (what ``json.dumps`` accepts). Treat it as
  read-only; change a world only through ``execute``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Environment", "binding_error", "error_observation"]

ERROR_PREFIX = "Error: "


def error_observation(message: object) -> str:
    """The observation text of a refused call: ``Error: <message>``."""
    return f"{ERROR_PREFIX}{message}"


def _quoted(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)


def binding_error(
    name: str, signature: inspect.Signature, arguments: Mapping[str, Any], *, skip: int = 1
) -> str | None:
    """Why ``arguments`` cannot call the tool ``name``, in the tool's terms; None when they can.

    Why not Python's own ``TypeError``: its text names the implementation
    (``SearchDirectFlight.invoke() missing 1 required positional argument``),
    which a simulator cannot derive from the tool's spec and a model should not
    learn. This message names only the tool and its arguments, all in the spec.

    Args:
        name: the tool's name.
        signature: the signature of the function behind the tool.
        arguments: the call's arguments.
        skip: leading parameters the caller fills (the state), never arguments.
    """
    params = list(signature.parameters.values())[skip:]
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    accepted = [p.name for p in params if p.kind in named]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    missing = [
        p.name
        for p in params
        if p.kind in named and p.default is inspect.Parameter.empty and p.name not in arguments
    ]
    unexpected = [] if takes_any else sorted(k for k in arguments if k not in accepted)
    problems = []
    if missing:
        plural = "s" if len(missing) > 1 else ""
        problems.append(f"missing required argument{plural} {_quoted(missing)}")
    if unexpected:
        plural = "s" if len(unexpected) > 1 else ""
        problems.append(f"unexpected argument{plural} {_quoted(unexpected)}")
    if not problems:
        return None
    takes = f"takes {_quoted(accepted)}" if accepted else "takes no arguments"
    return f"{'; '.join(problems)} for {name} ({name} {takes})"


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
