"""Helpers shared by the per-format converters (not public API).

Every converter builds turns, then calls :func:`finish`; errors are raised as
``SeedFormatError`` with a code from ``factory.core.reasons`` and never anything else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from factory.core.repair import parse_arguments, parse_json_value, parse_observation
from factory.core.trajectory import ToolCall, Trajectory, Turn, normalize_tool_spec
from factory.errors import RepairError, SeedFormatError, short

_THINK = re.compile(r"\A\s*<think>(.*?)</think>\s*", re.S)
# Fields copied from the record into metadata when present (tau-bench, APIGen-MT ...).
CARRIED_FIELDS = ("reward", "task_id", "trial", "user_id")
# Where a record keeps its messages; the layout inside decides the format, not the key.
LIST_KEYS = ("conversations", "messages", "traj")
# Longest tool name the OpenAI and Anthropic APIs accept; a longer one cannot be
# served, and in a seed it is garbage (a whole payload pasted into the name).
MAX_TOOL_NAME = 64


def fail(reason: str, message: str) -> SeedFormatError:
    return SeedFormatError(reason, message)


def split_think(text: str) -> tuple[str | None, str]:
    """Split a leading ``<think>...</think>`` block off ``text``."""
    m = _THINK.match(text)
    if not m:
        return None, text
    return m.group(1).strip() or None, text[m.end() :]


def as_text(value: Any, where: str) -> str:
    """Message content as a string: str, None (empty) or a list of text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts: list[str] = []
        for part in value:
            if isinstance(part, str):
                parts.append(part)
            elif (
                isinstance(part, dict)
                and part.get("type", "text") == "text"
                and isinstance(part.get("text"), str)
            ):
                parts.append(part["text"])
            else:
                raise fail("bad_field_type", f"{where}: only text content parts are supported")
        return "".join(parts)
    raise fail("bad_field_type", f"{where}: expected text, got {type(value).__name__}")


def decode_list(record: dict[str, Any], key: str) -> list[Any]:
    """The message list under ``key``; Parquet/CSV dumps sometimes store it as JSON text."""
    value = record[key]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise fail("bad_field_type", f"{key}: a string that is not a JSON list") from exc
    if not isinstance(value, list):
        raise fail("bad_field_type", f"{key}: expected a list, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise fail("bad_field_type", f"{key}[{i}]: expected an object")
    return value


def message_list(record: dict[str, Any]) -> tuple[str, list[Any]]:
    """``(key, messages)`` from the first of ``LIST_KEYS`` the record has.

    A null value counts as absent: Parquet gives every row every column.
    """
    key = next((k for k in LIST_KEYS if record.get(k) is not None), None)
    if key is None:
        keys = short(sorted(map(str, record))[:20], 120)
        raise fail("unknown_format", f"no conversations/messages/traj field; keys {keys}")
    return key, decode_list(record, key)


def record_system(record: dict[str, Any]) -> str:
    """The record's ``system`` field: a string, or empty when absent.

    Raises:
        SeedFormatError: ``bad_field_type`` when it is anything else.
    """
    system = record.get("system") or ""
    if not isinstance(system, str):
        raise fail("bad_field_type", "system: expected a string")
    return system


def parse_tools(raw: Any, default_tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Normalised tool specs from a JSON string or list; ``default_tools`` when absent."""
    if raw is None or raw == "" or raw == []:
        raw = default_tools or []
    if isinstance(raw, str):
        try:
            raw, _ = parse_json_value(raw, reason="bad_tools")
        except RepairError as exc:
            raise fail("bad_tools", f"tools: {exc}") from exc
    if isinstance(raw, dict):  # one spec instead of a list of one
        raw = [raw]
    if not isinstance(raw, list):
        raise fail("bad_tools", f"tools: expected a list of specs, got {type(raw).__name__}")
    tools: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, spec in enumerate(raw):
        try:
            tool = normalize_tool_spec(spec)
        except ValueError as exc:
            raise fail("bad_tools", f"tools[{i}]: {exc}") from exc
        if len(tool["name"]) > MAX_TOOL_NAME:
            size = f"{len(tool['name'])} characters (at most {MAX_TOOL_NAME})"
            raise fail("bad_tools", f"tools[{i}]: a name of {size}")
        if tool["name"] in seen:
            raise fail("bad_tools", f"tools[{i}]: duplicate tool name {short(tool['name'], 60)!r}")
        seen.add(tool["name"])
        tools.append(tool)
    return tools


def make_call(raw: Any, where: str, repairs: list[str]) -> ToolCall:
    """A ToolCall from ``{"name", "arguments", "id"?}`` or OpenAI's ``{"function": {...}}``."""
    if not isinstance(raw, dict):
        raise fail("bad_field_type", f"{where}: a tool call must be an object")
    fn: dict[str, Any] = raw["function"] if isinstance(raw.get("function"), dict) else raw
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise fail("bad_field_type", f"{where}: a tool call needs a non-empty string name")
    try:
        arguments, notes = parse_arguments(fn.get("arguments"))
    except RepairError as exc:
        raise fail(exc.reason, f"{where}.arguments: {exc}") from exc
    repairs.extend(f"{where}.arguments: {note}" for note in notes)
    call_id = raw.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise fail("bad_field_type", f"{where}.id: expected a string")
    return ToolCall(name=name, arguments=arguments, id=call_id or None)


def observation(text: str, where: str, repairs: list[str]) -> str:
    try:
        content, notes = parse_observation(text)
    except RepairError as exc:
        raise fail(exc.reason, f"{where}: {exc}") from exc
    repairs.extend(f"{where}: {note}" for note in notes)
    return content


class Pending:
    """Calls of the latest assistant turn still waiting for their observations."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []

    def set(self, calls: Iterable[ToolCall]) -> None:
        self.calls = list(calls)

    def clear(self) -> None:
        self.calls = []

    def answer(self, call_id: str | None = None, name: str | None = None) -> ToolCall | None:
        """Pop the call an observation answers: by id, else by name, else the oldest."""
        for key, attr in ((call_id, "id"), (name, "name")):
            if key is not None:
                for i, call in enumerate(self.calls):
                    if getattr(call, attr) == key:
                        return self.calls.pop(i)
        return self.calls.pop(0) if self.calls else None

    def __len__(self) -> int:
        return len(self.calls)


def tool_turn(
    content: str, pending: Pending, *, name: str | None = None, call_id: str | None = None
) -> Turn:
    """A tool turn named after the call it answers (its own name wins when given)."""
    call = pending.answer(call_id, name)
    return Turn(
        role="tool",
        content=content,
        name=name or (call.name if call else None),
        tool_call_id=call_id or (call.id if call else None),
    )


def add_system(system: str, text: str) -> str:
    return f"{system}\n\n{text}" if system else text


def system_message(system: str, text: str, turns: list[Turn], where: str) -> str:
    """The system prompt with a system message's text added; only before the first turn.

    Raises:
        SeedFormatError: ``bad_role`` for a system message after the conversation began.
    """
    if turns:
        raise fail("bad_role", f"{where}: a system message after the conversation began")
    return add_system(system, text)


def carried_metadata(record: dict[str, Any]) -> dict[str, Any]:
    """reward / task_id / trial / user_id from the record (tau-bench keeps user_id in info.task)."""
    meta = {k: record[k] for k in CARRIED_FIELDS if record.get(k) is not None}
    info = record.get("info")
    task = info.get("task") if isinstance(info, dict) else None
    if "user_id" not in meta and isinstance(task, dict) and task.get("user_id") is not None:
        meta["user_id"] = task["user_id"]
    for key, value in meta.items():
        if not isinstance(value, (str, int, float, bool)):
            raise fail("bad_field_type", f"{key}: expected a scalar, got {type(value).__name__}")
    return meta


def finish(
    fmt: str,
    record: dict[str, Any],
    system: str,
    tools: list[dict[str, Any]],
    turns: list[Turn],
    repairs: list[str],
) -> Trajectory:
    """Assemble the Trajectory, refuse empty ones, stamp format/repairs/id metadata."""
    if not any(t.role in ("user", "assistant") for t in turns):
        raise fail("empty_trajectory", "no user or assistant turns")
    traj = Trajectory(system=system, tools=tools, turns=turns)
    traj.metadata = {"format": fmt, "repairs": list(repairs), **carried_metadata(record)}
    traj.metadata["id"] = traj.content_id()
    return traj
