"""Text-action conversations: the agent's action is text in its turn, read by a grammar.

The layouts AgentTuning/AgentInstruct and AgentBench use: ShareGPT ``conversations``
(``from: human|gpt``, optionally ``system``) or OpenAI chat ``messages``
(``role: user|assistant``) without ``tool_calls``. Which text is an action is the
domain's :class:`~factory.core.grammar.ActionGrammar`'s call; this module maps the
turns onto the canonical model:

* an agent turn keeps its whole text as ``content`` (the agent's format is what a
  trainer learns, so it is never rebuilt), with the one action it holds as its
  ``tool_calls`` (name and arguments, for dedup, labels, rules and mixtures) and the
  grammar's lossless repairs applied and noted in ``metadata["repairs"]``;
* the environment's answer is a ``tool`` turn named after the action it answers.
  With explicit observation roles (``observation``/``tool``) those are the
  observations; without, every human turn after the agent's first action is one
  (AgentBench: the task comes first, then the environment speaks for the user).

Nothing here rejects a broken action: the turn keeps its text and no call, and
``factory.core.actions.check_actions`` names the problem with its reason code.
"""

from __future__ import annotations

from typing import Any

from factory.core.formats._common import (
    as_text,
    fail,
    finish,
    message_list,
    record_system,
    split_think,
    system_message,
)
from factory.core.formats.completion import completion_messages
from factory.core.grammar import ActionGrammar
from factory.core.trajectory import Trajectory, Turn
from factory.errors import RepairError, SeedFormatError

__all__ = ["FORMAT", "parse", "parse_completion", "render_messages"]

FORMAT = "textaction"
_ROLES = {
    "system": "system",
    "developer": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "observation": "tool",
    "tool": "tool",
}
_STRUCTURED = ("tool_calls", "function_call")


def _role(msg: dict[str, Any], where: str) -> tuple[str, bool]:
    """(canonical role, ShareGPT layout) of one message."""
    sharegpt = "from" in msg
    role = msg.get("from") if sharegpt else msg.get("role")
    kind = _ROLES.get(role) if isinstance(role, str) else None
    if kind is None:
        raise fail("bad_role", f"{where}: unknown role {role!r}"[:200])
    return kind, sharegpt


def _reasoning(msg: dict[str, Any], where: str) -> str | None:
    for key in ("reasoning_content", "reasoning"):
        value = msg.get(key)
        if value is not None and not isinstance(value, str):
            raise fail("bad_field_type", f"{where}.{key}: expected a string")
        if value:
            return value
    return None


def parse(record: dict[str, Any], *, grammar: ActionGrammar) -> Trajectory:
    """Convert one text-action record with ``grammar``.

    Raises:
        SeedFormatError: ``bad_role``, ``bad_field_type`` (structured tool calls in a
            text-action domain, a non-text value), ``empty_trajectory``.
    """
    key, messages = message_list(record)
    system = record_system(record)
    explicit = any(_role(m, f"{key}[{i}]")[0] == "tool" for i, m in enumerate(messages))
    turns: list[Turn] = []
    repairs: list[str] = []
    acted = False
    for i, msg in enumerate(messages):
        where = f"{key}[{i}]"
        kind, sharegpt = _role(msg, where)
        if any(msg.get(k) for k in _STRUCTURED):
            raise fail(
                "bad_field_type",
                f"{where}: structured tool calls, but this domain's actions are text "
                f"(grammar {grammar.name!r}); use the domain's tools instead of a grammar",
            )
        text = as_text(msg.get("value") if sharegpt else msg.get("content"), where)
        if kind == "system":
            system = system_message(system, text, turns, where)
        elif kind == "assistant":
            reasoning = _reasoning(msg, where)
            if reasoning is None:
                reasoning, text = split_think(text)
            parsed = grammar.parse_turn(text)
            repairs.extend(f"{where}: {note}" for note in parsed.repairs)
            calls = [parsed.call] if parsed.call is not None else []
            turns.append(
                Turn(role="assistant", content=parsed.text, tool_calls=calls, reasoning=reasoning)
            )
            acted = acted or parsed.found
        elif kind == "tool" or (not explicit and acted):
            before = turns[-1] if turns else None
            answered = before.tool_calls[0].name if before and before.tool_calls else None
            turns.append(Turn(role="tool", content=text, name=answered))
        else:
            turns.append(Turn(role="user", content=text))
    return finish(FORMAT, record, system, [], turns, repairs)


def parse_completion(text: str, grammar: ActionGrammar) -> Trajectory:
    """A model's answer (``{"messages": [...]}``, observations as ``tool`` messages) read
    with ``grammar``; the caller sets the system prompt.

    Raises:
        RepairError: ``unparsable_completion`` (no message list) or the reader's reason
            code (``bad_role``, ``bad_field_type``, ``empty_trajectory``).
    """
    messages, repairs = completion_messages(text)
    try:
        traj = parse({"messages": messages}, grammar=grammar)
    except SeedFormatError as exc:
        raise RepairError(exc.reason, str(exc)) from exc
    traj.metadata["format"] = "completion"
    traj.metadata["repairs"] = [*repairs, *traj.metadata["repairs"]]
    return traj


def render_messages(traj: Trajectory) -> dict[str, Any]:
    """The turns in the output format of text-action prompts: the agent's text as it is,
    observations as ``tool`` messages (reasoning kept in its own field)."""
    out: list[dict[str, Any]] = []
    for turn in traj.turns:
        msg: dict[str, Any] = {"role": turn.role}
        if turn.role == "assistant" and turn.reasoning:
            msg["reasoning"] = turn.reasoning
        msg["content"] = turn.content
        out.append(msg)
    return {"messages": out}
