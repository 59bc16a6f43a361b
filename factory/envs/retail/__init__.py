"""The executable retail world: tau-bench's users, orders and products behind ``Environment``.

The machinery (copy-on-write forks, argument checks, ``Error: ...`` observations) is
``factory.envs.tables.TableWorld``, shared with the airline world; this module names the
retail tables and tools, and words a call that does not bind as tau-bench does when
arguments are not validated.
"""

from __future__ import annotations

from typing import Any

from factory.envs.retail.tools import (
    PARAMETERS,
    TOOLS,
    WRITE_TOOLS,
    tau_bench_qualname,
    write_targets,
)
from factory.envs.tables import TableWorld

__all__ = ["TABLES", "RetailEnv"]

TABLES = ("users", "orders", "products")


class RetailEnv(TableWorld):
    """tau-bench's retail world over a ``{"users", "orders", "products"}`` state
    (arguments: ``TableWorld``'s)."""

    domain = "retail"
    tables = TABLES
    tools = TOOLS
    write_tools = WRITE_TOOLS
    parameters = PARAMETERS
    generator = "factory.envs.retail.world:generate_world"
    write_targets = write_targets

    def binding_problem(self, name: str, arguments: dict[str, Any]) -> str | None:
        """In the tool's own terms, or, with ``validate_arguments`` off (run calls as
        tau-bench does), the TypeError text tau-bench's ``invoke(data=..., **arguments)``
        raises before running (``CancelPendingOrder.invoke() missing 1 required positional
        argument``), which names the implementation: a simulator cannot derive it from
        the tool's spec (issue 10)."""
        if self.validate_arguments:
            return super().binding_problem(name, arguments)
        if "data" not in arguments:
            try:
                self._signatures[name].bind(None, **arguments)
                return None
            except TypeError:
                pass
        fn = TOOLS[name]
        try:
            fn(data={}, **arguments)  # fails while binding; the body never runs
        except TypeError as exc:
            text = str(exc)
            own = f"{fn.__qualname__}()"
            if text.startswith(own):
                return f"{tau_bench_qualname(name)}()" + text[len(own) :]
            return text
        except Exception as exc:  # pragma: no cover - bind() and the call agree on CPython
            return str(exc)
        return f"arguments do not fit {name}"  # pragma: no cover
