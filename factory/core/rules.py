"""Domain argument rules (``filters/<domain>.yaml``): checks a tool schema cannot say.

A tool's JSON Schema says an argument is a string; the domain knows a
reservation id is six upper-case letters or digits and that its agents make
one call at a time. Rules are data so a new domain needs a YAML file, not
code: each applies a JSON-Schema fragment to the value(s) at an argument path
(``payment_methods[].payment_id`` walks every list item) of the calls to the
listed tools, and a violation is reported as ``domain:<rule id>``.

The loader is strict: an unknown key, a bad regex or an invalid schema
fragment is a ``ConfigError`` naming its key path (``rules[2].schema.pattern``),
because a typo in a filter silently disabling a check is the worst outcome.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import SchemaError
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator

from factory.core.reasons import Issue
from factory.core.schema import Check, compile_schema, fast_check, format_path
from factory.core.trajectory import Trajectory
from factory.core.yamlfile import read_yaml
from factory.errors import ConfigError, short

__all__ = ["MAX_PARALLEL_CALLS", "DomainRules", "Rule", "parse_path"]

MAX_PARALLEL_CALLS = "domain:max_parallel_calls"

_TOP_KEYS = ("domain", "limits", "rules")
_LIMIT_KEYS = ("max_parallel_calls",)
_RULE_KEYS = ("id", "description", "tools", "argument", "schema")
_RULE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_SEGMENT = r"[^.\[\]\s]+(?:\[\])*"
_PATH = re.compile(rf"{_SEGMENT}(?:\.{_SEGMENT})*")

Step = str | None  # a key, or None for "every item of a list"
Fail = Callable[[str, str], ConfigError]


def parse_path(path: str) -> tuple[Step, ...]:
    """``payment_methods[].payment_id`` -> ``("payment_methods", None, "payment_id")``.

    Raises:
        ValueError: not dotted names, each optionally followed by ``[]``.
    """
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise ValueError(
            "expected dotted argument names, each optionally followed by [] "
            f"(e.g. payment_methods[].payment_id), got {short(path, 80)!r}"
        )
    steps: list[Step] = []
    for segment in path.split("."):
        name = segment.rstrip("[]")
        steps.append(name)
        steps.extend([None] * ((len(segment) - len(name)) // 2))
    return tuple(steps)


@dataclass(frozen=True)
class Rule:
    """One argument rule. ``tools`` ``None`` means every tool."""

    id: str
    argument: str
    schema: Mapping[str, Any]
    description: str = ""
    tools: frozenset[str] | None = None
    steps: tuple[Step, ...] = field(init=False, repr=False, compare=False)
    validator: Validator = field(init=False, repr=False, compare=False)
    fast: Check | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", parse_path(self.argument))
        object.__setattr__(self, "validator", compile_schema(dict(self.schema)))
        object.__setattr__(self, "fast", fast_check(dict(self.schema)))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as what it was made from: a stage spec carries the domain (its rules
        included) to every worker, and the compiled validator pickles by value to tens of
        kB per rule (jsonschema's registry); it is compiled again on arrival."""
        return (Rule, (self.id, self.argument, self.schema, self.description, self.tools))

    @property
    def code(self) -> str:
        return f"domain:{self.id}"

    def applies_to(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools

    def values(self, arguments: Any) -> Iterator[tuple[str, Any]]:
        """Every ``(concrete path, value)`` the argument path reaches; none if absent."""
        yield from _walk(arguments, self.steps, ())

    def check_value(self, value: Any) -> str | None:
        """The most relevant schema error for ``value``, or ``None`` when it passes."""
        if self.fast is not None and self.fast(value):
            return None  # jsonschema would find nothing (factory.core.validate.fast_check)
        error = best_match(self.validator.iter_errors(value))
        return None if error is None else error.message


def _walk(
    value: Any, steps: tuple[Step, ...], at: tuple[str | int, ...]
) -> Iterator[tuple[str, Any]]:
    if not steps:
        yield format_path(at), value
        return
    step, rest = steps[0], steps[1:]
    if step is None:
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield from _walk(item, rest, (*at, index))
    elif isinstance(value, dict) and step in value:
        yield from _walk(value[step], rest, (*at, step))


@dataclass(frozen=True)
class DomainRules:
    """The rules and limits of one domain, checked on every tool call."""

    domain: str
    rules: tuple[Rule, ...] = ()
    max_parallel_calls: int | None = None

    @classmethod
    def load(cls, path: str | Path) -> DomainRules:
        """Read a rules file.

        Raises:
            ConfigError: unreadable file, bad YAML, or a malformed rules document
                (``key_path`` names the offending key).
        """
        data = read_yaml(path, "rules file")
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "") -> DomainRules:
        """Build rules from a parsed rules document.

        Args:
            data: the parsed YAML mapping.
            source: file name added to error messages.

        Raises:
            ConfigError: unknown keys, wrong types, duplicate ids, a bad argument
                path, a bad regex or an invalid JSON-Schema fragment.
        """
        where = f" (in {source})" if source else ""

        def fail(key_path: str, message: str) -> ConfigError:
            return ConfigError(message + where, key_path=key_path)

        if not isinstance(data, Mapping):
            raise fail("", "a rules file must be a mapping with domain, limits and rules")
        _no_unknown_keys(data, _TOP_KEYS, "", fail)
        domain = data.get("domain")
        if not isinstance(domain, str) or not domain.strip():
            raise fail("domain", "must be a non-empty string naming the domain")

        limits = data.get("limits") or {}
        if not isinstance(limits, Mapping):
            raise fail("limits", "must be a mapping")
        _no_unknown_keys(limits, _LIMIT_KEYS, "limits", fail)
        max_calls = limits.get("max_parallel_calls")
        if max_calls is not None and (
            isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1
        ):
            raise fail("limits.max_parallel_calls", "must be an integer of at least 1")

        raw_rules = data.get("rules") or []
        if not isinstance(raw_rules, list):
            raise fail("rules", "must be a list of rules")
        rules: list[Rule] = []
        seen: set[str] = set()
        for n, raw in enumerate(raw_rules):
            rule = _parse_rule(raw, f"rules[{n}]", fail)
            if rule.id in seen:
                raise fail(f"rules[{n}].id", f"duplicate rule id {rule.id!r}")
            seen.add(rule.id)
            rules.append(rule)
        return cls(domain=domain, rules=tuple(rules), max_parallel_calls=max_calls)

    def check(self, traj: Trajectory) -> list[Issue]:
        """Issues ``domain:<rule id>`` / ``domain:max_parallel_calls`` in turn order.

        A rule whose argument is absent from a call does not apply; missing
        required arguments are the tool schema's job.
        """
        issues: list[Issue] = []
        for turn_index, turn in enumerate(traj.turns):
            calls = turn.tool_calls
            if self.max_parallel_calls is not None and len(calls) > self.max_parallel_calls:
                issues.append(
                    Issue(
                        MAX_PARALLEL_CALLS,
                        f"{len(calls)} calls in one turn; the domain allows "
                        f"{self.max_parallel_calls}",
                        turn=turn_index,
                    )
                )
            for call in calls:
                for rule in self.rules:
                    if not rule.applies_to(call.name):
                        continue
                    for path, value in rule.values(call.arguments):
                        problem = rule.check_value(value)
                        if problem is not None:
                            issues.append(
                                Issue(
                                    rule.code,
                                    f"{call.name}: {path}: {short(problem)}",
                                    turn=turn_index,
                                    path=path,
                                )
                            )
        return issues


def _no_unknown_keys(
    data: Mapping[str, Any], allowed: tuple[str, ...], at: str, fail: Fail
) -> None:
    for key in data:
        if key not in allowed:
            key_path = f"{at}.{key}" if at else str(key)
            raise fail(key_path, f"unknown key; expected one of {', '.join(allowed)}")


def _parse_rule(raw: Any, at: str, fail: Fail) -> Rule:
    if not isinstance(raw, Mapping):
        raise fail(at, "a rule must be a mapping with id, argument and schema")
    _no_unknown_keys(raw, _RULE_KEYS, at, fail)
    for key in ("id", "argument", "schema"):
        if key not in raw:
            raise fail(f"{at}.{key}", "is required")
    rule_id = raw["id"]
    if not isinstance(rule_id, str) or not _RULE_ID.fullmatch(rule_id):
        raise fail(f"{at}.id", "must be letters, digits, _, . or - (it becomes domain:<id>)")
    if f"domain:{rule_id}" == MAX_PARALLEL_CALLS:
        raise fail(f"{at}.id", f"{rule_id!r} is reserved for the limits block")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise fail(f"{at}.description", "must be a string")
    tools = raw.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools)
    ):
        raise fail(f"{at}.tools", "must be a list of tool names")
    try:
        parse_path(raw["argument"])
    except ValueError as exc:
        raise fail(f"{at}.argument", str(exc)) from exc
    schema = raw["schema"]
    if not isinstance(schema, Mapping):
        raise fail(f"{at}.schema", "must be a JSON-Schema object")
    try:
        compile_schema(dict(schema))
    except TypeError as exc:
        raise fail(
            f"{at}.schema", "is not JSON (quote dates and other YAML-typed scalars)"
        ) from exc
    except SchemaError as exc:
        inner = ".".join(str(p) for p in exc.path)
        key_path = f"{at}.schema" + (f".{inner}" if inner else "")
        raise fail(key_path, f"invalid JSON Schema: {short(exc.message)}") from exc
    return Rule(
        id=rule_id,
        argument=raw["argument"],
        schema=dict(schema),
        description=description,
        tools=frozenset(tools) if tools is not None else None,
    )
