"""The executable retail world: tau-bench's users, orders and products behind ``Environment``.

Why copy-on-write (as the airline world): a sampling run forks the world once
per episode and steps it many times, so ``copy()`` copies only the three
tables (dicts of references) and a call deep-copies only the order and user it
is about to change. Objects are shared between forks until one of them
writes; never mutate ``state`` by hand.
"""

from __future__ import annotations

import inspect
import json
from copy import deepcopy
from pathlib import Path
from typing import Any

import jsonschema

from factory.envs.base import binding_error, error_observation
from factory.envs.retail.tools import (
    PARAMETERS,
    TOOLS,
    WRITE_TOOLS,
    tau_bench_qualname,
    write_targets,
)
from factory.errors import ConfigError

__all__ = ["TABLES", "RetailEnv"]

TABLES = ("users", "orders", "products")

_SIGNATURES = {name: inspect.signature(fn) for name, fn in TOOLS.items()}
_VALIDATORS = {name: jsonschema.Draft202012Validator(schema) for name, schema in PARAMETERS.items()}


def _binding_error(name: str, arguments: dict[str, Any], *, tau_bench_text: bool) -> str | None:
    """A missing or unexpected argument. In the tool's own terms (``binding_error``), or,
    with ``tau_bench_text`` (``validate_arguments: false``: run calls as tau-bench does),
    the TypeError text tau-bench's ``invoke(data=..., **arguments)`` raises before running
    (``CancelPendingOrder.invoke() missing 1 required positional argument``), which names
    the implementation: a simulator cannot derive it from the tool's spec (issue 10)."""
    if not tau_bench_text:
        return binding_error(name, _SIGNATURES[name], arguments)
    if "data" not in arguments:
        try:
            _SIGNATURES[name].bind(None, **arguments)
            return None
        except TypeError:
            pass
    fn = TOOLS[name]
    try:
        fn(data={}, **arguments)  # fails while binding; the body never runs
    except TypeError as exc:
        text = str(exc)
        own = f"{fn.__qualname__}()"
        return f"{tau_bench_qualname(name)}()" + text[len(own) :] if text.startswith(own) else text
    except Exception as exc:  # pragma: no cover - bind() and the call agree on CPython
        return str(exc)
    return f"arguments do not fit {name}"  # pragma: no cover


def _schema_error(name: str, arguments: dict[str, Any]) -> str | None:
    error = jsonschema.exceptions.best_match(_VALIDATORS[name].iter_errors(arguments))
    if error is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    where = where.lstrip(".") or "arguments"
    return f"invalid argument {where} for {name}: {error.message}"


class RetailEnv:
    """tau-bench's retail world over a ``{"users", "orders", "products"}`` state.

    Args:
        state: the database in tau-bench's layout (keyed by id); the env takes
            ownership (pass a copy if the caller keeps using it).
        validate_arguments: check argument types against the tool schema before
            running a call (an ``Error: invalid argument ...`` observation). Off,
            a wrong-typed call runs as in tau-bench (often a Python error text,
            sometimes a write of the wrong value).
    """

    domain = "retail"

    def __init__(self, state: dict[str, Any], *, validate_arguments: bool = True):
        missing = [t for t in TABLES if not isinstance(state.get(t), dict)]
        if missing:
            raise ConfigError(f"retail state lacks table(s) {', '.join(missing)}")
        self._state = state
        self._owned: set[tuple[str, str]] = set()
        self.validate_arguments = validate_arguments

    # --- construction -----------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | Path, **kw: Any) -> RetailEnv:
        """Load ``users.json``, ``orders.json``, ``products.json`` (tau-bench format) as is.

        Raises:
            ConfigError: a file is missing or is not a JSON object.
        """
        root = Path(path)
        state: dict[str, Any] = {}
        for table in TABLES:
            file = root / f"{table}.json"
            try:
                state[table] = json.loads(file.read_text(encoding="utf-8"))
            except OSError as exc:
                raise ConfigError(f"cannot read {file}: {exc.strerror}", key_path="db") from exc
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{file} is not JSON: {exc}", key_path="db") from exc
        return cls(state, **kw)

    @classmethod
    def create(
        cls,
        *,
        db_dir: str | Path | None = None,
        state: dict[str, Any] | None = None,
        seed: int | None = None,
        validate_arguments: bool = True,
        **world: Any,
    ) -> RetailEnv:
        """One of: a tau-bench folder, a state dict, or a generated world (default seed 0)."""
        if sum(x is not None for x in (db_dir, state, seed)) > 1:
            raise ConfigError("give at most one of db_dir, state, seed")
        if db_dir is not None:
            return cls.from_dir(db_dir, validate_arguments=validate_arguments)
        if state is None:
            from factory.envs.retail.world import generate_world

            state = generate_world(seed or 0, **world)
        return cls(state, validate_arguments=validate_arguments)

    # --- Environment ------------------------------------------------------------------
    @property
    def state(self) -> dict[str, Any]:
        return self._state

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(TOOLS)

    def copy(self) -> RetailEnv:
        """Fork: the tables are new dicts, their objects are shared until written."""
        clone = object.__new__(RetailEnv)
        clone._state = {k: dict(v) if k in TABLES else v for k, v in self._state.items()}
        clone._owned = set()
        clone.validate_arguments = self.validate_arguments
        self._owned.clear()  # what this env owned is now shared with the clone
        return clone

    def execute(self, name: str, arguments: Any) -> str:
        """Run one call; every refusal or malformed call is an ``Error: ...`` observation."""
        if not isinstance(name, str) or name not in TOOLS:
            return error_observation(f"unknown tool {name!r}")
        if not isinstance(arguments, dict):
            return error_observation(
                f"arguments of {name} must be a JSON object, not {type(arguments).__name__}"
            )
        try:  # detach from the caller and make sure the state stays JSON
            arguments = json.loads(json.dumps(arguments))
        except (TypeError, ValueError) as exc:
            return error_observation(f"arguments of {name} are not JSON: {exc}")
        problem = _binding_error(name, arguments, tau_bench_text=not self.validate_arguments)
        if problem is None and self.validate_arguments:
            problem = _schema_error(name, arguments)
        if problem is not None:
            return error_observation(problem)
        if name in WRITE_TOOLS:
            self._own(write_targets(self._state, name, arguments))
        try:
            return TOOLS[name](self._state, **arguments)
        except Exception as exc:  # tau-bench: observation = f"Error: {e}"
            return error_observation(exc)

    def _own(self, targets: list[tuple[str, str]]) -> None:
        for table, key in targets:
            if (table, key) not in self._owned:
                self._state[table][key] = deepcopy(self._state[table][key])
                self._owned.add((table, key))

    def __repr__(self) -> str:
        sizes = ", ".join(f"{t}={len(self._state[t])}" for t in TABLES)
        return f"RetailEnv({sizes})"
