"""OpenAI chat messages (``messages``, or tau-bench's ``traj``).

Roles system / user / assistant / tool (``developer`` and the legacy ``function``
role are accepted as system and tool). Assistant ``content`` may be a string,
None or a list of text parts; ``tool_calls`` carry ``arguments`` as a JSON
string, which becomes an object here. Reasoning comes from
``reasoning_content`` / ``reasoning`` or else a leading ``<think>`` block.
The tau-bench records (``traj``, ``reward``, ``task_id``, ``trial``,
``info.task.user_id``) have no tool list; ``default_tools`` supplies it.
"""

from __future__ import annotations

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
from factory.core.trajectory import ToolCall, Trajectory, Turn

__all__ = ["FORMAT", "parse"]

FORMAT = "openai"
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}


def _optional_str(msg: dict[str, Any], key: str, where: str) -> str | None:
    value = msg.get(key)
    if value is not None and not isinstance(value, str):
        raise fail("bad_field_type", f"{where}.{key}: expected a string")
    return value


def _assistant(msg: dict[str, Any], where: str, repairs: list[str]) -> Turn:
    content = as_text(msg.get("content"), f"{where}.content")
    reasoning = _optional_str(msg, "reasoning_content", where) or _optional_str(
        msg, "reasoning", where
    )
    if reasoning is None:
        reasoning, content = split_think(content)
    raw_calls = msg.get("tool_calls")
    if raw_calls is None:
        raw_calls = []
    if not isinstance(raw_calls, list):
        raise fail("bad_field_type", f"{where}.tool_calls: expected a list")
    calls: list[ToolCall] = [
        make_call(c, f"{where}.tool_calls[{j}]", repairs) for j, c in enumerate(raw_calls)
    ]
    legacy = msg.get("function_call")
    if legacy is not None:  # pre-2023 single function call
        calls.append(make_call(legacy, f"{where}.function_call", repairs))
    return Turn(role="assistant", content=content, tool_calls=calls, reasoning=reasoning or None)


def parse(
    record: dict[str, Any], *, default_tools: list[dict[str, Any]] | None = None
) -> Trajectory:
    """Convert one OpenAI-chat (or tau-bench) record.

    Raises:
        SeedFormatError: with a reason code (bad_role, bad_field_type, bad_tools,
            malformed_arguments, arguments_not_object, malformed_observation, ...).
    """
    key, messages = message_list(record)
    system = record_system(record)
    tools = parse_tools(record.get("tools"), default_tools)
    turns: list[Turn] = []
    repairs: list[str] = []
    pending = Pending()
    for i, msg in enumerate(messages):
        where = f"{key}[{i}]"
        role = msg.get("role")
        kind = _ROLES.get(role) if isinstance(role, str) else None
        if kind is None:
            raise fail("bad_role", f"{where}: unknown role {role!r}"[:200])
        if kind == "assistant":
            turn = _assistant(msg, where, repairs)
            turns.append(turn)
            pending.set(turn.tool_calls)
        elif kind == "tool":
            text = observation(as_text(msg.get("content"), f"{where}.content"), where, repairs)
            name = _optional_str(msg, "name", where)
            call_id = _optional_str(msg, "tool_call_id", where)
            turns.append(tool_turn(text, pending, name=name, call_id=call_id))
        else:
            text = as_text(msg.get("content"), f"{where}.content")
            if kind == "system":
                system = system_message(system, text, turns, where)
            else:
                turns.append(Turn(role="user", content=text))
                pending.clear()
    return finish(FORMAT, record, system, tools, turns, repairs)
