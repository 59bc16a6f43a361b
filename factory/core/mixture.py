"""Mixture specs: quotas over labels, read strictly from a mixture file.

Why: EnvSimBench trains on a fixed mix (Balance2: 1,000 Failure, 1,000
No-Change, 2,000 Simple, 2,230 Complex) rather than on whatever the factory
happened to produce. A mixture file states the quotas;
``factory.core.selection.select`` picks the rows, reproducibly, from labels alone.

File format (``pipelines/mixtures/<name>.yaml``)::

    name: balance2
    description: optional text
    min_per_tool: 5                    # optional: every tool appears at least 5 times
    max_per_tool: 400                  # optional: and at most 400 times
    quotas:
      - name: complex_change           # unique; keys of counts / shortfall
        count: 2230                    # rows wanted (0 disables the quota)
        group: [Medium, Difficult, Beyond]   # one group or a list (factory.core.labels.GROUPS)
        outcome: change                # one outcome or a list (step or trajectory outcomes)
        delta: [1, {min: 3, max: 6}]   # exact |Δ| (labels.delta_size): values and/or ranges
        write_calls: {min: 1}          # labels.write_calls (trajectories without executor)
        arg_cardinality: {max: 3}      # labels.arg_cardinality
        apps: {min: 2}                 # labels.apps (text-action trajectories)
        description: optional text

``min_per_tool`` (tool balance) asks the selection to take, before filling the
quotas, that many rows of every tool (a step's ``labels.tool``; the envsim job
names every tool of the domain, so a tool no candidate calls is a shortfall).
The rows still count against the quotas they match. ``max_per_tool`` caps every
tool (EnvSimBench's airline rows were a third ``book_reservation``): once a tool has
that many rows, its other candidates are passed over and the quota fills from other
tools' rows, or reports the shortfall.

A quota needs ``group`` or ``outcome``; the other selectors narrow it. A sample
whose label is missing or ``None`` never matches a selector on that label, so a
write-call count can never stand in for |Δ|.

Selecting rows by these quotas is ``factory.core.selection``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeGuard

from factory.core.labels import GROUPS, STEP_OUTCOMES, TRAJECTORY_OUTCOMES
from factory.core.yamlfile import read_yaml
from factory.errors import ConfigError, short

__all__ = ["IntSet", "Mixture", "Quota"]

OUTCOMES: tuple[str, ...] = STEP_OUTCOMES + TRAJECTORY_OUTCOMES
_MIXTURE_KEYS = ("name", "description", "min_per_tool", "max_per_tool", "quotas")
_QUOTA_KEYS = (
    "name",
    "count",
    "group",
    "outcome",
    "delta",
    "write_calls",
    "arg_cardinality",
    "apps",
    "description",
)
_RANGE_KEYS = ("min", "max")
# Selector key in the file -> label key it reads.
_INT_SELECTORS = {
    "delta": "delta_size",
    "write_calls": "write_calls",
    "arg_cardinality": "arg_cardinality",
    "apps": "apps",
}


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# --- spec -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntSet:
    """Exact values and inclusive ranges of a non-negative integer label.

    ``ranges`` holds ``(low, high)`` pairs; ``high`` ``None`` means unbounded.
    """

    ranges: tuple[tuple[int, int | None], ...]

    def __contains__(self, value: object) -> bool:
        if not _is_count(value):
            return False
        return any(lo <= value and (hi is None or value <= hi) for lo, hi in self.ranges)

    @classmethod
    def parse(cls, raw: Any, key_path: str) -> IntSet:
        """``3``, ``{min: 1, max: 2}`` (either bound optional) or a list of those.

        Raises:
            ConfigError: naming the offending key path.
        """
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise ConfigError("must not be an empty list", key_path=key_path)
        ranges: list[tuple[int, int | None]] = []
        for n, item in enumerate(items):
            where = f"{key_path}[{n}]" if isinstance(raw, list) else key_path
            if _is_count(item):
                ranges.append((item, item))
            elif isinstance(item, Mapping):
                _no_unknown_keys(item, _RANGE_KEYS, where)
                lo, hi = item.get("min", 0), item.get("max")
                if not _is_count(lo):
                    raise ConfigError("must be a non-negative integer", key_path=f"{where}.min")
                if hi is not None and not _is_count(hi):
                    raise ConfigError("must be a non-negative integer", key_path=f"{where}.max")
                if hi is not None and hi < lo:
                    raise ConfigError(f"max {hi} is below min {lo}", key_path=where)
                ranges.append((lo, hi))
            else:
                raise ConfigError(
                    "expected a non-negative integer, {min: a, max: b}, or a list of them, "
                    f"got {short(item, 60)}",
                    key_path=where,
                )
        return cls(tuple(ranges))

    def to_yaml(self) -> list[Any]:
        return [
            lo if hi == lo else {"min": lo, **({"max": hi} if hi is not None else {})}
            for lo, hi in self.ranges
        ]


@dataclass(frozen=True)
class Quota:
    """``count`` rows whose labels match every given selector."""

    name: str
    count: int
    groups: tuple[str, ...] | None = None
    outcomes: tuple[str, ...] | None = None
    delta: IntSet | None = None
    write_calls: IntSet | None = None
    arg_cardinality: IntSet | None = None
    apps: IntSet | None = None
    description: str = ""

    def matches(self, labels: Mapping[str, Any]) -> bool:
        """Whether a sample with these labels may fill this quota."""
        if self.groups is not None and labels.get("group") not in self.groups:
            return False
        if self.outcomes is not None and labels.get("outcome") not in self.outcomes:
            return False
        for selector, label in _INT_SELECTORS.items():
            wanted: IntSet | None = getattr(self, selector)
            if wanted is not None and labels.get(label) not in wanted:
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "count": self.count}
        if self.groups is not None:
            out["group"] = list(self.groups)
        if self.outcomes is not None:
            out["outcome"] = list(self.outcomes)
        for selector in _INT_SELECTORS:
            wanted: IntSet | None = getattr(self, selector)
            if wanted is not None:
                out[selector] = wanted.to_yaml()
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Mixture:
    """A named list of quotas, filled in order."""

    name: str
    quotas: tuple[Quota, ...]
    description: str = ""
    min_per_tool: int = 0
    max_per_tool: int | None = None

    @property
    def total(self) -> int:
        return sum(q.count for q in self.quotas)

    @classmethod
    def load(cls, path: str | Path) -> Mixture:
        """Read a mixture file.

        Raises:
            ConfigError: unreadable file, bad YAML, or a malformed spec (with key path).
        """
        return cls.from_dict(read_yaml(path, "mixture file", key_path="mixture"))

    @classmethod
    def from_dict(cls, data: Any) -> Mixture:
        """Build a mixture from its parsed YAML mapping.

        Raises:
            ConfigError: unknown key, wrong type, negative count, unknown group or
                outcome, a quota without group/outcome, duplicate quota names.
        """
        if not isinstance(data, Mapping):
            raise ConfigError("a mixture must be a mapping with name and quotas", key_path="")
        _no_unknown_keys(data, _MIXTURE_KEYS, "")
        name = data.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError("must be a non-empty string", key_path="name")
        raw_quotas = data.get("quotas")
        if not isinstance(raw_quotas, list) or not raw_quotas:
            raise ConfigError("must be a non-empty list of quotas", key_path="quotas")
        quotas: list[Quota] = []
        for n, raw in enumerate(raw_quotas):
            quota = _parse_quota(raw, f"quotas[{n}]")
            if any(q.name == quota.name for q in quotas):
                raise ConfigError(
                    f"duplicate quota name {quota.name!r}", key_path=f"quotas[{n}].name"
                )
            quotas.append(quota)
        min_per_tool = data.get("min_per_tool", 0)
        if not _is_count(min_per_tool):
            raise ConfigError(
                f"must be a non-negative integer, got {short(min_per_tool, 40)}",
                key_path="min_per_tool",
            )
        max_per_tool = data.get("max_per_tool")
        if max_per_tool is not None and (
            not _is_count(max_per_tool) or max_per_tool < max(1, min_per_tool)
        ):
            raise ConfigError(
                f"must be an integer of at least max(1, min_per_tool) = {max(1, min_per_tool)},"
                f" got {short(max_per_tool, 40)}",
                key_path="max_per_tool",
            )
        return cls(
            name=name,
            quotas=tuple(quotas),
            description=_text(data, "description", ""),
            min_per_tool=min_per_tool,
            max_per_tool=max_per_tool,
        )

    def scaled(self, factor: float, name: str | None = None) -> Mixture:
        """The same quotas with ``ceil(count * factor)`` rows each (a held-out split's mix)."""
        quotas = tuple(replace(q, count=math.ceil(q.count * factor - 1e-9)) for q in self.quotas)
        cap = self.max_per_tool
        if cap is not None:
            cap = max(self.min_per_tool, math.ceil(cap * factor - 1e-9), 1)
        return replace(self, name=name or self.name, quotas=quotas, max_per_tool=cap)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        if self.min_per_tool:
            out["min_per_tool"] = self.min_per_tool
        if self.max_per_tool is not None:
            out["max_per_tool"] = self.max_per_tool
        out["quotas"] = [q.to_dict() for q in self.quotas]
        return out


def _no_unknown_keys(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in allowed:
            path = f"{where}.{key}" if where else str(key)
            raise ConfigError(f"unknown key (allowed here: {', '.join(allowed)})", key_path=path)


def _text(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError("must be a string", key_path=f"{where}.{key}" if where else key)
    return value


def _names(raw: Any, allowed: tuple[str, ...], key_path: str) -> tuple[str, ...]:
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise ConfigError("must not be an empty list", key_path=key_path)
    for n, item in enumerate(items):
        if item not in allowed:
            where = f"{key_path}[{n}]" if isinstance(raw, list) else key_path
            raise ConfigError(
                f"unknown value {short(item, 60)} (allowed: {', '.join(allowed)})", key_path=where
            )
    return tuple(dict.fromkeys(items))


def _parse_quota(raw: Any, where: str) -> Quota:
    if not isinstance(raw, Mapping):
        raise ConfigError(
            "a quota must be a mapping with name, count and selectors", key_path=where
        )
    _no_unknown_keys(raw, _QUOTA_KEYS, where)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("must be a non-empty string", key_path=f"{where}.name")
    count = raw.get("count")
    if not _is_count(count):
        raise ConfigError(
            f"must be a non-negative integer, got {short(count, 40)}", key_path=f"{where}.count"
        )
    if raw.get("group") is None and raw.get("outcome") is None:
        raise ConfigError("a quota needs a group or an outcome selector", key_path=where)
    groups = None if raw.get("group") is None else _names(raw["group"], GROUPS, f"{where}.group")
    outcomes = (
        None if raw.get("outcome") is None else _names(raw["outcome"], OUTCOMES, f"{where}.outcome")
    )
    ints = {
        selector: None
        if raw.get(selector) is None
        else IntSet.parse(raw[selector], f"{where}.{selector}")
        for selector in _INT_SELECTORS
    }
    return Quota(
        name=name,
        count=count,
        groups=groups,
        outcomes=outcomes,
        description=_text(raw, "description", where),
        **ints,
    )
