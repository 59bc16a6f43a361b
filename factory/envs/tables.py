"""A tau-bench-style world: tables keyed by id, tools ``fn(state, **arguments) -> str``.

Airline and retail are both this shape, so the machinery lives here once and a domain
declares only its tables, tools, argument schemas, write targets and world generator.

Why copy-on-write: a sampling run forks the world once per episode and steps it
thousands of times. ``copy()`` therefore copies only the tables (a dict of references
each, microseconds for the tau-bench DBs) and a call deep-copies only the objects it is
about to change (``write_targets``), so a step costs the size of what it touches, not the
size of the database. Objects are shared between forks until one of them writes; never
mutate ``state`` by hand.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Collection, Mapping
from copy import deepcopy
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import jsonschema

from factory.envs.base import binding_error, error_observation
from factory.errors import ConfigError

__all__ = ["TableWorld"]

W = TypeVar("W", bound="TableWorld")


class TableWorld:
    """An ``Environment`` over tables of JSON objects, with copy-on-write forks.

    Subclasses set the class attributes below, ``generate`` (their seeded world) and
    ``writes`` (what a write tool will change, so only that is copied).

    Args:
        state: the database, keyed by id in tau-bench's layout; the env takes
            ownership (pass a copy if the caller keeps using it).
        validate_arguments: check argument types and enums against the tool schema
            before running a call (an ``Error: invalid argument ...`` observation).
            Off, a wrong-typed call runs as in tau-bench, which often stores the wrong
            value without complaint.
    """

    domain: str
    tables: ClassVar[tuple[str, ...]]
    tools: ClassVar[Mapping[str, Callable[..., str]]]
    write_tools: ClassVar[Collection[str]]
    parameters: ClassVar[Mapping[str, dict[str, Any]]]
    _signatures: ClassVar[dict[str, inspect.Signature]]
    _validators: ClassVar[dict[str, jsonschema.Draft202012Validator]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._signatures = {name: inspect.signature(fn) for name, fn in cls.tools.items()}
        cls._validators = {
            name: jsonschema.Draft202012Validator(schema) for name, schema in cls.parameters.items()
        }

    def __init__(self, state: dict[str, Any], *, validate_arguments: bool = True):
        missing = [t for t in self.tables if not isinstance(state.get(t), dict)]
        if missing:
            raise ConfigError(f"{self.domain} state lacks table(s) {', '.join(missing)}")
        self._state = state
        self._owned: set[tuple[str, str]] = set()
        self.validate_arguments = validate_arguments

    # --- construction -----------------------------------------------------------------
    @staticmethod
    def generate(seed: int, **world: Any) -> dict[str, Any]:
        """The domain's seeded world (its ``world.generate_world``)."""
        raise NotImplementedError

    @classmethod
    def from_dir(cls: type[W], path: str | Path, **kw: Any) -> W:
        """Load one ``<table>.json`` per table (tau-bench format) as is.

        Raises:
            ConfigError: a file is missing or is not a JSON object.
        """
        root = Path(path)
        state: dict[str, Any] = {}
        for table in cls.tables:
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
        cls: type[W],
        *,
        db_dir: str | Path | None = None,
        state: dict[str, Any] | None = None,
        seed: int | None = None,
        validate_arguments: bool = True,
        **world: Any,
    ) -> W:
        """One of: a tau-bench folder, a state dict, or a generated world (default seed 0)."""
        if sum(x is not None for x in (db_dir, state, seed)) > 1:
            raise ConfigError("give at most one of db_dir, state, seed")
        if db_dir is not None:
            return cls.from_dir(db_dir, validate_arguments=validate_arguments)
        if state is None:
            state = cls.generate(seed or 0, **world)
        return cls(state, validate_arguments=validate_arguments)

    # --- Environment ------------------------------------------------------------------
    @property
    def state(self) -> dict[str, Any]:
        return self._state

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(self.tools)

    def copy(self: W) -> W:
        """Fork: the tables are new dicts, their objects are shared until written."""
        clone = object.__new__(type(self))
        clone._state = {k: dict(v) if k in self.tables else v for k, v in self._state.items()}
        clone._owned = set()
        clone.validate_arguments = self.validate_arguments
        self._owned.clear()  # what this env owned is now shared with the clone
        return clone

    def execute(self, name: str, arguments: Any) -> str:
        """Run one call; every refusal or malformed call is an ``Error: ...`` observation."""
        if not isinstance(name, str) or name not in self.tools:
            return error_observation(f"unknown tool {name!r}")
        if not isinstance(arguments, dict):
            return error_observation(
                f"arguments of {name} must be a JSON object, not {type(arguments).__name__}"
            )
        try:  # detach from the caller and make sure the state stays JSON
            arguments = json.loads(json.dumps(arguments))
        except (TypeError, ValueError) as exc:
            return error_observation(f"arguments of {name} are not JSON: {exc}")
        problem = self.binding_problem(name, arguments)
        if problem is None and self.validate_arguments:
            problem = self.schema_problem(name, arguments)
        if problem is not None:
            return error_observation(problem)
        if name in self.write_tools:
            self._own(self.writes(name, arguments))
        try:
            return self.tools[name](self._state, **arguments)
        except Exception as exc:  # tau-bench: observation = f"Error: {e}"
            return error_observation(exc)

    # --- argument checks (a domain may word them its own way) -----------------------------
    def binding_problem(self, name: str, arguments: dict[str, Any]) -> str | None:
        """A missing or unexpected argument, in the tool's terms; None when the call binds."""
        return binding_error(name, self._signatures[name], arguments)

    def schema_problem(self, name: str, arguments: dict[str, Any]) -> str | None:
        """The first argument the tool's JSON Schema refuses; None when all pass."""
        error = jsonschema.exceptions.best_match(self._validators[name].iter_errors(arguments))
        if error is None:
            return None
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        where = where.lstrip(".") or "arguments"
        return f"invalid argument {where} for {name}: {error.message}"

    def writes(self, name: str, arguments: dict[str, Any]) -> list[tuple[str, str]]:
        """The ``(table, key)`` objects the write tool ``name`` will change."""
        raise NotImplementedError

    def _own(self, targets: list[tuple[str, str]]) -> None:
        for table, key in targets:
            if (table, key) not in self._owned:
                self._state[table][key] = deepcopy(self._state[table][key])
                self._owned.add((table, key))

    def __repr__(self) -> str:
        sizes = ", ".join(f"{t}={len(self._state[t])}" for t in self.tables)
        return f"{type(self).__name__}({sizes})"
