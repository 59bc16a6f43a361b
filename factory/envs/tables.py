"""A tau-bench-style world: tables keyed by id, tools ``fn(state, **arguments) -> str``.

Airline and retail are both this shape, so the machinery lives here once and a domain
declares only its tables, tools, argument schemas, write targets and world generator (class
attributes, no methods to write). The same declarations give the domain plug-in its
defaults (``factory.envs.table_domain``): the bare tool specs, the world sizes, and an
exact slice of any call, read off the records the call touches (:meth:`TableWorld.reads`).

Why copy-on-write: a sampling run forks the world once per episode and steps it
thousands of times. ``copy()`` therefore copies only the tables (a dict of references
each, microseconds for the tau-bench DBs) and a call deep-copies only the objects it is
about to change (``write_targets``), so a step costs the size of what it touches, not the
size of the database. Objects are shared between forks until one of them writes; never
mutate ``state`` by hand.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable, Collection, Iterator, Mapping
from copy import deepcopy
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import jsonschema

from factory.envs.base import binding_error, error_observation
from factory.errors import ConfigError

__all__ = ["ALL", "READ_PREFIXES", "TableWorld"]

W = TypeVar("W", bound="TableWorld")
Target = tuple[str, str]
WriteTargets = Callable[[dict[str, Any], str, dict[str, Any]], list[Target]]

#: What :meth:`TableWorld.reads` reports for a table a call scans as a whole.
ALL = "*"
#: A tool whose name starts so is a read (``x-kind``) in the bare specs; a write tool is one
#: the world lists in ``write_tools``; the rest are generic (calculate, think, transfer).
READ_PREFIXES = ("get_", "search_", "find_", "list_")


class _Recording(dict[str, Any]):
    """A table that notes which of its records a tool touches (``ALL`` when it scans it)."""

    def __init__(self, records: dict[str, Any], name: str, log: dict[str, set[str]]) -> None:
        super().__init__(records)
        self._name, self._log = name, log

    def _saw(self, key: Any) -> None:
        self._log.setdefault(self._name, set()).add(key if isinstance(key, str) else ALL)

    def __getitem__(self, key: Any) -> Any:
        self._saw(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._saw(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._saw(key)
        return super().__contains__(key)

    def _scan(self) -> None:
        self._saw(None)

    def __iter__(self) -> Iterator[str]:
        self._scan()
        return super().__iter__()

    def __len__(self) -> int:
        self._scan()
        return super().__len__()

    def keys(self) -> Any:
        self._scan()
        return super().keys()

    def values(self) -> Any:
        self._scan()
        return super().values()

    def items(self) -> Any:
        self._scan()
        return super().items()


class TableWorld:
    """An ``Environment`` over tables of JSON objects, with copy-on-write forks.

    Subclasses set the class attributes below: ``generator`` (``"module:function"``, the
    seeded world generator, imported when a world is generated) and ``write_targets``
    (``fn(state, tool, arguments) -> [(table, key)]``, what a write tool will change, so
    only that is copied); or override ``generate`` and ``writes``.

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
    generator: ClassVar[str | None] = None
    write_targets: ClassVar[WriteTargets | None] = None
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
    @classmethod
    def generator_function(cls) -> Callable[..., dict[str, Any]]:
        """The seeded world generator ``generator`` names.

        Raises:
            NotImplementedError: the world has no generator (it is loaded, not generated).
        """
        if not cls.generator:
            raise NotImplementedError(f"the {cls.domain} world has no generator")
        module, _, name = cls.generator.partition(":")
        found: Callable[..., dict[str, Any]] = getattr(importlib.import_module(module), name)
        return found

    @classmethod
    def generate(cls, seed: int, **world: Any) -> dict[str, Any]:
        """The domain's seeded world (``generator``'s function, with its sizes ``world``)."""
        return cls.generator_function()(seed, **world)

    @classmethod
    def bare_tools(cls) -> list[dict[str, Any]]:
        """The tool specs without descriptions, with ``x-kind`` (episodes that get no pack
        tools): ``write`` for ``write_tools``, ``read`` for names starting with a
        :data:`READ_PREFIXES` verb, else ``generic``."""

        def kind(name: str) -> str:
            if name in cls.write_tools:
                return "write"
            return "read" if name.startswith(READ_PREFIXES) else "generic"

        return [
            {"name": n, "description": "", "parameters": p, "x-kind": kind(n)}
            for n, p in sorted(cls.parameters.items())
        ]

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
        targets = type(self).write_targets
        if targets is None:
            raise NotImplementedError(f"the {self.domain} world names no write_targets")
        return targets(self._state, name, arguments)

    def reads(self, name: str, arguments: Any) -> dict[str, set[str]]:
        """The records the call ``name(arguments)`` touches, per table (:data:`ALL` when it
        scans the table), found by running it on a fork whose tables note every access.

        Why: a step sample needs the part of the state that decides its observation. The
        tools are deterministic functions of the records they read, so those records (and
        whole tables where a tool iterates one) give the same observation on a slice as on
        the world, for any domain, without a slicing rule written per tool.
        """
        fork = self.copy()
        log: dict[str, set[str]] = {}
        fork._state = {
            table: _Recording(records, table, log) if table in self.tables else records
            for table, records in fork._state.items()
        }
        fork.execute(name, arguments)
        return log

    def _own(self, targets: list[tuple[str, str]]) -> None:
        for table, key in targets:
            if (table, key) not in self._owned:
                self._state[table][key] = deepcopy(self._state[table][key])
                self._owned.add((table, key))

    def __repr__(self) -> str:
        sizes = ", ".join(f"{t}={len(self._state[t])}" for t in self.tables)
        return f"{type(self).__name__}({sizes})"
