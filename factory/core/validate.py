"""Reason-coded validation of a canonical trajectory.

Three layers, reported most fundamental first: the structure of the row we
would export (LLaMA-Factory would drop or crash on it), every tool call
against its tool's JSON Schema, then the domain's argument rules. A call is
checked with ``jsonschema`` and one rule of our own: an argument that the
schema does not declare in ``properties`` is ``unknown_argument`` even when
the schema leaves ``additionalProperties`` open, because tau-bench's specs do
exactly that and a model that invents argument names must not be trained on.

Compiled validators are cached per schema (keyed by its canonical JSON), so a
worker validating thousands of rows against the same 14 tools checks and
compiles each schema once. ``format`` is an annotation, as JSON Schema's
default says: value formats that matter are the domain rules' job.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from jsonschema import SchemaError
from jsonschema.exceptions import ValidationError as SchemaValidationError
from jsonschema.protocols import Validator

from factory.core.actions import ACTION_CODES, check_actions
from factory.core.compose import COMPOSE_CODES
from factory.core.export import (
    ReasoningMode,
    Rendered,
    check_structure,
    render,
)
from factory.core.reasons import Issue
from factory.core.schema import Check, compile_schema, fast_check, format_path
from factory.core.trajectory import (
    ROLES,
    IdentityMemo,
    ToolCall,
    Trajectory,
    canonical_json,
    normalize_tool_spec,
)
from factory.errors import short

if TYPE_CHECKING:
    from factory.core.compose import CompositionRules
    from factory.core.grammar import ActionGrammar
    from factory.core.rules import DomainRules

__all__ = [
    "ISSUE_ORDER",
    "first_reason",
    "validate",
    "validate_calls",
    "validate_rendered",
]

# Most fundamental first: a row LLaMA-Factory cannot read, then broken tool
# lists, then calls that do not fit their tool, then domain rules.
ISSUE_ORDER: tuple[str, ...] = (
    "bad_role",
    "bad_field_type",
    "empty_trajectory",
    "bad_tools",
    # text actions (factory.core.actions): a broken action explains the turn order it breaks
    *ACTION_CODES,
    "bad_turn_order",
    "no_assistant_ending",
    "unanswered_call",
    "orphan_observation",
    "bad_function_call",
    "empty_turn",
    "stray_think_tag",
    "arguments_not_object",
    "unknown_tool",
    "missing_argument",
    "unknown_argument",
    "wrong_type",
    "enum_violation",
    "schema_violation",
    # multi-app composition (factory.core.compose)
    *COMPOSE_CODES,
)
_RANK = {code: rank for rank, code in enumerate(ISSUE_ORDER)}
_KEYWORD_CODES = {
    "required": "missing_argument",
    "type": "wrong_type",
    "enum": "enum_violation",
    "additionalProperties": "unknown_argument",
}


@dataclass(frozen=True)
class _Tool:
    schema: dict[str, Any]
    validator: Validator
    fast: Check | None = None


@functools.lru_cache(maxsize=256)
def _tool_table(tools_json: str) -> tuple[dict[str, _Tool | None], tuple[Issue, ...]]:
    """Tools by name (``None``: named, but its schema is unusable) plus ``bad_tools`` issues."""
    table: dict[str, _Tool | None] = {}
    problems: list[Issue] = []
    tools = json.loads(tools_json)
    if not isinstance(tools, list):
        return table, (Issue("bad_tools", "the tools field is not a list of function specs"),)
    for n, raw in enumerate(tools):
        try:
            spec = normalize_tool_spec(raw)
        except ValueError as exc:
            problems.append(Issue("bad_tools", f"tool {n}: {exc}", path=f"tools[{n}]"))
            continue
        if spec["name"] in table:
            message = f"tool {n}: a second tool named {short(spec['name'], 80)!r}"
            problems.append(Issue("bad_tools", message, path=f"tools[{n}].name"))
            continue
        try:
            validator = compile_schema(spec["parameters"])
        except SchemaError as exc:
            where = ".".join(str(p) for p in exc.path)
            problems.append(
                Issue(
                    "bad_tools",
                    f"tool {spec['name']!r}: invalid parameters schema at {where or 'root'}: "
                    f"{short(exc.message)}",
                    path=f"tools[{n}].parameters" + (f".{where}" if where else ""),
                )
            )
            table[spec["name"]] = None
            continue
        table[spec["name"]] = _Tool(spec["parameters"], validator, fast_check(spec["parameters"]))
    return table, tuple(problems)


def _tool_table_of(tools: Any) -> tuple[dict[str, _Tool | None], tuple[Issue, ...]]:
    return _tool_table(canonical_json(tools))


# Every row of a pipeline carries the same domain tool list, whose canonical JSON (the
# key of ``_tool_table``'s cache) cost more than checking the calls: look it up once.
_tools_table: IdentityMemo[Any, tuple[dict[str, _Tool | None], tuple[Issue, ...]]] = IdentityMemo(
    _tool_table_of
)


# --- calls ------------------------------------------------------------------------------------
def validate_calls(traj: Trajectory) -> list[Issue]:
    """Check every tool call of ``traj`` against its tool's parameters schema.

    Args:
        traj: a canonical trajectory (not normalised: turn indices are the caller's).

    Returns:
        ``bad_tools`` for unusable specs, then per call in order: ``unknown_tool``,
        ``arguments_not_object``, ``missing_argument``, ``unknown_argument``,
        ``wrong_type``, ``enum_violation`` or ``schema_violation``, each with
        ``turn`` and ``path`` (e.g. ``passengers[0].dob``).
    """
    try:
        table, problems = _tools_table(traj.tools)
    except TypeError:
        return [Issue("bad_tools", "the tool list is not JSON-serialisable")]
    issues = list(problems)
    for turn, call in traj.calls():
        if call.name not in table:
            issues.append(
                Issue("unknown_tool", f"no tool named {short(call.name, 80)!r}", turn=turn)
            )
            continue
        tool = table[call.name]
        if tool is None:  # already reported as bad_tools
            continue
        if not isinstance(call.arguments, dict):
            issues.append(
                Issue(
                    "arguments_not_object",
                    f"{call.name}: arguments are {type(call.arguments).__name__}, not an object",
                    turn=turn,
                )
            )
            continue
        issues.extend(_call_issues(call.name, tool, call.arguments, turn))
    return issues


def _call_issues(name: str, tool: _Tool, arguments: dict[str, Any], turn: int) -> Iterator[Issue]:
    seen_missing: set[str] = set()
    seen_unknown: set[str] = set()
    accepted = tool.fast is not None and tool.fast(arguments)
    for error in () if accepted else tool.validator.iter_errors(arguments):
        code = _KEYWORD_CODES.get(str(error.validator), "schema_violation")
        base = tuple(error.absolute_path)
        if code == "missing_argument":
            # one error per missing name; read names off the instance, not the message
            for missing in _missing(error):
                path = format_path((*base, missing))
                if path not in seen_missing:
                    seen_missing.add(path)
                    yield Issue(code, f"{name}: {path} is required", turn=turn, path=path)
        elif code == "unknown_argument":
            for extra in _additional(error):
                path = format_path((*base, extra))
                if path not in seen_unknown:
                    seen_unknown.add(path)
                    yield Issue(code, f"{name}: {path} is not an argument", turn=turn, path=path)
        else:
            path = format_path(base)
            yield Issue(
                code, f"{name}: {path or 'arguments'}: {short(error.message)}", turn=turn, path=path
            )
    for parent, key in _undeclared(tool.schema, arguments, ()):
        path = format_path((*parent, key))
        if path not in seen_unknown:
            seen_unknown.add(path)
            yield Issue("unknown_argument", f"{name}: {path} is not declared", turn=turn, path=path)


def _missing(error: SchemaValidationError) -> list[str]:
    required = error.validator_value if isinstance(error.validator_value, list) else []
    instance = error.instance if isinstance(error.instance, dict) else {}
    return [str(r) for r in required if r not in instance]


def _additional(error: SchemaValidationError) -> list[str]:
    schema = error.schema if isinstance(error.schema, dict) else {}
    instance = error.instance if isinstance(error.instance, dict) else {}
    declared = schema.get("properties") or {}
    patterns = list((schema.get("patternProperties") or {}).keys())
    return [
        str(k)
        for k in instance
        if k not in declared and not any(re.search(p, str(k)) for p in patterns)
    ]


def _undeclared(
    schema: Any, value: Any, path: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Keys of objects whose schema declares ``properties`` but not the key.

    Keys matched by ``patternProperties`` are declared; an explicit
    ``additionalProperties`` (``true`` or a schema) allows extras on purpose.
    Walks ``properties`` and ``items`` only: under ``anyOf``/``oneOf`` which
    branch applies is jsonschema's call.
    """
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        if not isinstance(props, dict):
            return
        patterns = list((schema.get("patternProperties") or {}).keys())
        extras_allowed = schema.get("additionalProperties", False) is not False
        for key, item in value.items():
            if key in props:
                yield from _undeclared(props[key], item, (*path, key))
            elif not extras_allowed and not any(re.search(p, key) for p in patterns):
                yield path, key
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                yield from _undeclared(items, item, (*path, index))


# --- everything -------------------------------------------------------------------------------
def validate(
    traj: Trajectory,
    *,
    rules: DomainRules | None = None,
    reasoning: ReasoningMode = "keep",
    grammar: ActionGrammar | None = None,
    compose: CompositionRules | None = None,
) -> list[Issue]:
    """All issues of ``traj``: exported structure, tool calls, domain rules.

    The structure checked is that of ``to_sharegpt(normalize(traj), reasoning=...)``,
    i.e. what would be written, with ``Issue.turn`` mapped back to ``traj``'s turns.
    With a ``grammar`` (a text-action domain) the actions are checked against it
    (``factory.core.actions``) instead of tool schemas, on the row
    ``render_text_actions`` writes; with ``compose`` too, the composition rules.

    Args:
        traj: a canonical trajectory (not modified).
        rules: the domain's argument rules, if any.
        reasoning: the export mode the rows will be written with.
        grammar: the domain's action grammar, for a text-action domain.
        compose: multi-app composition rules (composed outputs only, never seeds).

    Returns:
        Issues ordered most fundamental first (see ``ISSUE_ORDER``), then by turn;
        empty when the trajectory is fit to train on. A turn with a bad role or
        field types is reported alone: nothing else can be checked safely.
    """
    return validate_rendered(
        traj, rules=rules, reasoning=reasoning, grammar=grammar, compose=compose
    )[0]


def validate_rendered(
    traj: Trajectory,
    *,
    rules: DomainRules | None = None,
    reasoning: ReasoningMode = "keep",
    grammar: ActionGrammar | None = None,
    compose: CompositionRules | None = None,
) -> tuple[list[Issue], Rendered | None]:
    """``validate`` plus the rendering it checked, for the exporter to reuse.

    Returns:
        ``(issues, rendered)``; ``rendered`` is ``None`` only when field types are
        broken (nothing could be rendered). Pass it to ``sharegpt_row`` so the row
        is written from the conversation that was checked, not rendered again.
    """
    malformed = _field_issues(traj)
    if malformed:
        return malformed, None
    rendered = render(traj, reasoning=reasoning, text_actions=grammar is not None)
    origin, where = rendered.origin, rendered.where
    issues = [
        replace(issue, turn=origin[where[issue.turn]]) if issue.turn is not None else issue
        for issue in check_structure(rendered.conversations)
    ]
    if grammar is None:
        issues.extend(validate_calls(traj))
    else:
        issues.extend(check_actions(traj, grammar))
        if compose is not None and not issues:  # composition needs well-formed actions
            issues.extend(compose.check(traj, grammar))
    if rules is not None:
        issues.extend(rules.check(traj))
    return sorted(issues, key=_sort_key), rendered


def _field_issues(traj: Trajectory) -> list[Issue]:
    """Turns that break the canonical model's types (the readers' contract)."""
    issues: list[Issue] = []
    for i, turn in enumerate(traj.turns):
        if turn.role not in ROLES:
            issues.append(Issue("bad_role", f"role {short(turn.role, 40)!r}", turn=i))
        wrong = [
            name
            for name, ok in (
                ("content", isinstance(turn.content, str)),
                ("reasoning", turn.reasoning is None or isinstance(turn.reasoning, str)),
                (
                    "tool_calls",
                    isinstance(turn.tool_calls, list)
                    and all(
                        isinstance(c, ToolCall) and isinstance(c.name, str) for c in turn.tool_calls
                    ),
                ),
            )
            if not ok
        ]
        if wrong:
            issues.append(
                Issue("bad_field_type", f"turn {i}: wrong type of {', '.join(wrong)}", turn=i)
            )
    return issues


def _rank(code: str) -> int:
    if code in _RANK:
        return _RANK[code]
    return len(ISSUE_ORDER) + (0 if code.startswith("domain:") else 1)


def _sort_key(issue: Issue) -> tuple[int, int]:
    return _rank(issue.code), -1 if issue.turn is None else issue.turn


def first_reason(issues: Sequence[Issue]) -> str | None:
    """The reason code a rejected row is filed under: its most fundamental issue's."""
    if not issues:
        return None
    return min(issues, key=_sort_key).code
