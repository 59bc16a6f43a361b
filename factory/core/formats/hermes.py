"""Hermes / Qwen text tool calling, in ShareGPT or OpenAI layout.

Tool use lives in the text: the assistant writes
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, the results
come back as ``<tool_response>...</tool_response>`` blocks in a user (or
``tool``) message, and the tool list is often only inside ``<tools>...</tools>``
in the system prompt. Messages are ``{from, value}`` (NousResearch
hermes-function-calling) or ``{role, content}``.

Assistant text outside the call blocks becomes ``content`` (it precedes the
calls in practice); a user message that mixes tool responses with other text
is refused rather than guessed apart. Hermes-v1 responses shaped
``{"name": tool, "content": result}`` are unwrapped to the result.
"""

from __future__ import annotations

import json
import re
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
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.errors import RepairError

__all__ = ["FORMAT", "has_markup", "parse"]

FORMAT = "hermes"
_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "observation": "tool",
}
# A final block may be cut off without its closing tag (note ``unclosed_tool_call``).
_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.S)
_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)
_TOOLS = re.compile(r"<tools>(.*?)</tools>", re.S)


def has_markup(role: str, text: str) -> bool:
    """Whether a message carries Hermes tool markup for its role."""
    kind = _ROLES.get(role)
    if kind == "assistant":
        return "<tool_call>" in text
    return kind in ("user", "tool") and "<tool_response>" in text


def _tools_from_system(system: str) -> list[Any] | None:
    # Hermes prompts mention "<tools></tools> XML tags" before the real, non-empty block.
    body = next((b.strip() for b in _TOOLS.findall(system) if b.strip()), None)
    if body is None:
        return None
    try:
        value, _ = parse_json_value(body, reason="bad_tools")
        return value if isinstance(value, list) else [value]
    except RepairError:
        pass
    specs: list[Any] = []  # one spec per line, as some Hermes prompts write them
    for line in body.splitlines():
        if line.strip():
            try:
                specs.append(parse_json_value(line.strip(), reason="bad_tools")[0])
            except RepairError as exc:
                raise fail("bad_tools", f"system <tools>: {exc}") from exc
    return specs


def _assistant(text: str, where: str, repairs: list[str]) -> Turn:
    reasoning, text = split_think(text)
    blocks = list(_CALL.finditer(text))
    if not blocks:
        return Turn(role="assistant", content=text, reasoning=reasoning)
    calls: list[ToolCall] = []
    for j, m in enumerate(blocks):
        sub = f"{where}.tool_call[{j}]"
        if not m.group(2):
            repairs.append(f"{sub}: unclosed_tool_call")
        try:
            value, repaired = parse_json_value(m.group(1).strip(), reason="malformed_arguments")
        except RepairError as exc:
            raise fail(exc.reason, f"{sub}: {exc}") from exc
        if repaired:
            repairs.append(f"{sub}: json_repair")
        items = value if isinstance(value, list) else [value]
        calls.extend(make_call(item, sub, repairs) for item in items)
    bounds = [0, *(x for m in blocks for x in (m.start(), m.end())), len(text)]
    pieces = (text[a:b].strip() for a, b in zip(bounds[::2], bounds[1::2], strict=True))
    content = "\n".join(p for p in pieces if p)
    return Turn(role="assistant", content=content, tool_calls=calls, reasoning=reasoning)


def _response(block: str, where: str, pending: Pending, repairs: list[str]) -> Turn:
    text = block.strip("\n")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if (
        isinstance(value, dict)
        and set(value) == {"name", "content"}
        and isinstance(value["name"], str)
    ):
        inner = value["content"]
        content = inner if isinstance(inner, str) else json.dumps(inner, ensure_ascii=False)
        return tool_turn(content, pending, name=value["name"])
    return tool_turn(observation(text, where, repairs), pending)


def parse(
    record: dict[str, Any], *, default_tools: list[dict[str, Any]] | None = None
) -> Trajectory:
    """Convert one Hermes-style record.

    Raises:
        SeedFormatError: with a reason code (bad_role, bad_field_type, bad_tools,
            malformed_arguments, arguments_not_object, malformed_observation, ...).
    """
    key, messages = message_list(record)
    system = record_system(record)
    turns: list[Turn] = []
    repairs: list[str] = []
    pending = Pending()
    for i, msg in enumerate(messages):
        where = f"{key}[{i}]"
        sharegpt_layout = "from" in msg
        role = msg.get("from") if sharegpt_layout else msg.get("role")
        kind = _ROLES.get(role) if isinstance(role, str) else None
        if kind is None:
            raise fail("bad_role", f"{where}: unknown role {role!r}"[:200])
        text = as_text(msg.get("value") if sharegpt_layout else msg.get("content"), where)
        if kind == "system":
            system = system_message(system, text, turns, where)
        elif kind == "assistant":
            turn = _assistant(text, where, repairs)
            turns.append(turn)
            pending.set(turn.tool_calls)
        elif "<tool_response>" in text:
            blocks = _RESPONSE.findall(text)
            if _RESPONSE.sub("", text).strip():
                raise fail("bad_field_type", f"{where}: tool responses mixed with other text")
            for j, block in enumerate(blocks):
                turns.append(_response(block, f"{where}.tool_response[{j}]", pending, repairs))
        elif kind == "tool":
            turns.append(tool_turn(observation(text, where, repairs), pending))
        else:
            turns.append(Turn(role="user", content=text))
            pending.clear()
    raw_tools = record.get("tools")
    if raw_tools is None or raw_tools == "" or raw_tools == []:
        raw_tools = _tools_from_system(system)
    tools = parse_tools(raw_tools, default_tools)
    return finish(FORMAT, record, system, tools, turns, repairs)
