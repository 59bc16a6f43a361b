"""Canonical trajectories -> LLaMA-Factory's sharegpt-with-tools rows.

LLaMA-Factory's ``SharegptDatasetConverter`` silently skips any example whose
roles do not alternate human/observation with gpt/function_call or whose turn
count is odd, and its ``FunctionFormatter`` raises on a function_call value
that is not JSON. A row we accept and it then drops (or crashes on) is a bug
we cannot see, so this module does three things in one place:

* ``normalize`` rewrites the few shapes seeds really have that the format
  cannot hold (tau-bench: text next to a tool call, a trailing
  ``###STOP###`` user turn, a trailing transfer observation), recording every
  change in ``metadata["repairs"]``;
* ``to_sharegpt`` renders exactly the row format LLaMA-Factory reads
  (``conversations`` / ``system`` / ``tools``);
* ``check_structure`` applies the converter's own acceptance rules plus our
  call/observation pairing rules to the rendered conversation.

``render`` does the first two once per trajectory and keeps the result
(``Rendered``): validation checks that conversation and the exported row is
built from it, so a trajectory is never normalised or rendered twice (issue 9).

Reasoning is written as ``<think>\\n...\\n</think>\\n\\n`` because those are
LLaMA-Factory's default ``thought_words``: its templates cut exactly that span
off the front of an assistant or function_call value and re-attach it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from factory.core.reasons import Issue
from factory.core.trajectory import IdentityMemo, ToolCall, Trajectory, Turn, normalize_tool_spec

__all__ = [
    "OBSERVATION_SEPARATOR",
    "THINK_CLOSE",
    "THINK_OPEN",
    "Rendered",
    "calls_json",
    "check_structure",
    "export_tools",
    "normalize",
    "normalize_mapped",
    "render",
    "render_conversations",
    "render_text_actions",
    "to_sharegpt",
]

ReasoningMode = Literal["keep", "strip"]

# LLaMA-Factory's OpenAI converter joins parallel tool results with this; its
# tool templates wrap each observation in <tool_response> tags, so the joined
# value renders as one <tool_response> block per result.
OBSERVATION_SEPARATOR = "\n</tool_response>\n<tool_response>\n"
THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
# FunctionFormatter: re.search (first match, anywhere), DOTALL, non-greedy.
_THOUGHT = re.compile(re.escape(THINK_OPEN) + "(.*?)" + re.escape(THINK_CLOSE), re.DOTALL)

_USER_TAGS = ("human", "observation")  # even positions after an optional system turn
_ASSISTANT_TAGS = ("gpt", "function_call")  # odd positions
_TEXT_JOIN = "\n\n"


# --- normalisation ----------------------------------------------------------------------------
def normalize(traj: Trajectory) -> Trajectory:
    """Return a copy of ``traj`` that LLaMA-Factory's sharegpt format can hold.

    Merges consecutive user turns and consecutive text-only assistant turns;
    moves the text of an assistant turn that also calls tools into its
    reasoning (a text-only assistant turn directly before a call turn counts as
    the same turn); drops assistant turns with neither text nor calls; drops
    trailing user and tool turns so the last turn is the assistant's. Nothing
    else is reordered and no content is invented. Each change is recorded with
    ``add_repair`` on the copy.

    Args:
        traj: the canonical trajectory; not modified.

    Returns:
        The normalised copy.
    """
    return normalize_mapped(traj)[0]


def normalize_mapped(traj: Trajectory) -> tuple[Trajectory, list[int]]:
    """``normalize`` plus, for every output turn, the index of its first source turn.

    Validation uses the map to report issues against the caller's turn indices.
    """
    # Only turns are rewritten: copy them, share the (large, read-only) tool specs.
    out = Trajectory(
        system=traj.system,
        tools=traj.tools,
        # A shallow copy per turn is enough: only turn fields (content, reasoning) are
        # rewritten below; tool calls and their arguments are shared, never mutated.
        turns=[dataclasses.replace(t) for t in traj.turns],
        metadata={**traj.metadata, "repairs": list(traj.metadata.get("repairs") or [])},
    )
    turns: list[Turn] = []
    origin: list[int] = []
    repairs: list[str] = []
    for i, turn in enumerate(out.turns):
        if turn.role == "assistant":
            has_text = bool(turn.content.strip())
            if not has_text and not turn.tool_calls:
                repairs.append(f"normalize: dropped assistant turn {i} (no text, no tool calls)")
                continue
            if turn.tool_calls and turn.content:
                if has_text:
                    turn.reasoning = _join(turn.reasoning, turn.content)
                    repairs.append(
                        f"normalize: moved the text of assistant turn {i} into its reasoning "
                        "(a turn cannot hold both text and tool calls)"
                    )
                else:
                    repairs.append(f"normalize: cleared whitespace-only text of assistant turn {i}")
                turn.content = ""
        prev = turns[-1] if turns else None
        if prev is not None and prev.role == turn.role == "user":
            prev.content = _join(prev.content, turn.content) or ""
            repairs.append(f"normalize: merged user turn {i} into user turn {origin[-1]}")
            continue
        if prev is not None and prev.role == turn.role == "assistant" and not prev.tool_calls:
            if not turn.tool_calls:
                prev.content = _join(prev.content, turn.content) or ""
                prev.reasoning = _join(prev.reasoning, turn.reasoning)
                repairs.append(f"normalize: merged assistant turn {i} into turn {origin[-1]}")
            else:
                turn.reasoning = _join(prev.reasoning, prev.content, turn.reasoning)
                turns[-1] = turn
                repairs.append(
                    f"normalize: moved the text of assistant turn {origin[-1]} into the reasoning "
                    f"of the tool-call turn {i} that follows it"
                )
            continue
        turns.append(turn)
        origin.append(i)
    while turns and turns[-1].role != "assistant":
        dropped = turns.pop()
        repairs.append(f"normalize: dropped trailing {dropped.role} turn {origin.pop()}")
    out.turns = turns
    for what in repairs:
        out.add_repair(what)
    return out, origin


def _join(*parts: str | None) -> str | None:
    """Join the non-blank parts with a blank line; ``None`` when there are none."""
    kept = [p for p in parts if p and p.strip()]
    return _TEXT_JOIN.join(kept) if kept else None


# --- rendering --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rendered:
    """One trajectory normalised and rendered, once: what validation checks and export writes.

    ``origin[k]``: the source turn of normalised turn ``k``; ``where[j]``: the
    normalised turn of conversation entry ``j``; ``repairs``: what normalising added
    to ``metadata["repairs"]`` (the exporter appends them to the trajectory's own).
    """

    normalized: Trajectory
    origin: list[int]
    conversations: list[dict[str, str]]
    where: list[int]
    reasoning: ReasoningMode
    repairs: tuple[str, ...]
    tools_column: bool = True


def render(
    traj: Trajectory, *, reasoning: ReasoningMode = "keep", text_actions: bool = False
) -> Rendered:
    """``normalize`` then ``render_conversations``, keeping both maps back to ``traj``.

    With ``text_actions`` (a domain with an action grammar) the trajectory is rendered
    as it is, by :func:`render_text_actions`.

    Raises:
        ValueError: unknown ``reasoning`` mode.
    """
    if text_actions:
        return render_text_actions(traj, reasoning=reasoning)
    normalized, origin = normalize_mapped(traj)
    conversations, where = render_conversations(normalized, reasoning=reasoning)
    before = len(traj.metadata.get("repairs") or [])
    repairs = tuple(normalized.metadata["repairs"][before:])
    return Rendered(normalized, origin, conversations, where, reasoning, repairs)


def render_text_actions(traj: Trajectory, *, reasoning: ReasoningMode = "keep") -> Rendered:
    """A text-action trajectory as a sharegpt row without tools, the agent's text untouched.

    Why no normalising: the agent's turn *is* its action (``Act: bash`` and a code
    block), so nothing may move into reasoning or merge; why observations become
    ``human`` turns: that is how AgentBench serves them and AgentInstruct stores them,
    and the trained agent reads the environment where it reads the user. Each turn
    is one conversation entry, so ``where`` and ``origin`` are the identity.

    Raises:
        ValueError: unknown ``reasoning`` mode.
    """
    if reasoning not in ("keep", "strip"):
        raise ValueError(f"reasoning must be 'keep' or 'strip', not {reasoning!r}")
    conversations: list[dict[str, str]] = []
    for turn in traj.turns:
        if turn.role == "assistant":
            think = _think(turn.reasoning) if reasoning == "keep" else ""
            conversations.append({"from": "gpt", "value": think + turn.content})
        elif turn.role in ("user", "tool"):
            conversations.append({"from": "human", "value": turn.content})
        else:  # not a canonical role: render it so check_structure names the problem
            conversations.append({"from": str(turn.role), "value": turn.content})
    index = list(range(len(traj.turns)))
    return Rendered(traj, index, conversations, list(index), reasoning, (), tools_column=False)


def to_sharegpt(traj: Trajectory, *, reasoning: ReasoningMode = "keep") -> dict[str, Any]:
    """Render ``traj`` as one LLaMA-Factory sharegpt row with tools.

    Expects a ``normalize``d trajectory. Anything the format cannot hold is
    still rendered (never dropped) so that ``check_structure`` reports it: an
    assistant turn with text and calls becomes a gpt turn then a function_call.

    Args:
        traj: the trajectory to render.
        reasoning: "keep" writes ``<think>\\n{reasoning}\\n</think>\\n\\n`` before
            the assistant text or call JSON; "strip" drops reasoning.

    Returns:
        ``{"conversations": [{"from", "value"}...], "system": str, "tools": str}``.

    Raises:
        ValueError: unknown ``reasoning`` mode or a tool spec without a name.
    """
    conversations, _ = render_conversations(traj, reasoning=reasoning)
    tools = export_tools(traj.tools)
    return {"conversations": conversations, "system": traj.system, "tools": tools}


def render_conversations(
    traj: Trajectory, *, reasoning: ReasoningMode = "keep"
) -> tuple[list[dict[str, str]], list[int]]:
    """The ``conversations`` list plus, per entry, the index of its (first) source turn.

    Raises:
        ValueError: unknown ``reasoning`` mode.
    """
    if reasoning not in ("keep", "strip"):
        raise ValueError(f"reasoning must be 'keep' or 'strip', not {reasoning!r}")
    conversations: list[dict[str, str]] = []
    where: list[int] = []
    results: list[str] = []

    def emit(tag: str, value: str, at: int) -> None:
        conversations.append({"from": tag, "value": value})
        where.append(at)

    for i, turn in enumerate(traj.turns):
        if turn.role == "tool":
            results.append(turn.content)
            continue
        if results:
            emit("observation", OBSERVATION_SEPARATOR.join(results), i - len(results))
            results = []
        if turn.role == "user":
            emit("human", turn.content, i)
        elif turn.role == "assistant":
            think = _think(turn.reasoning) if reasoning == "keep" else ""
            if turn.tool_calls and turn.content.strip():
                emit("gpt", think + turn.content, i)
                think = ""
            if turn.tool_calls:
                emit("function_call", think + calls_json(turn.tool_calls), i)
            else:
                emit("gpt", think + turn.content, i)
        else:  # not a canonical role: render it so check_structure names the problem
            emit(str(turn.role), turn.content, i)
    if results:
        emit("observation", OBSERVATION_SEPARATOR.join(results), len(traj.turns) - len(results))
    return conversations, where


def _think(reasoning: str | None) -> str:
    return f"{THINK_OPEN}{reasoning}{THINK_CLOSE}" if reasoning and reasoning.strip() else ""


def calls_json(calls: list[ToolCall]) -> str:
    """A function_call value: one ``{"name", "arguments"}`` object, or a list for parallel calls."""
    bodies = [{"name": c.name, "arguments": c.arguments} for c in calls]
    return json.dumps(bodies[0] if len(bodies) == 1 else bodies, ensure_ascii=False)


def export_tools(tools: Iterable[Any]) -> str:
    """The ``tools`` column: JSON list of bare function specs without any ``x-`` key.

    ``x-`` keys are removed from the spec and from every schema inside its
    parameters, but never from property *names* (an argument may be called
    ``x-foo``). Memoised by identity: a pipeline exports the same domain tool
    list every row.

    Raises:
        ValueError: a spec is not a function spec with a name.
    """
    return _export_tools(tools)


def _bare_tools(tools: Iterable[Any]) -> str:
    specs = []
    for spec in tools:
        bare = normalize_tool_spec(spec)
        specs.append(
            {
                key: _strip_schema(value) if key == "parameters" else value
                for key, value in bare.items()
                if not key.startswith("x-")
            }
        )
    return json.dumps(specs, ensure_ascii=False)


_export_tools: IdentityMemo[Iterable[Any], str] = IdentityMemo(_bare_tools)


# Keywords whose value maps names to subschemas / is one subschema / is a list of subschemas.
_NAMED_SUBSCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
_SUBSCHEMAS = frozenset(
    {
        "items", "additionalItems", "additionalProperties", "unevaluatedItems",
        "unevaluatedProperties", "contains", "propertyNames", "not", "if", "then", "else",
        "allOf", "anyOf", "oneOf", "prefixItems",
    }
)  # fmt: skip


def _strip_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_strip_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-"):
            continue
        if key in _NAMED_SUBSCHEMAS and isinstance(value, dict):
            out[key] = {name: _strip_schema(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMAS:
            out[key] = _strip_schema(value)
        else:
            out[key] = value
    return out


# --- structure check --------------------------------------------------------------------------
def check_structure(conversations: list[dict[str, Any]]) -> list[Issue]:
    """Every reason LLaMA-Factory (or training on the row) would reject ``conversations``.

    The converter's rules: after an optional leading system turn, human or
    observation at even positions and gpt or function_call at odd ones, and an
    even count (the row ends on the assistant). Ours on top: non-empty, every
    function_call answered by an observation unless it is the last turn, every
    observation answering a function_call with one result per parallel call,
    no empty human/gpt value, every function_call value parseable the way
    ``FunctionFormatter`` parses it, and no think tag left in gpt text once the
    templates have cut the reasoning span (it would be trained as visible text).

    Args:
        conversations: the ``conversations`` list of a sharegpt row.

    Returns:
        Issues in conversation order; ``Issue.turn`` is the index into ``conversations``.
    """
    issues: list[Issue] = []
    start = 1 if conversations and _tag(conversations[0]) == "system" else 0
    body = conversations[start:]
    if not body:
        return [Issue("empty_trajectory", "the conversation has no user or assistant turns")]
    for offset, message in enumerate(body):
        i = start + offset
        if not isinstance(message, dict) or not isinstance(message.get("value"), str):
            issues.append(Issue("bad_field_type", "a turn needs a string 'value'", turn=i))
        expected = _USER_TAGS if offset % 2 == 0 else _ASSISTANT_TAGS
        if _tag(message) not in expected:
            issues.append(
                Issue(
                    "bad_turn_order",
                    f"turn {i} is {_tag(message)!r} where {' or '.join(expected)} must come",
                    turn=i,
                )
            )
            break  # the converter stops at the first misplaced role, so do we
    if _tag(body[-1]) not in _ASSISTANT_TAGS:
        issues.append(
            Issue(
                "no_assistant_ending",
                f"the conversation ends with {_tag(body[-1])!r}, not gpt or function_call",
                turn=len(conversations) - 1,
            )
        )
    elif len(body) % 2 != 0:
        issues.append(
            Issue(
                "no_assistant_ending",
                f"{len(body)} turns: the last assistant turn has no user/observation turn "
                "of its own, so LLaMA-Factory cannot pair it",
                turn=len(conversations) - 1,
            )
        )
    calls_open: int | None = None  # calls made by the preceding function_call turn
    for i in range(start, len(conversations)):
        message = conversations[i]
        tag, value = _tag(message), _value(message)
        if tag in ("human", "gpt") and not _strip_thought(value).strip():
            issues.append(Issue("empty_turn", f"the {tag} turn {i} has no text", turn=i))
        if tag == "gpt" and any(t in _strip_thought(value) for t in ("<think>", "</think>")):
            issues.append(
                Issue(
                    "stray_think_tag",
                    f"a think tag remains in the text of turn {i} once its reasoning span is cut",
                    turn=i,
                )
            )
        if tag == "function_call":
            calls_open = _count_calls(value)
            if calls_open is None:
                issues.append(
                    Issue(
                        "bad_function_call",
                        f"turn {i} is not a JSON call object or list of them",
                        turn=i,
                    )
                )
            if i + 1 < len(conversations) and _tag(conversations[i + 1]) != "observation":
                issues.append(Issue("unanswered_call", f"nothing answers call turn {i}", turn=i))
            continue
        if tag == "observation":
            if calls_open is None and (i == start or _tag(conversations[i - 1]) != "function_call"):
                issues.append(
                    Issue("orphan_observation", f"observation {i} follows no function_call", turn=i)
                )
            elif calls_open is not None:
                results = value.count(OBSERVATION_SEPARATOR) + 1
                if results < calls_open:
                    issues.append(
                        Issue(
                            "unanswered_call",
                            f"{calls_open} parallel calls, observation {i} holds {results} results",
                            turn=i - 1,
                        )
                    )
                elif results > calls_open:
                    issues.append(
                        Issue(
                            "orphan_observation",
                            f"{calls_open} call(s) but observation {i} holds {results} results",
                            turn=i,
                        )
                    )
        calls_open = None
    return issues


def _tag(message: Any) -> str:
    return str(message.get("from")) if isinstance(message, dict) else f"<{type(message).__name__}>"


def _value(message: Any) -> str:
    value = message.get("value") if isinstance(message, dict) else None
    return value if isinstance(value, str) else ""


def _strip_thought(value: str) -> str:
    """What FunctionFormatter parses: the value minus its first thought span."""
    match = _THOUGHT.search(value)
    return value.replace(match.group(0), "") if match else value


def _count_calls(value: str) -> int | None:
    """Number of calls in a function_call value, or ``None`` if FunctionFormatter would fail."""
    try:
        parsed = json.loads(_strip_thought(value))
    except json.JSONDecodeError:
        return None
    calls = parsed if isinstance(parsed, list) else [parsed]
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        if not isinstance(call.get("arguments"), dict):
            return None
    return len(calls) or None
