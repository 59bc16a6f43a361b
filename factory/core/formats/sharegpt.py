"""ShareGPT with function calling (APIGen-MT, LLaMA-Factory ``formatting: sharegpt``).

``conversations`` alternate ``human``/``observation`` with ``gpt``/``function_call``;
a ``function_call`` value is JSON ``{"name", "arguments"}`` or a JSON list of
them (parallel calls). LLaMA-Factory answers N parallel calls with *one*
observation, either a JSON list of N results or N results joined by
``"\\n</tool_response>\\n<tool_response>\\n"``; it is split back into N tool
turns here so the canonical model has one observation per call. When the
seed already has one observation turn per call, nothing is split.
"""

from __future__ import annotations

import json
from typing import Any

from factory.core.formats._common import (
    Pending,
    as_text,
    fail,
    finish,
    make_call,
    message_list,
    observation,
    parse_tools,
    record_system,
    split_think,
    system_message,
    tool_turn,
)
from factory.core.repair import parse_json_value
from factory.core.trajectory import Trajectory, Turn
from factory.errors import RepairError

__all__ = ["FORMAT", "OBSERVATION_SEPARATOR", "parse", "split_observation"]

FORMAT = "sharegpt"
OBSERVATION_SEPARATOR = "\n</tool_response>\n<tool_response>\n"
_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "function_call",
    "observation": "observation",
    "tool": "observation",
}


def split_observation(text: str, n: int) -> list[str] | None:
    """Split one observation answering ``n`` parallel calls; None when it does not split."""
    if OBSERVATION_SEPARATOR in text:
        parts = text.split(OBSERVATION_SEPARATOR)
        return parts if len(parts) == n else None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list) or len(value) != n:
        return None
    return [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in value]


def _calls_value(value: Any, where: str, repairs: list[str]) -> tuple[str | None, list[Any]]:
    """Reasoning and the list of raw call objects of a function_call value."""
    reasoning = None
    if isinstance(value, str):
        reasoning, body = split_think(value)
        try:
            parsed, repaired = parse_json_value(body, reason="malformed_arguments")
        except RepairError as exc:
            raise fail(exc.reason, f"{where}: {exc}") from exc
        if repaired:
            repairs.append(f"{where}: json_repair")
        value = parsed
    items = value if isinstance(value, list) else [value]
    if not items:
        raise fail("bad_field_type", f"{where}: an empty list of calls")
    return reasoning, items


def _run_length(conv: list[dict[str, Any]], start: int) -> int:
    n = 0
    while start + n < len(conv) and _ROLES.get(str(conv[start + n].get("from"))) == "observation":
        n += 1
    return n


def parse(
    record: dict[str, Any], *, default_tools: list[dict[str, Any]] | None = None
) -> Trajectory:
    """Convert one ShareGPT record.

    Raises:
        SeedFormatError: with a reason code (bad_role, bad_field_type, bad_tools,
            malformed_arguments, arguments_not_object, malformed_observation, ...).
    """
    key, conv = message_list(record)
    system = record_system(record)
    tools = parse_tools(record.get("tools"), default_tools)
    turns: list[Turn] = []
    repairs: list[str] = []
    pending = Pending()
    prev_kind = None
    for i, msg in enumerate(conv):
        where = f"{key}[{i}]"
        role = msg.get("from")
        kind = _ROLES.get(role) if isinstance(role, str) else None
        if kind is None:
            raise fail("bad_role", f"{where}: unknown 'from' value {role!r}"[:200])
        value = msg.get("value")
        if kind == "function_call":
            reasoning, items = _calls_value(value, where, repairs)
            calls = [make_call(c, f"{where}.calls[{j}]", repairs) for j, c in enumerate(items)]
            turns.append(Turn(role="assistant", tool_calls=calls, reasoning=reasoning))
            pending.set(calls)
        elif kind == "observation":
            text = as_text(value, where)
            parts = None
            if prev_kind != "observation" and len(pending) > 1 and _run_length(conv, i) == 1:
                parts = split_observation(text, len(pending))
            for j, part in enumerate(parts or [text]):
                sub = f"{where}[{j}]" if parts else where
                turns.append(tool_turn(observation(part, sub, repairs), pending))
        else:
            text = as_text(value, where)
            if kind == "system":
                system = system_message(system, text, turns, where)
            elif kind == "user":
                turns.append(Turn(role="user", content=text))
                pending.clear()
            else:
                reasoning, text = split_think(text)
                turns.append(Turn(role="assistant", content=text, reasoning=reasoning))
                pending.clear()
        prev_kind = kind
    return finish(FORMAT, record, system, tools, turns, repairs)
