"""The model output format: how a whole trajectory travels inside one completion.

The amplification prompt shows the reference in this format and asks for the
new trajectory in it::

    {"messages": [{"role": "user", "content": "..."},
                  {"role": "assistant", "reasoning": "...", "content": "",
                   "tool_calls": [{"name": "t", "arguments": {...}}]},
                  {"role": "tool", "name": "t", "content": "..."}]}

Why this shape: it is OpenAI chat messages, which every model has seen, but
with ``arguments`` as an object (no JSON inside a JSON string, the commonest
source of broken output) and reasoning in its own field. One JSON object means
``json-repair`` can mend small syntax slips (a trailing comma, single quotes)
in the answer as a whole, while ``factory.core.repair``'s lossless policy refuses
anything truncated mid-value instead of guessing how it ended.
"""

from __future__ import annotations

import json
import re
from typing import Any

from factory.core.repair import parse_arguments, parse_json_value, parse_observation
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.errors import RepairError

__all__ = ["completion_messages", "parse_output", "render_output"]

# "\ud800" is valid JSON but half a UTF-16 pair: no UTF-8 text (Arrow, hashes) holds it.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def render_output(traj: Trajectory) -> dict[str, Any]:
    """The trajectory's turns in the output format (system and tools are not part of it)."""
    messages: list[dict[str, Any]] = []
    for turn in traj.turns:
        if turn.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant"}
            if turn.reasoning:
                msg["reasoning"] = turn.reasoning
            msg["content"] = turn.content
            if turn.tool_calls:
                msg["tool_calls"] = [
                    {"name": c.name, "arguments": c.arguments} for c in turn.tool_calls
                ]
            messages.append(msg)
        elif turn.role == "tool":
            messages.append({"role": "tool", "name": turn.name or "", "content": turn.content})
        else:
            messages.append({"role": "user", "content": turn.content})
    return {"messages": messages}


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts
        parts = [p.get("text", "") for p in value if isinstance(p, dict)]
        if len(parts) == len(value):
            return "".join(str(p) for p in parts)
    raise RepairError("unparsable_completion", f"{where}: content must be a string")


def _call(raw: Any, where: str) -> tuple[ToolCall, list[str]]:
    if not isinstance(raw, dict):
        raise RepairError("unparsable_completion", f"{where}: a tool call must be an object")
    function = raw.get("function")
    fn: dict[str, Any] = function if isinstance(function, dict) else raw
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise RepairError("unparsable_completion", f"{where}: a tool call needs a name")
    args, repairs = parse_arguments(fn.get("arguments"))
    return ToolCall(name=name, arguments=args, id=raw.get("id")), repairs


def completion_messages(text: str) -> tuple[list[Any], list[str]]:
    """The ``messages`` list of a completion and the repairs its JSON needed.

    Raises:
        RepairError: ``unparsable_completion`` when the text holds no message list.
    """
    try:
        value, repaired = parse_json_value(text)
    except RepairError as exc:
        raise RepairError("unparsable_completion", f"no JSON trajectory: {exc}") from exc
    if _SURROGATE_ESCAPE.search(text) and _SURROGATE.search(json.dumps(value, ensure_ascii=False)):
        raise RepairError("unparsable_completion", "a lone surrogate escape is not Unicode text")
    repairs = ["completion:json_repair"] if repaired else []
    if isinstance(value, list):
        value = {"messages": value}
        repairs.append("completion:bare_message_list")
    messages = value.get("messages") if isinstance(value, dict) else None
    if not isinstance(messages, list) or not messages:
        raise RepairError("unparsable_completion", "expected an object with a 'messages' list")
    return messages, repairs


def parse_output(text: str) -> Trajectory:
    """Parse a completion into a Trajectory (turns only; the caller sets system and tools).

    Repairs applied on the way are listed in ``metadata["repairs"]``.

    Raises:
        RepairError: ``unparsable_completion`` when no trajectory can be recovered without
            guessing, ``malformed_arguments`` / ``arguments_not_object`` /
            ``malformed_observation`` for a broken nested piece.
    """
    messages, repairs = completion_messages(text)
    turns: list[Turn] = []
    pending: list[ToolCall] = []  # calls still waiting for their observation, in order
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RepairError("unparsable_completion", f"{where}: a message must be an object")
        role = msg.get("role")
        if role == "user":
            turns.append(Turn(role="user", content=_text(msg.get("content"), where)))
        elif role == "assistant":
            calls = []
            for j, raw_call in enumerate(msg.get("tool_calls") or []):
                call, fixed = _call(raw_call, f"{where}.tool_calls[{j}]")
                calls.append(call)
                repairs += [f"{where}.tool_calls[{j}]:{r}" for r in fixed]
            reasoning = msg.get("reasoning") or msg.get("reasoning_content")
            turns.append(
                Turn(
                    role="assistant",
                    content=_text(msg.get("content"), where),
                    tool_calls=calls,
                    reasoning=_text(reasoning, where) or None,
                )
            )
            pending = list(calls)
        elif role == "tool":
            content = msg.get("content")
            if not isinstance(content, str):
                content = json.dumps(content, ensure_ascii=False)
                repairs.append(f"{where}:observation_serialised")
            content, fixed = parse_observation(content)
            repairs += [f"{where}:{r}" for r in fixed]
            answered = pending.pop(0) if pending else None
            name = msg.get("name") or (answered.name if answered else None)
            turns.append(
                Turn(
                    role="tool",
                    content=content,
                    name=name,
                    tool_call_id=answered.id if answered else None,
                )
            )
        else:
            raise RepairError("unparsable_completion", f"{where}: unknown role {role!r}")
    traj = Trajectory(turns=turns, metadata={"format": "completion", "repairs": repairs})
    return traj
